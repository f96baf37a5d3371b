"""Tool calling with a model whose chat template asks for `<tool_call>` tags (Qwen2.5's): the server constrains
and parses calls in that format, through the OpenAI SDK and raw SSE, with text before calls under "auto"."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.conftest import QWEN_TOOL_TAGS, build_qwen_tools_tokenizer, build_tiny_model_dir
from tests.serverproc import ServerProcess
from tests.service.conftest import assert_stream_matches_whole_answer, assert_tool_calls_valid

MODEL = "qwen-tools-tiny"
OPEN_ID = min(QWEN_TOOL_TAGS)
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "array", "items": {"enum": [1, 2, 3]},
                                                     "maxItems": 3, "uniqueItems": True}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory):
    base = tmp_path_factory.mktemp("qwen-tools")
    return build_tiny_model_dir(base / "model", build_qwen_tools_tokenizer(base / "tokenizer"))


@pytest.fixture(scope="module")
def qwen_server(qwen_model):
    with ServerProcess("--model", str(qwen_model), "--served-model-name", MODEL, "--max-batch-size", "8") as proc:
        yield proc


@pytest.fixture(scope="module")
def client(qwen_server):
    from openai import OpenAI

    return OpenAI(base_url=qwen_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _check_calls(calls):
    assert calls
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_come_back_as_tool_calls(client, parallel):
    for seed in (1, 2):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=parallel, max_tokens=160, seed=seed)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        _check_calls(choice.message.tool_calls)
        if not parallel:
            assert len(choice.message.tool_calls) == 1


def test_a_call_the_budget_cannot_hold_ends_the_answer_as_cut(client):
    """Under "auto", where the model began a call that could not close in max_tokens, the budget rule ends the
    output instead (the answer may be empty): that was `finish_reason: "stop"` with no content, as if the model
    had nothing to say; the client is told the budget cut it."""
    for max_tokens in (1, 4, 8):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", seed=1,
                                           max_tokens=max_tokens, logit_bias={str(OPEN_ID): 100})
        choice = r.choices[0]
        assert not choice.message.tool_calls and not choice.message.content
        assert choice.finish_reason == "length", max_tokens


def test_named_call_through_the_outlines_backend(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=160, seed=4,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}},
                                       extra_body={"constraint_backend": "outlines"})
    assert r.choices[0].finish_reason == "stop"  # (named)
    _check_calls(r.choices[0].message.tool_calls)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_time"]


def test_auto_returns_the_text_before_the_calls_as_content(client):
    """A logit bias on the tag token makes the random model call after some text (or at once): the text is the
    content, the calls are tool_calls; without it, plain text, which never holds a tag."""
    seen_calls = seen_text = False
    for seed in range(6):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto",
                                           max_tokens=160, seed=seed, logit_bias={str(OPEN_ID): 8})
        message = r.choices[0].message
        assert "<tool_call>" not in (message.content or "")
        if message.tool_calls:
            seen_calls = True
            _check_calls(message.tool_calls)
            assert r.choices[0].finish_reason == "tool_calls"
            seen_text |= bool(message.content)
    assert seen_calls and seen_text
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=20, seed=0,
                                       logit_bias={str(OPEN_ID): -100})
    assert r.choices[0].message.tool_calls is None and "<tool_call>" not in r.choices[0].message.content


@pytest.mark.parametrize("tool_choice, bias", [("required", 0), ("auto", 8)])
def test_streamed_calls_match_the_whole_answer(qwen_server, tool_choice, bias):
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 160,
            "logit_bias": {str(OPEN_ID): bias}}
    with httpx.Client(base_url=qwen_server.base_url, timeout=120) as http:
        for seed in (1, 3):
            assert_stream_matches_whole_answer(http, {**body, "seed": seed, "logprobs": True})


def test_stop_strings_cut_the_text_before_calls_but_never_a_call(qwen_server, client):
    """A newline follows every `<tool_call>` tag: with "\n" as a stop string, calls still come back whole (forced,
    or after text under auto, streamed as answered whole), while text with a newline before any call ends there."""
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 160, "stop": ["\n", '"']}
    with httpx.Client(base_url=qwen_server.base_url, timeout=120) as http:
        for seed in (1, 2):
            message = assert_stream_matches_whole_answer(http, {**body, "tool_choice": "required", "seed": seed})
            assert_tool_calls_valid(message["tool_calls"], SCHEMAS)
        seen_calls = seen_cut = False
        for seed in range(6):
            request = {**body, "tool_choice": "auto", "seed": seed, "logit_bias": {str(OPEN_ID): 8, "198": 4}}
            message = assert_stream_matches_whole_answer(http, request)
            if message.get("tool_calls"):
                seen_calls = True
                assert_tool_calls_valid(message["tool_calls"], SCHEMAS)
            else:
                seen_cut = True
            assert "\n" not in (message["content"] or "") and '"' not in (message["content"] or "")
        assert seen_calls and seen_cut


def test_streamed_text_under_auto_carries_the_logprobs_of_all_its_tokens(qwen_server):
    """Text the tool stream held back (trailing whitespace, what may begin the tag) carries its tokens' logprobs
    when it is sent, once each: the logprob tokens' bytes of the content chunks spell the content."""
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 40,
            "logit_bias": {str(OPEN_ID): -100, "198": 9, "271": 9}, "logprobs": True, "stream": True}  # (newlines)
    with httpx.Client(base_url=qwen_server.base_url, timeout=120) as http:
        for seed in (1, 2, 3):
            lines = http.post("/v1/chat/completions", json={**body, "seed": seed}).text.splitlines()
            content, spelled = "", b""
            for chunk in (json.loads(line[6:]) for line in lines if line.startswith("data: {")):
                for choice in chunk["choices"]:
                    content += choice["delta"].get("content") or ""
                    spelled += b"".join(bytes(t["bytes"]) for t in (choice["logprobs"] or {}).get("content") or ())
            assert "\n" in content.strip() and spelled.decode() == content


def test_history_with_calls_and_results_goes_through_the_template(client):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=160, seed=2)
    _check_calls(r.choices[0].message.tool_calls)


def test_tool_call_format_option_overrides_the_template(qwen_model, client):
    """`--tool-call-format json_array` (here from its environment variable) on the same model: calls are our JSON
    array, so under "auto" a strong bias on the tag token, which makes the template's format call, gives text;
    forced calls still come back as tool_calls."""
    from openai import OpenAI

    body = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=60, seed=0,
                logit_bias={str(OPEN_ID): 100})
    assert client.chat.completions.create(**body).choices[0].message.tool_calls
    with ServerProcess("--model", str(qwen_model), "--served-model-name", MODEL,
                       env={"STRUCTGEN_TOOL_CALL_FORMAT": "json_array"}) as proc:
        array_client = OpenAI(base_url=proc.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        message = array_client.chat.completions.create(**body).choices[0].message
        assert message.tool_calls is None and message.content and "<tool_call>" not in message.content
        r = array_client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                                 parallel_tool_calls=False, max_tokens=160, seed=1)
        _check_calls(r.choices[0].message.tool_calls)
