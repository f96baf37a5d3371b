"""Mistral's tool calls, on tokenizers shaped as Mistral's (the tags special tokens): "mistral", `[TOOL_CALLS]`
then a JSON array of calls (Mistral 7B v0.3's template), and "mistral_args", `[TOOL_CALLS]name[ARGS]{...}` per
call (the later templates). Calls come back as `tool_calls`, whole or streamed, with or without special tokens in
the text, and go back through the template. And a conversation with tool calls, round trip, where the chat
template refuses tool call ids other than 9 letters and digits (as Mistral's do): the ids the server hands out go
back in history and render."""

from __future__ import annotations

import contextlib
import json

import pytest

from tests.conftest import (MISTRAL_TAGS, MISTRAL_TOOLS_TEMPLATE, TOKENIZERS, build_mistral_args_tokenizer,
                            build_mistral_tools_tokenizer, build_template_tokenizer, build_tiny_model_dir)
from tests.serverproc import ServerProcess
from tests.service.conftest import assert_stream_matches_whole_answer, assert_tool_calls_valid, serving

MODEL = "mistral-tools-tiny"
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"],
        "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "array", "items": {"enum": [1, 2, 3]},
                                                     "maxItems": 3, "uniqueItems": True}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
CALLS_ID = next(i for i, tag in MISTRAL_TAGS.items() if tag == "[TOOL_CALLS]")  # (the same in both tokenizers)
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
FORMATS = {"mistral": build_mistral_tools_tokenizer, "mistral_args": build_mistral_args_tokenizer}
# A bias on [TOOL_CALLS] under "auto" that makes the random model call: at once ("mistral"), or at once or after
# some text ("mistral_args", where text may come first).
CALL_BIAS = {"mistral": 100, "mistral_args": 6}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Format -> an httpx client of a server on a tiny model whose tokenizer and template write it (each started
    on first use, stopped with the module)."""
    clients = {}
    with contextlib.ExitStack() as stack:
        def http(tool_format: str):
            if tool_format not in clients:
                base = tmp_path_factory.mktemp(tool_format)
                model = build_tiny_model_dir(base / "model", FORMATS[tool_format](base / "tokenizer"))
                clients[tool_format] = stack.enter_context(serving(model, MODEL))
            return clients[tool_format]

        yield http


def _chat(http, **body) -> dict:
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 80,
                                                **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


@pytest.mark.parametrize("tool_format", FORMATS)
@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_are_written_with_the_tags_and_come_back_as_tool_calls(served, tool_format, parallel):
    for seed in (1, 2):
        choice = _chat(served(tool_format), tool_choice="required", parallel_tool_calls=parallel, seed=seed,
                       logprobs=True)
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        assert_tool_calls_valid(choice["message"]["tool_calls"], SCHEMAS)
        assert len(choice["message"]["tool_calls"]) == 1 or parallel
        written = [t["token"] for t in choice["logprobs"]["content"]]
        assert written[0] == "[TOOL_CALLS]"
        calls = len(choice["message"]["tool_calls"])
        if tool_format == "mistral":  # one token before the array
            assert "[TOOL_CALLS]" not in written[1:]
        else:  # both tags per call
            assert written.count("[TOOL_CALLS]") == written.count("[ARGS]") == calls


@pytest.mark.parametrize("tool_format", FORMATS)
@pytest.mark.parametrize("tool_choice", ["required", "auto"])
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_streamed_calls_match_the_whole_answer(served, tool_format, tool_choice, skip_special_tokens):
    # (one backend: under `auto` a repeat may be served by the other, whose masks allow other spellings)
    bias = CALL_BIAS[tool_format] if tool_choice == "auto" else 0
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 80,
            "logit_bias": {str(CALLS_ID): bias}, "skip_special_tokens": skip_special_tokens,
            "constraint_backend": "llguidance"}
    called = 0
    for seed in (1, 2, 3):
        message = assert_stream_matches_whole_answer(served(tool_format), {**body, "seed": seed, "logprobs": True})
        assert "[TOOL_CALLS]" not in (message["content"] or "")
        if message.get("tool_calls"):  # (under "auto" with a mild bias, text may come first, or alone)
            assert_tool_calls_valid(message["tool_calls"], SCHEMAS)
            called += 1
    assert called


@pytest.mark.parametrize("tool_format", FORMATS)
def test_a_conversation_with_calls_goes_back_through_the_template(served, tool_format):
    http = served(tool_format)
    first = _chat(http, tool_choice={"type": "function", "function": {"name": "get_time"}}, seed=5)["message"]
    [call] = first["tool_calls"]
    assert call["function"]["name"] == "get_time"
    messages = ASK + [first, {"role": "tool", "tool_call_id": call["id"], "content": '{"time": "12:00"}'}]
    second = _chat(http, messages=messages, tool_choice="required", seed=6)
    assert second["finish_reason"] == "tool_calls"
    assert_tool_calls_valid(second["message"]["tool_calls"], SCHEMAS)


def test_the_calls_may_begin_with_a_space_as_mistral_v0_3_writes_them(served):
    """`[TOOL_CALLS] [`: SentencePiece's `▁[` after the token, as the model learned it, is the calls' beginning."""
    from transformers import AutoTokenizer

    spaced = AutoTokenizer.from_pretrained(str(TOKENIZERS["phi3"])).convert_tokens_to_ids("▁[")
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 80, "seed": 2,
            "logit_bias": {str(spaced): 100}, "constraint_backend": "llguidance"}
    assert_tool_calls_valid(assert_stream_matches_whole_answer(served("mistral"), body)["tool_calls"], SCHEMAS)
    written = [t["token"] for t in _chat(served("mistral"), **body, logprobs=True)["logprobs"]["content"]]
    assert written[:2] == ["[TOOL_CALLS]", " ["]


def test_auto_calls_after_the_token_or_answers_in_text(served):
    """("mistral") A bias on the call token makes the random model call; against it, text, which never starts as
    calls would."""
    choice = _chat(served("mistral"), tool_choice="auto", seed=3, logit_bias={str(CALLS_ID): 100})
    assert choice["finish_reason"] == "tool_calls"
    assert_tool_calls_valid(choice["message"]["tool_calls"], SCHEMAS)
    for seed in (1, 2, 3):
        choice = _chat(served("mistral"), tool_choice="auto", seed=seed, max_tokens=12,
                       logit_bias={str(CALLS_ID): -100})
        message = choice["message"]
        assert message.get("tool_calls") is None and message["content"]
        assert message["content"].lstrip()[:1] not in ("[", "{")


def test_auto_answers_in_text_calls_or_text_then_calls(served):
    """("mistral_args") A bias on the call token makes the random model call, at once or after some text (which is
    the content); against it, text, which holds no tag."""
    seen = set()
    for seed, bias in [(0, 100), (1, 100), (0, 6), (1, 6), (2, 6), (3, 6)]:
        choice = _chat(served("mistral_args"), tool_choice="auto", seed=seed, max_tokens=60,
                       logit_bias={str(CALLS_ID): bias})
        message = choice["message"]
        assert "[TOOL_CALLS]" not in (message["content"] or "") and "[ARGS]" not in (message["content"] or "")
        if message.get("tool_calls"):
            assert_tool_calls_valid(message["tool_calls"], SCHEMAS)
            assert choice["finish_reason"] == "tool_calls"
            seen.add("text then calls" if message["content"] else "calls")
    assert seen == {"calls", "text then calls"}
    choice = _chat(served("mistral_args"), tool_choice="auto", seed=0, max_tokens=12,
                   logit_bias={str(CALLS_ID): -100})
    assert choice["message"].get("tool_calls") is None and choice["message"]["content"]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from openai import OpenAI

    base = tmp_path_factory.mktemp("mistral-tools")
    model = build_tiny_model_dir(base / "model", build_template_tokenizer(base / "tokenizer", MISTRAL_TOOLS_TEMPLATE))
    with ServerProcess("--model", str(model), "--served-model-name", MODEL) as proc:
        yield OpenAI(base_url=proc.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_calls_ids_go_back_in_history(client):
    messages = [{"role": "user", "content": "What time is it in Paris?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS[1:], tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=60, seed=1).choices[0].message
    [call] = first.tool_calls
    assert call.id.startswith("call_") and len(call.id) > 9
    messages += [first.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"time": "12:00"})}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS[1:], tool_choice="required",
                                            max_tokens=60, seed=2)
    assert second.choices[0].finish_reason == "tool_calls"
    assert json.loads(second.choices[0].message.tool_calls[0].function.arguments)["zone"] is not None
