"""From a validated OpenAI request to engine requests, and back to a stream of (choice index, TokenEvent).

`Generation` is the one service the routes call: it resolves the prompt, the constraint (compiled here, before
anything is streamed, so a bad schema is a 400) and the sampling params, then runs the engine request(s) and
cancels them when the client goes away. No tensors, no grammar internals, no HTTP shaping here.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import inspect
import logging
import re
import string
import time
import uuid
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator
from urllib.parse import quote

import constrain
from constrain.compiler import unenforced_in_client_terms
from constrain.continued import ContinuedGrammar
from constrain.harmony import HarmonyGrammar
from constrain.reasoning import ReasoningGrammar, ReasoningTokens
from constrain.tools import calls_opening
from engine.engine import recoverable
from engine.types import GenerationRequest, ReasoningTags, TokenEvent
from service.chat_template import ChatTemplate
from service.errors import APIError, invalid
from service.metrics import Metrics
from service.prompts import Prompt, completion_prompts, encode_chat_prompt, encode_prompt, fit_max_tokens
from service.protocol import UNSUPPORTED_FIELDS, ChatCompletionRequest, CompletionRequest, SamplingFields
from service.sampling import sampling_params

log = logging.getLogger(__name__)

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # seed 002; chat defaults to the room left in the context
_HEADER_SAFE = "".join(c for c in string.punctuation if c not in '%,"')  # (with letters and digits)


# Characters a header list may take: all of a response's headers must fit proxies' buffers (nginx's proxy_buffer_size
# is 4 or 8 KB) and clients' limits (httpx, so the OpenAI SDK, refused a 140 KB header outright).
HEADER_LIST_MAX = 2000


def header_list(items) -> str:
    """A response header's comma-separated list of client strings (field names, JSON Pointers into the client's
    schema). Each item is percent-encoded as UTF-8 (RFC 3986) where it holds a character other than printable
    ASCII, a space, a `%`, a `,` or a `"`: header values are Latin-1 and end at a newline, so a property named
    `名前` or `a\nb` made the response a 500. Pointers so written are RFC 6901's URI-fragment form. A list longer than
    HEADER_LIST_MAX characters ends with `+N more`, N the items left out. An empty item is written `""` (a field
    named `""` was an empty header), so `"` is always encoded."""
    items = list(items)
    encoded, size = [], -1
    for item in items:  # (encoded only until the list is too long: half a million field names took 0.6 s)
        encoded.append(quote(item, safe=_HEADER_SAFE) if item else '""')
        size += len(encoded[-1]) + 1
        if size > HEADER_LIST_MAX:
            break
    else:
        return ",".join(encoded)
    written, size = [], 0
    for i, item in enumerate(encoded):  # (ends within `encoded`: its last item passes HEADER_LIST_MAX)
        if size + len(item) > HEADER_LIST_MAX - len(f",+{len(items)} more"):
            written.append(f"+{len(items) - i} more")
            break
        written.append(item)
        size += len(item) + 1
    return ",".join(written)


_LISTED_FIELD = re.compile(r"(messages|tools|functions)\.([0-9]+)\.(.+)", re.DOTALL)
_CONSTRAINT_THREADS = 4  # (`Generation._constraints`: a small check shares the interpreter lock with large ones)


def _per_entry_fields_collapsed(names: list[str]) -> list[str]:
    """`messages.*.id` for a field that two or more messages carry (`messages.0.id`, `messages.1.id`, ...: clients
    keep their own ids and timestamps on each message), likewise for tools; in the order first met."""
    entries: dict[tuple[str, str], int] = {}
    for name in names:
        if m := _LISTED_FIELD.fullmatch(name):
            entries[m[1], m[3]] = entries.get((m[1], m[3]), 0) + 1
    out: dict[str, None] = {}
    for name in names:
        m = _LISTED_FIELD.fullmatch(name)
        out[f"{m[1]}.*.{m[3]}" if m and entries[m[1], m[3]] > 1 else name] = None
    return list(out)


# OpenAI's `reasoning_effort` values -> gpt-oss's (its template writes "Reasoning: low|medium|high").
# (OpenAI's levels, as the SDK's ReasoningEffort lists them, onto gpt-oss's three)
HARMONY_EFFORT = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high",
                  "max": "high"}


@dataclass
class Plan:
    """Everything needed to run and answer one API request."""

    request_id: str
    requests: list[GenerationRequest]  # one per prompt
    prompts: list[Prompt]
    n: int
    spec: Any = None  # constrain.ConstraintSpec or None
    reasoning: ReasoningTags | None = None  # the answer may follow a reasoning block (chat only)
    harmony: bool = False  # the output is in gpt-oss's harmony format, whose answer may follow reasoning messages
    headers: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    created: int = field(default_factory=lambda: int(time.time()))  # the `created` of the response

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p.ids) for p in self.prompts)

    @property
    def choices(self) -> int:
        return len(self.requests) * self.n

    @property
    def thinks(self) -> bool:
        """The answer may follow reasoning: the message has `reasoning_content` and usage `reasoning_tokens`."""
        return self.reasoning is not None or self.harmony

    @property
    def constraint_backend(self) -> str | None:
        """The backend that serves the constraint (one grammar for every prompt), None when unconstrained (the
        harmony format's grammar alone is no constraint of the client's)."""
        grammar = self.requests[0].grammar if self.requests else None
        return grammar.backend if grammar is not None and self.spec is not None else None


def engine_error(message: str | None, code: str | None, plan: Plan | None) -> APIError:
    """An engine-ended choice as an HTTP error, by the engine's error code (engine/types.py ErrorCode); the plan's
    constraint names the field a constraint's error is about."""
    message = message or "engine error"
    spec = plan.spec if plan is not None else None
    if code == "empty_allowed_set":  # (the grammar's doing: logit_bias adds to logits, never removes a token)
        return APIError(400, message, param=spec.param if spec is not None else None, code="empty_allowed_set")
    if code == "constraint_too_complex":  # the grammar gave up mid-output: the client's constraint is the cause
        return APIError(400, message, param=spec.param if spec is not None else None, code="constraint_too_complex")
    if code == "invalid_request":
        return APIError(400, message, code="invalid_request")
    if code == "unavailable":
        return APIError(503, message, code="server_shutting_down")
    if code == "engine_failed":
        return APIError(503, message, code="engine_unavailable")
    return APIError(500, f"generation failed: {message}", code="generation_error")


