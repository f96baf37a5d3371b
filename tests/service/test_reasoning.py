"""A model that thinks before answering (Qwen3's shape): the `<think>` block comes back as `reasoning_content`, the
constraint applies to the answer after it, and stop strings and logprobs belong to the answer. A real server on
a tiny random model with the Qwen3-style test template (tests/tokenizers/qwen3_thinking)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.conftest import QWEN3_THINK_TAGS, build_qwen3_thinking_tokenizer, build_tiny_model_dir
from tests.serverproc import ServerProcess
from tests.service.conftest import assert_stream_matches_whole_answer

MODEL = "qwen3-thinking-tiny"
OPEN, CLOSE = QWEN3_THINK_TAGS
OPEN_TAG, CLOSE_TAG = QWEN3_THINK_TAGS[OPEN], QWEN3_THINK_TAGS[CLOSE]
CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                         "population": {"type": "integer", "minimum": 0}},
        "required": ["name", "population"], "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
MESSAGES = [{"role": "user", "content": "Name a city and its population."}]
OPENED = {"think_opened": True}  # the template opens the block in the prompt, as DeepSeek-R1's does


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("qwen3-thinking")
    return build_tiny_model_dir(base / "model", build_qwen3_thinking_tokenizer(base / "tokenizer"))


@pytest.fixture(scope="module")
def server(model_dir):
    with ServerProcess("--model", str(model_dir), "--served-model-name", MODEL) as proc:
        yield proc


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(http, **body) -> dict:
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, **body})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("max_tokens", [12, 40])
def test_a_constrained_answer_follows_the_block_whatever_the_budget(client, max_tokens):
    """The random model never closes its block by itself: the close tag comes when only it and the shortest
    answer still fit, and the answer is valid."""
    for seed in range(3):
        out = client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=RESPONSE_FORMAT,
                                             max_tokens=max_tokens, seed=seed, extra_body={
                                                 "chat_template_kwargs": OPENED})
        choice = out.choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), CITY)
        reasoning = choice.message.model_extra["reasoning_content"]
        assert reasoning and "</think>" not in reasoning and "</think>" not in choice.message.content
        details = out.usage.completion_tokens_details
        assert 0 < details.reasoning_tokens < out.usage.completion_tokens <= max_tokens


@pytest.mark.parametrize("pattern", [" [a-z]{3}", "\n[0-9]{2}", "  +x"])
def test_whitespace_the_answers_grammar_writes_after_the_block_is_the_answers(http, pattern):
    """Whitespace after the block was stripped from the answer whatever wrote it: a regex `' [a-z]{3}'` answered
    `'eql'`, which does not match it. Only the whitespace the reasoning matcher takes itself is dropped."""
    import re

    body = _chat(http, regex=pattern, max_tokens=40, temperature=0, logit_bias={str(CLOSE): 100},
                 chat_template_kwargs=OPENED)
    content = body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "stop" and re.fullmatch(pattern, content), content


def test_the_model_may_open_the_block_itself(http):
    """Qwen3's template leaves the block to the model: its first token may be the open tag (here by logit_bias,
    which also fills the block with open tags, ordinary text inside it); the answer after the block is valid."""
    body = _chat(http, response_format=RESPONSE_FORMAT, max_tokens=30, logit_bias={str(OPEN): 100})
    message = body["choices"][0]["message"]
    jsonschema.validate(json.loads(message["content"]), CITY)
    assert message["reasoning_content"].replace("<think>", "") == ""
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] >= 2  # (both tags count)


def test_the_model_may_answer_at_once(http):
    body = _chat(http, response_format=RESPONSE_FORMAT, max_tokens=30, logit_bias={str(OPEN): -100})
    message = body["choices"][0]["message"]
    jsonschema.validate(json.loads(message["content"]), CITY)
    assert message["reasoning_content"] is None and message["reasoning"] is None
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


def test_thinking_switched_off_in_the_template_means_no_block(http):
    """Qwen3's `enable_thinking: false` writes an empty block into the prompt: the open tag is not offered and
    there is no reasoning_content."""
    body = _chat(http, response_format=RESPONSE_FORMAT, max_tokens=30, logit_bias={str(OPEN): 100},
                 chat_template_kwargs={"enable_thinking": False})
    message = body["choices"][0]["message"]
    jsonschema.validate(json.loads(message["content"]), CITY)
    assert "reasoning_content" not in message and "reasoning" not in message
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


def test_stop_strings_and_logprobs_belong_to_the_answer(http):
    """A stop string inside the block does not end the output, and logprobs cover the answer's tokens only."""
    # every token is the open tag: the prompt's block fills with "<think>" text, which is also the stop string
    body = _chat(http, max_tokens=8, logit_bias={str(OPEN): 100}, stop=["<think>"],
                 chat_template_kwargs=OPENED, logprobs=True)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["reasoning_content"] == "<think>" * 8
    assert choice["message"]["content"] == "" and choice["logprobs"]["content"] == []
    answer = _chat(http, response_format=RESPONSE_FORMAT, max_tokens=24, seed=4, chat_template_kwargs=OPENED,
                   logprobs=True)["choices"][0]
    assert "".join(t["token"] for t in answer["logprobs"]["content"]) == answer["message"]["content"]


