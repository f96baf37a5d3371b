"""A constraint continuing a prefill (constrain/continued.py): the prefill and every continuation the mask allows
form one valid document, on both backends, with the budget rule counted from the prefill's end."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from constrain import ConstraintError, ConstraintSpec
from constrain.continued import ContinuedGrammar
from tests.constrain.conftest import decode, random_walk

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
          "required": ["name", "tags"], "additionalProperties": False}


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
@pytest.mark.parametrize("prefill", ['{"name": "Al', '{"name": "Alice", "tags": [', ""])
def test_every_continuation_completes_the_prefill_into_a_valid_document(backend, prefill, gpt2_compiler, vocabs):
    vocab = vocabs["gpt2"]
    g = ContinuedGrammar(gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=SCHEMA, backend=backend)),
                         vocab, prefill, "response_format")
    shortest = g.matcher().min_tokens_to_end()
    rng = random.Random(5)
    for max_tokens in (shortest, shortest + 4, 40):
        toks, ended = random_walk(g, vocab, rng, max_tokens, budget=True, prefer_end=0.4)
        assert ended
        jsonschema.validate(json.loads(prefill + decode(vocab, toks)), SCHEMA)


@pytest.mark.parametrize("prefill", ['{"nom": ', '[', '{"name": "Alice", "tags": ["c'])
def test_a_prefill_the_constraint_cannot_continue_is_refused_naming_messages(prefill, gpt2_compiler, vocabs):
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=SCHEMA, backend="llguidance"))
    with pytest.raises(ConstraintError) as exc:
        ContinuedGrammar(g, vocabs["gpt2"], prefill, "response_format")
    assert exc.value.param == "messages" and "response_format" in exc.value.message
    assert repr(prefill) in exc.value.message  # (it quoted only what fit: '' where the first token did not)
    where = "at its start" if prefill == "[" else "after '{"
    assert where in exc.value.message


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_a_refused_prefill_is_quoted_up_to_a_whole_character(backend, gpt2_compiler, vocabs):
    """GPT-2 spells U+2028 as `\\xe2\\x80` (which ’ begins with too) and `\\xa8`, which the pattern refuses: the quote
    of what fit ended in half a character, written as U+FFFD (QA round 27)."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[a-z’]*$"}},
              "additionalProperties": False}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, backend=backend))
    with pytest.raises(ConstraintError) as exc:
        ContinuedGrammar(g, vocabs["gpt2"], '{"s":"\u2028', "response_format")
    assert "after '{\"s\":\"'" in exc.value.message and "\ufffd" not in exc.value.message
