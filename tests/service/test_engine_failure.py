"""A server whose engine thread stopped after a failure it cannot go on from says so and stops: the request being
streamed ends with an error chunk, later requests get a 503 in the OpenAI error shape, /health a 503, /metrics
`structgen_engine_alive` 0, and the server can stop (before, the streamed request waited forever, and so did the
server's shutdown: it needed a second SIGTERM). `structgen serve` then stops by itself and exits with status 1.

The first test runs the real app on uvicorn on 127.0.0.1 in this process (its server is not told to stop with the
engine, so the 503s can be read): the engine's step is replaced by one that raises KeyboardInterrupt (what
`engine.engine.recoverable` does not recover from) when the test says so. The second runs the real command, its
engine's step failing likewise."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import uvicorn
from openai import APIStatusError, OpenAI

from engine.model_loader import BUILTIN_MODEL, load_model
from service.app import create_app
from service.config import ServerConfig
from service.errors import OpenAIErrorH11Protocol
from tests.serverproc import ServerProcess, free_port
from tests.service.conftest import metric


@pytest.fixture
def breakable_server(tmp_path):
    """(base URL, an Event that makes the engine's next step fail, the uvicorn Server, its thread)."""
    config = ServerConfig(cache_dir=tmp_path / "cache", port=free_port(), log_level="warning")
    app = create_app(config, load_model(BUILTIN_MODEL, device="cpu"))
    engine = app.state.generation.engine
    fail_now = threading.Event()
    real_step = engine.step

    def step():
        if fail_now.is_set():
            raise KeyboardInterrupt("the engine's failure, for this test")
        real_step()

    engine.step = step
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=config.port, log_level="warning",
                                           http=OpenAIErrorH11Protocol))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{config.port}"
    deadline = time.monotonic() + 120
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.started
    yield base_url, fail_now, server, thread
    server.should_exit = True
    thread.join(30)


@pytest.mark.timeout(240)  # (without the fix the stream, and the server's shutdown, wait forever)
def test_a_failed_engine_ends_the_stream_refuses_requests_fails_health_and_lets_the_server_stop(breakable_server):
    base_url, fail_now, server, thread = breakable_server
    body = {"model": BUILTIN_MODEL, "messages": [{"role": "user", "content": "Talk."}], "max_tokens": 2000,
            "ignore_eos": True}
    assert httpx.get(base_url + "/health").status_code == 200
    assert metric(httpx.get(base_url + "/metrics").text, "structgen_engine_alive") == 1
    chunks = []
    with httpx.Client(base_url=base_url, timeout=60) as http:
        with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line[6:])
                    if len(chunks) == 3:
                        fail_now.set()
        assert chunks[-1] == "[DONE]"
        error = json.loads(chunks[-2])["error"]
        assert error["code"] == "engine_unavailable" and "restarted" in error["message"]

        health = http.get("/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "engine_unavailable"
        assert "KeyboardInterrupt" in health.json()["error"]["message"]
        assert metric(http.get("/metrics").text, "structgen_engine_alive") == 0

    client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(APIStatusError) as refused:
        client.chat.completions.create(model=BUILTIN_MODEL, messages=body["messages"], max_tokens=5)
    assert refused.value.status_code == 503
    assert refused.value.body["code"] == "engine_unavailable"
    assert set(refused.value.body) >= {"message", "type", "param", "code"}

    server.should_exit = True  # what one SIGTERM does
    thread.join(60)
    assert not thread.is_alive()


FAILING_SERVER = """
import sys
import engine.engine

real_step = engine.engine.Engine.step


def step(self):  # the third step of the first request fails as nothing in a step can (the engine thread ends)
    if self._steps >= 2:
        raise KeyboardInterrupt("the engine's failure, for this test")
    real_step(self)


engine.engine.Engine.step = step
from service.cli import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(300)
def test_a_server_whose_engine_failed_answers_its_request_then_stops_and_exits_nonzero(tmp_path):
    """The real `structgen serve` process, its engine's step failing as the test script makes it: the request
    in flight gets its 503, then the server stops by itself (so that a supervisor restarts it) and exits with
    status 1 and a one-line reason."""
    log = tmp_path / "server.log"
    with ServerProcess("--log-level", "warning", launcher=("-c", FAILING_SERVER), log_path=log) as server:
        answer = httpx.post(server.base_url + "/v1/chat/completions", timeout=60, json={
            "model": BUILTIN_MODEL, "messages": [{"role": "user", "content": "Talk."}], "max_tokens": 50,
            "ignore_eos": True})
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "engine_unavailable"
        assert server.proc.wait(timeout=60) == 1
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines[-1] == ("structgen: error: the engine stopped after a failure "
                         "(KeyboardInterrupt: the engine's failure, for this test)")
