"""The event loop stays free while a large schema is validated and rewritten, or a long prompt tokenized (that work
runs on threads)."""

from __future__ import annotations

import json
import threading
import time
import uuid

import httpx

from tests.service.conftest import MODEL


def _health_beside(server, send_heavy, after: float) -> tuple[httpx.Response, float, float]:
    """(the heavy request's response, its seconds, /health's seconds): `send_heavy()` is sent on a thread, and
    /health `after` seconds later, from another client, while the heavy request is being worked on."""
    done = {}

    def heavy():
        t0 = time.perf_counter()
        done["response"] = send_heavy()
        done["seconds"] = time.perf_counter() - t0

    worker = threading.Thread(target=heavy)
    worker.start()
    time.sleep(after)
    t0 = time.perf_counter()
    with httpx.Client(base_url=server.base_url, timeout=60) as other:
        assert other.get("/health").status_code == 200
    health = time.perf_counter() - t0
    worker.join()
    return done["response"], done["seconds"], health


def test_health_answers_while_a_large_schema_is_being_checked(http, server):
    """~0.5 s of jsonschema work for this 100 KB schema (300 enums filtered by `minimum`): /health, sent while
    it runs, must not wait for it. Compared as a ratio of the two latencies, not against a fixed time."""
    salt = uuid.uuid4().int % 1000  # a schema no cache has seen
    # (each enum keeps some values >= 100: an empty one would make the schema unsatisfiable, a 400)
    props = {f"p{i}": {"type": "integer", "minimum": 100, "enum": list(range(70 + salt + i, 130 + salt + i))}
             for i in range(300)}
    schema = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}}
    r, big, health = _health_beside(server, lambda: http.post("/v1/chat/completions", json=body), after=0.05)
    assert r.status_code == 200
    assert health < 0.5 * big, (health, big)


def test_health_answers_while_a_long_prompt_is_tokenized(http, server):
    """Megabytes of prompt take seconds to tokenize (~1.3 s a megabyte on these machines), and that ran on the event
    loop: /health waited for it. Compared as a ratio of the two latencies, as above. (One text far past the context
    is refused from its first pieces, service/prompts.py `encode_prompt`: so 100 prompts, each within 4x the
    built-in model's 4,096-token context in characters, and so tokenized whole before the context refuses them.)"""
    body = {"model": MODEL, "prompt": ["a " * 8192] * 100, "max_tokens": 1}
    r, big, health = _health_beside(server, lambda: http.post("/v1/completions", json=body), after=0.3)
    assert r.json()["error"]["code"] == "context_length_exceeded"  # (refused once tokenized: 8,192 tokens each)
    assert health < 0.5 * big, (health, big)


def test_health_answers_while_a_large_body_is_validated(http, server):
    """200,000 messages (7 MB, within the 8 MiB body limit) take ~1-2 s to read and validate, which FastAPI did on
    the event loop: /health waited for all of it. The body is refused only by its last field, so all of it is
    validated first. Compared as a ratio of the two latencies, as above."""
    raw = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}] * 200_000,
                      "temperature": 5}).encode()
    r, big, health = _health_beside(
        server, lambda: http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"}),
        after=0.3)
    assert r.json()["error"]["param"] == "temperature", r.text[:500]
    assert health < 0.5 * big, (health, big)


def test_a_whole_answer_is_written_a_choice_at_a_time_as_the_same_bytes(monkeypatch):
    """json.dumps holds the interpreter lock while it writes: a 17 MB answer in one call held every client ~0.55 s.
    Written a choice at a time, the bytes are JSONResponse's (a model name that spells the key is no key)."""
    import starlette.responses
    from fastapi.responses import JSONResponse

    from service.routes import ChoicewiseJSONResponse

    body = {"id": "x", "model": 'm"choices":[]', "choices": [
        {"index": i, "message": {"content": f'é\n"{i}"', "choices": []}} for i in range(3)], "usage": {"n": 1}}
    whole = JSONResponse(body).body
    calls = []
    dumps = starlette.responses.json.dumps
    monkeypatch.setattr(starlette.responses.json, "dumps", lambda *a, **k: calls.append(1) or dumps(*a, **k))
    assert ChoicewiseJSONResponse(body).body == whole
    assert len(calls) == 1 + len(body["choices"])
