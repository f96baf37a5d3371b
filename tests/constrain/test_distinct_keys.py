"""No key twice in one JSON object (constrain/distinct_keys.py): the tokens that would close a key the object
already has are refused, through the real tokenizers' masks, whatever spells the key (in pieces, in one token,
after a comma, escaped); walks under open objects and JSON mode end without a repeated key."""

from __future__ import annotations

import json
import random

import pytest
import torch

from constrain import ConstraintSpec, GrammarCompiler
from constrain.distinct_keys import DistinctKeysGrammar
from constrain.grammar import ConstraintError
from constrain.outlines_backend import schema_regex
from constrain.support import outlines_unsupported
from constrain.spec import normalise_schema
from constrain.walkbench import decode, random_walk
from tests.constrain.conftest import allowed_ids

SCORES = {"type": "object", "additionalProperties": {"type": "integer"}}  # (pydantic's dict[str, int])


@pytest.fixture(scope="module")
def qwen(tokenizers, vocabs):
    c = GrammarCompiler(vocabs["qwen2"], tokenizers["qwen2"], backend="llguidance")
    yield c, tokenizers["qwen2"], vocabs["qwen2"]
    c.close()


def _pairs(text: str) -> list:
    found = []
    json.loads(text, object_pairs_hook=lambda p: found.append([k for k, _ in p]) or dict(p))
    return found


@pytest.mark.parametrize("spec", [
    ConstraintSpec(kind="json_schema", schema=SCORES, strict=True),
    ConstraintSpec(kind="json_schema", schema={"type": "object", "properties": {"tags": SCORES}}),
    ConstraintSpec(kind="json_object"),
], ids=["dict", "nested-dict", "json_object"])
def test_walks_write_no_key_twice_in_one_object(qwen, spec):
    """A property over whole walks (random keys seldom repeat, so these also passed before the check: the
    token-level tests below are the ones that fail without it)."""
    compiler, _, vocab = qwen
    g = compiler.compile(ConstraintSpec(kind=spec.kind, schema=normalise_schema(spec.schema) if spec.schema else None,
                                        strict=spec.strict))
    rng = random.Random(3)
    ended = 0
    for _ in range(16):
        tokens, done = random_walk(g, vocab, rng, 60, budget=True, prefer_end=0.02)
        if done:
            ended += 1
            assert all(len(set(keys)) == len(keys) for keys in _pairs(decode(vocab, tokens))), decode(vocab, tokens)
    assert ended >= 12


def _allowed_after(compiler, vocab, text: bytes) -> set[bytes]:
    m = compiler.compile(ConstraintSpec(kind="json_schema", schema=SCORES)).matcher()
    for piece in _pieces(vocab, text):
        assert m.accept(piece), text
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    m.fill_bitmask(bitmask, 0)
    return {vocab.token_bytes[i] for i in allowed_ids(bitmask).tolist()}


def _pieces(vocab, text: bytes) -> list[int]:
    """`text` one byte-token at a time (every byte is a token of a byte-level vocabulary)."""
    ids = vocab.ids_by_bytes()
    return [ids[bytes([c])] for c in text]


@pytest.mark.parametrize("written, refused, kept", [
    (b'{"ab": 1, "ab', [b'"', b'":'], [b'c', b'x']),  # the key written in pieces, closing
    (b'{"ab": 1, "\\u0061b', [b'"', b'":'], [b'c']),  # escaped
    (b'{"": 1,', [b' ""', b'""'], [b' "']),  # opened and closed in one token
    (b'{"": 1, ', [b'""'], [b'"']),
])
def test_tokens_that_close_a_key_the_object_has_are_refused(qwen, written, refused, kept):
    compiler, _, vocab = qwen
    allowed = _allowed_after(compiler, vocab, written)
    present = set(vocab.ids_by_bytes())
    assert all(r not in allowed for r in refused)
    assert any(r in present for r in refused)  # (the vocabulary has such a token: the check is not vacuous)
    assert all(k in allowed for k in kept if k in present)


def test_a_repeat_is_allowed_where_nothing_else_may_follow(qwen):
    """Every name a pattern admits used, and a comma written: the repeat (legal JSON) rather than a failed answer."""
    compiler, _, vocab = qwen
    schema = {"type": "object", "patternProperties": {"^[ab]$": {"type": "integer"}}, "additionalProperties": False}
    m = compiler.compile(ConstraintSpec(kind="json_schema", schema=schema)).matcher()
    for piece in _pieces(vocab, b'{"a": 1, "b": 2, "'):
        assert m.accept(piece)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    m.fill_bitmask(bitmask, 0)
    assert vocab.ids_by_bytes()[b"a"] in allowed_ids(bitmask).tolist()


