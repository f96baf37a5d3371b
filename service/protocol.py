"""OpenAI request bodies as pydantic models: every field the seed API pages define, with their ranges.

Validation only: no tokenizing, no grammar logic, no tensors. Unknown fields are kept (extra="allow") so the
route can name them in a response header; fields the API defines but we cannot honour are refused here.
"""

from __future__ import annotations

import email.message
import json
import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictFloat, StrictInt, StrictStr,
                      field_validator, model_validator)

from constrain.limits import nesting_depth, read_json

# Fields OpenAI (or the seed pages) define that this server cannot honour: sending them is a 400, not a silent
# drop. The value is the reason, which becomes the error message.
UNSUPPORTED_FIELDS: dict[str, str] = {
    "suffix": "`suffix` (insertion / fill-in-the-middle) is not supported by this server",
    "images": "this model does not accept images",
    "audio": "audio output is not supported by this server",
    "web_search_options": "web search is not supported by this server",
    "moderation": "moderation (blocking flagged input or output) is not supported by this server",
    # (vLLM's token-level constraints: an empty list asks for nothing)
    "allowed_token_ids": "`allowed_token_ids` is not supported by this server: constrain the output with a "
                         "`regex`, a `choice` or a `response_format` schema",
    "bad_words": "`bad_words` is not supported by this server: constrain the output with a `regex`, a `choice` "
                 "or a `response_format` schema",
}


_TOKEN_ID = re.compile(r"[0-9]+")  # logit_bias keys: ASCII digits (str.isdigit also takes "²" and "١٢")

# The names clients send an assistant's earlier reasoning under (DeepSeek's and vLLM's, OpenRouter's): both reach
# the chat template, the first one where both are sent.
REASONING_FIELDS = ("reasoning_content", "reasoning")

MAX_TEMPLATE_KWARGS_NESTING = 64  # (as a schema's: the values a template reads are flags, names, short lists)


# Variables of the chat template that the server derives from the request (chat_template_kwargs may not set them).
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "continue_final_message",
                                         "chat_template", "tokenize", "return_dict", "documents"})


