"""Engine events -> OpenAI JSON: chat and completion bodies, chunks, logprobs shapes, tool calls.

Pure functions over plain data; no HTTP, no tensors. Used by both the JSON and the SSE paths so the two can
never disagree.
"""

from __future__ import annotations

import codecs
import math
import unicodedata
from dataclasses import dataclass, field

from engine.types import TokenEvent, TokenLogprob
from service.fingerprint import system_fingerprint
from service.prompts import Prompt


def reasoning_fields(text: str | None) -> dict:
    """A reasoning block's text under both names clients read: `reasoning_content` (DeepSeek's API, vLLM's first)
    and `reasoning` (OpenRouter's, vLLM's later)."""
    return {"reasoning_content": text, "reasoning": text}


def usage_dict(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None = None) -> dict:
    """`reasoning_tokens`: of the completion tokens, those of a reasoning block. The details are sent always, as
    OpenAI sends them: a client reading `usage.prompt_tokens_details.cached_tokens` met None (no prompt is
    cached here: 0)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens or 0}}


def finite(logprob: float) -> float:
    """JSON has no -inf: an impossible token gets -9999.0 (vLLM's convention)."""
    return logprob if math.isfinite(logprob) else -9999.0


def token_text(lp_token_id: int, token: str, as_ids: bool) -> str:
    return f"token_id:{lp_token_id}" if as_ids else token


# ---- logprobs shapes
def chat_logprob_entry(lp: TokenLogprob, as_ids: bool = False) -> dict:
    return {
        "token": token_text(lp.token_id, lp.token, as_ids),
        "logprob": finite(lp.logprob),
        "bytes": list(lp.token_bytes),
        "top_logprobs": [{"token": token_text(tid, tok, as_ids), "logprob": finite(lgp), "bytes": list(b)}
                         for tid, tok, b, lgp in lp.top],
    }


def chat_logprobs(lps: list[TokenLogprob], as_ids: bool = False) -> dict:
    return {"content": [chat_logprob_entry(lp, as_ids) for lp in lps], "refusal": None}


def legacy_token(token_id: int, token: str, data: bytes, as_ids: bool) -> str:
    """A token as the completions shape names it. Bytes that are not whole UTF-8 characters (a byte-level
    vocabulary spells an emoji in up to 4 tokens) are written `bytes:\\xf0\\x9f`, as OpenAI's legacy API writes
    them: each shown as U+FFFD, two such alternatives were one key of `top_logprobs` and one was lost."""
    if as_ids:
        return token_text(token_id, token, as_ids)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)
    return token


class TextOffsets:
    """Completions' `text_offset`s: where each token starts in the text, in characters. Tokens' bytes are decoded
    as they come, so a token that ends inside a character adds nothing and the one that completes it adds the
    character (counting each partial token as one U+FFFD put every later offset past its token, the last ones
    past the end of the text); special tokens the text leaves out (`skipped`) add nothing. Offsets count from
    the start of the prompt, echoed or not (OpenAI's definition). Given the echoed prompt's `text`, tokens are
    followed through it: a string prompt's BOS is not in it, nor a SentencePiece piece's leading space at its
    start, and where the tokenizer normalised it (`_normalized_span`), a token stands for the characters it was
    normalised from. An answer to token ids that end inside a character (`unfinished`: its first bytes) starts with
    that character where its first tokens complete it; where they show it never will, the U+FFFD is the prompt's."""

    def __init__(self, start: int = 0, skipped: frozenset[int] = frozenset(), text: str | None = None,
                 unfinished: bytes = b""):
        self.offset = start
        self._skipped = skipped
        self._text = text
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._utf8.decode(unfinished)
        self._prompts_bytes_held = bool(unfinished)

    def of(self, tokens: list[tuple[int, bytes]]) -> list[int]:
        """The offsets of (token id, bytes) pairs that follow those already counted."""
        return [self._next(token_id, data) for token_id, data in tokens]

    def _next(self, token_id: int, data: bytes) -> int:
        at, text = self.offset, self._text
        if token_id in self._skipped and (text is None or not text.startswith(data.decode("utf-8", "replace"), at)):
            return at
        pending = self._utf8.getstate()[0]
        chars = self._utf8.decode(data)
        own = 0  # where this token's own characters start in `chars`
        if pending:  # bytes held from earlier tokens: a character this one completes is theirs (it starts before),
            # and so is the U+FFFD of bytes this one shows to be invalid (a lone lead byte, 0xF0)
            alone = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data)
            if chars.endswith(alone) and set(chars[:len(chars) - len(alone)]) <= {"\ufffd"}:
                own = len(chars) - len(alone)
                if self._prompts_bytes_held:  # (the prompt's text has that U+FFFD)
                    chars, own, self._prompts_bytes_held = chars[own:], 0, False
            self._prompts_bytes_held = self._prompts_bytes_held and not chars
        elif text is not None and not text.startswith(chars, at) and chars.startswith(" ") \
                and text.startswith(chars[1:], at):
            chars = chars[1:]
        if text is None:
            self.offset = at + len(chars)
            return at + own
        spelled = _normalized_span(text, at, chars) if chars and not text.startswith(chars, at) else None
        # (where the tokenizer normalised the text, `e` and U+0301 are one `é`: the characters they stand for)
        self.offset = min(at + (len(chars) if spelled is None else spelled), len(text))
        return min(at + own, len(text))


