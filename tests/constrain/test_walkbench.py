"""constrain/walkbench.py: on the committed MaskBench subset, every document that a budgeted random walk through a
compiled case's mask finishes is valid against the case's schema (the generation side of what MaskBench checks)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from constrain import GrammarCompiler
from constrain.walkbench import ESCAPED_KEY, validator_for, walk_case

CASES = Path(__file__).parent / "maskbench_cases"


@pytest.fixture(scope="module")
def walked(tokenizers, vocabs):
    compiler = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="llguidance")
    yield [walk_case(p, CASES, compiler, walks=2, max_tokens=120) for p in sorted(CASES.rglob("*.json"))]
    compiler.close()


def test_every_document_a_walk_finishes_is_valid(walked):
    """Caught, before they were mended: dates of year 0000 written by the budget completion (llguidance's own
    `date`), and late `not`s in definitions that were never checked (Handwritten/object5)."""
    assert [f"{r.case}: {why}" for r in walked for why in r.invalid] == []
    compiled = [r for r in walked if r.compiled]
    assert len(compiled) >= 0.9 * len(walked)
    assert sum(r.ended for r in compiled) >= 1.5 * len(compiled)  # most walks finish a document to judge


def test_multiple_of_is_judged_in_decimal():
    """JSON Schema's multipleOf is decimal; jsonschema divides in floating point (550.44 / 0.01 is not whole)."""
    assert not jsonschema.Draft202012Validator({"multipleOf": 0.01}).is_valid(550.44)
    v = validator_for({"multipleOf": 0.01})
    assert v.is_valid(550.44) and v.is_valid(-34.84) and v.is_valid(3) and not v.is_valid(550.445)


def test_an_escaped_key_is_told_apart_from_escapes_in_values():
    assert ESCAPED_KEY.search('{"a": 1, "\\u0061": 2}')
    assert ESCAPED_KEY.search('{"x\\"\\u0062y" : 2}')
    assert not ESCAPED_KEY.search('{"a": "\\u0061", "b": ["\\u0062"]}')
