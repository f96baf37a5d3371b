"""`--api-key` (here via STRUCTGEN_API_KEY): every route but /health needs the bearer key; without it, open.
The auth server also runs with a 64-token context, to check context_length_exceeded_behavior=truncate, and 2 s for
a request's body to arrive (`--max-body-seconds`); it also serves the outlines builds that a test counts (the
shared server's background builds, begun by other tests, would count too)."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.service.conftest import API_KEY, MODEL, metric


@pytest.fixture(scope="module")
def auth_server_small(tmp_path_factory, grammar_cache):
    from tests.serverproc import ServerProcess

    log = tmp_path_factory.mktemp("logs") / "auth_server.log"
    with ServerProcess("--cache-dir", str(grammar_cache), "--max-model-len", "64", "--max-body-seconds", "2",
                       env={"STRUCTGEN_API_KEY": API_KEY}, log_path=log) as proc:
        proc.log = log
        yield proc


def test_health_is_open(auth_server_small):
    assert httpx.get(auth_server_small.base_url + "/health").status_code == 200


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong-key"}, {"authorization": API_KEY},
                                     {"authorization": "Basic " + API_KEY}])
def test_requests_without_the_key_are_401(auth_server_small, headers):
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/metrics"),
                         ("POST", "/v1/nothing-here")):
        r = httpx.request(method, auth_server_small.base_url + path, headers=headers, json={})
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
    metrics = httpx.get(auth_server_small.base_url + "/metrics", headers={"authorization": "Bearer " + API_KEY})
    assert metrics.status_code == 200
    assert 'structgen_requests_total{endpoint="chat",status="401"}' in metrics.text  # (auth answers before the app)


def test_the_right_key_is_accepted_and_never_logged(auth_server_small):
    from openai import OpenAI

    client = OpenAI(base_url=auth_server_small.base_url + "/v1", api_key=API_KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.choices[0].message.role == "assistant"
    assert API_KEY not in auth_server_small.log.read_text(errors="replace")


def test_max_tokens_is_truncated_to_the_context_by_default(auth_server_small):
    r = httpx.post(auth_server_small.base_url + "/v1/completions", timeout=120,
                   headers={"authorization": "Bearer " + API_KEY},
                   json={"model": MODEL, "prompt": "The sky is", "max_tokens": 1000, "ignore_eos": True})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 64
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_a_prompt_that_fills_the_context_is_scored_but_generates_nothing(auth_server_small):
    """`echo` with `max_tokens: 0` generates nothing, so a prompt of exactly the context's 64 tokens fits (it was a
    400 context_length_exceeded); one token more, or any token to generate, does not."""
    def post(prompt, max_tokens):
        return httpx.post(auth_server_small.base_url + "/v1/completions", timeout=120,
                          headers={"authorization": "Bearer " + API_KEY},
                          json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "echo": True,
                                "logprobs": 1})
    r = post([785] * 64, 0)
    assert r.status_code == 200, r.text
    assert r.json()["usage"] == {"prompt_tokens": 64, "completion_tokens": 0, "total_tokens": 64,
                                 "prompt_tokens_details": {"cached_tokens": 0},
                                 "completion_tokens_details": {"reasoning_tokens": 0}}
    assert len(r.json()["choices"][0]["logprobs"]["tokens"]) == 64
    for prompt, max_tokens in (([785] * 65, 0), ([785] * 64, 1)):
        r = post(prompt, max_tokens)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_open_server_needs_no_key(http):
    assert http.get("/v1/models").status_code == 200


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_its_connection_closed(auth_server_small):
    """A client that declared a body and sent part of it held its connection for ever (3,000 such were all open a
    minute later, QA hostile F8); the 408 closes it (one trickling bytes held it on, review of 21e32d7)."""
    url = urlsplit(auth_server_small.base_url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"model\"")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
        waited = time.monotonic() - started
        sock.settimeout(3)  # (a client trickling its body on after the 408 holds nothing: closed at once)
        try:
            sock.sendall(b" ")
            closed = sock.recv(1) == b""
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        assert closed
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert json.loads(body)["error"]["code"] == "request_timeout" and waited >= 2
    r = httpx.post(auth_server_small.base_url + "/v1/chat/completions", headers={"authorization": f"Bearer {API_KEY}"},
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert r.status_code == 200, r.text


def test_clients_that_leave_while_their_schemas_wait_for_outlines_builds_have_those_builds_dropped(
        auth_server_small):
    """Ten clients that left while their schemas waited for outlines builds had all ten made, one after the other
    (review of d29d872): leaving did not cancel a request before its plan was made."""
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    url, key = auth_server_small.base_url, {"authorization": f"Bearer {API_KEY}"}
    run = uuid.uuid4().hex[:8]  # (no build of an earlier run on disk)

    def body(i):
        props = {f"p{j}": {"type": "string", "enum": [f"{run}-{i}-{j}", "w"]} for j in range(48)}  # (a build: ~4 s)
        schema = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
        return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "constraint_backend": "outlines",
                "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}

    def leave(i):
        with pytest.raises(httpx.ReadTimeout):  # (the client gives up and closes its connection)
            httpx.post(url + "/v1/chat/completions", headers=key, json=body(i), timeout=1.0)

    def builds():
        return metric(httpx.get(url + "/metrics", headers=key).text, "structgen_grammar_outlines_builds_total")

    before = builds()
    with ThreadPoolExecutor(10) as pool:
        list(pool.map(leave, range(10)))
    # A new schema's build queues behind any build still to begin: once it is made, those that were not dropped
    # have begun.
    for _ in range(10):  # (on a loaded machine its wait may end before its build does: it then asks again)
        r = httpx.post(url + "/v1/chat/completions", headers=key, json=body("last"), timeout=300)
        if r.status_code != 400 or r.json()["error"]["code"] != "compile_timeout" or "was stopped" in r.text:
            break
    assert r.status_code == 200, r.text
    assert builds() - before <= 4  # (the last, and the 2 workers' builds under way when the clients left, or so)


def test_a_client_without_the_key_is_refused_before_its_body_is_read(auth_server_small):
    """The body limits read every body first: forty clients without the key held ~7 MB each for up to a minute
    before their 401 (review of 21e32d7). A declared body never sent gets its 401 now, and the connection closes."""
    url = urlsplit(auth_server_small.base_url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 8000000\r\n\r\n{")
        answer = b""
        while True:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    assert answer.startswith(b"HTTP/1.1 401"), answer
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "invalid_api_key"


def test_a_request_head_trickled_a_byte_at_a_time_is_cut_off(auth_server_small):
    """A client that sent part of its request line and headers, then a byte now and then, held its connection for
    ever (uvicorn's keep-alive timer restarts at every byte; review of 21e32d7 F7): `--max-body-seconds` bounds the
    head too, and the connection closes."""
    url = urlsplit(auth_server_small.base_url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        closed = False
        for _ in range(40):  # (20 s of a header byte every half second; the limit is 2 s)
            time.sleep(0.5)
            try:
                sock.sendall(b"x")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            sock.settimeout(0.01)
            try:
                closed = sock.recv(1) == b""
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed = True
            sock.settimeout(30)
            if closed:
                break
    assert closed


PAGE = "http://localhost:5173"  # a web app's dev server, whose page calls the API from the browser


@pytest.fixture(scope="module")
def cors_server(grammar_cache):
    from tests.serverproc import ServerProcess

    with ServerProcess("--cache-dir", str(grammar_cache), "--allowed-origins", f"https://app.example,{PAGE}",
                       env={"STRUCTGEN_API_KEY": API_KEY}) as proc:
        yield proc


def test_allowed_origins_let_a_browser_page_call_the_api_as_it_calls_openais(cors_server):
    """A browser page (the Node SDK's `dangerouslyAllowBrowser`, a web UI) first asks with a preflight that carries
    no key: every one was a 405 (or a 401 with a key set), so no page could call the server at all."""
    preflight = httpx.options(cors_server.base_url + "/v1/chat/completions", headers={
        "origin": PAGE, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-stainless-os"})
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == PAGE
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(cors_server.base_url + "/v1/chat/completions", json=body,
                   headers={"origin": PAGE, "authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == PAGE
    assert "x-request-id" in r.headers["access-control-expose-headers"].lower()  # (the SDKs read it)
    # the key is still needed, and the page can read why it was refused
    refused = httpx.post(cors_server.base_url + "/v1/chat/completions", json=body, headers={"origin": PAGE})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == PAGE
    # an origin not listed gets no grant: its page cannot read the answer
    other = httpx.options(cors_server.base_url + "/v1/chat/completions", headers={
        "origin": "https://elsewhere.example", "access-control-request-method": "POST"})
    assert "access-control-allow-origin" not in other.headers


def test_without_allowed_origins_no_browser_page_is_answered(http):
    """The default serves no page: a local server is not reachable by any web site the user happens to visit."""
    r = http.post("/v1/chat/completions", headers={"origin": PAGE},
                  json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