def _normalized_span(text: str, at: int, chars: str) -> int | None:
    """How many characters of `text` from `at` a token's `chars` stand for where the tokenizer normalised them
    (Qwen2's normalizer is NFC: `cafe\u0301` is tokenised as `café`, and offsets counted in the token's
    characters fell behind the echoed text by one for each such character); None where no normal form of the
    text there spells them (also where the text there is in both normal forms already: nothing to search)."""
    window = text[at:at + 3 * len(chars) + 3]  # (decomposed Hangul: three characters for each syllable)
    if unicodedata.is_normalized("NFC", window) and unicodedata.is_normalized("NFKC", window):
        return None
    for form in ("NFC", "NFKC"):
        # (a normal form never gets shorter as characters are added: the shortest span whose form is as long as
        # the token's characters, found by bisection, then the marks that may still compose into its last one)
        low, high = 1, len(window)
        while low < high:
            mid = (low + high) // 2
            if len(unicodedata.normalize(form, window[:mid])) >= len(chars):
                high = mid
            else:
                low = mid + 1
        for length in range(low, min(low + 4, len(window)) + 1):
            if unicodedata.normalize(form, window[:length]) == chars:
                return length
    return None


def legacy_logprobs(lps: list[TokenLogprob | None], offsets: list[int], as_ids: bool = False,
                    first_token: tuple[int, str, bytes] = (0, "", b""), top_n: int = 5) -> dict:
    """The completions shape: tokens, token_logprobs, top_logprobs (token -> logprob, the chosen token plus up
    to `logprobs` alternatives), text_offset (`offsets`, one per entry: `TextOffsets`). A None entry (the first
    prompt token, which has no logprob) gives `first_token` (its id, text and bytes) with a null logprob and null
    top."""
    tokens, token_logprobs, top = [], [], []
    for lp in lps:
        if lp is None:
            tokens.append(legacy_token(*first_token, as_ids))
            token_logprobs.append(None)
            top.append(None)
            continue
        text = legacy_token(lp.token_id, lp.token, lp.token_bytes, as_ids)
        tokens.append(text)
        token_logprobs.append(finite(lp.logprob))
        alternatives = {text: finite(lp.logprob)}
        for tid, tok, data, lgp in lp.top[:top_n]:
            alternatives.setdefault(legacy_token(tid, tok, data, as_ids), finite(lgp))
        top.append(alternatives)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def token_pairs(lps: list[TokenLogprob | None], first_token: tuple[int, str, bytes] = (0, "", b"")
                ) -> list[tuple[int, bytes]]:
    """(token id, bytes) of each entry, for `TextOffsets`."""
    return [(first_token[0], first_token[2]) if lp is None else (lp.token_id, lp.token_bytes) for lp in lps]


def echoed_offsets(entries: list[TokenLogprob | None], first_token: tuple[int, str, bytes], text: str,
                   mapped: tuple[int, ...] | None, skipped_ids: frozenset[int]) -> list[int]:
    """The offsets of an echoed prompt's tokens (`entries`): as its tokenizer maps them where it did
    (`Prompt.offsets`, one a token), else followed through its `text` (`TextOffsets`)."""
    if mapped is not None and len(mapped) == len(entries):
        return list(mapped)
    return TextOffsets(0, skipped_ids, text).of(token_pairs(entries, first_token))


# ---- one choice, accumulated
@dataclass
class ChoiceState:
    index: int
    text: str = ""
    reasoning: str = ""  # the reasoning block's text (chat, for models that think first)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: tuple | None = None
    finish_reason: str | None = None
    error: str | None = None
    error_code: str | None = None
    completion_tokens: int = 0
    reasoning_tokens: int = 0

    def add(self, event: TokenEvent) -> None:
        self.text += event.text
        self.reasoning += event.reasoning
        self.token_ids.extend(event.token_ids)
        self.logprobs.extend(event.logprobs)
        if event.prompt_logprobs is not None:
            self.prompt_logprobs = event.prompt_logprobs
        if event.finish_reason is not None:
            self.finish_reason = event.finish_reason
            self.error, self.error_code = event.error, event.error_code
            self.completion_tokens = event.usage.completion_tokens if event.usage else len(self.token_ids)
            self.reasoning_tokens = event.usage.reasoning_tokens if event.usage else 0


