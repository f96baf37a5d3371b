"""`structgen serve` as the README runs it: a real uvicorn process on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.serverproc import ServerProcess


@pytest.fixture(scope="module")
def default_server():
    with ServerProcess() as server:  # no --model: the built-in model, as the README's serve command
        yield server


def test_default_server_answers_health(default_server):
    response = httpx.get(default_server.base_url + "/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert httpx.head(default_server.base_url + "/health").status_code == 200  # (load balancers' probes; was 405)


def test_default_server_lists_builtin_model_with_context_length(default_server):
    body = httpx.get(default_server.base_url + "/v1/models").json()
    assert body["object"] == "list"
    [model] = body["data"]
    assert model["id"] == "structgen-builtin"
    assert model["object"] == "model"
    assert model["context_length"] == 4096


def test_serve_options_come_from_environment_variables(tiny_model_dirs):
    env = {"STRUCTGEN_MODEL": str(tiny_model_dirs["phi3"]), "STRUCTGEN_SERVED_MODEL_NAME": "tiny-phi3",
           "STRUCTGEN_MAX_MODEL_LEN": "1024"}
    with ServerProcess(env=env) as server:
        [model] = httpx.get(server.base_url + "/v1/models").json()["data"]
    assert model["id"] == "tiny-phi3"
    assert model["context_length"] == 1024


def test_command_line_wins_over_environment(tiny_model_dirs):
    env = {"STRUCTGEN_SERVED_MODEL_NAME": "from-env"}
    with ServerProcess("--model", str(tiny_model_dirs["gpt2"]), "--served-model-name", "from-cli",
                       env=env) as server:
        [model] = httpx.get(server.base_url + "/v1/models").json()["data"]
    assert model["id"] == "from-cli"
    assert model["context_length"] == 2048  # the saved config's max_position_embeddings


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.cli", "serve", *args], capture_output=True,
                          text=True, timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", **(env or {})})


def test_missing_model_directory_exits_nonzero_with_one_line_reason(tmp_path):
    missing = tmp_path / "no-such-model"
    result = _serve("--model", str(missing))
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1] == f"structgen: error: model directory not found: {missing}"


def test_directory_without_a_model_exits_nonzero_with_one_line_reason(tmp_path):
    result = _serve("--model", str(tmp_path))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"structgen: error: cannot load model '{tmp_path}'")


@pytest.mark.parametrize("args", [["--port", "http"], ["--max-batch-size", "0"], ["--dtype", "float8"],
                                  ["--cache-max-mb", "0"], ["--grammar-cache-mb", "0"],
                                  ["--no-such-option"], ["--json-whitespace", "[ ]*"],
                                  ["--json-whitespace", "[ x]?"], ["--api-key", ""], ["--api-key", " "],
                                  ["--api-key", "secret "], ["--allowed-origins", "app.example"],
                                  ["--allowed-origins", "https://app.example/chat"]])
def test_bad_option_exits_nonzero_naming_it(args):
    result = _serve(*args)
    assert result.returncode == 2
    assert args[0] in result.stderr


@pytest.mark.parametrize("name, value", [("LOG_LEVEL", "bogus"), ("CONSTRAINT_BACKEND", "Auto"),
                                         ("TOOL_CALL_FORMAT", "bogus"), ("REASONING", "nonee"),
                                         ("SCHEMAS_DIR", "/no/such/schemas")])
def test_a_bad_option_from_the_environment_exits_nonzero_naming_it_as_on_the_command_line(name, value):
    """argparse checks `choices` only on the command line: STRUCTGEN_LOG_LEVEL=bogus ended in a traceback, a bad
    STRUCTGEN_TOOL_CALL_FORMAT served 400s that blamed the clients, a misspelt STRUCTGEN_REASONING was taken, and a
    --schemas-dir that is not there was taken as holding no schema."""
    option = "--" + name.lower().replace("_", "-")
    for result in (_serve(env={f"STRUCTGEN_{name}": value}), _serve(option, value)):
        assert result.returncode == 2, result.stderr
        assert option in result.stderr and "Traceback" not in result.stderr


def test_the_grammar_cache_bound_reaches_the_compiler(tmp_path):
    """`--grammar-cache-mb` (the in-memory cache was 1 GiB, and no option could lower it)."""
    from engine.model_loader import BUILTIN_MODEL, load_model
    from service.app import create_app
    from service.cli import build_parser
    from service.config import ServerConfig

    assert build_parser().parse_args(["serve", "--grammar-cache-mb", "64"]).grammar_cache_mb == 64
    app = create_app(ServerConfig(cache_dir=tmp_path, grammar_cache_mb=64), load_model(BUILTIN_MODEL, device="cpu"))
    compiler = app.state.generation.compiler
    try:
        assert compiler._lru.max_bytes == 64 << 20
    finally:
        compiler.close()


def test_an_empty_option_from_the_environment_is_unset(monkeypatch):
    """Env files and charts leave values empty: `STRUCTGEN_CACHE_DIR=` made the working directory the grammar
    cache's root, and `STRUCTGEN_SCHEMAS_DIR=` read the working directory's JSON files as named schemas."""
    from service.cli import build_parser

    for name in ("CACHE_DIR", "SCHEMAS_DIR", "SERVED_MODEL_NAME", "MAX_BATCH_SIZE"):
        monkeypatch.setenv(f"STRUCTGEN_{name}", "")
    monkeypatch.delenv("STRUCTGEN_MODEL", raising=False)
    args = build_parser().parse_args(["serve"])
    assert args.cache_dir is None and args.schemas_dir is None
    monkeypatch.delenv("STRUCTGEN_SERVED_MODEL_NAME")
    monkeypatch.delenv("STRUCTGEN_MAX_BATCH_SIZE")
    unset = build_parser().parse_args(["serve"])
    assert (args.served_model_name, args.max_batch_size) == (unset.served_model_name, unset.max_batch_size)
    monkeypatch.setenv("STRUCTGEN_JSON_WHITESPACE", "")  # (but where empty means something: compact JSON)
    assert build_parser().parse_args(["serve"]).json_whitespace == ""


def test_a_sigterm_ends_the_server_within_its_shutdown_timeout_though_a_client_stopped_reading():
    """A stream whose client stopped reading held a SIGTERMed server for as long as the client stayed (90 s in
    QA, for ever in principle): systemd or Docker then killed it mid-stream. The shutdown done, it exits 0, as
    after Ctrl-C (uvicorn raised the SIGTERM again once its handler was gone: status 143, QA cli F4)."""
    import signal
    import socket

    with ServerProcess("--shutdown-timeout", "2") as server:
        body = json.dumps({"model": "structgen-builtin", "prompt": "x", "max_tokens": 3000, "stream": True,
                           "ignore_eos": True, "logprobs": 5}).encode()
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", server.port))
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert stalled.recv(100)  # the stream began; nothing more is read
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=60)
        finally:
            stalled.close()
        assert server.proc.returncode == 0


def _whitespace_outside_strings(text: str) -> str:
    out, in_string, escaped = [], False, False
    for ch in text:
        if in_string:
            in_string = escaped or ch != '"'
            escaped = not escaped and ch == "\\"
        elif ch == '"':
            in_string = True
        elif ch in " \t\r\n":
            out.append(ch)
    return "".join(out)


def test_json_whitespace_option_shapes_constrained_output(tiny_model_dirs):
    from openai import OpenAI

    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}},
                                               "n": {"type": "integer"}},
              "required": ["tags", "n"], "additionalProperties": False}
    with ServerProcess("--model", str(tiny_model_dirs["gpt2"]), "--json-whitespace", "") as server:
        client = OpenAI(base_url=server.base_url + "/v1", api_key="none")
        docs = [client.chat.completions.create(
            model=str(tiny_model_dirs["gpt2"]), messages=[{"role": "user", "content": "go"}], seed=seed,
            max_tokens=60, response_format={"type": "json_schema",
                                            "json_schema": {"name": "t", "schema": schema, "strict": True}},
        ).choices[0].message.content for seed in range(4)]
    for doc in docs:
        assert json.loads(doc).keys() == {"tags", "n"}
        assert _whitespace_outside_strings(doc) == "", doc


def test_max_prefill_tokens_option_prefills_a_longer_prompt_in_chunks(tiny_model_dirs):
    """--max-prefill-tokens reaches the engine: a 100-token prompt is prefilled 16 positions a step (7 chunks,
    /metrics), and the answer is the one the default (one prefill) gives."""
    from tests.service.conftest import metric

    model = str(tiny_model_dirs["gpt2"])
    body = {"model": model, "prompt": list(range(300, 400)), "max_tokens": 8, "temperature": 0}
    answers, chunks = [], []
    for args in (("--max-prefill-tokens", "16"), ()):
        with ServerProcess("--model", model, *args) as server:
            response = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60)
            assert response.status_code == 200, response.text
            answers.append(response.json()["choices"][0]["text"])
            chunks.append(metric(httpx.get(server.base_url + "/metrics").text,
                                 "structgen_engine_prefill_chunks_total"))
    assert chunks == [7, 0]
    assert answers[0] == answers[1] and answers[0]


def test_mask_threads_option_reaches_the_engine(tiny_model_dirs):
    """--mask-threads 3 (1 by default on a CPU): /metrics reads it, and a request's three choices, filled by the
    three threads on their own lanes, each answer a JSON object."""
    from tests.service.conftest import metric

    model = str(tiny_model_dirs["gpt2"])
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 24,
            "response_format": {"type": "json_object"}}
    threads = []
    for args in (("--mask-threads", "3"), ()):
        with ServerProcess("--model", model, *args) as server:
            threads.append(metric(httpx.get(server.base_url + "/metrics").text, "structgen_engine_mask_threads"))
            if args:
                response = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert threads == [3, 1]
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert len(choices) == 3
    for choice in choices:  # (complete within max_tokens: the budget rule)
        assert choice["finish_reason"] == "stop" and isinstance(json.loads(choice["message"]["content"]), dict)


def test_logit_bias_takes_the_vocabulary_ids_not_the_padding_of_the_logits(tmp_path):
    """A model whose logits are padded past its vocabulary (GPT-2's 50257 tokens in 50304 logits, as Qwen2's 151665
    in 151936): a bias on a padding id was taken, and +100 made the model write ids that decode to nothing."""
    from tests.conftest import build_tiny_model_dir

    model = str(build_tiny_model_dir(tmp_path / "padded", "gpt2", logits_width=50304))
    with ServerProcess("--model", model) as server:
        def post(bias):
            return httpx.post(server.base_url + "/v1/completions", timeout=60, json={
                "model": model, "prompt": "Hello", "max_tokens": 3, "logit_bias": bias})
        refused = post({"50300": 100})
        taken = post({"50256": -100, "13": 100})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "logit_bias" and "50257" in error["message"]
    assert taken.status_code == 200 and taken.json()["choices"][0]["text"] == "..."


def test_a_tool_call_format_the_tokenizer_cannot_write_exits_nonzero_naming_it():
    result = _serve("--tool-call-format", "mistral")  # (the built-in model's tokenizer has no [TOOL_CALLS])
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == ("structgen: error: --tool-call-format mistral: the model's "
                                                      "tokenizer has no [TOOL_CALLS] token")


def test_unavailable_device_exits_nonzero():
    result = _serve("--device", "cuda:7" if not _has_cuda() else "nosuchdevice")
    assert result.returncode == 1
    assert "structgen: error:" in result.stderr.strip().splitlines()[-1]


def test_a_device_torch_does_not_know_is_named_with_the_devices_this_server_takes():
    """(The line was torch's own list of device types: ipu, xpu, mkldnn, opengl... which this server refuses.)"""
    from engine.model_loader import ModelLoadError, resolve_device

    for device in ("tpu", "xpu", "meta"):
        with pytest.raises(ModelLoadError) as exc:
            resolve_device(device)
        assert str(exc.value).endswith("use auto, cpu, cuda, cuda:N or mps (where torch has it)"), exc.value
        assert "opengl" not in str(exc.value)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_a_port_already_in_use_exits_nonzero_naming_it_before_the_model_loads():
    """Found only once the model was loaded and the named schemas built (minutes on a GPU host), the bind error
    followed by uvicorn's shutdown lines (QA round 22): the socket is now bound first, and the reason is the
    last line, as for any other bad option."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve("--host", "127.0.0.1", "--port", str(port))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"structgen: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert "loading model" not in result.stderr


def test_a_stream_the_shutdown_deadline_ends_gets_an_error_event_and_done():
    """A stream still generating when the shutdown timeout ran out was cut mid-body, no `[DONE]`, which the OpenAI
    SDK reports as a connection error (QA round 22). The engine now stops a moment before the deadline, so the
    stream ends as the README says errors after the first byte do: an `error` event, then `[DONE]`."""
    import signal

    with ServerProcess("--shutdown-timeout", "2") as server:
        body = {"model": "structgen-builtin", "prompt": "x", "max_tokens": 3000, "stream": True, "ignore_eos": True}
        events = []
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    events.append(line[len("data: "):])
                    break
            server.proc.send_signal(signal.SIGTERM)
            events += [line[len("data: "):] for line in lines if line.startswith("data: ")]
        server.proc.wait(timeout=60)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "server_shutting_down" and error["type"]
    assert all("error" not in json.loads(e) for e in events[:-2])


def test_a_second_ctrl_c_ends_what_still_generates_with_errors_its_clients_read():
    """A second Ctrl-C (uvicorn's forced exit: it does not wait for the requests still generating) cancelled them
    as the event loop closed: a text/plain `Internal Server Error` and streams cut mid-body (QA ops F4). The engine
    now stops at the second Ctrl-C: a 503 in the error shape, a stream's `error` event and `[DONE]`; exit 0."""
    import signal
    import threading
    import time

    from tests.service.conftest import metric

    with ServerProcess() as server:
        request = {"model": "structgen-builtin", "prompt": "x", "max_tokens": 3000, "ignore_eos": True}
        plain: list[httpx.Response] = []
        waiting = threading.Thread(target=lambda: plain.append(
            httpx.post(server.base_url + "/v1/completions", json=request, timeout=60)))
        events = []
        with httpx.stream("POST", server.base_url + "/v1/completions", json={**request, "stream": True},
                          timeout=60) as response:
            lines = response.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    events.append(line[len("data: "):])
                    break
            waiting.start()
            deadline = time.monotonic() + 60
            while metric(httpx.get(server.base_url + "/metrics").text, "structgen_batch_size") < 2:
                assert time.monotonic() < deadline, "the second request never joined the batch"
                time.sleep(0.05)
            server.proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
            server.proc.send_signal(signal.SIGINT)
            events += [line[len("data: "):] for line in lines if line.startswith("data: ")]
        waiting.join(60)
        server.proc.wait(timeout=60)
    assert server.proc.returncode == 0
    [answer] = plain
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "server_shutting_down"
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "server_shutting_down"


def test_serve_without_options_runs_with_the_configs_defaults_and_each_option_reaches_its_setting(monkeypatch):
    """`serve`'s defaults are ServerConfig's (they were written twice, as text in the parser too), and every
    option lands in the field of its name."""
    import os
    from dataclasses import fields

    from service.cli import build_parser, server_config
    from service.config import ServerConfig

    for name in [n for n in os.environ if n.startswith("STRUCTGEN_")]:
        monkeypatch.delenv(name)
    assert server_config(build_parser().parse_args(["serve"])) == ServerConfig()
    given = {"port": "8123", "max_batch_size": "3", "max_prefill_tokens": "64", "mask_threads": "2",
             "max_model_len": "512", "cache_max_mb": "7", "grammar_cache_mb": "9", "max_body_bytes": "1000",
             "max_body_seconds": "5", "shutdown_timeout": "4", "json_whitespace": "", "host": "0.0.0.0",
             "api_key": "k", "allowed_origins": "https://app.example,http://localhost:3000", "device": "cpu",
             "dtype": "float32", "served_model_name": "m",
             "constraint_backend": "llguidance", "tool_call_format": "hermes", "reasoning": "none",
             "log_level": "debug", "model": "some/model", "cache_dir": "/tmp/x", "schemas_dir": "schemas"}
    assert set(given) == {f.name for f in fields(ServerConfig)}
    argv = ["serve"] + [item for name, value in given.items() for item in ("--" + name.replace("_", "-"), value)]
    config = server_config(build_parser().parse_args(argv))
    for name, value in given.items():
        assert str(getattr(config, name)) == value, name