@pytest.mark.parametrize("written, refused, kept", [
    (b'{"agh": 1, "ag', [b"h"], [b"i", b"a"]),  # (after `h` only a closing quote: the repeat)
    (b'{"agh": 1, "a', [b"gh"], [b"g", b"b"]),  # (tokens that end where the key does)
    (b'{"agh": 1, "', [b"agh"], [b"ag", b"a"]),
])
def test_tokens_after_which_only_a_repeated_key_may_close_are_refused(qwen, written, refused, kept):
    """Keys a pattern makes of one length (`^[a-z]{3}$`, closed object): after `{"agh": 1, "ag` an `h` left only
    the closing quote, so the repeat was allowed as the sole way on (Phi-3 at temperature 0 wrote
    `{"agh" :0,"agh":888...}` every time). The token that leads there is refused, one token ahead."""
    compiler, _, vocab = qwen
    schema = {"type": "object", "patternProperties": {"^[a-z]{3}$": {"type": "integer"}},
              "additionalProperties": False}
    m = compiler.compile(ConstraintSpec(kind="json_schema", schema=schema)).matcher()
    for piece in _pieces(vocab, written):
        assert m.accept(piece)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    m.fill_bitmask(bitmask, 0)
    allowed = {vocab.token_bytes[i] for i in allowed_ids(bitmask).tolist()}
    present = set(vocab.ids_by_bytes())
    assert all(r not in allowed for r in refused) and all(r in present for r in refused)
    assert all(k in allowed for k in kept if k in present)


def test_the_lookahead_runs_only_where_names_are_restricted(qwen, monkeypatch):
    """It cost a mask per key the object had at each key's step (0.3 s a step at 200 keys of a `dict[str, int]`,
    35 s for 300 on GPT-2): an open object's key may always go on, so it is not looked at there; where names are
    restricted it asks the backend for the bytes forced after a token, not for a mask."""
    from constrain.llg_backend import LlgMatcher

    compiler, _, vocab = qwen
    asked = []
    forced_after = LlgMatcher.forced_after
    monkeypatch.setattr(LlgMatcher, "forced_after",
                        lambda self, tokens: asked.append(tokens) or forced_after(self, tokens))
    monkeypatch.setattr(LlgMatcher, "mask_after", lambda self, tokens: pytest.fail("a mask after a token"))
    restricted = {"type": "object", "patternProperties": {"^k[0-9]+$": {"type": "integer"}},
                  "additionalProperties": False}
    for schema, looked in ((SCORES, False), (restricted, True)):
        m = compiler.compile(ConstraintSpec(kind="json_schema", schema=schema)).matcher()
        bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
        asked.clear()
        for piece in _pieces(vocab, b'{"k1": 1, "k2": 2, "k'):
            m.fill_bitmask(bitmask, 0)
            assert m.accept(piece)
        assert bool(asked) == looked


CLOSED = {"type": "object", "additionalProperties": False, "required": ["b"], "properties": {
    "a": {"type": "integer"}, "b": {"type": "boolean"},
    "c": {"type": "array", "maxItems": 3, "items": {"anyOf": [
        {"type": "object", "additionalProperties": False, "properties": {"x": {"type": "integer"},
                                                                          "y": {"type": "null"}}},
        {"type": "object", "additionalProperties": False, "required": ["y"],
         "properties": {"y": {"type": "boolean"}, "x": {"type": "null"}}}]}}}}


def _in_declared_order(keys: list[str], declared: list[list[str]]) -> bool:
    return any(keys == [k for k in order if k in keys] for order in declared)


def test_outlines_writes_each_declared_property_once_in_declared_order(tokenizers, vocabs):
    """Why an outlines grammar goes without the check (`GrammarCompiler._on_backend`): outlines serves only closed
    objects, and its automaton writes their properties once each, in declared order, optional ones included."""
    vocab = vocabs["qwen2"]
    compiler = GrammarCompiler(vocab, tokenizers["qwen2"], backend="outlines")
    try:
        g = compiler.compile(ConstraintSpec(kind="json_schema", schema=CLOSED, strict=True))
        assert g.backend == "outlines" and not isinstance(g, DistinctKeysGrammar)  # (no per-token follower)
        rng = random.Random(5)
        seen = set()
        for _ in range(40):
            tokens, done = random_walk(g, vocab, rng, 60, budget=True, prefer_end=0.02)
            assert done
            objects = _pairs(decode(vocab, tokens))
            for keys in objects:
                assert _in_declared_order(keys, [["a", "b", "c"], ["x", "y"], ["y", "x"]]), keys
                seen.add(tuple(keys))
        assert len(seen) >= 6  # (optional properties were both written and left out)
    finally:
        compiler.close()


