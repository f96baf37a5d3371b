"""One real `structgen serve` (uvicorn on 127.0.0.1, built-in model) per configuration, shared by the session."""

from __future__ import annotations

import httpx
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


def metric(text: str, name: str) -> float:
    """The value of an unlabelled Prometheus sample."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)
