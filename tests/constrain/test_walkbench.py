"""constrain/walkbench.py: on the committed MaskBench subset, every document that a budgeted random walk through a
compiled case's mask finishes is valid against the case's schema (the generation side of what MaskBench checks)."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("fmt, valid, invalid", [
    ("date-time", ["2020-01-01T00:00:00Z", "2020-02-29T23:59:59.5+05:30"],
     ["2020-01-01T00:00:00", "2020-01-01", "2021-02-29T00:00:00Z", "2020-01-01 00:00:00Z"]),
    ("time", ["00:00:00Z", "23:59:59.123-01:00"], ["00:00:00", "24:00:00Z", "0:00:00Z"]),
])
def test_times_are_judged_as_rfc_3339_that_python_reads(fmt, valid, invalid):
    """RFC 3339 asks an offset, which Python's `fromisoformat` does not: a time without one passed the oracle (QA
    realschemas)."""
    check = validator_for({"type": "string", "format": fmt})
    assert [v for v in valid if not check.is_valid(v)] == [] and [v for v in invalid if check.is_valid(v)] == []


def test_an_escaped_key_is_told_apart_from_escapes_in_values():
    assert ESCAPED_KEY.search('{"a": 1, "\\u0061": 2}')
    assert ESCAPED_KEY.search('{"x\\"\\u0062y" : 2}')
    assert not ESCAPED_KEY.search('{"a": "\\u0061", "b": ["\\u0062"]}')


def test_a_walk_that_spends_the_lexer_ends_as_given_up_not_as_a_disagreement(tmp_path, gpt2_compiler):
    """Handwritten/num4 (only a negative number in a narrow range can be valid, and following one spends
    llguidance's lexer): its walks used to stop the whole run with "the matcher refuses a token its mask
    allowed", the lookahead's probe having spent the lexer that the matcher shares."""
    from tests.constrain.test_hostile import LEXER_PUZZLE

    schema = {**LEXER_PUZZLE, "type": ["number", "boolean"], "not": {"multipleOf": 7}}  # (a late check)
    (tmp_path / "num.json").write_text(json.dumps({"schema": schema}))
    result = walk_case(tmp_path / "num.json", tmp_path, gpt2_compiler, walks=12, max_tokens=40)
    assert result.compiled and result.walks == 12 and result.invalid == []


def test_a_disagreement_is_counted_with_its_case(tmp_path, gpt2_compiler, monkeypatch):
    """A mask and a matcher that disagree are a bug: reported as an invalid walk of the case, and the run goes on."""
    from constrain import walkbench

    def disagree(*args, **kwargs):
        raise walkbench.WalkError("the matcher refuses a token its mask allowed")

    (tmp_path / "int.json").write_text(json.dumps({"schema": {"type": "integer"}}))
    monkeypatch.setattr(walkbench, "random_walk", disagree)
    result = walk_case(tmp_path / "int.json", tmp_path, gpt2_compiler, walks=2)
    assert result.invalid == ["walk error: the matcher refuses a token its mask allowed"] * 2
    assert "invalid=2" in walkbench.summary_line([result])


def test_not_strict_walks_count_documents_that_break_a_named_keyword_apart(tmp_path, gpt2_compiler):
    """As the server compiles a schema sent without `strict`: an overlapping oneOf is checked late, as in strict
    mode (its walks used to end in documents valid in both branches, since llguidance's lenient pass took it as
    an anyOf); a `not` of a backreference is named unenforced, and the documents that break it are counted as
    `named`, not as bugs."""
    from constrain import walkbench

    overlap = {"type": "object", "properties": {"v": {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]}},
               "required": ["v"], "additionalProperties": False}
    named = {"enum": ["aa", "ab"], "not": {"pattern": "^(a)\\1$"}}
    (tmp_path / "overlap.json").write_text(json.dumps({"schema": overlap}))
    (tmp_path / "named.json").write_text(json.dumps({"schema": named}))
    result = walk_case(tmp_path / "overlap.json", tmp_path, gpt2_compiler, walks=12, max_tokens=24, strict=False)
    assert result.compiled and result.ended >= 6 and result.invalid == [] and result.named == 0
    result = walk_case(tmp_path / "named.json", tmp_path, gpt2_compiler, walks=12, max_tokens=24, strict=False)
    assert result.compiled and result.ended == 12 and result.invalid == [] and 0 < result.named < 12
    assert f"named={result.named}" in walkbench.summary_line([result])
