"""A client that leaves frees its engine rows (streaming and not); /metrics exposes the serving numbers."""

from __future__ import annotations

import time

import httpx

from tests.service.conftest import MODEL, metric


def _body(**extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Talk."}], "max_tokens": 3000,
            "ignore_eos": True}
    body.update(extra)
    return body


def _wait_for_idle_batch(http, timeout=60.0) -> float:
    deadline = time.monotonic() + timeout
    while True:
        text = http.get("/metrics").text
        busy = metric(text, "structgen_batch_size") + metric(text, "structgen_queue_depth")
        if busy == 0 or time.monotonic() > deadline:
            return busy
        time.sleep(0.2)


def test_disconnect_mid_stream_frees_the_engine_row(server, http):
    assert _wait_for_idle_batch(http) == 0
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions", json=_body(stream=True)) as r:
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    seen += 1
                if seen >= 5:
                    break
            assert metric(http.get("/metrics").text, "structgen_batch_size") >= 1
    # the connection is closed; the row must leave the batch long before 3000 tokens are generated
    assert _wait_for_idle_batch(http) == 0
    after = metric(http.get("/metrics").text, "structgen_engine_tokens_generated_total")
    time.sleep(0.5)
    assert metric(http.get("/metrics").text, "structgen_engine_tokens_generated_total") == after


def test_disconnect_while_waiting_for_a_whole_answer_frees_the_engine_row(server, http):
    assert _wait_for_idle_batch(http) == 0
    before = metric(http.get("/metrics").text, "structgen_engine_tokens_generated_total")
    gave_up = False
    try:
        httpx.post(server.base_url + "/v1/chat/completions", json=_body(), timeout=1.5)
    except httpx.TimeoutException:
        gave_up = True  # the client closed the connection while the answer was being generated
    assert gave_up, "the answer arrived before the client left: nothing was tested"
    assert _wait_for_idle_batch(http) == 0
    generated = metric(http.get("/metrics").text, "structgen_engine_tokens_generated_total") - before
    assert 0 < generated < 3000  # the row left the batch long before its max_tokens


def test_a_failed_choice_cancels_its_siblings_of_a_whole_answer(http):
    """With `n` choices and no stream, a choice that fails makes the answer its error; the other choices ran on to
    `max_tokens` (here 1,200-2,000 tokens in all, seconds on a CPU) before that error was sent. Key `a` takes a
    string llguidance gives up on once it has begun (a 400 mid-output), key `b` a long array: the choices that
    write `b` now leave the batch when the first `a` fails."""
    schema = {"type": "object", "additionalProperties": False, "minProperties": 1, "properties": {
        "a": {"type": "string", "pattern": "^(?:\\S+\\s+){0,99}\\S+$", "maxLength": 10000},
        "b": {"type": "array", "items": {"type": "integer"}, "minItems": 100}}}
    failed = 0
    for seed in range(5):
        assert _wait_for_idle_batch(http) == 0
        before = metric(http.get("/metrics").text, "structgen_engine_tokens_generated_total")
        r = http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400, "n": 6, "seed": seed,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
        if r.status_code == 200:  # (no choice wrote `a`: nothing failed)
            continue
        assert r.status_code == 400 and r.json()["error"]["code"] == "constraint_too_complex", r.text
        failed += 1
        assert _wait_for_idle_batch(http) == 0
        generated = metric(http.get("/metrics").text, "structgen_engine_tokens_generated_total") - before
        assert generated < 400, (seed, generated)
    assert failed >= 2


def test_metrics_are_prometheus_text_with_the_serving_numbers(http):
    http.post("/v1/chat/completions", json={"model": MODEL, "messages": [], "max_tokens": 3})  # a 400
    http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                           "max_tokens": 3, "response_format": {"type": "json_object"}})
    r = http.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in ("structgen_requests_total", "structgen_prompt_tokens_total", "structgen_completion_tokens_total",
                 "structgen_time_to_first_token_seconds_bucket", "structgen_time_per_output_token_seconds_bucket",
                 "structgen_batch_size", "structgen_queue_depth", "structgen_grammar_compile_seconds_total",
                 "structgen_grammar_cache_hits_total", "structgen_grammar_compiles_total",
                 "structgen_grammar_outlines_builds_total", "structgen_grammar_outlines_build_seconds_total",
                 "structgen_grammar_outlines_build_failures_total"):
        assert name in text, name
    assert metric(text, "structgen_prompt_tokens_total") > 0
    assert 'structgen_requests_total{endpoint="chat",status="200"}' in text
    assert 'structgen_requests_total{endpoint="chat",status="400"}' in text


def test_metrics_count_the_body_limits_413s_and_model_lookups(http):
    """The body limit answers before the app (it was counted by nothing), and `/v1/models/{id}` is the models
    endpoint too."""
    def count(endpoint: str, status: int) -> float:
        try:
            return metric(http.get("/metrics").text,
                          f'structgen_requests_total{{endpoint="{endpoint}",status="{status}"}}')
        except KeyError:
            return 0.0

    before = {(e, s): count(e, s) for e, s in (("chat", 413), ("models", 200), ("models", 404))}
    assert http.post("/v1/chat/completions", content=b"x" * (9 << 20)).status_code == 413
    assert http.get(f"/v1/models/{MODEL}").status_code == 200
    assert http.get("/v1/models/no-such-model").status_code == 404
    for key, was in before.items():
        assert count(*key) == was + 1, key


def _step_seconds(http) -> dict[str, float]:
    text = http.get("/metrics").text
    return {phase: metric(text, f'structgen_engine_step_seconds_total{{phase="{phase}"}}')
            for phase in ("schedule", "forward", "prefill", "mask", "sample", "postprocess")}


def test_metrics_say_where_the_engine_steps_spend_their_time(http):
    """Seconds per step phase: each phase a request passes through grows, and together they never exceed the
    time that passed (one engine thread, each moment counted once)."""
    before = _step_seconds(http)
    start = time.monotonic()
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                "max_tokens": 8, "response_format": {"type": "json_object"}})
    assert r.status_code == 200
    elapsed = time.monotonic() - start
    after = _step_seconds(http)
    grown = {phase: after[phase] - before[phase] for phase in before}
    assert all(grown[phase] > 0 for phase in ("forward", "prefill", "mask", "sample", "postprocess")), grown
    assert all(seconds >= 0 for seconds in grown.values()), grown
    assert sum(grown.values()) <= elapsed, (grown, elapsed)
