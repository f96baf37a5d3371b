"""Tool calling with a model whose chat template asks for Qwen3-Coder's XML calls (`<function=NAME>` and a
`<parameter=KEY>` per argument inside `<tool_call>` tags, string values raw): the server detects the format,
constrains and parses calls in it, streams their arguments as JSON, and renders calls in history back through the
template."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.conftest import QWEN_TOOL_TAGS, build_qwen3_coder_tokenizer, build_tiny_model_dir
from tests.serverproc import ServerProcess
from tests.service.conftest import assert_stream_matches_whole_answer

MODEL = "qwen3-coder-tiny"
OPEN_ID = min(QWEN_TOOL_TAGS)
WRITE = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 20},
                                          "content": {"type": "string"},
                                          "mode": {"type": ["string", "null"], "enum": ["w", "a", None]},
                                          "lines": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
         "required": ["path", "content", "mode"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "write_file", "description": "Write a file", "strict": True,
                                           "parameters": WRITE}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"write_file": WRITE, "get_time": TIME}
ASK = [{"role": "user", "content": "Write hello.txt"}]


@pytest.fixture(scope="module")
def coder_model(tmp_path_factory):
    base = tmp_path_factory.mktemp("qwen3-coder")
    return build_tiny_model_dir(base / "model", build_qwen3_coder_tokenizer(base / "tokenizer"))


@pytest.fixture(scope="module")
def coder_server(coder_model):
    with ServerProcess("--model", str(coder_model), "--served-model-name", MODEL, "--max-batch-size", "8") as proc:
        yield proc


@pytest.fixture(scope="module")
def client(coder_server):
    from openai import OpenAI

    return OpenAI(base_url=coder_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _check_calls(calls):
    assert calls
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_come_back_as_tool_calls(client, parallel):
    for seed in (1, 2):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=parallel, max_tokens=120, seed=seed)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        _check_calls(choice.message.tool_calls)
        if not parallel:
            assert len(choice.message.tool_calls) == 1


def test_a_tight_budget_still_ends_in_whole_calls(client):
    """The budget rule closes the raw values and the tags: a named call in 60 tokens (the shortest takes about 40)
    comes back whole."""
    for seed in range(3):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=60, seed=seed,
                                           tool_choice={"type": "function", "function": {"name": "write_file"}})
        assert r.choices[0].finish_reason == "stop"  # (a named function's whole call, as OpenAI's: not `length`)
        _check_calls(r.choices[0].message.tool_calls)


def test_auto_returns_the_text_before_the_calls_as_content(client):
    seen_calls = seen_text = False
    for seed in range(6):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto",
                                           max_tokens=120, seed=seed, logit_bias={str(OPEN_ID): 8})
        message = r.choices[0].message
        assert "<tool_call>" not in (message.content or "")
        if message.tool_calls:
            seen_calls = True
            _check_calls(message.tool_calls)
            seen_text |= bool(message.content)
    assert seen_calls and seen_text


@pytest.mark.parametrize("tool_choice, bias", [("required", 0), ("auto", 8)])
def test_streamed_calls_match_the_whole_answer(coder_server, tool_choice, bias):
    """Raw values stream as JSON strings, piece by piece: the pieces assemble to the whole answer's arguments."""
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 120,
            "logit_bias": {str(OPEN_ID): bias}}
    with httpx.Client(base_url=coder_server.base_url, timeout=120) as http:
        for seed in (1, 3):
            assert_stream_matches_whole_answer(http, {**body, "seed": seed, "logprobs": True})


def test_history_with_calls_and_results_goes_through_the_template(client):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "write_file",
                          "arguments": '{"path": "a.txt", "content": "hi\\nthere", "mode": null}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=120, seed=2)
    _check_calls(r.choices[0].message.tool_calls)


