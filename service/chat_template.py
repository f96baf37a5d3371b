"""Chat messages -> prompt token ids, with the model's own chat template (a ChatML fallback when it has none).

Handles `tool` role messages and assistant `tool_calls` in history, and adds the tools to the prompt (as the
template's `tools` argument when the template knows tools, else as a system prompt from constrain). Never
samples and never touches tensors.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from typing import Any, Callable

from constrain.harmony import CHANNEL, harmony_token_ids
from constrain.limits import read_json
from constrain.tools import GRANITE_CALLS, HERMES_CLOSE, HERMES_OPEN, MISTRAL_ARGS, MISTRAL_CALLS, call_token_id
from constrain.xml_calls import ARG_KEY_CLOSE, ARG_KEY_OPEN, ARG_VALUE_OPEN, FUNCTION_OPEN, PARAMETER_OPEN, SHAPES
from engine.model_loader import ModelLoadError
from engine.types import ReasoningTags
from service.errors import invalid
from service.protocol import REASONING_FIELDS, ChatMessage

# Used when the tokenizer has no chat template (e.g. GPT-2): ChatML, which most instruction data resembles.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _arguments_object(arguments: str | dict) -> Any:
    """An earlier call's `arguments` as the JSON value they spell, for templates that write them as one; the
    string itself where they spell none a tokenizer can take (OpenAI takes any string there): not JSON, nested
    past MAX_JSON_NESTING, or holding a lone surrogate once decoded (`"\\ud800"`). An empty string is no arguments
    (`{}`: the templates that walk them as a mapping refused it)."""
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str) and not arguments.strip():
        return {}
    try:
        value = read_json(arguments)
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError):  # (UnicodeEncodeError and JSONTooDeep are ValueErrors)
        return arguments
    return value


def _arguments_text(arguments: str | dict) -> str:
    """An earlier call's `arguments` as JSON text, for templates that add them to a string (DeepSeek's)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def tool_calls_as_text(message: ChatMessage) -> str:
    """An assistant's earlier tool calls written the way constrain asks the model to write them (a JSON array of
    {"name", "arguments"})."""
    calls = [{"name": c.function.name, "arguments": _arguments_object(c.function.arguments)}
             for c in message.tool_calls or ()]
    return json.dumps(calls, ensure_ascii=False)


def short_call_id(call_id: str) -> str:
    """9 letters and digits drawn from `call_id`'s hash: the same id always gives the same short one."""
    alphabet = string.ascii_letters + string.digits
    return "".join(alphabet[b % len(alphabet)] for b in hashlib.sha256(call_id.encode()).digest()[:9])


def _with_short_call_ids(dicts: list[dict]) -> list[dict] | None:
    """The conversation with its tool call ids (the calls' and the results' `tool_call_id`) made `short_call_id`s,
    or None when it holds none. Mistral's templates refuse any other id ("Tool call IDs should be alphanumeric
    strings with length 9!"), OpenAI's and ours are longer, and the id only pairs a result with its call."""
    out, changed = [], False
    for d in dicts:
        d = dict(d)
        if d.get("tool_calls"):
            d["tool_calls"] = [{**c, "id": short_call_id(c["id"])} if c.get("id") else c for c in d["tool_calls"]]
            changed = True
        if d.get("tool_call_id"):
            d["tool_call_id"] = short_call_id(d["tool_call_id"])
            changed = True
        out.append(d)
    return out if changed else None


def _whole_members(text: str) -> dict:
    """What a cut-off JSON object's text holds whole: its members up to the last one complete (`{"a": 1, "b": "x`
    -> {"a": 1}); {} where none is, or the text does not begin an object."""
    s = text.lstrip()
    if not s.startswith("{"):
        return {}
    depth, in_string, escaped, last_comma = 0, False, False, None
    for i, ch in enumerate(s):
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 1:
            last_comma = i
    if last_comma is None:
        return {}
    try:
        value = read_json(s[:last_comma] + "}")
    except ValueError:  # (JSONTooDeep too: a member nested 2,000 deep was a RecursionError, a 500)
        return {}
    return value if isinstance(value, dict) else {}


def _with_arguments_objects(dicts: list[dict]) -> list[dict] | None:
    """The conversation with each call's `arguments` that is not a JSON object (a call max_tokens cut: `{"a": `)
    made one, of its whole members; or None when every call's is one. The templates that walk the arguments as a
    mapping (Qwen3-Coder's, GLM's) refused the server's own cut calls sent back, as agent loops send them."""
    out, changed = [], False
    for d in dicts:
        calls = d.get("tool_calls")
        if calls and any(not isinstance(c["function"]["arguments"], dict) for c in calls):
            d = {**d, "tool_calls": [c if isinstance(c["function"]["arguments"], dict) else
                                     {**c, "function": {**c["function"],
                                                        "arguments": _whole_members(str(c["function"]["arguments"]))}}
                                     for c in calls]}
            changed = True
        out.append(d)
    return out if changed else None


