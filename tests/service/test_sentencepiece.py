"""Through the real server on a SentencePiece tokenizer (Phi-3's: spaces written as '▁', a BOS added to string
prompts, byte fallback): text a constraint forces."""

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

