"""Server-sent events exactly as OpenAI sends them: `data: {json}\\n\\n` per chunk, then `data: [DONE]\\n\\n`.

Chat: a first chunk per choice with the role, content (or tool-call) deltas, a final chunk per choice with
`finish_reason`, with include_usage one more chunk with `choices: []` and the usage. An error after the stream
started is sent as `data: {"error": ...}` (what the OpenAI SDK raises on). No tensors here.
"""

from __future__ import annotations

import contextlib
import json
from typing import AsyncIterator

from service.errors import APIError, error_body
from service.fingerprint import system_fingerprint
from service.generation import Generation, Plan, engine_error
from service.responses import (ChoiceState, TextOffsets, chat_logprobs, echoed_offsets, finish_for, names_its_call,
                               function_call_delta, legacy_logprobs, reasoning_fields, token_pairs, usage_dict)
from service.tool_stream import answer_calls, tool_stream_for

DONE = b"data: [DONE]\n\n"


# Characters JSON leaves raw that line readers (Python's str.splitlines: httpx's iter_lines) take for line ends
_LINE_ENDS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def encode(payload: dict) -> bytes:
    """One SSE event: the payload as one line of JSON, with no character a client may split a line at."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).translate(_LINE_ENDS)
    return b"data: " + text.encode() + b"\n\n"


class _Chunks:
    """Chunk envelopes for one request: same id, created, model and fingerprint on every chunk."""

    def __init__(self, plan: Plan, model: str, created: int, obj: str, include_usage: bool):
        self.base = {"id": plan.request_id, "object": obj, "created": created, "model": model,
                     "system_fingerprint": system_fingerprint(model, plan.constraint_backend)}
        if obj == "chat.completion.chunk":
            self.base["service_tier"] = "default"  # (as `responses.chat_body` says)
        self.include_usage = include_usage

    def chunk(self, choices: list[dict]) -> bytes:
        payload = {**self.base, "choices": choices}
        if self.include_usage:
            payload["usage"] = None
        return encode(payload)

    def usage(self, prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None = None) -> bytes:
        return encode({**self.base, "choices": [],
                       "usage": usage_dict(prompt_tokens, completion_tokens, reasoning_tokens)})


def _error_chunk(exc: APIError) -> bytes:
    return encode(error_body(exc.status, exc.message, exc.param, exc.code))


async def chat_stream(gen: Generation, plan: Plan, *, model: str, created: int, include_usage: bool,
                      logprobs: bool, as_ids: bool, tools: bool, uses_functions: bool = False) -> AsyncIterator[bytes]:
    """With tools in play each choice's text goes through a `ToolCallStream`: tool calls stream as `tool_calls`
    deltas (id and name first, then argument pieces), anything else as content. A request that sent the
    deprecated `functions` gets the call as `function_call` deltas (`function_call_delta`). Each answer token's
    logprob is sent once, with the delta that spells its text (a call's tokens with the call's deltas) or, for
    tokens that spell none, with the last chunk: the chunks' logprobs add up to the whole answer's.

    Each choice's first chunk carries the role. Without tools it comes at once, `content: ""`; with tools it comes
    with the choice's first delta (or in a chunk of its own just before, where that delta has logprobs), as
    OpenAI's does: `content: null` beside a call (or reasoning), so a stream's
    assembled message has the whole answer's `content: null` where it made calls (a first `""` assembled to
    `""`)."""
    chunks = _Chunks(plan, model, created, "chat.completion.chunk", include_usage)
    states = {i: ChoiceState(i) for i in range(plan.choices)}
    streams = {i: tool_stream_for(plan.spec) for i in range(plan.choices)} if tools else {}
    unsent_logprobs: dict[int, list] = {i: [] for i in range(plan.choices)}  # (tools: of text not sent yet)
    unopened = set(range(plan.choices)) if tools else set()
    unsaid = set(unopened)  # (choices that sent no delta but perhaps a role chunk in front of a later choice's)

    def opened(index: int, delta: dict) -> dict:
        """`delta`, with the role in front where it is the choice's first."""
        if index not in unopened:
            return delta
        unopened.discard(index)
        return {"role": "assistant", "content": None, **delta}

    def chunk_of(index: int, delta: dict, logprobs_entry, finish_reason, says: bool = True) -> list[bytes]:
        """The choice's chunk (the role in front where it is its first), after a role chunk for each choice below
        it not opened yet: choices first appear in index order, as OpenAI streams them (the SDK's stream helper
        adds a choice where its index first appears, and failed with an IndexError on 0, 2, 1). A choice's first
        chunk carries no logprobs, as OpenAI's (the Node SDK's stream helper counted those twice): a role chunk
        comes before one that has them. `says`: the delta is the answer's (content or calls), not reasoning, which
        leaves the answer unsaid."""
        out = [chunks.chunk([{"index": j, "delta": opened(j, {}), "logprobs": None, "finish_reason": None}])
               for j in sorted(j for j in unopened if j < index or (j == index and logprobs_entry))]
        out.append(chunks.chunk([{"index": index, "delta": opened(index, delta), "logprobs": logprobs_entry,
                                  "finish_reason": finish_reason}]))
        if says:
            unsaid.discard(index)
        return out

    if not tools:
        for i in range(plan.choices):
            yield chunks.chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}])
    try:
        async with contextlib.aclosing(gen.events(plan)) as events:
            async for index, event in events:
                state = states[index]
                state.add(event)
                lp = chat_logprobs(list(event.logprobs), as_ids) if logprobs and event.logprobs else None
                if event.reasoning:  # (a reasoning block's tokens carry no logprobs: those are the answer's)
                    for chunk in chunk_of(index, reasoning_fields(event.reasoning), None, None, says=False):
                        yield chunk
                if tools:
                    unsent_logprobs[index].extend(event.logprobs)
                    deltas = streams[index].feed(event.text)
                    if event.finish_reason is not None:
                        deltas += streams[index].finish()
                    for delta in deltas:  # text held back for a while: its tokens' logprobs go with it
                        lp = chat_logprobs(unsent_logprobs[index], as_ids) if logprobs else None
                        unsent_logprobs[index].clear()
                        delta = function_call_delta(delta) if uses_functions else delta
                        for chunk in chunk_of(index, delta, lp, None):
                            yield chunk
                elif event.text or lp:
                    yield chunks.chunk([{"index": index, "delta": {"content": event.text},
                                         "logprobs": lp, "finish_reason": None}])
                if event.finish_reason is None:
                    continue
                if event.finish_reason == "error":
                    raise engine_error(event.error, event.error_code, plan)
                calls = gen.parse_tool_calls(state.text, plan.spec) if tools else None
                # (the tokens no delta spelled, as a call's closing tag: their logprobs go with the last chunk)
                lp = chat_logprobs(unsent_logprobs[index], as_ids) if logprobs and unsent_logprobs[index] else None
                last = {}
                if index in unsaid:  # nothing sent: an empty answer, or a call max_tokens cut before its name
                    cut = answer_calls(calls, state.text, plan.spec, state.finish_reason)
                    last = {"content": (cut.content if cut else state.text) or ""}  # (as chat_body: never null)
                finish = finish_for(state, calls, uses_functions, names_its_call(plan.spec))
                for chunk in chunk_of(index, last, lp, finish):
                    yield chunk
    except APIError as exc:
        yield _error_chunk(exc)
        yield DONE
        return
    if include_usage:
        reasoning_tokens = sum(s.reasoning_tokens for s in states.values()) if plan.thinks else None
        yield chunks.usage(plan.prompt_tokens, sum(s.completion_tokens for s in states.values()), reasoning_tokens)
    yield DONE