class ParamError(ValueError):
    """A check across fields, naming the parameter it is about: the OpenAI error's `param` (service/errors.py).
    Nested inside a list or object of the body, the place of that part comes first (`messages[2].tool_call_id`)."""

    def __init__(self, param: str, message: str, code: str = "invalid_request"):
        super().__init__(message)
        self.param = param
        self.code = code


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool | None = False


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionDefinition

    @model_validator(mode="before")
    @classmethod
    def _custom_tools_unsupported(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("type") == "custom":  # (was "Input should be 'function'")
            raise ParamError("type", "custom tools (free-form text input) are not supported by this server: "
                             "declare a `function` tool, whose arguments are JSON", code="unsupported_parameter")
        return value


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ContentPart(BaseModel):
    """A text part (or an assistant's `refusal` part, which OpenAI allows): `ChatMessage._content_shape` refuses
    every other kind, each with its reason."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None
    refusal: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    function_call: ToolCallFunction | None = None  # (deprecated: an assistant's one call, before `tool_calls`)
    refusal: str | None = None  # an assistant's refusal, as OpenAI returns it (and SDKs send back in history)

    @field_validator("content", mode="before")
    @classmethod
    def _content_shape(cls, value):
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("`content` must be a string or a list of text parts")
        if not value:
            return value  # (an empty list: `_content_present` decides, knowing the role)
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("image_url", "input_image", "image"):
                raise ValueError("this model does not accept images")
            if kind in ("input_audio", "audio", "file"):
                raise ValueError(f"content parts of type {kind!r} are not supported: send text")
            if kind == "refusal" and isinstance(part.get("refusal"), str):
                continue  # (an assistant's; `_content_present` checks the role)
            if kind != "text":
                raise ValueError(f"content parts must be {{'type': 'text', 'text': ...}}, got type {kind!r}")
            if not isinstance(part.get("text"), str):  # (was told "got type 'text'")
                raise ValueError("a text content part's `text` must be a string")
        return value

    def renders(self, extra_field: str) -> bool:
        """Whether the chat template gets this field that the model does not declare: an assistant's earlier
        reasoning, under the first of the names clients send it under that holds text (service/chat_template.py);
        the other name, sent too, is ignored."""
        extra = self.model_extra or {}
        return self.role == "assistant" and extra_field == next(
            (name for name in REASONING_FIELDS if isinstance(extra.get(name), str)), None)

    def says_nothing(self, extra_field: str) -> bool:
        """Whether this field that the model does not declare is an answer's empty `annotations`, which an agent
        loop sends back with the message: named as ignored in every request, it said nothing."""
        return extra_field == "annotations" and (self.model_extra or {}).get(extra_field) == []

    @model_validator(mode="after")
    def _content_present(self) -> "ChatMessage":
        calls = self.tool_calls or self.function_call
        if self.content == [] and not (self.role == "assistant" and calls):
            raise ParamError("content", "`content` is an empty list: send at least one text part (as OpenAI "
                                        "requires), or a string")
        if self.role != "assistant" and calls:
            field = "tool_calls" if self.tool_calls else "function_call"
            raise ParamError(field, f"only an 'assistant' message holds `{field}`, not a {self.role!r} one")
        if self.content is None and not (self.role == "assistant" and (
                self.tool_calls or self.function_call or self.refusal is not None)):
            article = "an" if self.role == "assistant" else "a"
            raise ParamError("content", f"{article} {self.role!r} message needs `content`")
        if self.role != "assistant" and isinstance(self.content, list) and any(
                part.type == "refusal" for part in self.content):
            raise ParamError("content", f"a 'refusal' content part belongs to an assistant's message, not a "
                                        f"{self.role!r} one")
        if self.role == "tool" and not self.tool_call_id:
            raise ParamError("tool_call_id", "a 'tool' message needs `tool_call_id`")
        if self.role == "function" and not self.name:
            raise ParamError("name", "a 'function' message needs the `name` of the function it answers")
        return self

    @property
    def text(self) -> str:
        """The content as one string (text and refusal parts joined); an assistant's refusal when it has no
        content."""
        if self.content is None:
            return self.refusal or ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or part.refusal or "" for part in self.content)


def _check_tool_turns(messages: list[ChatMessage], continue_final: bool) -> None:
    """Each 'tool' message answers a call of the assistant message before its run of tool messages, by its id (any
    call, where one was sent without an id), and each call of an assistant message is answered by a tool message
    of the run right after it, as OpenAI requires; not the final message that `continue_final` continues. One pass
    over the messages: 20,000 tool results took 88 s of the event loop when each looked back over the others."""
    calls, ids, anonymous = (), set(), False  # the calls of the assistant message the tool messages may answer
    for i, message in enumerate(messages):
        if message.role == "tool":
            if not calls or not (anonymous or message.tool_call_id in ids):
                raise ParamError(f"messages[{i}]", "a 'tool' message must answer a preceding assistant message's "
                                                  "`tool_calls`, by one of their ids (as OpenAI requires)")
            continue
        calls = (message.tool_calls or ()) if message.role == "assistant" else ()
        ids = {c.id for c in calls if c.id is not None}
        anonymous = any(c.id is None for c in calls)
        if not ids or (continue_final and i == len(messages) - 1):
            continue
        answered, j = set(), i + 1
        while j < len(messages) and messages[j].role == "tool":
            answered.add(messages[j].tool_call_id)
            j += 1
        unanswered = [c.id for c in calls if c.id is not None and c.id not in answered]
        if unanswered:
            raise ParamError(f"messages[{i}]", "an assistant message with `tool_calls` must be followed by a "
                             "'tool' message answering each call (as OpenAI requires); no answer for "
                             + ", ".join(unanswered))


StopField = str | list[str] | None


def _first_invalid_text(value) -> str | None:
    """The path of the first string holding a lone UTF-16 surrogate (JSON allows "\\ud800", UTF-8 does not). The
    whole value is first written as UTF-8 in one go (C code: 0.2 s for 200,000 messages, where the walk below takes
    1.4 s); only where that fails is it walked to find the place. Each node is followed with a link to its parent,
    and only the path of the string found is spelled: spelling every node's path cost depth x nodes (a 3 MB body
    nested 990 deep: 6 s of the event loop and 4 GB)."""
    try:
        json.dumps(value, ensure_ascii=False, check_circular=False).encode("utf-8")
        return None
    except (UnicodeEncodeError, TypeError, ValueError, RecursionError):
        pass  # (a lone surrogate, or a value not written as JSON: walked)
    stack: list[tuple[Any, tuple | None]] = [(value, None)]  # (node, (its parent's place, key or index) or None)
    while stack:
        node, place = stack.pop()
        if isinstance(node, str):
            if not _utf8(node):
                return _spelled_path(place)
        elif isinstance(node, dict):
            if any(isinstance(k, str) and not _utf8(k) for k in node):
                return _spelled_path(place)
            stack.extend(reversed([(v, (place, k)) for k, v in node.items()]))  # (popped first to last)
        elif isinstance(node, list):
            stack.extend(reversed([(v, (place, i)) for i, v in enumerate(node)]))
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _spelled_path(place: tuple | None) -> str:
    """`messages[0].content`, as errors.param_path writes a place; "body" for the whole."""
    steps = []
    while place is not None:
        place, step = place
        steps.append(step)
    where = ""
    for step in reversed(steps):
        where = f"{where}[{step}]" if isinstance(step, int) else (f"{where}.{step}" if where else str(step))
    return where or "body"


class SamplingFields(BaseModel):
    """Fields shared by chat and completions, ranges from the seed pages (inclusive where a page says so)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data):
        where = _first_invalid_text(data)
        if where is not None:
            raise ParamError(where, f"'{where}' is not valid Unicode text (it holds a lone surrogate)")
        return data

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    max_completion_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, strict=True)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0, strict=True)
    top_k: int | None = Field(default=None, ge=-1, strict=True)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0, strict=True)
    n: int | None = Field(default=None, ge=1, le=128, strict=True)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1, strict=True)
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    stop: StopField = None
    include_stop_str_in_output: StrictBool | None = False
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0, strict=True)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0, strict=True)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0, strict=True)
    logit_bias: dict[str, StrictFloat] | None = None
    ignore_eos: StrictBool | None = False
    # vLLM's: more token ids that end the output, and the fewest tokens before an end token may come
    stop_token_ids: list[StrictInt] | None = Field(default=None, max_length=1024)
    min_tokens: int | None = Field(default=None, ge=0, strict=True)
    response_format: dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    constraint_backend: Literal["auto", "outlines", "llguidance"] | None = None  # extension: per request
    context_length_exceeded_behavior: Literal["truncate", "error"] | None = "truncate"
    mirostat_target: float | None = Field(default=None, gt=0.0, strict=True)
    mirostat_lr: float | None = Field(default=None, gt=0.0, le=1.0, strict=True)
    return_tokens_as_token_ids: StrictBool | None = False
    skip_special_tokens: StrictBool | None = True
    user: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=128, strict=True)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_shape(cls, value):
        if value is not None and not isinstance(value, str) and not (
                isinstance(value, list) and all(isinstance(s, str) for s in value)):
            raise ValueError("`stop` must be a string or a list of up to 4 strings")
        return value

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, value: StopField) -> StopField:
        if isinstance(value, list):
            if len(value) > 4:
                raise ValueError("at most 4 stop sequences are allowed")
            if any(not s for s in value):
                raise ValueError("stop sequences must be non-empty strings")
        if isinstance(value, str) and not value:
            raise ValueError("a stop sequence must be a non-empty string")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys_are_token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not _TOKEN_ID.fullmatch(key):
                raise ValueError(f"logit_bias keys must be token ids (non-negative integers), got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be between -100 and 100, got {bias} for token {key}")
        return value

    @field_validator("choice")
    @classmethod
    def _choice_not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("`choice` needs at least one string")
        return value

    @model_validator(mode="after")
    def _best_of_is_n(self):
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise ParamError("best_of", "`best_of` other than `n` is not supported by this server")
        return self

    @model_validator(mode="after")
    def _one_output_limit(self):
        """Both limits sent must agree: one was silently dropped (`max_completion_tokens` won), where OpenAI refuses
        the pair. The same value twice, as vLLM-style clients send it, asks one thing and is taken."""
        if None not in (self.max_tokens, self.max_completion_tokens) and self.max_tokens != self.max_completion_tokens:
            raise ParamError("max_tokens", f"`max_tokens` ({self.max_tokens}) and `max_completion_tokens` "
                             f"({self.max_completion_tokens}) set different limits: send one of them",
                             code="invalid_parameter_combination")
        return self

    @model_validator(mode="after")
    def _stream_options_with_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ParamError("stream_options", "`stream_options` is only allowed when `stream` is true")
        return self

    @property
    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def tokens_field(self) -> str:
        """The field that sets the output's limit: `max_completion_tokens` where sent, else `max_tokens` (both sent hold
        one value: `_one_output_limit`)."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def extra_fields(self) -> list[str]:
        """Fields we do not know: accepted, ignored, named in the `x-structgen-ignored-fields` header (those of
        `stream_options` as `stream_options.name`: vLLM's `continuous_usage_stats` is one)."""
        options = self.stream_options.model_extra if self.stream_options is not None else None
        return sorted(self.model_extra or {}) + [f"stream_options.{name}" for name in sorted(options or {})]


# OpenAI's `reasoning_effort` levels, as the SDK's ReasoningEffort lists them
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# The fields of a chat request that are checked, then ignored (`ChatCompletionRequest`)
IGNORED_CHAT_FIELDS = ("service_tier", "store", "metadata", "verbosity", "reasoning_effort", "prediction",
                       "safety_identifier", "prompt_cache_key", "prompt_cache_retention")


class PredictedText(BaseModel):
    model_config = ConfigDict(extra="allow")  # (the SDK's text parts may carry a `prompt_cache_breakpoint`)
    type: Literal["text"]
    text: StrictStr


class PredictedOutput(BaseModel):
    """OpenAI's `prediction` (predicted outputs): text the answer is expected to repeat."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["content"]
    content: StrictStr | list[PredictedText]


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] | None = None
    prompt: str | None = None  # raw prompt, bypassing the chat template (seed 001)
    logprobs: StrictBool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20, strict=True)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    modalities: list[str] | None = None
    # OpenAI's processing tiers: one tier here, so a valid value is ignored (and named as ignored); another is a 400,
    # as OpenAI answers it
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    # OpenAI fields that change no answer here, checked as OpenAI checks them (a typo is a 400 there too), then
    # ignored and named as ignored: nothing is stored for later retrieval (`store`, `metadata`); the answer's
    # length and reasoning are the model's (`verbosity`; `reasoning_effort` but on a harmony model, whose template
    # takes it); `prediction` only makes decoding faster.
    store: StrictBool | None = None
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[StrictStr, Field(max_length=512)]] | None = \
        Field(default=None, max_length=16)
    verbosity: Literal["low", "medium", "high"] | None = None
    reasoning_effort: Literal[REASONING_EFFORTS] | None = None
    prediction: PredictedOutput | None = None
    safety_identifier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    # Deprecated by OpenAI, still sent by older clients: served as the `tools` they became (`_legacy_functions`)
    functions: list[FunctionDefinition] | None = None
    function_call: Literal["none", "auto"] | dict[str, Any] | None = None
    _uses_functions: bool = PrivateAttr(False)
    # Chat template controls, as vLLM names them: a final assistant message continued (a prefill), and variables
    # for the model's template (Qwen3's `enable_thinking`, ...).
    add_generation_prompt: StrictBool | None = None  # default: true, false when continue_final_message
    continue_final_message: StrictBool | None = False
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _messages_or_prompt(self) -> "ChatCompletionRequest":
        if self.messages is None and self.prompt is None:
            raise ParamError("messages", "either `messages` or `prompt` must be provided")
        if self.messages is not None and self.prompt is not None:
            raise ParamError("prompt", "send either `messages` or `prompt`, not both")
        if self.messages is not None and not self.messages:
            raise ParamError("messages", "`messages` must not be empty")
        _check_tool_turns(self.messages or [], bool(self.continue_final_message))
        if self.top_logprobs and not self.logprobs:
            raise ParamError("top_logprobs", "`top_logprobs` requires `logprobs: true`")
        if self.modalities and any(m != "text" for m in self.modalities):
            raise ParamError("modalities", "only the 'text' modality is supported", code="unsupported_parameter")
        if self.continue_final_message:
            if self.messages is None or self.messages[-1].role != "assistant":
                raise ParamError("continue_final_message",
                                 "`continue_final_message` needs `messages` that end with an assistant message")
            if self.add_generation_prompt:
                raise ParamError("add_generation_prompt", "`add_generation_prompt` and `continue_final_message` "
                                 "cannot both be true: the answer either continues the last message or starts one")
        reserved = set(self.chat_template_kwargs or ()) & RESERVED_TEMPLATE_VARIABLES
        if reserved:
            raise ParamError("chat_template_kwargs", f"`chat_template_kwargs` may not set {sorted(reserved)}: "
                             "the server sets them from the request's own fields")
        if nesting_depth(self.chat_template_kwargs) > MAX_TEMPLATE_KWARGS_NESTING:
            # (600 levels failed the render with a RecursionError, named as the messages' fault)
            raise ParamError("chat_template_kwargs", f"`chat_template_kwargs` nests arrays and objects deeper than "
                             f"{MAX_TEMPLATE_KWARGS_NESTING} levels")
        return self

    @property
    def extra_fields(self) -> list[str]:
        """Also `service_tier` where sent, and the unknown fields of messages, as `messages.N.name` (a message echoed
        back from an answer may carry fields such as `annotations` or `audio`: accepted, named), and of tools, as
        `tools.N.name` and `tools.N.function.name` (`functions.N.name` where the request sent the deprecated
        `functions`)."""
        nested = [f"messages.{i}.{name}" for i, m in enumerate(self.messages or ())
                  for name in sorted(m.model_extra or {}) if not m.renders(name) and not m.says_nothing(name)]
        for i, tool in enumerate(self.tools or ()):
            where = f"functions.{i}" if self.uses_functions else f"tools.{i}"
            nested += [f"{where}.{name}" for name in sorted(tool.model_extra or {})]
            nested += [f"{where}{'' if self.uses_functions else '.function'}.{name}"
                       for name in sorted(tool.function.model_extra or {})]
        declared = [name for name in IGNORED_CHAT_FIELDS if getattr(self, name) is not None]
        return sorted(super().extra_fields + declared) + nested

    @property
    def generation_prompt(self) -> bool:
        """Whether the rendered prompt opens the assistant's turn."""
        if self.add_generation_prompt is None:
            return not self.continue_final_message
        return self.add_generation_prompt

    @model_validator(mode="after")
    def _legacy_functions(self) -> "ChatCompletionRequest":
        """`functions` and `function_call` become `tools` and `tool_choice` (one call at most: the answer's
        `function_call` holds one); history in the old shape (an assistant's `function_call`, `function` role
        results) becomes tool calls and tool results, paired in order. The answer keeps the old shape
        (`uses_functions`)."""
        self._pair_legacy_history()
        if self.functions is None and self.function_call is None:
            return self
        if self.tools is not None or self.tool_choice is not None or self.parallel_tool_calls is not None:
            raise ParamError("functions", "send either `tools` (and `tool_choice`, `parallel_tool_calls`) or the "
                             "deprecated `functions` (and `function_call`), not both")
        if not self.functions:
            if self.function_call in (None, "none"):  # `functions: []` asks for nothing, as `tools: []` does
                return self
            raise ParamError("function_call", "`function_call` needs `functions`")
        self.tools = [Tool(function=f) for f in self.functions]
        choice = self.function_call
        if isinstance(choice, dict):
            if set(choice) != {"name"} or not isinstance(choice["name"], str):
                raise ParamError("function_call",
                                 "`function_call` must be 'none', 'auto' or {'name': <a function's name>}")
            if choice["name"] not in {f.name for f in self.functions}:
                raise ParamError("function_call",
                                 f"`function_call` names an unknown function {choice['name']!r}")
            self.tool_choice = {"type": "function", "function": {"name": choice["name"]}}
        else:
            self.tool_choice = choice
        self.parallel_tool_calls = False
        self._uses_functions = True
        return self

    def _pair_legacy_history(self) -> None:
        """An assistant's `function_call` as a tool call, a `function` message as the result of the latest one."""
        last_id = None
        for i, m in enumerate(self.messages or ()):
            if m.role == "assistant" and m.function_call is not None and not m.tool_calls:
                last_id = f"call_{i}"
                self.messages[i] = m.model_copy(update={
                    "tool_calls": [ToolCall(id=last_id, function=m.function_call)], "function_call": None})
            elif m.role == "function":
                self.messages[i] = m.model_copy(update={"role": "tool", "tool_call_id": last_id or f"call_{m.name}"})

    @property
    def uses_functions(self) -> bool:
        """The request used the deprecated `functions`: the answer is a `function_call`, not `tool_calls`."""
        return self._uses_functions


# Prompts one completions request may hold: each is tokenized, queued and answered in turn, and 200,000 took
# minutes and 1.2 GB (QA hostile F7).
MAX_PROMPTS = 2048


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: StrictBool | None = False
    logprobs: int | None = Field(default=None, ge=0, le=5, strict=True)
    # (0 with `echo`: the prompt scored, nothing generated; seed 002, and lm-evaluation-harness's loglikelihood)
    max_tokens: int | None = Field(default=None, ge=0, strict=True)
    max_completion_tokens: int | None = Field(default=None, ge=0, strict=True)  # (seed 003: max_tokens' synonym)

    @model_validator(mode="after")
    def _nothing_generated_only_to_echo(self):
        field = self.tokens_field
        if getattr(self, field) == 0 and not self.echo:
            raise ParamError(field, f"`{field}: 0` generates nothing: it is only for `echo`, to score the prompt")
        return self

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value):
        def ids(x):
            return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

        if isinstance(value, str) or ids(value):
            return value
        if isinstance(value, list) and (all(isinstance(p, str) for p in value) or all(ids(p) for p in value)):
            return value
        raise ValueError("`prompt` must be a string, a list of strings, a list of token ids, or a list of "
                         "token-id lists")

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value):
        if isinstance(value, list):
            if not value:
                raise ValueError("`prompt` must not be an empty list")
            if len(value) > MAX_PROMPTS and not all(isinstance(p, int) for p in value):
                raise ValueError(f"`prompt` holds more than {MAX_PROMPTS} prompts")
            if any(isinstance(p, list) and not p for p in value):
                raise ValueError("`prompt` token lists must not be empty")
            if any(isinstance(p, int) and p < 0 for p in value) or any(
                    isinstance(p, list) and any(t < 0 for t in p) for p in value):
                raise ValueError("token ids in `prompt` must be non-negative")
        return value


_Request = TypeVar("_Request", bound=SamplingFields)


def read_body(raw: bytes, content_type: str | None, model: type[_Request]) -> _Request:
    """The body as `model`, read as FastAPI reads a JSON body: as JSON where its Content-Type is JSON (`application/
    json`, `application/*+json`) or where it names none (`requests.post(url, data=...)`), otherwise left as bytes,
    which no request model takes (curl -d without -H sends a form); no body at all is None. Raises pydantic's
    ValidationError, or what `read_json` raises (JSONTooDeep, json.JSONDecodeError, ...)."""
    if not raw:
        return model.model_validate(None)
    data: Any = raw
    if not content_type:
        data = read_json(raw)
    else:
        message = email.message.Message()
        message["content-type"] = content_type
        subtype = message.get_content_subtype()
        if message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json")):
            data = read_json(raw)
    return model.model_validate(data)
