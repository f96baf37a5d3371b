"""One real `structgen serve` (uvicorn on 127.0.0.1, built-in model) per configuration, shared by the session."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import httpx
import jsonschema
import pytest

from tests.serverproc import ServerProcess

MODEL = "structgen-builtin"
API_KEY = "test-key-0123456789"


@pytest.fixture(scope="session")
def grammar_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("grammar-cache")


@pytest.fixture(scope="session")
def server(tmp_path_factory, grammar_cache):
    """The open server (no API key)."""
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with ServerProcess("--cache-dir", str(grammar_cache), "--max-batch-size", "8", log_path=log) as proc:
        yield proc


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


@contextlib.contextmanager
def serving(model_dir: Path, model_name: str):
    """An httpx client of a server started on `model_dir` (served as `model_name`), for one test module."""
    with ServerProcess("--model", str(model_dir), "--served-model-name", model_name) as proc:
        with httpx.Client(base_url=proc.base_url, timeout=120) as client:
            yield client


def assert_tool_calls_valid(calls: list[dict], schemas: dict[str, dict]) -> None:
    """At least one call, each in OpenAI's shape, its arguments valid against its function's parameters."""
    assert calls
    for call in calls:
        assert call["id"].startswith("call_") and call["type"] == "function"
        jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])


def metric(text: str, name: str) -> float:
    """The value of an unlabelled Prometheus sample."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def assert_stream_matches_whole_answer(http: httpx.Client, body: dict) -> dict:
    """The same seeded request, whole and streamed: the stream's content, reasoning, tool calls (each id sent once,
    arguments in pieces), finish reason and logprobs (where asked for, none in a choice's first chunk) assemble to
    the whole answer's. Returns the
    whole answer's message. The two are asked again when another backend served the stream: under the auto policy a
    repeated schema moves to outlines once built, which spells forced text in other tokens (the README says so),
    and a build finishing between the two requests made the comparison flaky."""
    for _ in range(3):
        r = http.post("/v1/chat/completions", json=body)
        streamed = http.post("/v1/chat/completions", json={**body, "stream": True})
        if streamed.headers.get("x-structgen-constraint-backend") == r.headers.get("x-structgen-constraint-backend"):
            break
    whole = r.json()["choices"][0]
    lines = streamed.text.splitlines()
    content, reasoning, calls, finish, logprobs = None, "", {}, None, []  # (content: null until a delta sends one)
    opened = set()
    for chunk in (json.loads(line[6:]) for line in lines if line.startswith("data: {")):
        for choice in chunk.get("choices", ()):
            delta = choice["delta"]
            if choice["index"] not in opened:  # (as OpenAI's: the Node SDK's stream helper counted them twice)
                assert not (choice.get("logprobs") or {}).get("content"), "logprobs in a choice's first chunk"
                opened.add(choice["index"])
            logprobs += (choice.get("logprobs") or {}).get("content") or []
            if delta.get("content") is not None:  # (as the SDK assembles it: a first "" makes "", never null)
                content = (content or "") + delta["content"]
            assert delta.get("reasoning") == delta.get("reasoning_content")  # (the two names clients read)
            reasoning += delta.get("reasoning_content") or ""
            for d in delta.get("tool_calls") or ():
                slot = calls.setdefault(d["index"], {"id": None, "name": "", "arguments": ""})
                if d.get("id"):
                    assert slot["id"] is None
                    slot["id"] = d["id"]
                slot["name"] += d.get("function", {}).get("name") or ""
                slot["arguments"] += d.get("function", {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    message = whole["message"]
    assert finish == whole["finish_reason"]
    if body.get("logprobs"):  # (each token's once, in order, calls' included)
        assert logprobs == whole["logprobs"]["content"]
    assert content == message["content"]
    assert (reasoning or None) == message.get("reasoning_content") == message.get("reasoning")
    # (both send the arguments as the model wrote them, so the strings are equal, not just their JSON)
    assert [(c["name"], c["arguments"]) for c in calls.values()] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or ()]
    return message
