"""The two generation routes: read and validate the body (pydantic), plan (Generation), answer as JSON or SSE. Thin by
design."""

from __future__ import annotations

import asyncio
import contextlib
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from service.errors import APIError, invalid_body, unreadable_body
from service.generation import ClientGone, Generation, Plan, engine_error, until_done_or_gone
from service.protocol import ChatCompletionRequest, CompletionRequest, read_body
from service.responses import ChoiceState, chat_body, completion_body, names_its_call
from service.sse import chat_stream, completion_stream
from service.tool_stream import answer_calls

router = APIRouter()

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


async def _body(request: Request, model):
    """The request body as `model` (ChatCompletionRequest or CompletionRequest), read and validated on a worker
    thread rather than by FastAPI on the event loop: a body near the size limit holding many JSON values (200,000
    messages, a million token ids) took 1-3 s to validate, during which no other client was answered."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):  # (a gzip body was read as bytes and refused as "not valid JSON")
        raise APIError(415, f"the request body's Content-Encoding {encoding!r} is not supported: send the body "
                            "uncompressed", code="unsupported_content_encoding",
                       headers={"accept-encoding": "identity"})
    raw = await request.body()
    content_type = request.headers.get("content-type")

    def read():
        try:
            return read_body(raw, content_type, model)
        except json.JSONDecodeError:
            raise unreadable_body(None) from None
        except ValidationError as exc:
            raise invalid_body(exc.errors(), content_type) from None
        except ValueError as exc:  # (what else read_json refuses: see unreadable_body)
            raise unreadable_body(exc) from None

    return await asyncio.to_thread(read)


def _gen(request: Request) -> Generation:
    return request.app.state.generation


async def _watch_disconnect(request: Request, gen: Generation, plan: Plan) -> None:
    """Cancel the engine requests as soon as the client leaves, even while no chunk is being sent."""
    while True:
        await asyncio.sleep(0.25)
        if await request.is_disconnected():
            gen.cancel(plan)
            return


async def _planned(request: Request, gen: Generation, planning) -> Plan:
    """The plan `planning` makes, or ClientGone once the client leaves before it is made: its compile is then
    cancelled, and an outlines build it was waiting for is dropped when nobody else waits for it (ten clients
    that left while their schemas waited for builds had all ten made, one after the other). The request counts
    as in flight meanwhile (`Generation.events` counts it from there on): twelve requests whose schemas took
    seconds to check read as an idle server. Once the engine stops (a shutdown's deadline), a 503."""
    gen.metrics.in_flight.inc()
    try:
        return await until_done_or_gone(request, planning, ended=gen.stopped_error)
    finally:
        gen.metrics.in_flight.dec()


def _streaming(request: Request, gen: Generation, plan: Plan, body) -> StreamingResponse:
    async def guarded():
        watcher = asyncio.create_task(_watch_disconnect(request, gen, plan))
        try:
            async with contextlib.aclosing(body) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            watcher.cancel()
            gen.cancel(plan)  # no-op for finished requests; frees rows when the client left mid-stream

    return StreamingResponse(guarded(), media_type="text/event-stream", headers={**SSE_HEADERS, **plan.headers})


class ChoicewiseJSONResponse(JSONResponse):
    """A whole answer written as JSON a choice at a time: `json.dumps` holds the interpreter lock for as long as it
    writes, and a 17 MB answer (16 choices of 600 tokens with 20 top logprobs each) written in one call held every
    other client ~0.55 s (bench/loop_stalls.py). Between two choices the event loop gets its turn. The same bytes
    as JSONResponse's."""

    def render(self, content: dict) -> bytes:
        render = super().render
        choices = content.get("choices")
        if not isinstance(choices, list) or len(choices) < 2:
            return render(content)
        around = render({**content, "choices": []})  # (the only `"choices":[]` in it: a key of the body)
        at = around.index(b'"choices":[]') + len(b'"choices":[')
        return around[:at] + b",".join(render(choice) for choice in choices) + around[at:]


def _states(events: dict, plan: Plan) -> list[ChoiceState]:
    """The choices of a whole answer. The answer is built (and written as JSON) on a worker thread, not on the event
    loop: n=16 answers of 2,000 tokens with 20 top logprobs each (57 MB) held every other client for 11.5 s."""
    states = []
    for i in range(plan.choices):
        state = ChoiceState(i)
        for event in events.get(i, ()):
            state.add(event)
        if state.finish_reason == "error":
            raise engine_error(state.error, state.error_code, plan)
        states.append(state)
    return states


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    body = await _body(request, ChatCompletionRequest)
    gen = _gen(request)
    try:
        plan = await _planned(request, gen, gen.plan_chat(body))
    except ClientGone:
        return JSONResponse({}, status_code=499)
    model = gen.config.model_name
    as_ids = bool(body.return_tokens_as_token_ids)
    tools_mode = getattr(plan.spec, "kind", None) == "tools"
    if body.stream:
        return _streaming(request, gen, plan, chat_stream(
            gen, plan, model=model, created=plan.created, include_usage=body.include_usage,
            logprobs=bool(body.logprobs), as_ids=as_ids, tools=tools_mode, uses_functions=body.uses_functions))
    try:
        events = await gen.collect(plan, request)
    except ClientGone:
        return JSONResponse({}, status_code=499)

    def answer() -> JSONResponse:
        states = _states(events, plan)
        calls = {s.index: answer_calls(gen.parse_tool_calls(s.text, plan.spec), s.text, plan.spec, s.finish_reason)
                 for s in states} if tools_mode else {}
        whole = chat_body(request_id=plan.request_id, model=model, constraint_backend=plan.constraint_backend,
                          created=plan.created, choices=states, parsed_calls={k: v for k, v in calls.items() if v},
                          prompt_tokens=plan.prompt_tokens, logprobs=bool(body.logprobs), as_ids=as_ids,
                          uses_functions=body.uses_functions, reasoning=plan.thinks,
                          named=names_its_call(plan.spec))
        return ChoicewiseJSONResponse(whole, headers=plan.headers)

    return await asyncio.to_thread(answer)  # (see `_states`: off the event loop)


def _first_tokens(gen: Generation, plan: Plan) -> list[tuple[int, str, bytes]]:
    """Each prompt's first token (id, text and bytes): echoed logprobs list it, with no logprob."""
    tok = gen.loaded.tokenizer
    return [(p.ids[0], tok.decode(p.ids[:1], skip_special_tokens=False), gen.engine.texts.get(p.ids[0])[1])
            if p.ids else (0, "", b"") for p in plan.prompts]


def _output_skipped(gen: Generation, body: CompletionRequest) -> frozenset[int]:
    """The special tokens an answer's text leaves out: none with `skip_special_tokens: false`."""
    return frozenset() if body.skip_special_tokens is False else gen.special_ids


@router.post("/v1/completions")
async def completions(request: Request):
    body = await _body(request, CompletionRequest)
    gen = _gen(request)
    try:
        plan = await _planned(request, gen, gen.plan_completion(body))
    except ClientGone:
        return JSONResponse({}, status_code=499)
    model = gen.config.model_name
    as_ids = bool(body.return_tokens_as_token_ids)
    logprobs = body.logprobs  # None: no logprobs; 0..5: the chosen token plus that many alternatives
    if body.stream:
        return _streaming(request, gen, plan, completion_stream(
            gen, plan, model=model, created=plan.created, include_usage=body.include_usage, echo=bool(body.echo),
            logprobs=logprobs, as_ids=as_ids, first_tokens=_first_tokens(gen, plan),
            skipped_ids=gen.special_ids, output_skipped=_output_skipped(gen, body)))
    try:
        events = await gen.collect(plan, request)
    except ClientGone:
        return JSONResponse({}, status_code=499)
    first_tokens = _first_tokens(gen, plan)  # (on the loop, as before: the answer's thread calls no tokenizer)

    def answer() -> JSONResponse:
        return ChoicewiseJSONResponse(completion_body(
            request_id=plan.request_id, model=model, constraint_backend=plan.constraint_backend,
            created=plan.created, choices=_states(events, plan), prompts=plan.prompts,
            first_tokens=first_tokens, skipped_ids=gen.special_ids,
            output_skipped=_output_skipped(gen, body), n=plan.n,
            prompt_tokens=plan.prompt_tokens, echo=bool(body.echo), logprobs=logprobs, as_ids=as_ids),
            headers=plan.headers)

    return await asyncio.to_thread(answer)  # (see `_states`: off the event loop)
