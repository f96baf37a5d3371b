"""The exact server-sent-event bytes, read with raw HTTP."""

from __future__ import annotations

import json

from tests.service.conftest import MODEL

HELLO = [{"role": "user", "content": "Say hello."}]


def _events(body: bytes) -> list[bytes]:
    assert body.endswith(b"\n\n")
    events = body[:-2].split(b"\n\n")
    assert all(e.startswith(b"data: ") and b"\n" not in e for e in events)
    return [e[len(b"data: "):] for e in events]


def test_chat_stream_bytes_are_openai_chunks_then_done(http):
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": HELLO, "max_tokens": 6, "stream": True,
                                               "temperature": 0, "stream_options": {"include_usage": True}})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.content)
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    first, *middle, final, usage = chunks
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    for c in chunks:
        assert c["object"] == "chat.completion.chunk"
        assert c["model"] == MODEL and isinstance(c["created"], int) and c["system_fingerprint"]
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}]
    assert first["usage"] is None
    for c in middle:
        (choice,) = c["choices"]
        assert set(choice["delta"]) == {"content"} and choice["finish_reason"] is None and c["usage"] is None
    assert final["choices"][0]["delta"] == {} and final["choices"][0]["finish_reason"] in ("stop", "length")
    assert usage["choices"] == []
    u = usage["usage"]
    assert u["completion_tokens"] == 6 or final["choices"][0]["finish_reason"] == "stop"
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_stream_without_include_usage_has_no_usage_key(http):
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": HELLO, "max_tokens": 3,
                                               "stream": True})
    chunks = [json.loads(e) for e in _events(r.content)[:-1]]
    assert all("usage" not in c for c in chunks)


def test_n_2_stream_gives_each_choice_a_role_chunk_and_a_finish_chunk(http):
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": HELLO, "max_tokens": 4, "n": 2,
                                               "stream": True})
    chunks = [json.loads(e) for e in _events(r.content)[:-1]]
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert mine[-1]["finish_reason"] is not None
        assert all(m["finish_reason"] is None for m in mine[:-1])


def test_completion_stream_bytes(http):
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "The sky is", "max_tokens": 4,
                                          "stream": True, "logprobs": 1, "echo": True,
                                          "stream_options": {"include_usage": True}})
    events = _events(r.content)
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" and c["id"].startswith("cmpl-") for c in chunks)
    assert chunks[0]["choices"][0]["text"] == "The sky is"  # echo comes first
    texts = [c["choices"][0] for c in chunks if c["choices"]]
    for t in texts[1:-1]:
        assert set(t["logprobs"]) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert texts[-1]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 3


def test_error_in_a_streamed_request_is_a_plain_400_before_streaming(http):
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": HELLO, "stream": True,
                                               "response_format": {"type": "json_schema", "json_schema": {
                                                   "name": "x", "schema": {"type": "nonsense"}}}})
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["param"] == "response_format"


def test_an_answer_holding_line_separators_streams_as_lines_a_line_reader_keeps_whole(http):
    """U+2028, U+2029 and U+0085 went out raw in a chunk's JSON: valid SSE, but httpx's iter_lines (str.splitlines)
    split the event there and the client's json.loads failed."""
    text = "a\u2028b\u2029c\x85d"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "choice": [text], "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == text