@pytest.mark.parametrize("kwargs", [OPENED, {}], ids=["opened", "model-opens"])
def test_the_stream_assembles_to_the_whole_answer(http, kwargs):
    for seed in range(3):
        message = assert_stream_matches_whole_answer(http, {
            "model": MODEL, "messages": MESSAGES, "response_format": RESPONSE_FORMAT, "max_tokens": 30,
            "seed": seed, "chat_template_kwargs": kwargs, "logit_bias": {str(OPEN): 3}})
        jsonschema.validate(json.loads(message["content"]), CITY)


def test_tool_calls_follow_the_block(http):
    tools = [{"type": "function", "function": {"name": "get_city", "parameters": CITY}}]
    body = {"model": MODEL, "messages": MESSAGES, "tools": tools, "tool_choice": "required", "max_tokens": 40,
            "chat_template_kwargs": OPENED}
    for seed in range(2):
        message = assert_stream_matches_whole_answer(http, {**body, "seed": seed, "logprobs": True})
        assert message["reasoning_content"]
        [call] = message["tool_calls"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), CITY)


def test_thinking_that_runs_to_max_tokens_under_tools_auto_ends_with_no_answer(http):
    """Under tool_choice "auto" the answer had to hold a character: the budget rule closed the block with one
    token left and the closing walk's `}` was the whole answer, whatever the model (content "}", logprob 0). The
    answer may now be empty: the block runs to the last token, and nothing is made up after it. Its content is
    "", streamed too (the stream's reasoning deltas left it null: sent back, a 400)."""
    tools = [{"type": "function", "function": {"name": "get_city", "parameters": CITY}}]
    for seed in range(2):
        message = assert_stream_matches_whole_answer(http, {
            "model": MODEL, "messages": MESSAGES, "tools": tools, "tool_choice": "auto", "max_tokens": 10,
            "seed": seed, "chat_template_kwargs": OPENED})
        assert message["reasoning_content"] and message["content"] == "" and not message.get("tool_calls")


def test_a_prefill_that_opens_the_block_is_continued_as_reasoning_then_the_answer(http):
    """A continued assistant message "<think>\nLet me think" left the block open, yet its continuation (the rest
    of the reasoning, the close tag, the answer) came back as content, and a constraint applied from its start (a
    400: the prefill does not fit the schema). The continuation is reasoning until the close tag, then the answer."""
    prefill = [{"role": "assistant", "content": f"{OPEN_TAG}\nLet me think"}]
    for seed in range(2):
        message = assert_stream_matches_whole_answer(http, {
            "model": MODEL, "messages": MESSAGES + prefill, "continue_final_message": True,
            "response_format": RESPONSE_FORMAT, "max_tokens": 30, "seed": seed})
        assert message["reasoning_content"] and CLOSE_TAG not in message["reasoning_content"]
        jsonschema.validate(json.loads(message["content"]), CITY)


