"""Tool calling with a model whose chat template asks for GLM-4.5's calls (`<tool_call>NAME`, then `<arg_key>` and
`<arg_value>` tags per argument, all special tokens): the server writes the tags as their tokens, decodes tool
requests with them, and returns, streams and renders back the calls."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.conftest import build_glm45_tokenizer, build_tiny_model_dir
from tests.serverproc import ServerProcess
from tests.service.conftest import assert_stream_matches_whole_answer

MODEL = "glm-tiny"
NOTE = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 16},
                                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
                                         "due": {"type": ["string", "null"], "format": "date"}},
        "required": ["title", "due"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "add_note", "strict": True, "parameters": NOTE}}]
ASK = [{"role": "user", "content": "Note: buy milk"}]


@pytest.fixture(scope="module")
def glm_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("glm")
    model = build_tiny_model_dir(base / "model", build_glm45_tokenizer(base / "tokenizer"))
    with ServerProcess("--model", str(model), "--served-model-name", MODEL) as proc:
        with httpx.Client(base_url=proc.base_url, timeout=120) as http:
            yield http


def test_required_calls_come_back_and_stream_as_the_whole_answer(glm_server):
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 80}
    for seed in (1, 2):
        message = assert_stream_matches_whole_answer(glm_server, {**body, "seed": seed, "logprobs": True})
        assert message["tool_calls"] and message["content"] is None
        for call in message["tool_calls"]:
            assert call["function"]["name"] == "add_note"
            jsonschema.validate(json.loads(call["function"]["arguments"]), NOTE)


def test_history_calls_go_back_through_the_template(glm_server):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "add_note", "arguments": '{"title": "milk", "due": null}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "saved"}]
    r = glm_server.post("/v1/chat/completions", json={"model": MODEL, "messages": history, "tools": TOOLS,
                                                      "tool_choice": "required", "max_tokens": 80, "seed": 3})
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and choice["finish_reason"] == "tool_calls"
    jsonschema.validate(json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]), NOTE)