def _with_description(tool: dict) -> dict:
    """A tool with a `description` ("" where it had none): gpt-oss's template adds it to a string, which fails where
    it is missing (OpenAI's API does not require one)."""
    function = tool.get("function")
    if not isinstance(function, dict) or isinstance(function.get("description"), str):
        return tool
    return {**tool, "function": {**function, "description": ""}}


def _with_optional_fields(tool: dict) -> dict:
    """A tool with the fields OpenAI's API leaves optional that some templates read without asking: a `description`
    on the function and on each property ("" where none), and `parameters` with `properties` (`{}` where none):
    Hermes 3's and Command-R's read descriptions, Command-R's and Seed-OSS's walk the properties (gpt-oss's reads
    the function's: `_with_description`, given it always)."""
    function = tool.get("function")
    if not isinstance(function, dict):
        return tool
    parameters = function.get("parameters")
    parameters = {"type": "object", "properties": {}} if not isinstance(parameters, dict) else parameters
    properties = parameters.get("properties")
    properties = {name: {**value, "description": ""} if isinstance(value, dict) and "description" not in value
                  else value for name, value in properties.items()} if isinstance(properties, dict) else {}
    return {**tool, "function": {**function, "description": function.get("description") or "",
                                 "parameters": {**parameters, "properties": properties}}}


def _one_call_each(item: dict) -> list[dict]:
    """An assistant message with several tool calls as one message per call, the first with its text: harmony
    writes one call per message, and gpt-oss's template renders only the first call of each."""
    calls = item.get("tool_calls") or []
    if len(calls) < 2:
        return [item]
    return [{**item, "tool_calls": [calls[0]]}] + [{"role": "assistant", "content": "", "tool_calls": [c]}
                                                   for c in calls[1:]]


def _results_after_their_calls(dicts: list[dict]) -> list[dict]:
    """The conversation with each tool result moved to just after the call it answers (in the messages of one call
    each that `_one_call_each` made): gpt-oss's template names a result after the call before it, and parallel
    results after all the calls were each named the last call's. Results no call of theirs names stay after them."""
    out: list[dict] = []
    i = 0
    while i < len(dicts):
        if not dicts[i].get("tool_calls"):
            out.append(dicts[i])
            i += 1
            continue
        calls_end = i
        while calls_end < len(dicts) and dicts[calls_end].get("tool_calls"):
            calls_end += 1
        results_end = calls_end
        while results_end < len(dicts) and dicts[results_end]["role"] == "tool":
            results_end += 1
        ids = {call["id"] for message in dicts[i:calls_end] for call in message["tool_calls"] if call.get("id")}
        results: dict[Any, list[dict]] = {}
        for result in dicts[calls_end:results_end]:
            results.setdefault(result.get("tool_call_id") if result.get("tool_call_id") in ids else None,
                               []).append(result)
        for message in dicts[i:calls_end]:
            out.append(message)
            for call in message["tool_calls"]:  # (one result each, in order: ids may repeat; a call sent
                answers = results.get(call.get("id") or None)  # without an id takes the next result no id names)
                if answers:
                    out.append(answers.pop(0))
        out.extend(result for rest in results.values() for result in rest)
        i = results_end
    return out


_PROBE = "structgen-role-probe-7f3a"
_FIRST_PROBE = "structgen-first-probe-7f3a"
_ANSWER_PROBE = "structgen-answer-probe-7f3a"
_PROBE_TOOL = "structgen_tool_probe_7f3a"
_ARGUMENTS_PROBE = "structgen-arguments-probe-7f3a"  # (in a call's arguments: a call is not told by its name,
# which the tools' list and a tool result's name may hold too)
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": _PROBE_TOOL, "description": "A probe.",
    "parameters": {"type": "object", "properties": {"x": {"type": "string", "description": "x"}}, "required": ["x"]}}}]
# Each probe is rendered as it is, then with tools given (Hermes 3's `tool_use` template refuses a conversation
# without them).
_PROBE_OPTIONS = ({"add_generation_prompt": True}, {"add_generation_prompt": True, "tools": _PROBE_TOOLS})


def _probe_call(as_text: bool = False) -> dict:
    arguments = {"x": _ARGUMENTS_PROBE}
    return {"id": "call_0", "type": "function",
            "function": {"name": _PROBE_TOOL, "arguments": json.dumps(arguments) if as_text else arguments}}