def test_a_prefill_that_closed_its_block_continues_the_answer_after_it(http):
    prefill = [{"role": "assistant", "content": f"{OPEN_TAG}\nParis is big.\n{CLOSE_TAG}\n\n{{\"name\": \"Par"}]
    body = {"model": MODEL, "messages": MESSAGES + prefill, "continue_final_message": True,
            "response_format": RESPONSE_FORMAT, "max_tokens": 30}
    for seed in range(2):
        message = _chat(http, **body, seed=seed)["choices"][0]["message"]
        jsonschema.validate(json.loads('{"name": "Par' + message["content"]), CITY)


def test_a_prefill_that_ends_with_its_closed_block_drops_the_whitespace_before_the_answer(http, model_dir):
    """After a block the model closes, the whitespace before the answer is dropped; after one a continued message
    closed, it stayed: the answer was "\n\n\n\n\n\n" (QA reasoning D3)."""
    from transformers import AutoTokenizer

    newlines = AutoTokenizer.from_pretrained(str(model_dir)).encode("\n\n", add_special_tokens=False)[0]
    prefill = [{"role": "assistant", "content": f"{OPEN_TAG}\nParis is big.\n{CLOSE_TAG}"}]
    body = {"model": MODEL, "messages": MESSAGES + prefill, "continue_final_message": True, "max_tokens": 4,
            "logit_bias": {str(newlines): 30}, "logprobs": True}
    for seed in range(2):
        message = assert_stream_matches_whole_answer(http, {**body, "seed": seed})
        assert message["content"] == message["content"].lstrip(), message


def test_reasoning_sent_back_in_history_is_rendered(http):
    """An assistant turn's `reasoning_content` (or `reasoning`, as other clients name it) goes to the template
    (Qwen3's writes it back as the block)."""
    turn = [{"role": "assistant", "content": "Paris."}]
    text = "The user wants a large city; Paris will do."
    follow_up = [{"role": "user", "content": "Another one?"}]
    plain = _chat(http, messages=MESSAGES + turn + follow_up, max_tokens=1)
    rich = _chat(http, messages=MESSAGES + [{**turn[0], "reasoning_content": text}] + follow_up, max_tokens=1)
    alias = _chat(http, messages=MESSAGES + [{**turn[0], "reasoning": text}] + follow_up, max_tokens=1)
    assert rich["usage"]["prompt_tokens"] == alias["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 8


def test_reasoning_none_makes_the_whole_output_the_answer(model_dir):
    """`--reasoning none` (here from its environment variable): the tags are ordinary text of the answer, and a
    constraint applies from the first token."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "logit_bias": {str(OPEN): 100}}
    with ServerProcess("--model", str(model_dir), "--served-model-name", MODEL,
                       env={"STRUCTGEN_REASONING": "none"}) as proc, \
            httpx.Client(base_url=proc.base_url, timeout=120) as plain:
        message = plain.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert message["content"] == "<think>" * 4 and "reasoning_content" not in message
        r = plain.post("/v1/chat/completions", json={**body, "max_tokens": 30, "response_format": RESPONSE_FORMAT,
                                                      "chat_template_kwargs": OPENED})
        jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), CITY)


def test_tools_with_a_response_format_follow_the_block_and_name_the_answers_unenforced_keywords(http):
    """Calls or an answer under the response_format after the block; the answer's keywords that nothing enforces
    are still named (the block's grammar wraps the choice between the two)."""
    schema = {**CITY, "properties": {**CITY["properties"], "motto": {"type": "string", "not": {"pattern": "(a)\\1"},
                                                                     "maxLength": 8}}}
    tools = [{"type": "function", "function": {"name": "get_city", "parameters": CITY}}]
    r = http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": MESSAGES, "tools": tools, "max_tokens": 60, "seed": 1,
        "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}})
    assert r.status_code == 200, r.text
    assert r.headers["x-structgen-unenforced"] == "response_format:/properties/motto/not"
    message = r.json()["choices"][0]["message"]
    if message.get("tool_calls"):
        jsonschema.validate(json.loads(message["tool_calls"][0]["function"]["arguments"]), CITY)
    else:
        jsonschema.validate(json.loads(message["content"]), schema)
