"""Hermes calls where `<tool_call>` and `</tool_call>` are special tokens of the vocabulary (as where a fine-tune
renamed a base model's reserved special tokens to them): the model writes the tag tokens, and the calls come back as `tool_calls`, whole and
streamed, whatever `skip_special_tokens` says (the text keeps them: they are how the calls are read back)."""

from __future__ import annotations


import pytest

from tests.conftest import QWEN_TOOL_TAGS, build_special_tags_tokenizer, build_tiny_model_dir
from tests.service.conftest import assert_stream_matches_whole_answer, assert_tool_calls_valid, serving

MODEL = "hermes-special-tags-tiny"
OPEN_ID = min(QWEN_TOOL_TAGS)
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
ASK = [{"role": "user", "content": "What time is it in Paris?"}]


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    base = tmp_path_factory.mktemp("hermes-special-tags")
    with serving(build_tiny_model_dir(base / "model", build_special_tags_tokenizer(base / "tokenizer")), MODEL) as c:
        yield c


def _check(message: dict) -> None:
    assert "<tool_call>" not in (message["content"] or "")
    assert_tool_calls_valid(message["tool_calls"], {"get_time": TIME})


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_calls_written_with_the_special_tags_come_back_as_tool_calls(http, skip_special_tokens):
    for tool_choice in ("required", "auto"):  # (the tag's token made likely: its text may also be spelled out)
        body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 60,
                "seed": 1, "logit_bias": {str(OPEN_ID): 100}, "skip_special_tokens": skip_special_tokens,
                "logprobs": True}
        whole = http.post("/v1/chat/completions", json=body).json()["choices"][0]
        assert whole["finish_reason"] == "tool_calls"
        _check(whole["message"])
        assert "<tool_call>" in [t["token"] for t in whole["logprobs"]["content"]]  # (the tag token itself)
        _check(assert_stream_matches_whole_answer(http, {**body, "constraint_backend": "llguidance"}))