def _answered_call(call_id: str | None, calls: list, answered: int, earlier: dict[str, Any]):
    """The call a tool result answers: the next of the last answer's `calls` (`answered` of them are answered)
    where its id is the result's, else the call of that id there, else the latest earlier one, else, where no call
    has the id (calls sent without ids), the next by order."""
    in_order = calls[answered] if answered < len(calls) else None
    if in_order is not None and in_order.id == call_id:
        return in_order
    return next((c for c in calls if c.id and c.id == call_id), None) or earlier.get(call_id) or in_order


def _probe_result(content: str) -> dict:
    """A tool result answering `_probe_call`, named as `_message_dicts` names one (vLLM's hermes template asks)."""
    return {"role": "tool", "content": content, "tool_call_id": "call_0", "name": _PROBE_TOOL}


# Phi-4-mini's calls (in llama.cpp's copy of its template) are each an object between `<|tool_call|>` and this:
# not Granite's list after `<|tool_call|>`.
PHI4_CALL_CLOSE = "<|/tool_call|>"
# Llama 3.1-3.3's templates tell the model: 'Respond in the format {"name": function name, "parameters":
# dictionary of argument name and its value}.'
LLAMA3_JSON_INSTRUCTION = re.compile(r'"name": [^\n"]{0,80}"parameters": ')
# The tags around the reasoning block some models write before the answer: Qwen3's, QwQ's and DeepSeek-R1's;
# Magistral's and Ministral 3's.
REASONING_TAGS = (("<think>", "</think>"), ("[THINK]", "[/THINK]"))


# A message's fields whose text stays as it is: values the template compares (`tool_call_id`: Mistral's templates
# check its length) and the role.
_NOT_HELD = ("role", "tool_call_id")


class _HeldText:
    """The special tokens' text (`<|im_end|>`) found in what messages and tools say, held out of the chat template as
    placeholders and put back after it, where it is text: a message may not open or close turns. Placeholders
    carry a nonce, so that no client text can pass for one."""

    def __init__(self, special_text: re.Pattern):
        self.special_text = special_text
        self.nonce = secrets.token_hex(6)
        self.texts: list[str] = []

    def hold(self, value: Any) -> Any:
        """`value` (a string, or the strings inside lists and dicts, their keys too: a call's argument names, a
        tool's property names) with the special tokens' text held."""
        if isinstance(value, str):
            return self.special_text.sub(self._placeholder, value)
        if isinstance(value, list):
            return [self.hold(v) for v in value]
        if isinstance(value, dict):
            return {self.hold(k): self.hold(v) for k, v in value.items()}
        return value

    def _placeholder(self, match: re.Match) -> str:
        self.texts.append(match[0])
        return f"\ue000{self.nonce}.{len(self.texts) - 1}\ue001"

    def put_back(self, rendered: str) -> tuple[str, tuple[tuple[int, int], ...]]:
        """`rendered` with the text in place of each placeholder, and where that text now lies (start, end)."""
        if not self.texts:
            return rendered, ()
        out, spans, at, length = [], [], 0, 0
        for m in re.finditer(f"\ue000{self.nonce}\\.([0-9]+)\ue001", rendered):
            text = self.texts[int(m[1])]
            out += [rendered[at:m.start()], text]
            length += m.start() - at
            spans.append((length, length + len(text)))
            length += len(text)
            at = m.end()
        out.append(rendered[at:])
        return "".join(out), tuple(spans)


