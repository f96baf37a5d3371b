"""Tool calling with a model whose chat template asks for Llama 3's format (one `{"name", "parameters"}` object):
the server constrains, parses and streams calls in that format through the OpenAI SDK and raw SSE, and earlier
calls and results go back through the template."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.conftest import LLAMA3_TOOLS_TEMPLATE, build_template_tokenizer, build_tiny_model_dir
from tests.serverproc import ServerProcess
from tests.service.conftest import assert_stream_matches_whole_answer

MODEL = "llama3-tools-tiny"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "array", "items": {"enum": [1, 2, 3]},
                                                     "maxItems": 3, "uniqueItems": True}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def llama_model(tmp_path_factory):
    base = tmp_path_factory.mktemp("llama3-tools")
    return build_tiny_model_dir(base / "model", build_template_tokenizer(base / "tokenizer", LLAMA3_TOOLS_TEMPLATE))


@pytest.fixture(scope="module")
def brace_id(llama_model) -> int:
    """The token "{", which opens a call in this format."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(llama_model)).convert_tokens_to_ids("{")


@pytest.fixture(scope="module")
def llama_server(llama_model):
    with ServerProcess("--model", str(llama_model), "--served-model-name", MODEL, "--max-batch-size", "8") as proc:
        yield proc


@pytest.fixture(scope="module")
def client(llama_server):
    from openai import OpenAI

    return OpenAI(base_url=llama_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _check_one_call(choice, finish: str = "tool_calls"):
    assert choice.finish_reason == finish and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return call


@pytest.mark.parametrize("parallel", [True, None])
def test_required_gives_one_call_whatever_parallel_tool_calls_says(client, parallel):
    for seed in (1, 2, 3):
        extra = {} if parallel is None else {"parallel_tool_calls": parallel}
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=120, seed=seed, **extra)
        _check_one_call(r.choices[0])


def test_named_call_through_the_outlines_backend(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=120, seed=4,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}},
                                       extra_body={"constraint_backend": "outlines"})
    assert _check_one_call(r.choices[0], finish="stop").function.name == "get_time"  # (named: `stop`)


def test_auto_gives_the_call_or_text_that_is_not_one(client, brace_id):
    """With a bias on "{" the random model calls (or writes text); text never starts with "{"; with "{" banned,
    text only."""
    seen_calls = False
    for seed in range(6):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto",
                                           max_tokens=120, seed=seed, logit_bias={str(brace_id): 12})
        choice = r.choices[0]
        if choice.message.tool_calls:
            seen_calls = True
            _check_one_call(choice)
        else:
            assert not choice.message.content.lstrip().startswith("{")
    assert seen_calls
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=20, seed=0,
                                       logit_bias={str(brace_id): -100})
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content


@pytest.mark.parametrize("tool_choice, bias", [("required", 0), ("auto", 12), ("auto", -100)])
def test_streamed_call_matches_the_whole_answer(llama_server, brace_id, tool_choice, bias):
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 120,
            "logit_bias": {str(brace_id): bias}}
    with httpx.Client(base_url=llama_server.base_url, timeout=120) as http:
        for seed in (1, 3):
            message = assert_stream_matches_whole_answer(http, {**body, "seed": seed, "logprobs": True})
            if bias == -100:
                assert message["content"] and not message.get("tool_calls")


def test_history_goes_through_the_template_which_takes_one_call_per_message(llama_server, client):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="required",
                                       max_tokens=120, seed=2)
    _check_one_call(r.choices[0])
    two = ASK + [{"role": "assistant", "content": None, "tool_calls": [call, {**call, "id": "call_2"}]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
                 {"role": "tool", "tool_call_id": "call_2", "content": "12:00"}]
    r = httpx.post(llama_server.base_url + "/v1/chat/completions",
                   json={"model": MODEL, "messages": two, "tools": TOOLS}, timeout=120)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "messages" and "single tool-calls" in error["message"]


@pytest.fixture(scope="module")
def tagged_http(tmp_path_factory):
    """A model whose vocabulary has Llama 3's `<|python_tag|>` special token."""
    from tests.conftest import build_llama3_tagged_tokenizer
    from tests.service.conftest import serving

    base = tmp_path_factory.mktemp("llama3-tag")
    with serving(build_tiny_model_dir(base / "model", build_llama3_tagged_tokenizer(base / "tokenizer")), MODEL) as c:
        yield c


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_a_call_opened_by_the_python_tag_comes_back_as_a_tool_call(tagged_http, skip_special_tokens):
    """Llama 3.1 and 3.2 sometimes write `<|python_tag|>` before a call (a bias makes this model do it): the call
    after it comes back as the tool call, whole and streamed, and the tag is never content."""
    from tests.conftest import LLAMA3_PYTHON_TAG
    from tests.service.conftest import assert_tool_calls_valid

    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 120,
            "logit_bias": {str(min(LLAMA3_PYTHON_TAG)): 100}, "skip_special_tokens": skip_special_tokens,
            "constraint_backend": "llguidance"}
    for seed in (1, 2):
        whole = tagged_http.post("/v1/chat/completions", json={**body, "seed": seed, "logprobs": True}).json()
        choice = whole["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        assert choice["logprobs"]["content"][0]["token"] == "<|python_tag|>"
        message = assert_stream_matches_whole_answer(tagged_http, {**body, "seed": seed, "logprobs": True})
        assert_tool_calls_valid(message["tool_calls"], SCHEMAS)