def _closed(x: dict, **more) -> dict:
    return {"type": "object", "additionalProperties": False, "required": ["x"], "properties": {"x": x}, **more}


@pytest.mark.parametrize("schema, pointer", [
    (_closed({"type": ["array", "null"]}), "/properties/x/type"),  # (outlines writes any items: open objects)
    (_closed({"type": ["array"]}), "/properties/x/type"),
    (_closed({"$ref": "#/properties/y/default"}, properties={"x": {"$ref": "#/properties/y/default"},
                                                             "y": {"type": "integer", "default": {}}}),
     "/properties/x/$ref"),  # (a target no check walks: `{}`, any value)
    (_closed({"$ref": "#/stash/open"}, stash={"open": {"type": "object"}}), "/properties/x/$ref"),
    (_closed({"$ref": "#/$defs/any"}, **{"$defs": {"any": {"description": "anything"}}}), "/properties/x/$ref"),
    (_closed({"$ref": "#open"}, open={"type": "object"}), "/properties/x/$ref"),  # (outlines: the root's key)
], ids=["type-list-array", "type-array-list", "ref-into-default", "ref-into-unknown-keyword", "ref-to-any-value",
        "ref-by-name"])
def test_outlines_is_given_no_schema_where_it_would_write_an_open_object(tokenizers, vocabs, schema, pointer):
    """Where outlines-core writes any value (an array without `items`, a `$ref` to a target the support check does
    not walk or that takes any value), it writes open objects, whose keys may repeat, and the outlines grammar goes
    without the distinct-keys check (helper-27 wrote `{"x": [{"a": 1, "a": 2}]}` through each): refused."""
    assert pointer in outlines_unsupported(schema)
    compiler = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines")
    try:
        with pytest.raises(ConstraintError) as exc:
            compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True))
        assert exc.value.code == "unsupported_schema"
    finally:
        compiler.close()


@pytest.mark.parametrize("schema, where, pointer", [
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, "at the root", ""),
    (_closed({"type": "object", "properties": {"k": {"type": "integer"}}}), "at /properties/x", "/properties/x"),
    ({"type": "object", "additionalProperties": False, "required": ["a%20b"],
      "properties": {"a%20b": {"type": "object"}}}, "at /properties/a%20b", "/properties/a%20b"),
])
def test_an_open_object_outlines_cannot_serve_is_named_as_such(tokenizers, vocabs, schema, where, pointer):
    """Its `additionalProperties` is absent: the refusal named a keyword at `/`, "in the equivalent form that the
    subschema there is rewritten into" (QA: 56 of 94 outlines refusals of real-world schemas)."""
    compiler = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines")
    try:
        with pytest.raises(ConstraintError) as exc:
            compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                            extra={"source": schema}))
        message = exc.value.message
        assert f"closed objects, and the object {where} takes properties" in message, message
        assert "additionalProperties: false" in message and "rewritten" not in message, message
        assert exc.value.pointer == pointer and exc.value.code == "unsupported_schema"
    finally:
        compiler.close()


def test_outlines_still_serves_references_to_definitions():
    schema = _closed({"$ref": "#/$defs/A"}, **{"$defs": {"A": {"type": "array", "items": {"type": "integer"}}}})
    assert outlines_unsupported(schema) == []


@pytest.mark.parametrize("whitespace", ["[ ]?", "[ \n]{0,2}"])
def test_an_open_object_in_outlines_regex_is_refused_whatever_let_it_through(whitespace):
    """The second guard: were the support check to miss a place where outlines-core writes any value, its regex
    would hold outlines' generic key (a string before the colon), and the translation refuses it."""
    for schema in (_closed({"type": "array"}), _closed({"$ref": "#/properties/y/default"},
                   properties={"x": {"$ref": "#/properties/y/default"}, "y": {"type": "integer", "default": {}}})):
        with pytest.raises(ValueError, match="open to any key"):
            schema_regex(schema, whitespace)
    closed = {"type": "object", "additionalProperties": False, "properties": {
        "x": {"type": "object", "additionalProperties": False, "properties": {"k": {"type": "string"}}},
        "y)*": {"type": "string"}}}
    assert r'"y\)\*"' in schema_regex(closed, whitespace)  # (declared keys, however spelled, are not generic)