def tool_calls_json(calls) -> list[dict]:
    """constrain's parsed calls (name, arguments JSON string) -> OpenAI `tool_calls`."""
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def finish_for(choice: ChoiceState, calls, uses_functions: bool = False, named: bool = False) -> str:
    """`calls`: the choice's `ParsedCalls`, or None. (Calls the budget rule closed as `max_tokens` ran out are
    whole calls: the engine says `length` for tools' output, since text there would be cut.) `named`: the request
    named the function to call (`tool_choice: {"type": "function", ...}`, `function_call: {"name": ...}`), whose
    call ends as `stop` in OpenAI's API, where `required` and `auto` calls end as `tool_calls`."""
    if calls and calls.complete and choice.finish_reason in ("stop", "length"):
        return "stop" if named else "function_call" if uses_functions else "tool_calls"
    return choice.finish_reason or "stop"


def names_its_call(spec) -> bool:
    """The request named the one function its answer calls (`finish_for`)."""
    return spec is not None and spec.tool_choice == "named"


def function_call_delta(delta: dict) -> dict:
    """A `tool_calls` delta (`ToolCallStream`) in the deprecated shape, for requests that sent `functions`: the
    one call's name and argument pieces under `function_call` (there is at most one call: see protocol.py)."""
    if "tool_calls" not in delta:
        return delta
    return {"function_call": dict(delta["tool_calls"][0]["function"])}


# ---- whole bodies
def chat_body(*, request_id: str, model: str, constraint_backend: str | None, created: int,
              choices: list[ChoiceState], parsed_calls: dict,
              prompt_tokens: int, logprobs: bool, as_ids: bool, uses_functions: bool = False,
              reasoning: bool = False, named: bool = False) -> dict:
    """`parsed_calls`: index -> `ParsedCalls` of the choices that made tool calls. `uses_functions`: the request
    sent the deprecated `functions`, so a call is the message's `function_call`. `reasoning`: the answer could
    follow a reasoning block, so the message has `reasoning_content` and `reasoning` (null when the model wrote
    none) and the
    usage counts `reasoning_tokens`."""
    out = []
    for c in choices:
        calls = parsed_calls.get(c.index)
        content = calls.content if calls else c.text
        if content is None and not (calls and calls.calls):
            content = ""  # (a call max_tokens cut before its name: no call, and null content is no message to send
            # back, as agent loops send every answer: "an 'assistant' message needs `content`")
        message: dict = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
        if reasoning:
            message.update(reasoning_fields(c.reasoning or None))
        if calls and calls.calls and uses_functions:
            message["function_call"] = {"name": calls.calls[0].name, "arguments": calls.calls[0].arguments}
        elif calls and calls.calls:
            message["tool_calls"] = tool_calls_json(calls.calls)
        out.append({"index": c.index, "message": message,
                    "logprobs": chat_logprobs(c.logprobs, as_ids) if logprobs else None,
                    "finish_reason": finish_for(c, calls, uses_functions, named)})
    completion = sum(c.completion_tokens for c in choices)
    reasoning_tokens = sum(c.reasoning_tokens for c in choices) if reasoning else None
    return {"id": request_id, "object": "chat.completion", "created": created, "model": model,
            "service_tier": "default",  # (OpenAI names the tier that served the request: there is one here)
            "system_fingerprint": system_fingerprint(model, constraint_backend), "choices": out,
            "usage": usage_dict(prompt_tokens, completion, reasoning_tokens)}


def completion_body(*, request_id: str, model: str, constraint_backend: str | None, created: int,
                    choices: list[ChoiceState], prompts: list[Prompt],
                    first_tokens: list[tuple[int, str, bytes]], skipped_ids: frozenset[int],
                    output_skipped: frozenset[int], n: int, prompt_tokens: int, echo: bool, logprobs: int | None,
                    as_ids: bool) -> dict:
    """`skipped_ids`: the special tokens, which an echoed prompt's text may leave out; `output_skipped`: those the
    answers' texts leave out (none under `skip_special_tokens: false`)."""
    out = []
    for c in choices:
        prompt, first = prompts[c.index // n], first_tokens[c.index // n]
        prompt_text = prompt.text
        text = (prompt_text + c.text) if echo else c.text
        lp = None
        if logprobs is not None:
            entries: list = []
            offsets: list[int] = []
            if echo and c.prompt_logprobs is not None:
                entries.extend(c.prompt_logprobs)
                offsets += echoed_offsets(entries, first, prompt_text, prompt.offsets, skipped_ids)
            offsets += TextOffsets(len(prompt_text), output_skipped, unfinished=prompt.unfinished).of(
                token_pairs(c.logprobs))
            entries.extend(c.logprobs)
            lp = legacy_logprobs(entries, offsets, as_ids, first, top_n=logprobs)
        out.append({"index": c.index, "text": text, "logprobs": lp, "finish_reason": c.finish_reason or "stop"})
    completion = sum(c.completion_tokens for c in choices)
    return {"id": request_id, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": system_fingerprint(model, constraint_backend), "choices": out,
            "usage": usage_dict(prompt_tokens, completion)}