def _check_compiles(template: str) -> None:
    """A template Jinja cannot read is a start-up error: served, every chat request was a 400 blaming `messages`,
    which the client cannot mend (QA)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(template)
    except Exception as exc:  # noqa: BLE001 - jinja's TemplateSyntaxError and the like, said in one line
        raise ModelLoadError(f"the model's chat template cannot be read: {type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:200]}") from None


class ChatTemplate:
    """Renders a conversation for one tokenizer."""

    def __init__(self, tokenizer, tool_format: str = "auto", reasoning: str = "auto", template: str | None = None):
        """`template`: the one to render with (default: the tokenizer's; where it has named ones, `tool_use`, with
        `default` for requests without tools)."""
        self.tokenizer = tokenizer
        specials = sorted({t.content for t in tokenizer.added_tokens_decoder.values() if t.special and t.content},
                          key=len, reverse=True)
        self._special_text = re.compile("|".join(map(re.escape, specials))) if specials else None
        own = getattr(tokenizer, "chat_template", None)
        self._without_tools: ChatTemplate | None = None
        if template is None and isinstance(own, dict) and own:
            # Named templates (Hermes-2-Pro's and 3's, Command-R's): transformers and vLLM render a request with
            # tools by `tool_use` (which may refuse a conversation without them), any other by `default`.
            template = own.get("tool_use") or own.get("default") or next(iter(own.values()))
            plain = own.get("default")
            if plain and plain != template:
                self._without_tools = ChatTemplate(tokenizer, tool_format, reasoning, template=plain)
        self.template = template or (own if isinstance(own, str) else None) or FALLBACK_TEMPLATE
        self.has_own_template = bool(own)
        _check_compiles(self.template)
        self.knows_tools = "tools" in self.template and self._renders_tools()
        self.knows_tool_calls = "tool_calls" in self.template
        # gpt-oss's harmony format (constrain/harmony.py): the template writes its channels, and its tags are tokens
        self.harmony = CHANNEL in self.template and harmony_token_ids(tokenizer) is not None
        self.tool_format = self._tool_format() if tool_format == "auto" else tool_format
        # Tool-call tags the format writes as text that are special tokens (`<tool_call>` in some fine-tunes): the
        # vocabulary lets grammars write them, and tool requests keep special tokens in their text, as they must
        # where the tags themselves are special tokens (mistral_args).
        self.written_special_tags = self._written_special_tags()
        self.calls_in_special_tokens = self.tool_format == "mistral_args" or bool(self.written_special_tags)
        tags = {"mistral": [MISTRAL_CALLS], "mistral_args": [MISTRAL_CALLS, MISTRAL_ARGS],
                "granite": [GRANITE_CALLS]}.get(self.tool_format, ())
        for tag in tags:  # (a format forced on a vocabulary without its tags)
            if call_token_id(tokenizer, tag) is None:
                raise ModelLoadError(f"--tool-call-format {self.tool_format}: the model's tokenizer has no {tag} "
                                     "token")
        if self.tool_format == "harmony" and harmony_token_ids(tokenizer) is None:
            raise ModelLoadError("--tool-call-format harmony: the model's tokenizer does not have harmony's tags as "
                                 "tokens")
        self.reasoning = self._reasoning_tags() if reasoning == "auto" else None
        # Some templates silently drop roles (Phi-3's renders only user and assistant): fold those into user
        # turns rather than lose the system prompt, the tools description or a tool's result. Each probe is also
        # tried with tools given (Hermes 3's `tool_use` template refuses a conversation without). Mistral's write
        # a system message only where a user message ends the conversation: one ending with an answer, a prefill
        # or a tool result lost it.
        self.renders_system = self._renders([{"role": "system", "content": _PROBE},
                                             {"role": "user", "content": "hi"}]) \
            and not self._drops([{"role": "system", "content": _PROBE}, {"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "ok"}])
        # Others render one system message as the system prompt: the first (gpt-oss's, Magistral's) or the last
        # (DeepSeek-R1's), or all of them together at the top (DeepSeek-V3's); the others would be lost, or moved,
        # where OpenAI applies each one where it stands.
        self.renders_later_system = self.renders_system and self._renders(
            [{"role": "system", "content": _FIRST_PROBE}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": _ANSWER_PROBE}, {"role": "system", "content": _PROBE},
             {"role": "user", "content": "hi"}], in_order=(_FIRST_PROBE, _ANSWER_PROBE, _PROBE))
        # (a tool result after the call it answers, as gpt-oss's template demands one, or after a plain answer)
        self.renders_tool = any(self._renders(conversation) for conversation in (
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}, _probe_result(_PROBE)],
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [_probe_call()]},
             _probe_result(_PROBE)]))
        self._calls_in_history = self._calls_written_as()
        # (Llama 3.x's and Hermes 3's write an answer's calls and not the text before them, which the hermes format
        # returns as its content; vLLM's phi4_mini writes the text and not the calls: the text is given to them as
        # an answer of its own, just before the calls, where two answers in a row render: Mistral's refuse them)
        self._answer_before_calls = self._calls_in_history != "content" and not self.harmony and self._drops(
            [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": _PROBE, "tool_calls": [_probe_call()]}, _probe_result("ok")],
            (_PROBE, _ARGUMENTS_PROBE)) and self._renders(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE},
             {"role": "assistant", "content": "", "tool_calls": [_probe_call()]}, _probe_result("ok"),
             {"role": "assistant", "content": "ok"}, {"role": "user", "content": "hi"}], (_PROBE, _ARGUMENTS_PROBE))

    def summary(self) -> str:
        """What the probes found, in one line for the start-up log: they decide without a word where each message
        reaches the prompt, which whoever reads a new model's prompts needs to know."""
        if not self.renders_system:
            system = "folded into user turns"
        elif not self.renders_later_system:
            system = "the first as the system prompt, later ones folded into user turns"
        else:
            system = "where they stand"
        parts = [("its own" if self.has_own_template else "ChatML (the tokenizer has none)")
                 + (" (named: tool_use, default)" if self._without_tools is not None else ""),
                 f"tool calls written as {self.tool_format}",
                 "tools written by the template" if self.knows_tools else "tools described in a system message",
                 f"system messages {system}",
                 "tool results " + ("as the tool role" if self.renders_tool else "folded into user turns"),
                 "earlier calls " + {"arguments": "as tool_calls", "arguments text": "as tool_calls, arguments text",
                                     "content": "written into the content as JSON"}[self._calls_in_history]]
        if self._answer_before_calls:
            parts.append("an answer's text beside its calls as an answer of its own")
        if self.harmony:
            parts.append("harmony channels")
        if self.reasoning is not None:
            parts.append(f"reasoning in {self.reasoning[0]}...{self.reasoning[1]}")
        summary = "chat template: " + "; ".join(parts)
        if self._without_tools is not None:
            summary += " | without tools: " + self._without_tools.summary().removeprefix("chat template: ")
        return summary

    def _tool_format(self) -> str:
        """How the model writes tool calls (constrain/tools.py), as its template tells it to: the `<tool_call>` tags
        of Qwen2.5, Qwen3 and Hermes, around the `<function=...>` and `<parameter=...>` tags of Qwen3-Coder and
        Qwen3.5, or around GLM's `<arg_key>` and `<arg_value>` tags (on lines of their own up to GLM-4.6);
        Mistral's `[TOOL_CALLS]` token before a JSON array, or its later `[TOOL_CALLS]name[ARGS]{...}`, where those
        are tokens of the vocabulary; Granite's `<|tool_call|>` special token before a JSON array; gpt-oss's harmony
        calls; Llama 3's `{"name": ..., "parameters": ...}`; else ours (the tools prompt describes it to templates
        without tool support)."""
        if not self.knows_tools:
            return "json_array"
        if self.harmony:
            return "harmony"
        if HERMES_OPEN in self.template and FUNCTION_OPEN in self.template and PARAMETER_OPEN in self.template:
            return "qwen3_coder"
        if HERMES_OPEN in self.template and ARG_KEY_OPEN in self.template and ARG_VALUE_OPEN in self.template:
            return "glm47" if ARG_KEY_CLOSE + ARG_VALUE_OPEN in self.template else "glm45"
        if HERMES_OPEN in self.template:
            return "hermes"
        if GRANITE_CALLS in self.template and PHI4_CALL_CLOSE not in self.template \
                and self._special_token(GRANITE_CALLS):
            return "granite"
        if MISTRAL_CALLS in self.template and call_token_id(self.tokenizer) is not None:
            if MISTRAL_ARGS not in self.template:
                return "mistral"
            if call_token_id(self.tokenizer, MISTRAL_ARGS) is not None:
                return "mistral_args"
        if LLAMA3_JSON_INSTRUCTION.search(self.template):
            return "llama3_json"
        return "json_array"

    def _special_token(self, tag: str) -> bool:
        """`tag` is one special token of the vocabulary (so no text but the tag itself writes it)."""
        tid = call_token_id(self.tokenizer, tag)
        added = self.tokenizer.added_tokens_decoder.get(tid) if tid is not None else None
        return added is not None and added.special

    def _written_special_tags(self) -> tuple[str, ...]:
        if self.tool_format != "hermes" and self.tool_format not in SHAPES:
            return ()
        special = {t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special}
        tags = (HERMES_OPEN, HERMES_CLOSE, *(SHAPES[self.tool_format].tags if self.tool_format in SHAPES else ()))
        return tuple(tag for tag in tags if tag in special)

    def _reasoning_tags(self) -> tuple[str, str, int, int] | None:
        """The open and close tags (of REASONING_TAGS) and their ids, when the template writes reasoning blocks
        and each tag is one token (a tag spelled in pieces could not be told from the same text inside the
        answer)."""
        for tags in REASONING_TAGS:
            if tags[1] not in self.template:
                continue
            ids = [self.tokenizer.encode(tag, add_special_tokens=False) for tag in tags]
            if all(len(i) == 1 for i in ids):
                return tags[0], tags[1], ids[0][0], ids[1][0]
        return None

    def reasoning_for(self, prompt: str) -> ReasoningTags | None:
        """How the answer to `prompt` (rendered with the assistant's turn opened) starts: inside a block that
        the template opened (DeepSeek-R1, QwQ), free to open one (Qwen3), or with none, where the template wrote
        an empty block (Qwen3 with `enable_thinking: false`) or the model writes none."""
        if self.reasoning is None:
            return None
        open_tag, close_tag, open_id, close_id = self.reasoning
        end = prompt.rstrip()
        if end.endswith(close_tag):
            return None
        return ReasoningTags(open_id, close_id, opened=end.endswith(open_tag))

    def prefill_reasoning(self, prefill: str) -> tuple[ReasoningTags | None, str, bool]:
        """For an assistant message left open to be continued: the block it leaves open, if any (the continuation
        is then reasoning until the close tag, and a constraint applies after it), the part of the message that is
        the answer (after a block it closed, less the whitespace between; none while one is open), and whether
        the message ends after a block it closed with no answer yet (whose leading whitespace is then dropped, as
        after a block the model closes: QA reasoning D3)."""
        if self.reasoning is None:
            return None, prefill, False
        open_tag, close_tag, open_id, close_id = self.reasoning
        opened, closed = prefill.rfind(open_tag), prefill.rfind(close_tag)
        if opened > closed:
            return ReasoningTags(open_id, close_id, opened=True), "", False
        if closed < 0:
            return None, prefill, False
        answer = prefill[closed + len(close_tag):].lstrip()
        return None, answer, not answer

    def _renders_tools(self) -> bool:
        """The template writes the `tools` it is given into the prompt. Some name tools yet read them from elsewhere
        (Phi-4-mini's, from the system message's own `tools` field), so the model would never see them: those get
        the tools prompt instead, as templates without tool support do. A template that refuses the probe is
        trusted to know tools."""
        for conversation in ([{"role": "user", "content": "hi"}],
                             [{"role": "system", "content": "hi"}, {"role": "user", "content": "hi"}]):
            try:
                if _PROBE_TOOL in self._apply(conversation, {"add_generation_prompt": True, "tools": _PROBE_TOOLS}):
                    return True
            except Exception:  # noqa: BLE001 - a template that refuses the probe (it may want other fields)
                return True
        return False

    def _renders(self, conversation: list[dict], in_order: tuple[str, ...] = (_PROBE,)) -> bool:
        """The template writes the probes `in_order` of `conversation`, in that order, as it is or with tools
        given."""
        for options in _PROBE_OPTIONS:
            try:
                text = self._apply(conversation, options)
            except Exception:  # noqa: BLE001 - a template that refuses the role does not render it
                continue
            places = [text.find(probe) for probe in in_order]
            if -1 not in places and places == sorted(places):
                return True
        return False

    def _drops(self, conversation: list[dict], probes: tuple[str, ...] = (_PROBE,)) -> bool:
        """The template renders `conversation` without one of its `probes`, as it is or with tools given, and never
        with them all (a template that refuses the conversation drops nothing)."""
        dropped = False
        for options in _PROBE_OPTIONS:
            try:
                text = self._apply(conversation, options)
            except Exception:  # noqa: BLE001 - refused: not silently dropped
                continue
            if all(probe in text for probe in probes):
                return False
            dropped = True
        return dropped

    def _calls_written_as(self) -> str:
        """How an assistant's earlier calls reach the prompt: "arguments" (the template writes `tool_calls`, their
        arguments a mapping), "arguments text" (it adds them to a string: DeepSeek's), or "content" (written as text
        in the message's content, where the template has no `tool_calls`, or drops them without a word: DeepSeek-R1's
        and V3's write calls only where the content is None, which transformers 5 takes out of every message). A
        template that refuses every probe is trusted with a mapping."""
        if not self.knows_tool_calls:
            return "content"
        dropped = False
        for written_as, as_text in (("arguments", False), ("arguments text", True)):
            conversation = [{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "", "tool_calls": [_probe_call(as_text)]},
                            _probe_result("ok")]
            for options in _PROBE_OPTIONS:
                try:
                    text = self._apply(conversation, options)
                except Exception:  # noqa: BLE001 - not a shape it takes
                    continue
                if _ARGUMENTS_PROBE in text:
                    return written_as
                dropped = True
        return "content" if dropped else "arguments"

    def _fold_roles(self, dicts: list[dict], held: _HeldText | None = None) -> list[dict]:
        """The messages with the roles the template would drop folded into ones it renders: a tool result into a
        user turn; a system message into the next user turn, or, where the template renders one system message
        only, a system message right after the first into that one. A user turn this makes, or adds to, joins a
        user turn beside it (Gemma's template refuses two in a row: parallel results, a result and the next
        question, a question, a system message and the next)."""
        out: list[tuple[dict, bool]] = []  # (message, whether this made it a user turn or added to it)
        system: list[str] = []
        for d in dicts:
            made = False
            if d["role"] == "tool" and not self.renders_tool:
                label = d.get("name") or "tool"  # (its call's function's: `_message_dicts`)
                if not d.get("name") and d.get("tool_call_id"):  # (an id is not held, for the templates that
                    label = held.hold(d["tool_call_id"]) if held is not None else d["tool_call_id"]  # check it)
                d, made = {"role": "user", "content": f"Tool result ({label}): {d['content']}"}, True
            if d["role"] == "system" and self.renders_system and not self.renders_later_system and out:
                if len(out) == 1 and out[0][0]["role"] == "system":
                    out[0] = ({**out[0][0], "content": out[0][0]["content"] + "\n\n" + d["content"]}, False)
                else:
                    system.append(d["content"])
                continue
            if d["role"] == "system" and not self.renders_system:
                system.append(d["content"])
                continue
            if system and d["role"] == "user":
                d, made = {**d, "content": "\n\n".join(system + [d["content"]])}, True
                system = []
            elif system and d["role"] == "assistant":  # (before the answer it stood before: a prefill ends the prompt)
                out.append(({"role": "user", "content": "\n\n".join(system)}, True))
                system = []
            out.append((d, made))
        if system:
            out.append(({"role": "user", "content": "\n\n".join(system)}, True))
        joined: list[tuple[dict, list[str], bool]] = []  # (message, its content's parts, made)
        for d, made in out:
            if joined and d["role"] == "user" == joined[-1][0]["role"] and (made or joined[-1][2]):
                joined[-1][1].append(d["content"])  # (a list: joining thousands of results stays linear)
                joined[-1] = (joined[-1][0], joined[-1][1], True)
            else:
                joined.append((d, [d["content"]], made))
        return [d if len(parts) == 1 else {**d, "content": "\n\n".join(parts)} for d, parts, _ in joined]

    def _message_dicts(self, messages: list[ChatMessage], held: _HeldText | None = None,
                       prefill: bool = False) -> list[dict]:
        """The messages as the template reads them; with `held`, the special tokens' text in what they say (content,
        reasoning, calls' arguments, names) held out as placeholders, but in a final assistant message the answer
        continues (`prefill`): that one may open the model's channels, as gpt-oss's do."""
        out = []
        calls: list = []  # the calls of the last answer that made some, and how many results have answered them
        answered = 0
        earlier: dict[str, Any] = {}  # every call so far by its id, the latest where ids repeat
        for i, m in enumerate(messages):
            role = "system" if m.role == "developer" else m.role
            item: dict[str, Any] = {"role": role, "content": m.text}
            if m.role == "assistant" and m.tool_calls:
                if self._calls_in_history != "content":
                    item["tool_calls"] = [
                        {"id": c.id, "type": "function",
                         "function": {"name": c.function.name,
                                      "arguments": _arguments_text(c.function.arguments)
                                      if self._calls_in_history == "arguments text"
                                      else _arguments_object(c.function.arguments)}}
                        for c in m.tool_calls]
                else:
                    item["content"] = (m.text + "\n" if m.text else "") + tool_calls_as_text(m)
            unheld_calls = item.get("tool_calls") or []
            reasoning = next((m.model_extra[name] for name in REASONING_FIELDS if m.renders(name)), None)
            if reasoning is not None:
                item["reasoning_content"] = reasoning  # (templates of reasoning models read it; others ignore it)
                if self.harmony:
                    item["thinking"] = reasoning  # (gpt-oss's name for it)
            if m.role == "tool":
                item["tool_call_id"] = m.tool_call_id
            if m.name:  # (a participant's name: templates that write names get it; the others leave it out)
                item["name"] = m.name
            elif m.role == "tool":  # (the function's: vLLM's hermes template asks)
                call = _answered_call(m.tool_call_id, calls, answered, earlier)
                if call is not None:
                    item["name"] = call.function.name
                answered += 1
            if m.role == "assistant" and m.tool_calls:
                calls, answered = list(m.tool_calls), 0
                earlier.update((c.id, c) for c in m.tool_calls if c.id)
            if held is not None and not (prefill and i == len(messages) - 1):
                item = {key: value if key in _NOT_HELD else held.hold(value) for key, value in item.items()}
                if "tool_calls" in item:  # (a call's id stays as its results' `tool_call_id`: `_NOT_HELD`)
                    item["tool_calls"] = [{**held_call, "id": call["id"]} for held_call, call
                                          in zip(item["tool_calls"], unheld_calls)]
            if item.get("tool_calls") and item["content"] and self._answer_before_calls:
                out.append({"role": "assistant", "content": item["content"]})
                item = {**item, "content": ""}
            out.extend(_one_call_each(item) if self.harmony else [item])
        return _results_after_their_calls(out) if self.harmony else out

    def render(self, messages: list[ChatMessage], tools: list[dict] | None = None,
               tools_prompt: Callable[[list[dict]], str] | None = None, *, generation_prompt: bool = True,
               continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None) -> str:
        """The prompt text: the conversation, then the assistant's turn opened (`generation_prompt`), or the last
        (assistant) message left open so the answer continues it (`continue_final_message`, a prefill).
        `template_kwargs` are extra variables for the model's template."""
        return self.render_with_text_spans(messages, tools, tools_prompt, generation_prompt=generation_prompt,
                                           continue_final_message=continue_final_message,
                                           template_kwargs=template_kwargs)[0]

    def render_with_text_spans(self, messages: list[ChatMessage], tools: list[dict] | None = None,
                               tools_prompt: Callable[[list[dict]], str] | None = None, *,
                               generation_prompt: bool = True, continue_final_message: bool = False,
                               template_kwargs: dict[str, Any] | None = None
                               ) -> tuple[str, tuple[tuple[int, int], ...]]:
        """`render`'s text, and where in it what the messages and tools say spells special tokens (`<|im_end|>` in
        a tool's result or description), which are text, not tokens (service/prompts.encode_chat_prompt): OpenAI's
        models read content as text, and so a message cannot end its turn and begin another (an injected system or
        assistant turn). The template's own tokens, a prefill's (`_message_dicts`) and a raw `prompt`'s stay
        tokens."""
        if not tools and self._without_tools is not None:
            return self._without_tools.render_with_text_spans(
                messages, None, tools_prompt, generation_prompt=generation_prompt,
                continue_final_message=continue_final_message, template_kwargs=template_kwargs)
        held = _HeldText(self._special_text) if self._special_text is not None else None
        dicts = self._message_dicts(messages, held, prefill=continue_final_message)
        kwargs: dict[str, Any] = dict(template_kwargs or {})
        if tools:
            if self.knows_tools:
                kwargs["tools"] = [_with_description(t) for t in tools] if self.harmony else tools
                if held is not None:  # (descriptions come from whoever wrote the tools: an MCP server's, say)
                    kwargs["tools"] = held.hold(kwargs["tools"])
            elif tools_prompt is not None:
                text = tools_prompt(tools) if held is None else held.hold(tools_prompt(tools))
                if dicts and dicts[0]["role"] == "system":
                    dicts[0] = {**dicts[0], "content": dicts[0]["content"] + "\n\n" + text}
                else:
                    dicts.insert(0, {"role": "system", "content": text})
        dicts = self._fold_roles(dicts, held)
        options = dict(add_generation_prompt=generation_prompt, continue_final_message=continue_final_message,
                       **kwargs)
        try:
            rendered = self._apply(dicts, options)
        except Exception as exc:  # jinja raises TemplateError / TypeError for conversations it cannot render
            rendered = self._rendered_with_optional_fields(dicts, options)
            if rendered is None:
                raise invalid(f"the model's chat template cannot render these messages: {exc}", "messages") from None
        return held.put_back(rendered) if held is not None else (rendered, ())

    def _rendered_with_optional_fields(self, dicts: list[dict], options: dict[str, Any]) -> str | None:
        """The conversation rendered with the tools' optional fields filled in (`_with_optional_fields`); None where
        they have them all, or the template still refuses."""
        tools = options.get("tools")
        filled = [_with_optional_fields(t) for t in tools or ()]
        if filled == (tools or []):
            return None
        try:
            return self._apply(dicts, {**options, "tools": filled})
        except Exception:  # noqa: BLE001 - the first refusal is the one to tell
            return None

    def _apply(self, dicts: list[dict], options: dict[str, Any]) -> str:
        """The template applied; where it refuses the conversation, applied again with the tool call ids made
        `short_call_id`s (`_with_short_call_ids`), with the calls' arguments made objects
        (`_with_arguments_objects`), then with both, and the first error raised if every one fails."""
        try:
            return self.tokenizer.apply_chat_template(dicts, chat_template=self.template, tokenize=False, **options)
        except Exception:
            short, objects = _with_short_call_ids(dicts), _with_arguments_objects(dicts)
            both = _with_arguments_objects(short) if short is not None else None
            for retry in (short, objects, both):
                if retry is None:
                    continue
                try:
                    return self.tokenizer.apply_chat_template(retry, chat_template=self.template, tokenize=False,
                                                              **options)
                except Exception:  # noqa: BLE001 - not what it refused
                    pass
            raise