def test_an_earlier_call_with_empty_arguments_is_a_call_without_arguments(client):
    """Clients store a call without arguments as `""`; the template walks arguments as a mapping ("Can only get
    item pairs from a mapping": a 400)."""
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "write_file", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=2)
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_a_strict_function_the_format_cannot_write_is_refused_with_its_pointer(client):
    """A keyword about the parameters object beyond its properties that no argument list can say
    (`dependentSchemas` holding `b` to a second schema) cannot be said in this format: a strict function gets a 400
    naming where it is, in terms of the request's `tools`."""
    import openai

    params = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
              "dependentSchemas": {"a": {"properties": {"b": {"maxLength": 2}}}}, "additionalProperties": False}
    tools = [TOOLS[1], {"type": "function", "function": {"name": "f", "strict": True, "parameters": params}}]
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice="required",
                                       max_tokens=20)
    error = exc.value.body  # (dependentSchemas is rewritten into branches: named as written, QA toolfmt2 F4)
    assert error["param"] == "tools[1].function.parameters" and error["code"] == "unsupported_schema"
    assert "at /1/function/parameters/dependentSchemas in the qwen3_coder tool-call format" in error["message"]


def test_a_strict_function_is_checked_against_only_the_definitions_each_parameter_reaches(client):
    """pydantic's discriminated union of its models (open objects) in `$defs`: `lives`, an integer written as JSON,
    was compiled with every definition beside it, and `Dog`, which it never reaches, made the strict function a 400
    (QA xmlanyof F2). Served now, as the JSON formats serve it, nothing unenforced, every call valid."""
    cat = {"type": "object", "properties": {"kind": {"const": "cat", "type": "string"}, "lives": {"type": "integer"}},
           "required": ["kind", "lives"]}
    dog = {"type": "object", "properties": {"kind": {"const": "dog", "type": "string"}, "name": {"type": "string"}},
           "required": ["kind", "name"]}
    params = {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "$defs": {"Cat": cat, "Dog": dog}}
    tools = [{"type": "function", "function": {"name": "pet", "strict": True, "parameters": params}}]
    for seed in range(2):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=ASK, tools=tools, tool_choice="required", max_tokens=60, seed=seed)
        assert "x-structgen-unenforced" not in raw.headers
        calls = raw.parse().choices[0].message.tool_calls
        assert calls
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), params)


@pytest.mark.parametrize("max_tokens", [1, 16])
def test_the_servers_own_answer_cut_by_max_tokens_goes_back_in_history(client, max_tokens):
    """Agent loops append every answer as returned and answer each call. A call max_tokens cut (arguments `{"a": `)
    was a 400 on the next turn ("Can only get item pairs from a mapping": this template walks the arguments as a
    mapping), and so was an answer cut before any call's name (`content: null`, no calls: "an 'assistant' message
    needs `content`"). The cut call goes back with its whole members; the empty answer's content is ""."""
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=max_tokens, seed=1)
    choice = first.choices[0]
    assert choice.finish_reason == "length"
    message = choice.message.model_dump(exclude_none=True)
    history = [*ASK, message]
    if max_tokens == 1:
        assert choice.message.content == "" and not choice.message.tool_calls
    else:
        [call] = choice.message.tool_calls
        with pytest.raises(ValueError):  # (cut: not JSON)
            json.loads(call.function.arguments)
        history.append({"role": "tool", "tool_call_id": call.id, "content": "error: cut"})
    second = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=4)
    assert second.choices[0].message.role == "assistant"


@pytest.mark.parametrize("depth", [400, 2000])
def test_a_cut_call_in_history_nested_deep_is_read_without_a_fault(client, depth):
    """A cut call's whole members are read as JSON: one nested 2,000 deep was Python's RecursionError, a 500.
    Members nested past the server's 500 levels are left out, as members of text that is no JSON object are."""
    arguments = '{"a": ' + "[" * depth + "]" * depth + ', "b": 1'  # (cut after a whole member)
    call = {"id": "call_1", "type": "function", "function": {"name": "write_file", "arguments": arguments}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "error: cut"}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=2)
    assert r.choices[0].message.role == "assistant"
