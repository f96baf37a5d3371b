"""IBM Granite 3's tool calls ("granite" in constrain/tools.py): the special token `<|tool_call|>`, then a JSON list of
calls, as "mistral" with its `[TOOL_CALLS]`. A real server on a tiny random model with the Granite-shaped test
template (tests/tokenizers/granite) and that token special, as in Granite's vocabulary."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from service.chat_template import ChatTemplate
from service.protocol import ChatMessage
from tests.conftest import GRANITE_TAGS, build_granite_tokenizer, build_tiny_model_dir
from tests.service.conftest import assert_stream_matches_whole_answer, assert_tool_calls_valid, serving

MODEL = "granite-tiny"
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
ASK = [{"role": "user", "content": "What time is it in Paris?"}]
CALL_ID = str(next(iter(GRANITE_TAGS)))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return build_granite_tokenizer(tmp_path_factory.mktemp("granite-tokenizer"))


@pytest.fixture(scope="module")
def http(tmp_path_factory, tokenizer_dir):
    with serving(build_tiny_model_dir(tmp_path_factory.mktemp("granite") / "model", tokenizer_dir), MODEL) as c:
        yield c


def _chat(http, **body) -> dict:
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 60,
                                                **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_the_template_sets_the_format_and_renders_calls_after_the_token(tokenizer_dir):
    template = ChatTemplate(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    assert template.tool_format == "granite"
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}]}]
    text = template.render([ChatMessage.model_validate(m) for m in history], tools=TOOLS)
    assert '<|tool_call|>[{"name": "get_time", "arguments": {"zone": "CET"}}]' in text


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_required_calls_follow_the_token_whole_and_streamed(http, skip_special_tokens):
    for seed in (1, 2):
        body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 60,
                "seed": seed, "skip_special_tokens": skip_special_tokens}
        message = assert_stream_matches_whole_answer(http, {**body, "logprobs": True})
        assert_tool_calls_valid(message["tool_calls"], {"get_time": TIME})
        assert message["content"] is None
    written = [t["token"] for t in _chat(http, tool_choice="required", seed=1, logprobs=True)["logprobs"]["content"]]
    assert written[0] == "<|tool_call|>" and written[1].strip().startswith("[")  # (the array right after it)


def test_auto_calls_after_the_token_or_answers_in_text(http):
    choice = _chat(http, tool_choice="auto", seed=3, logit_bias={CALL_ID: 100})
    assert choice["finish_reason"] == "tool_calls"
    assert_tool_calls_valid(choice["message"]["tool_calls"], {"get_time": TIME})
    for seed in (1, 2):
        message = _chat(http, tool_choice="auto", seed=seed, max_tokens=12, logit_bias={CALL_ID: -100})["message"]
        assert message.get("tool_calls") is None and message["content"].lstrip()[:1] not in ("[", "{")


def test_free_text_never_begins_with_the_call_token_spelled_out(tokenizer_dir):
    """`<|tool_call|>` spelled in ordinary tokens decodes as the token does, and the parser reads the list after it
    as calls: such free text came back as calls no grammar held (QA toolfmt F1, unsound)."""
    from constrain import parse_tool_calls, spec_from_request
    from tests.constrain.conftest import compiling, takes_spelled

    with compiling(tokenizer_dir, "qwen2") as (tok, vocab, compiler):
        spec = spec_from_request(tools=TOOLS, tool_choice="auto", tool_format="granite")
        grammar = compiler.compile(spec)
        text = b'<|tool_call|>[{"name": "get_time", "arguments": {"zone": 5}}]'
        assert parse_tool_calls(text.decode(), spec) is not None  # (what it would be read as)
        assert not takes_spelled(grammar, vocab, text) and not takes_spelled(grammar, vocab, b"\n<|tool_call|>x")
        assert takes_spelled(grammar, vocab, b"Noon. <|tool_call|> is a token.")
