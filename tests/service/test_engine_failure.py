"""A server whose engine thread stopped after a failure it cannot go on from says so and can still stop: the
request being streamed ends with an error chunk, later requests get a 503 in the OpenAI error shape, /health a 503
(the container's HEALTHCHECK marks it unhealthy), /metrics `structgen_engine_alive` 0, and one shutdown request
stops the server. Before, the streamed
request waited forever, and so did the server's shutdown (it needed a second SIGTERM).

The real app runs on uvicorn on 127.0.0.1, in this process: the engine's step is replaced by one that raises
KeyboardInterrupt (what `engine.engine.recoverable` does not recover from) when the test says so."""

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
from tests.serverproc import free_port
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