class ClientGone(Exception):
    """The client disconnected; what was under way for it (its planning, its engine requests) was cancelled."""


async def until_done_or_gone(request, work, on_gone=None, ended=None):
    """The result of awaitable `work`, watching every 0.25 s for the client leaving; then ClientGone, and `work` is
    cancelled (after `on_gone`, when given). `ended`, when given, is asked as often for an error that makes `work`
    pointless (it is then raised, and `work` cancelled likewise)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            finished, _ = await asyncio.wait({task}, timeout=0.25)
            if finished:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
            if ended is not None and (error := ended()) is not None:
                raise error
    finally:
        if not task.done():
            if on_gone is not None:
                on_gone()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def _prompt_made_of(req: ChatCompletionRequest) -> str:
    """What a chat prompt was rendered from, for the context errors: a long tools list eats the context too, and
    OpenAI's error names it ("Please reduce the length of the messages or functions")."""
    if not req.tools or req.tool_choice == "none":
        return "messages"
    return "messages and functions" if req.uses_functions else "messages and tools"


def _constraint_error(exc, functions: bool = False) -> APIError:
    """`functions`: the request sent the deprecated `functions`, which became its `tools`: an error about the
    tools is told in terms of the `functions` sent (`_functions_pointer`)."""
    message, param, pointer = exc.message, exc.param, exc.pointer
    if functions and param == "tools":
        param, pointer = "functions", _functions_pointer(pointer) if pointer else pointer
        if exc.pointer:
            message = message.replace(exc.pointer, pointer)
        message = _TOOLS_ENTRY.sub(r"functions[\1]", message)
    if pointer and pointer not in message:
        message = f"{message} (at {pointer})"
    return APIError(400, message, param=_entry_param(param, pointer),
                    code=getattr(exc, "code", None) or "invalid_constraint")


def _entry_param(param: str | None, pointer: str | None) -> str | None:
    """The field of one `tools` (`functions`) entry an error's pointer leads into, as OpenAI names it:
    `tools[1].function.parameters` for `/1/function/parameters/properties/a`; `param` itself otherwise. Named
    `tools`, an error left the client to read which function from the message."""
    found = _ENTRY_POINTER.match(pointer or "") if param in ("tools", "functions") else None
    if found is None:
        return param
    index, *fields = found.groups()
    return f"{param}[{index}]" + "".join(f".{field}" for field in fields if field)