async def completion_stream(gen: Generation, plan: Plan, *, model: str, created: int, include_usage: bool,
                            echo: bool, logprobs: int | None, as_ids: bool,
                            first_tokens: list[tuple[int, str, bytes]], skipped_ids: frozenset[int],
                            output_skipped: frozenset[int]) -> AsyncIterator[bytes]:
    """(`skipped_ids` and `output_skipped` as in responses.completion_body.)"""
    chunks = _Chunks(plan, model, created, "text_completion", include_usage)
    states = {i: ChoiceState(i) for i in range(plan.choices)}
    offsets = {i: TextOffsets(len(prompt.text), output_skipped, unfinished=prompt.unfinished)
               for i in range(plan.choices) for prompt in [plan.prompts[i // plan.n]]}
    echoed: set[int] = set()
    try:
        async with contextlib.aclosing(gen.events(plan)) as events:
            async for index, event in events:
                state = states[index]
                state.add(event)
                if echo and index not in echoed:
                    echoed.add(index)
                    prompt = plan.prompts[index // plan.n]
                    prompt_text = prompt.text
                    lp = None
                    if logprobs is not None and event.prompt_logprobs is not None:
                        first, entries = first_tokens[index // plan.n], list(event.prompt_logprobs)
                        where = echoed_offsets(entries, first, prompt_text, prompt.offsets, skipped_ids)
                        lp = legacy_logprobs(entries, where, as_ids, first, top_n=logprobs)
                    yield chunks.chunk([{"index": index, "text": prompt_text, "logprobs": lp,
                                         "finish_reason": None}])
                if event.text or (logprobs is not None and event.logprobs):
                    lp = None
                    if logprobs is not None:
                        where = offsets[index].of(token_pairs(list(event.logprobs)))
                        lp = legacy_logprobs(list(event.logprobs), where, as_ids, top_n=logprobs)
                    yield chunks.chunk([{"index": index, "text": event.text, "logprobs": lp,
                                         "finish_reason": None}])
                if event.finish_reason == "error":
                    raise engine_error(event.error, event.error_code, plan)
                if event.finish_reason is not None:
                    yield chunks.chunk([{"index": index, "text": "", "logprobs": None,
                                         "finish_reason": event.finish_reason}])
    except APIError as exc:
        yield _error_chunk(exc)
        yield DONE
        return
    if include_usage:
        yield chunks.usage(plan.prompt_tokens, sum(s.completion_tokens for s in states.values()))
    yield DONE
