"""A checked matcher (constrain/checked.py) refuses in `accept` what its check clears from the mask, as the
`Matcher` interface promises, whether or not a mask was filled at that state, and stays where it was."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from constrain import ConstraintSpec
from constrain.checked import CheckedMatcher, backend_matcher
from tests.constrain.conftest import allowed_ids

# (schema, prefix the backend and the check allow, next text the backend allows and the check refuses, a way on)
CASES = {
    "plain keys": ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"\\', "u", 'n": 1}'),
    "unique items": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1,1", "]", "2]"),
    "late oneOf": ({"type": "array", "items": {"oneOf": [{"type": "integer", "minimum": 0},
                                                         {"type": "integer", "maximum": 10}]}}, "[5", "]", "0]"),
}


def _token(vocab, text: str) -> int:
    return vocab.token_bytes.index(text.encode())


def _feed(matcher, vocab, text: str, fill: bool) -> None:
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    for ch in text:
        tok = _token(vocab, ch)
        if fill:
            matcher.fill_bitmask(bitmask, 0)
            assert tok in allowed_ids(bitmask)
        assert matcher.accept(tok), ch


@pytest.mark.parametrize("fill", [True, False], ids=["after a mask", "without a mask"])
@pytest.mark.parametrize("name", list(CASES))
def test_accept_refuses_the_tokens_the_check_clears_from_the_mask(name, fill, gpt2_compiler, vocabs):
    schema, prefix, refused, way_on = CASES[name]
    vocab = vocabs["gpt2"]
    grammar = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, backend="llguidance"))
    matcher = grammar.matcher()
    assert isinstance(matcher, CheckedMatcher)
    _feed(matcher, vocab, prefix, fill)
    token = _token(vocab, refused)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    backend_matcher(matcher).fill_bitmask(bitmask, 0)
    assert token in allowed_ids(bitmask)  # the backend alone takes it
    if fill:
        matcher.fill_bitmask(bitmask, 0)
        assert token not in allowed_ids(bitmask)
    assert not matcher.accept(token)
    assert not matcher.accept(token)  # (and again: the refusal did not move the matcher)
    _feed(matcher, vocab, way_on, fill)
    assert matcher.can_end()
    assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(prefix + way_on))