_ENTRY_POINTER = re.compile(r"^/([0-9]+)(?:/(function))?(?:/(parameters|name|description|strict))?(?=/|$)")
_TOOL_POINTER = re.compile(r"^/([0-9]+)/function(?=/|$)")
_TOOLS_ENTRY = re.compile(r"\btools\[([0-9]+)\](?:\.function\b)?")


def _functions_pointer(pointer: str) -> str:
    """A pointer into `tools` (`/0/function/parameters/...`) as one into the `functions` they were made from
    (`/0/parameters/...`): ChatCompletionRequest._legacy_functions."""
    return _TOOL_POINTER.sub(r"/\1", pointer)


class Generation:
    def __init__(self, *, engine, compiler, loaded, config, template: ChatTemplate, metrics: Metrics):
        self.engine = engine
        self.compiler = compiler
        self.loaded = loaded
        self.config = config
        self.metrics = metrics
        self.template = template
        self._reasoning_tokens: ReasoningTokens | None = None  # built on the first request with a block
        self.vocab_limit = max(len(loaded.tokenizer), 1)
        # The special tokens, which generated text leaves out (completions' `text_offset`s skip them).
        self.special_ids = frozenset(int(i) for i, t in loaded.tokenizer.added_tokens_decoder.items() if t.special)
        # Prompts are rendered and tokenized here, off the event loop: a prompt of megabytes takes seconds, during
        # which the loop answered nothing (/health included). One thread, so calls into the tokenizer stay one at a
        # time, as they were on the loop (a fast tokenizer may refuse concurrent use: "Already borrowed").
        self._prompts = ThreadPoolExecutor(max_workers=1, thread_name_prefix="structgen-prompts")
        # Constraints are read (and schemas checked and rewritten) on threads of their own: a 130 KB schema takes
        # ~2 s, and on asyncio's default pool (6 threads on 2 cores), which reads every request's body and writes
        # every answer, twelve such requests held a plain one 9 s (QA load F1). Queued checks of clients that left
        # are dropped with their requests.
        self._constraints = ThreadPoolExecutor(max_workers=_CONSTRAINT_THREADS, thread_name_prefix="structgen-checks")

    def stopped_error(self) -> APIError | None:
        """The 503 a request still being planned gets once the engine stopped (the shutdown's deadline, a failure),
        as its engine request would have: the shutdown's deadline dropped its connection instead."""
        return engine_error(*self.engine.unavailable(), plan=None) if self.engine.stopped else None

    def close(self) -> None:
        """Stop the prompts and constraint threads (at shutdown, once no request is served)."""
        self._prompts.shutdown(wait=False, cancel_futures=True)
        self._constraints.shutdown(wait=False, cancel_futures=True)

    async def _off_loop(self, fn, *args):
        """`fn(*args)` on the prompts thread."""
        return await asyncio.get_running_loop().run_in_executor(self._prompts, functools.partial(fn, *args))

    # ---- validation shared by both endpoints
    def _check_common(self, req: SamplingFields) -> dict[str, str]:
        """The checks both endpoints share, and the header naming the fields ignored. Run on a worker thread: a body
        of 550,000 unknown fields took 0.7 s to list them, which held every other client."""
        if req.model != self.config.model_name:
            raise APIError(404, f"the model '{req.model}' does not exist: this server serves "
                                f"'{self.config.model_name}'", param="model", code="model_not_found")
        for name in req.extra_fields:
            if name in UNSUPPORTED_FIELDS and (req.model_extra or {}).get(name) not in (None, [], ""):
                raise invalid(UNSUPPORTED_FIELDS[name], name, code="unsupported_parameter")
        if (req.n or 1) > self.config.max_batch_size:
            raise invalid(f"n={req.n} is more than this server's batch size ({self.config.max_batch_size}): "
                          f"all choices of a prompt decode together", "n")
        harmony_effort = (self.template.harmony and isinstance(req, ChatCompletionRequest)
                          and req.reasoning_effort is not None)
        ignored = [f for f in req.extra_fields
                   if f not in UNSUPPORTED_FIELDS and f not in constrain.COMPAT_CONSTRAINT_FIELDS
                   and not (f == "reasoning_effort" and harmony_effort)]
        ignored += constrain.compat_options_ignored(req.model_extra or {})
        return {"x-structgen-ignored-fields": header_list(_per_entry_fields_collapsed(ignored))} if ignored else {}

    async def _compile(self, req: SamplingFields, tools=None, tool_choice=None, parallel_tool_calls=None,
                       tool_format="json_array"):
        """Spec and grammar for the request's constraint (None, None when unconstrained)."""
        spec = None
        fields = (req.response_format, req.regex, req.choice, tools, tool_choice, req.constraint_backend)
        extra = req.model_extra or {}
        if all(v is None for v in fields) and not any(f in extra for f in constrain.COMPAT_CONSTRAINT_FIELDS):
            return None, None  # (no field a constraint is read from: nothing to wait for behind others' checks)
        try:
            # Off the event loop and its default pool: checking and rewriting a large schema can take seconds.
            spec = await asyncio.get_running_loop().run_in_executor(self._constraints, functools.partial(
                constrain.spec_from_request,
                response_format=req.response_format, regex=req.regex, choice=req.choice, tools=tools,
                tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls, tool_format=tool_format,
                backend=req.constraint_backend, named_schemas=getattr(self.compiler, "named_schemas", None),
                other_fields=req.model_extra))
            if spec is None:
                return None, None
            started = time.monotonic()
            grammar = await self.compiler.compile_async(spec)
            self.metrics.grammar_wait.observe(time.monotonic() - started)
        except constrain.ConstraintError as exc:
            raise _constraint_error(exc, functions=getattr(req, "uses_functions", False)) from None
        except BaseException as exc:  # noqa: BLE001 - a backend failing on a client's constraint fails only this
            # request, as a 400; a panic in a Rust extension too (pyo3's PanicException is a BaseException: it was a
            # bare 500). A cancelled request (the client left) stays cancelled.
            if isinstance(exc, asyncio.CancelledError) or not recoverable(exc):
                raise
            log.warning("constraint compile failed: %s: %s", type(exc).__name__, exc)
            param = spec.param if spec is not None else None
            param = "functions" if param == "tools" and getattr(req, "uses_functions", False) else param
            raise APIError(400, f"the constraint could not be compiled: {type(exc).__name__}: {exc}",
                           param=param, code="invalid_constraint") from None
        return spec, grammar

    def _plan(self, req: SamplingFields, prompts: list[Prompt], spec, grammar, headers, *, default_max, started,
              logprobs=False, top_logprobs=0, prompt_logprobs=None, prefix="chatcmpl",
              reasoning: ReasoningTags | None = None, harmony: bool = False, after_block: bool = False) -> Plan:
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        n = req.n or 1
        calls = calls_opening(spec.tool_format, spec.tool_choice, object_answer=spec.answer is not None) \
            if spec is not None and spec.kind == "tools" else None
        # (the answer may be free text where no constraint of the client's shapes it: harmony's format alone, or
        # tools without a response_format; calls the budget rule closed still end as tool calls)
        text_answer = grammar is not None and (spec is None or (spec.kind == "tools" and spec.answer is None))
        requests = []
        for i, prompt in enumerate(prompts):
            max_tokens = self._fit(req, len(prompt.ids), default_max)
            params = sampling_params(req, max_tokens=max_tokens, logits_width=self.loaded.logits_width,
                                     vocab_size=self.vocab_limit, logprobs=logprobs, top_logprobs=top_logprobs,
                                     prompt_logprobs=prompt_logprobs)
            if spec is not None and spec.kind == "tools" and self.template.calls_in_special_tokens:
                params = dataclasses.replace(params, skip_special_tokens=False)  # (the calls' tags are special)
            rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
            requests.append(GenerationRequest(request_id=rid, prompt_ids=prompt.ids, params=params,
                                              grammar=grammar, reasoning=reasoning, calls=calls,
                                              text_answer=text_answer, group=request_id, after_block=after_block))
        if grammar is not None and spec is not None:
            headers["x-structgen-constraint-backend"] = grammar.backend
        unenforced = unenforced_in_client_terms(spec, grammar) if grammar is not None and spec is not None else ()
        if getattr(req, "uses_functions", False):
            unenforced = tuple(_functions_pointer(p) for p in unenforced)
        if unenforced:
            headers["x-structgen-unenforced"] = header_list(unenforced)
        return Plan(request_id, requests, prompts, n, spec, reasoning, harmony, headers, started)

    # ---- the two endpoints
    async def plan_chat(self, req: ChatCompletionRequest) -> Plan:
        started = time.monotonic()  # time to first token counts templating and compiling too
        headers = await asyncio.to_thread(self._check_common, req)  # (see _check_common)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        if req.tool_choice is not None and not tools and req.tool_choice != "none":
            raise invalid("`tool_choice` needs `tools`", "tool_choice")
        # gpt-oss's harmony format: the answer is a message after any reasoning messages (constrain/harmony.py)
        harmony = (self.template.harmony and req.messages is not None and req.generation_prompt
                   and not req.continue_final_message)
        if self.template.harmony and not harmony and tools and req.tool_choice != "none":
            # (a call is a message of its own, after the reasoning ones: one cannot continue a message, or follow a
            # prompt that does not open the assistant's turn, and its reasoning then went unreported)
            param, sent = (("continue_final_message", "`continue_final_message: true`") if req.continue_final_message
                           else ("add_generation_prompt", "`add_generation_prompt: false`") if req.messages is not None
                           else ("prompt", "a `prompt`"))
            raise invalid(f"on this model (gpt-oss's harmony format) tool calls are messages of their own: `tools` "
                          f"cannot be used with {sent}", param)
        reasoning, answer_prefill, after_block = None, "", False
        if req.messages is not None:
            text, ids, reasoning, answer_prefill, after_block = await self._off_loop(self._chat_prompt, req, tools)
        else:
            text = req.prompt or ""
            ids = await self._off_loop(lambda: encode_prompt(self.loaded.tokenizer, text, self.loaded.context_length,
                                                             add_special_tokens=True))
        if not ids:
            raise invalid("the prompt is empty", "messages" if req.messages is not None else "prompt")
        prompt = Prompt(ids, text)
        self._fit(req, len(ids), None)  # refuse before compiling
        spec, grammar = await self._compile(req, tools, req.tool_choice, req.parallel_tool_calls,
                                            self.template.tool_format)
        if grammar is not None and reasoning is not None:
            grammar = ReasoningGrammar(grammar, self._reasoning_masks(reasoning), opened=reasoning.opened)
        if harmony and not isinstance(grammar, HarmonyGrammar):  # (tool calls compile as harmony's already)
            try:
                grammar = HarmonyGrammar(grammar, {}, final=True, tokens=self.compiler.harmony_tokens(),
                                         vocab=self.compiler.vocab)
            except constrain.ConstraintError as exc:
                raise _constraint_error(exc) from None
        if grammar is not None and req.continue_final_message and reasoning is None:
            if spec.kind != "tools":
                grammar = self._continued(grammar, spec, text, answer_prefill)
            elif spec.answer is not None and answer_prefill.strip():
                # (tool calls are parsed from the generated text, so their constraint applies to it alone; but
                # beside a response_format the answer is never free text: a prefill is the answer's beginning, and
                # the constraint applies to it and its continuation together, as without tools. A prefill
                # `{"a": 1` was continued with a whole new object, `{"a": 1{"a": 2}`, and `ok` with `{...}`.)
                if not answer_prefill.lstrip().startswith("{"):
                    raise invalid(f"the assistant message to continue (continue_final_message), {answer_prefill!r}, "
                                  "is not the beginning of a `response_format` answer (a JSON object): beside "
                                  "`tools` and a `response_format` the answer is calls or that object, never free "
                                  "text, and a call cannot be continued (calls are read from the generated text)",
                                  "messages", code="invalid_constraint")
                grammar = self._continued(grammar, spec, text, answer_prefill)
        return self._plan(req, [prompt], spec, grammar, headers, default_max=None, started=started,
                          logprobs=bool(req.logprobs), top_logprobs=req.top_logprobs or 0, prefix="chatcmpl",
                          reasoning=reasoning, harmony=harmony, after_block=after_block)

    def _chat_prompt(self, req: ChatCompletionRequest, tools: list[dict] | None
                     ) -> tuple[str, list[int], ReasoningTags | None, str, bool]:
        """The rendered conversation, its token ids, the reasoning block the output may open or is inside (if
        any), and of an assistant message continued, the part that is the answer (the constraint's beginning) and
        whether it ends right after a block it closed (`ChatTemplate.prefill_reasoning`)."""
        text, text_spans = self.template.render_with_text_spans(
            req.messages, tools=tools if req.tool_choice != "none" else None, tools_prompt=self._tools_prompt,
            generation_prompt=req.generation_prompt, continue_final_message=bool(req.continue_final_message),
            template_kwargs=self._template_kwargs(req))
        reasoning, answer_prefill, after_block = None, "", False
        if req.continue_final_message:
            reasoning, answer_prefill, after_block = self.template.prefill_reasoning(req.messages[-1].text or "")
        elif req.generation_prompt:
            reasoning = self.template.reasoning_for(text)
        ids = encode_chat_prompt(self.template.tokenizer, text, text_spans, self.loaded.context_length,
                                 what=_prompt_made_of(req))
        return text, ids, reasoning, answer_prefill, after_block

    def _template_kwargs(self, req: ChatCompletionRequest) -> dict[str, Any] | None:
        """The request's `chat_template_kwargs`, and for harmony templates its `reasoning_effort` (gpt-oss's levels
        are low, medium and high: OpenAI's lower ones are low there, its higher ones high)."""
        kwargs = dict(req.chat_template_kwargs or {})
        if self.template.harmony and req.reasoning_effort is not None and "reasoning_effort" not in kwargs:
            kwargs["reasoning_effort"] = HARMONY_EFFORT[req.reasoning_effort]
        return kwargs or None

    def _continued(self, grammar, spec, prompt: str, final: str):
        """The constraint applied to the assistant message left open and its continuation together: the message
        is the document's beginning (as the template rendered it; templates may strip it)."""
        prefill = next((p for p in (final, final.strip()) if prompt.endswith(p)), None)
        if prefill is None:
            raise invalid("the chat template rewrote the assistant message to continue, so the constraint cannot "
                          "start where it ends", "messages")
        try:
            return ContinuedGrammar(grammar, self.compiler.vocab, prefill, spec.param)
        except constrain.ConstraintError as exc:
            raise _constraint_error(exc) from None

    def _reasoning_masks(self, tags: ReasoningTags) -> ReasoningTokens:
        if self._reasoning_tokens is None:
            self._reasoning_tokens = ReasoningTokens.for_vocab(self.compiler.vocab, tags.open_id, tags.close_id)
        return self._reasoning_tokens

    async def plan_completion(self, req: CompletionRequest) -> Plan:
        started = time.monotonic()
        headers = await asyncio.to_thread(self._check_common, req)  # (see _check_common)
        prompts = await self._off_loop(completion_prompts, req.prompt, self.loaded.tokenizer, self.vocab_limit,
                                       self.loaded.context_length, bool(req.echo) and req.logprobs is not None)
        for prompt in prompts:
            self._fit(req, len(prompt.ids), COMPLETIONS_DEFAULT_MAX_TOKENS, prompt.param)
        spec, grammar = await self._compile(req)
        want_logprobs = req.logprobs is not None
        if want_logprobs:  # (the answer's `text_offset`s start inside such a character)
            prompts = [dataclasses.replace(p, unfinished=self._unfinished(p.ids)) for p in prompts]
        return self._plan(req, prompts, spec, grammar, headers, default_max=COMPLETIONS_DEFAULT_MAX_TOKENS,
                          started=started,
                          logprobs=want_logprobs, top_logprobs=req.logprobs or 0,
                          prompt_logprobs=(req.logprobs or 0) if (want_logprobs and req.echo) else None,
                          prefix="cmpl")

    def _unfinished(self, ids: list[int]) -> bytes:
        """The first bytes of a character a prompt's token ids end inside (a character's at most 3 first bytes are
        in its last 3 tokens at most), which the answer's first tokens may complete."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        decoder.decode(b"".join(self.engine.texts.get(t)[1] for t in ids[-3:]))
        return decoder.getstate()[0]

    def _fit(self, req: SamplingFields, prompt_len: int, default_max: int | None, prompt_param: str = "prompt") -> int:
        """`fit_max_tokens` for this request, its errors naming the fields it sent (`prompt_param`: the prompt of
        a completions request, `prompt[1]` in a list). `min_tokens` past the limit so found (sent, the endpoint's
        default or the context's room) is a 400, as vLLM answers."""
        chat_messages = isinstance(req, ChatCompletionRequest) and req.messages is not None
        sent = getattr(req, req.tokens_field)
        limit = fit_max_tokens(prompt_len, sent, default_max, self.loaded.context_length,
                               req.context_length_exceeded_behavior or "truncate",
                               prompt_param="messages" if chat_messages else prompt_param,
                               tokens_param=req.tokens_field,
                               what=_prompt_made_of(req) if chat_messages else None)
        if req.min_tokens and req.min_tokens > limit:
            source = (f"`{req.tokens_field}`" if limit == sent else
                      f"the default `max_tokens` of {default_max}" if sent is None and limit == default_max else
                      "the room the context leaves after the prompt")
            raise APIError(400, f"`min_tokens` ({req.min_tokens}) may not exceed the output's limit ({limit}: "
                                f"{source}), as vLLM answers", param="min_tokens", code="invalid_value")
        return limit

    def _tools_prompt(self, tools: list[dict]) -> str:
        return constrain.tools_system_prompt(tools)

    def parse_tool_calls(self, text: str, spec):
        """constrain's parsed tool calls (`ParsedCalls`) for a finished choice, or None when it is plain text."""
        if spec is None or spec.kind != "tools":
            return None
        try:
            return constrain.parse_tool_calls(text, spec) or None
        except Exception:  # noqa: BLE001 - the parser answers None for text: raising is a bug in it, logged
            log.exception("reading tool calls failed; the output is returned as content")
            return None

    # ---- running
    def cancel(self, plan: Plan) -> None:
        for r in plan.requests:
            with contextlib.suppress(Exception):
                self.engine.cancel(r.request_id)

    async def _events_of(self, request: GenerationRequest, base: int, queue: asyncio.Queue) -> None:
        stream = self.engine.generate(request)
        if inspect.isawaitable(stream):
            stream = await stream
        try:
            async for event in stream:
                await queue.put((base + event.index, event))
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    async def events(self, plan: Plan) -> AsyncIterator[tuple[int, TokenEvent]]:
        """All choices' events, each tagged with its global index (prompt i, choice j -> i*n + j). Ends when
        every choice has finished; leaving early cancels the engine requests."""
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def pump(request: GenerationRequest, base: int) -> None:
            try:
                await self._events_of(request, base, queue)
            except Exception as exc:  # an engine failure ends this prompt's choices with an error
                await queue.put((base, exc))
            finally:
                await queue.put((base, done))

        self.metrics.in_flight.inc()
        tasks = [asyncio.create_task(pump(r, i * plan.n)) for i, r in enumerate(plan.requests)]
        running = len(tasks)
        first_token_at = last_token_at = None
        tokens = 0
        try:
            while running:
                index, item = await queue.get()
                if item is done:
                    running -= 1
                    continue
                if isinstance(item, Exception):
                    raise APIError(500, f"generation failed: {item}", code="generation_error")
                if item.token_ids:
                    now = time.monotonic()
                    if first_token_at is None:
                        first_token_at = now
                        self.metrics.ttft.observe(now - plan.started)
                    last_token_at = now
                    tokens += len(item.token_ids)
                yield index, item
        finally:
            self.metrics.in_flight.dec()
            finished = all(t.done() for t in tasks)
            if not finished:
                self.cancel(plan)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.metrics.prompt_tokens.inc(plan.prompt_tokens)
            self.metrics.completion_tokens.inc(tokens)
            if first_token_at is not None and tokens > 1:
                self.metrics.token_latency.observe((last_token_at - first_token_at) / (tokens - 1))

    async def collect(self, plan: Plan, request) -> dict[int, list[TokenEvent]]:
        """Run to the end (non-streaming), watching for a client disconnect; raises ClientGone if it left. A
        choice that fails makes the answer its error: collecting stops there, and the other choices are cancelled
        (they ran on to `max_tokens` for an answer nobody would get)."""
        events: dict[int, list[TokenEvent]] = {i: [] for i in range(plan.choices)}

        async def gather() -> None:
            async with contextlib.aclosing(self.events(plan)) as stream:
                async for index, event in stream:
                    events.setdefault(index, []).append(event)
                    if event.finish_reason == "error":
                        return  # (leaving `events` early cancels the engine requests)

        await until_done_or_gone(request, gather(), on_gone=lambda: self.cancel(plan))
        return events
