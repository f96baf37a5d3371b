"""Reading a request's constraint (checking and rewriting its schema: ~2 s for a 130 KB one) holds no other request:
it runs on threads of its own. On asyncio's default pool, which also reads every request's body and writes every
answer, twelve large schemas held a plain request 9 s (QA load F1). Such requests count as in flight meanwhile
(they read as an idle server), and once the engine stops (the shutdown's deadline) they are answered 503 rather than
having their connections dropped.

The real app on uvicorn on 127.0.0.1 in this process, its constraint reader replaced by one that waits, for schemas
titled "held", until the test lets them go: more of them than asyncio's default pool has threads (at most 32)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn

import constrain
from engine.model_loader import BUILTIN_MODEL, load_model
from service.app import create_app
from service.config import ServerConfig
from service.errors import OpenAIErrorH11Protocol
from tests.serverproc import free_port
from tests.service.conftest import metric

HELD = 40
HELD_REQUEST = {"model": "structgen-builtin", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "h", "schema": {
                    "title": "held", "type": "object", "properties": {"a": {"type": "integer"}}}}}}


@pytest.fixture
def server_with_held_checks(tmp_path, monkeypatch):
    """(base URL, the Event that lets held checks go on, how many checks are waiting, the app's engine)."""
    release, waiting, lock = threading.Event(), [0], threading.Lock()
    real = constrain.spec_from_request

    def held(**fields):
        schema = ((fields.get("response_format") or {}).get("json_schema") or {}).get("schema") or {}
        if schema.get("title") == "held":
            with lock:
                waiting[0] += 1
            release.wait(120)
        return real(**fields)

    monkeypatch.setattr(constrain, "spec_from_request", held)
    config = ServerConfig(cache_dir=tmp_path / "cache", port=free_port(), log_level="warning")
    app = create_app(config, load_model(BUILTIN_MODEL, device="cpu"))
    server = uvicorn.Server(uvicorn.Config(app,
                                           host="127.0.0.1", port=config.port, log_level="warning",
                                           http=OpenAIErrorH11Protocol))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.started
    yield f"http://127.0.0.1:{config.port}", release, waiting, app.state.generation.engine
    release.set()
    server.should_exit = True
    thread.join(30)


@pytest.mark.timeout(300)
def test_requests_whose_constraints_are_being_read_hold_no_other_request(server_with_held_checks):
    base, release, waiting, _ = server_with_held_checks
    with ThreadPoolExecutor(HELD) as pool, httpx.Client(base_url=base, timeout=200) as http:
        answers = [pool.submit(http.post, "/v1/chat/completions", json=HELD_REQUEST) for _ in range(HELD)]
        deadline = time.monotonic() + 60
        while waiting[0] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waiting[0] >= 2
        time.sleep(1)  # (every held request has been read by now: they queue for the checks)
        plain = http.post("/v1/chat/completions", timeout=60, json={
            "model": "structgen-builtin", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert plain.status_code == 200 and not release.is_set()
        deadline = time.monotonic() + 60  # (every held request arrives and counts as in flight)
        while metric(http.get("/metrics").text, "structgen_requests_in_flight") < HELD \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert metric(http.get("/metrics").text, "structgen_requests_in_flight") >= HELD
        release.set()
        assert all(a.result().status_code == 200 for a in answers)
    assert metric(httpx.get(f"{base}/metrics").text, "structgen_requests_in_flight") == 0


@pytest.mark.timeout(300)
def test_requests_whose_constraints_are_being_read_get_a_503_once_the_engine_stops(server_with_held_checks):
    """The server stops the engine a moment before its graceful-shutdown deadline cancels what still runs."""
    base, release, waiting, engine = server_with_held_checks
    with ThreadPoolExecutor(4) as pool, httpx.Client(base_url=base, timeout=200) as http:
        answers = [pool.submit(http.post, "/v1/chat/completions", json=HELD_REQUEST) for _ in range(4)]
        deadline = time.monotonic() + 60
        while waiting[0] < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waiting[0] == 4
        engine.stop()
        for answer in answers:
            response = answer.result(timeout=30)
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert error["code"] == "server_shutting_down" and error["message"] == "the server is shutting down"
        assert not release.is_set()  # (answered while their checks were still held)
