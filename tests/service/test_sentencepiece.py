"""Through the real server on a SentencePiece tokenizer (Phi-3's: spaces written as '▁', a BOS added to string
prompts, byte fallback): text a constraint forces, and completions' offsets over an echoed prompt."""

from __future__ import annotations

import pytest

from tests.service.conftest import serving

MODEL = "tiny-phi3"


@pytest.fixture(scope="module")
def phi3(tiny_model_dirs):
    with serving(tiny_model_dirs["phi3"], MODEL) as client:
        yield client


@pytest.mark.parametrize("constraint, answers", [
    ({"choice": ["\u2581"]}, {"\u2581"}),
    ({"regex": "[ab]\u2581x"}, {"a\u2581x", "b\u2581x"}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "k", "strict": True, "schema": {
        "type": "object", "properties": {"\u2581k": {"const": "\u2581v"}}, "required": ["\u2581k"],
        "additionalProperties": False}}}}, {'{"\u2581k":"\u2581v"}'}),
])
def test_a_forced_space_marker_is_answered_as_the_character(phi3, constraint, answers):
    """A '\u2581' the constraint forces was a 500 ("token 29871 was sampled but the grammar rejected it"): the
    tokenizer's piece for it spells a space."""
    for seed in range(3):
        r = phi3.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "go"}],
                                                    "max_tokens": 20, "seed": seed, **constraint})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["message"]["content"].replace(" ", "") in answers


def test_echoed_offsets_follow_the_prompt_text(phi3):
    """A string prompt's tokens are <s>, '▁hello', '▁world' while its text is "hello world": the offsets counted
    the BOS's 3 characters and the first piece's space ([0, 3, 9], the generated tokens past the text's end)."""
    body = {"model": MODEL, "prompt": "hello world", "max_tokens": 2, "echo": True, "logprobs": 0,
            "regex": "!!", "temperature": 0}
    choice = phi3.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["text"] == "hello world!!"
    offsets = choice["logprobs"]["text_offset"]
    assert offsets[:4] == [0, 0, 5, 11] and all(offset < len(choice["text"]) for offset in offsets)
