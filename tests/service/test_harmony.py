"""A model in gpt-oss's harmony format (constrain/harmony.py): its reasoning messages come back as
`reasoning_content`, the final message as `content` under the request's constraint, a call as `tool_calls`; the
history goes back through its template (reasoning as `thinking`, one call per message) and `reasoning_effort` reaches
it. A real server on a tiny random model with the harmony-shaped test template (tests/tokenizers/harmony)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from transformers import AutoTokenizer

from service.chat_template import ChatTemplate
from service.protocol import ChatMessage
from tests.conftest import build_harmony_model_dir
from tests.service.conftest import assert_stream_matches_whole_answer, assert_tool_calls_valid, serving

MODEL = "harmony-tiny"
CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                         "population": {"type": "integer", "minimum": 0}},
        "required": ["name", "population"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_city", "parameters": CITY}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
MESSAGES = [{"role": "user", "content": "Name a city and its population."}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_harmony_model_dir(tmp_path_factory.mktemp("harmony"))


@pytest.fixture(scope="module")
def http(model_dir):
    with serving(model_dir, MODEL) as c:
        yield c


@pytest.fixture(scope="module")
def ids(model_dir):
    """The first token of each header word, to steer the random model with logit_bias."""
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return {word.strip(): str(tok.encode(word, add_special_tokens=False)[0])
            for word in ("analysis", "final", "comment", " to")}


def _chat(http, **body) -> dict:
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_reasoning_comes_back_apart_and_the_final_message_is_valid(http, ids):
    """A bias on "analysis" makes the random model reason; it never ends that by itself: `<|end|>` comes when only
    the way to the shortest answer still fits (here 13 tokens: the tags, "assistant", "final" and 7 of JSON)."""
    for max_tokens in (20, 40):
        body = _chat(http, response_format=RESPONSE_FORMAT, max_tokens=max_tokens, seed=1,
                     logit_bias={ids["analysis"]: 100})
        message, usage = body["choices"][0]["message"], body["usage"]
        jsonschema.validate(json.loads(message["content"]), CITY)
        assert message["reasoning_content"] and body["choices"][0]["finish_reason"] == "stop"
        assert "<|" not in message["reasoning_content"] + message["content"]  # (the reasoning is the biased word)
        assert 2 < usage["completion_tokens_details"]["reasoning_tokens"] < usage["completion_tokens"] <= max_tokens
    at_once = _chat(http, response_format=RESPONSE_FORMAT, max_tokens=30, logit_bias={ids["final"]: 100})
    message = at_once["choices"][0]["message"]
    assert message["reasoning_content"] is None and json.loads(message["content"])["population"] >= 0
    assert at_once["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


def test_reasoning_messages_come_back_a_line_apart(http, ids, model_dir):
    """Several analysis messages were joined as they were: words of two messages ran together (QA reasoning D2).
    A bias on `<|end|>` and "analysis" makes the random model write short reasoning messages, one after another."""
    end = str(AutoTokenizer.from_pretrained(str(model_dir)).convert_tokens_to_ids("<|end|>"))
    request = {"model": MODEL, "messages": MESSAGES, "max_tokens": 60, "seed": 1, "response_format": RESPONSE_FORMAT,
               "logit_bias": {end: 10, ids["analysis"]: 10}}
    message = assert_stream_matches_whole_answer(http, request)
    jsonschema.validate(json.loads(message["content"]), CITY)
    parts = message["reasoning_content"].split("\n")
    assert len(parts) > 1 and all(parts), message["reasoning_content"]


def test_unconstrained_answers_keep_the_format_out_of_the_text(http, ids):
    for bias in ({ids["analysis"]: 100}, {ids["final"]: 100}):
        message = assert_stream_matches_whole_answer(http, {"model": MODEL, "messages": MESSAGES, "max_tokens": 24,
                                                            "seed": 4, "logit_bias": bias})
        assert "<|" not in (message["content"] or "") + (message["reasoning_content"] or "")
        assert (message["reasoning_content"] is not None) == (ids["analysis"] in bias)


def test_a_free_final_message_that_max_tokens_cuts_ends_length(http, ids):
    for tools in ({}, {"tools": TOOLS, "tool_choice": "auto"}):
        r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 16,
                                                    "seed": 2, "ignore_eos": True, "logit_bias": {ids["final"]: 100},
                                                    **tools}).json()
        assert r["choices"][0]["finish_reason"] == "length" and r["choices"][0]["message"]["content"], r


def test_calls_come_back_as_tool_calls_whole_and_streamed(http, ids):
    body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 48}
    names = set()
    # (with reasoning, which the bias keeps going until the budget ends it, the arguments are served by outlines,
    # whose shortest completions are exact: llguidance's may grow as answers teach it, which moves that end)
    for seed, choice, bias, backend in [(1, "required", {}, None), (2, "required", {ids["analysis"]: 100}, "outlines"),
                                        (3, "auto", {ids["comment"]: 100}, None),
                                        (4, {"type": "function", "function": {"name": "get_time"}}, {}, None)]:
        request = {**body, "seed": seed, "tool_choice": choice, "logit_bias": bias}
        if backend:  # (outlines enforces no `minimum`: the function it serves here is get_time)
            request.update(constraint_backend=backend, tools=TOOLS[1:])
        message = assert_stream_matches_whole_answer(http, {**request, "logprobs": True})
        assert_tool_calls_valid(message["tool_calls"], {"get_city": CITY, "get_time": TIME})
        assert message["content"] is None and len(message["tool_calls"]) == 1
        assert message["reasoning_content"] or ids["analysis"] not in bias  # (with tools, a preamble is too)
        names.add(message["tool_calls"][0]["function"]["name"])
        whole = http.post("/v1/chat/completions", json={**request, "logprobs": True}).json()["choices"][0]
        assert whole["finish_reason"] == ("stop" if isinstance(choice, dict) else "tool_calls")  # (as OpenAI's)
        # (a call's logprobs are its arguments': `<|message|>` alone of its header was listed, QA reasoning D1)
        listed = "".join(entry["token"] for entry in whole["logprobs"]["content"])
        assert listed == whole["message"]["tool_calls"][0]["function"]["arguments"], listed
    assert "get_time" in names


def test_the_header_and_fingerprint_name_each_backend_a_call_may_be_served_by(http):
    """Each function's arguments are a grammar of their own, which the auto policy moves to outlines once built:
    get_time's (built here at once) while get_city's stay on llguidance (outlines enforces no `minimum`). The
    header named get_city's backend alone, so a seed's call came in other tokens under the same header (CI)."""
    body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS[1:], "tool_choice": "required", "max_tokens": 24,
            "seed": 1}
    built = http.post("/v1/chat/completions", json={**body, "constraint_backend": "outlines"})
    assert built.headers["x-structgen-constraint-backend"] == "outlines"
    both = http.post("/v1/chat/completions", json={**body, "tools": TOOLS})
    city = http.post("/v1/chat/completions", json={**body, "tools": TOOLS[:1], "constraint_backend": "llguidance"})
    assert both.headers["x-structgen-constraint-backend"] == "llguidance+outlines"
    assert city.headers["x-structgen-constraint-backend"] == "llguidance"
    assert len({r.json()["system_fingerprint"] for r in (built, both, city)}) == 3


def test_auto_may_answer_in_text(http, ids):
    request = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 20,
               "seed": 5, "logit_bias": {ids["final"]: 100}}
    message = assert_stream_matches_whole_answer(http, request)
    assert message["content"] and not message.get("tool_calls")


@pytest.mark.parametrize("fields, param", [
    ({"messages": [*MESSAGES, {"role": "assistant", "content": ""}], "continue_final_message": True},
     "continue_final_message"),
    ({"add_generation_prompt": False}, "add_generation_prompt"),
    ({"messages": None, "prompt": "Name a city."}, "prompt")])
def test_tools_with_a_prompt_that_does_not_open_a_new_message_are_refused(http, fields, param):
    """A call is a message of its own after the reasoning ones: from a continued message (or a prompt that does not
    open the assistant's turn) the tool grammar wrote its reasoning messages inside, and the whole answer left that
    reasoning out, the stream sent it, and neither counted it (QA reasoning F1). Without tools it goes on as text."""
    body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required", "max_tokens": 12,
            **fields}
    body = {k: v for k, v in body.items() if v is not None}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "tool calls are messages of their own" in r.json()["error"]["message"]
    assert http.post("/v1/chat/completions", json={**body, "tool_choice": "none"}).status_code == 200


def test_tools_with_a_response_format_put_it_on_the_final_message(http, ids):
    body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "response_format": RESPONSE_FORMAT,
            "max_tokens": 40, "seed": 6}
    answer = assert_stream_matches_whole_answer(http, {**body, "logit_bias": {ids["final"]: 100}})
    assert not answer.get("tool_calls")
    jsonschema.validate(json.loads(answer["content"]), CITY)
    # (" to" too: after "commentary" a preamble may come instead of a call, as it did on a GPU in bfloat16)
    call = assert_stream_matches_whole_answer(http, {**body, "logit_bias": {ids["comment"]: 100, ids["to"]: 100}})
    assert_tool_calls_valid(call["tool_calls"], {"get_city": CITY, "get_time": TIME})


def test_history_with_calls_results_and_reasoning_goes_back_through_the_template(http, model_dir):
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}},
             {"id": "call_2", "type": "function", "function": {"name": "get_city",
                                                              "arguments": '{"name": "Oslo", "population": 1}'}}]
    history = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": calls,
                           "reasoning_content": "Both tools will tell."},
                          {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
                          {"role": "tool", "tool_call_id": "call_2", "content": "Oslo, 700000"}]
    body = _chat(http, messages=history, tools=TOOLS, max_tokens=8, seed=1)
    assert body["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    template = ChatTemplate(AutoTokenizer.from_pretrained(str(model_dir)))
    assert template.harmony and template.tool_format == "harmony"
    text = template.render([ChatMessage.model_validate(m) for m in history], tools=TOOLS)
    assert "to=functions.get_time <|constrain|>json<|message|>{\"zone\": \"UTC\"}<|call|>" in text
    assert "to=functions.get_city <|constrain|>json<|message|>" in text  # (each call its own message)
    assert "<|channel|>analysis<|message|>Both tools will tell.<|end|>" in text
    assert text.endswith("<|start|>assistant")


def test_reasoning_effort_reaches_the_template(http, model_dir):
    template = ChatTemplate(AutoTokenizer.from_pretrained(str(model_dir)))
    assert "Reasoning: high" in template.render([ChatMessage.model_validate(m) for m in MESSAGES],
                                                template_kwargs={"reasoning_effort": "high"})
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2,
                                                "reasoning_effort": "high"})
    assert r.status_code == 200 and "reasoning_effort" not in r.headers.get("x-structgen-ignored-fields", "")
    low = _chat(http, max_tokens=1, reasoning_effort="minimal")  # (gpt-oss's lowest level)
    assert low["usage"]["prompt_tokens"] == r.json()["usage"]["prompt_tokens"]
    top = _chat(http, max_tokens=1, reasoning_effort="max")  # (the SDK's highest level: gpt-oss's high)
    assert top["usage"]["prompt_tokens"] == r.json()["usage"]["prompt_tokens"]
    bad = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "reasoning_effort": "most"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"
