"""Keys are written without \\u escapes where a key's spelling selects its schema (constrain/plain_keys.py): an
escaped spelling of a declared name can no longer pass as another key, on the real tokenizers, while escapes in
values and short escapes in keys stay allowed, and objects that name no keys or take no others are untouched."""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest
import torch

from constrain import ConstraintSpec, GrammarCompiler
from constrain.checked import wrapped
from constrain.maskbench import walk_instance
from constrain.plain_keys import PlainKeysGrammar, keys_need_plain_spelling, open_object_at, writes_key_escape
from constrain.walkbench import ESCAPED_KEY
from tests.constrain.conftest import allowed_ids

OPEN = {"type": "object", "properties": {"a": {"type": "integer"}}}
PATTERNED = {"type": "object", "patternProperties": {"^x": {"type": "integer"}}}


def _compile(compiler, schema, kind: str = "json_schema"):
    return compiler.compile(ConstraintSpec(kind=kind, schema=schema, backend="llguidance"))


def _accepts(grammar, tokenizer, vocab, text: str) -> bool:
    tokens = tokenizer.encode(text, add_special_tokens=False)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    return walk_instance(grammar, tokens, min(vocab.eos_token_ids), bitmask, [])


@pytest.mark.parametrize("schema, text, accepted", [
    (OPEN, '{"a": 1}', True),
    (OPEN, '{"\\u0061": "x"}', False),  # the declared a, spelled with an escape, under the other keys' schema
    (OPEN, '{"a": 1, "\\u0061": "x"}', False),  # parses as {"a": "x"}
    (OPEN, '{"\\u00e9": 1}', False),  # non-ASCII keys are written as themselves
    (OPEN, '{"é": 1}', True),
    (OPEN, '{"b": "\\u00e9", "c": ["\\u0061"]}', True),  # escapes in values are untouched
    (OPEN, '{"a\\nb": 1, "q\\"\\\\": 2}', True),  # so are the short escapes in keys
    (PATTERNED, '{"\\u0078": "s"}', False),  # a name the pattern matches
    (PATTERNED, '{"x": 1, "y": "s"}', True),
    ({"type": "object", "required": ["a"], "properties": {"a": {"const": 1}}}, '{"a": 1, "\\u0061": 2}', False),
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/h/default"}}, "additionalProperties": False,
      "$defs": {"h": {"default": OPEN}}}, '{"x": {"\\u0061": "s"}}', False),  # (an open object a `$ref` names)
])
def test_a_key_spelled_with_a_unicode_escape_is_refused_where_names_select_schemas(schema, text, accepted,
                                                                                  gpt2_compiler, tokenizers, vocabs):
    grammar = _compile(gpt2_compiler, schema)
    assert wrapped(grammar, PlainKeysGrammar) is not None
    assert _accepts(grammar, tokenizers["gpt2"], vocabs["gpt2"], text) == accepted
    if accepted:
        assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))


@pytest.mark.parametrize("schema, kind", [
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
      "additionalProperties": False}, "json_schema"),  # OpenAI's strict shape
    ({"type": "object", "additionalProperties": {"type": "integer"}}, "json_schema"),  # a map: every key alike
    (None, "json_object"),
    ({"type": "array", "items": {"type": "string"}}, "json_schema"),
])
def test_objects_that_name_no_keys_or_take_no_others_keep_escaped_keys_and_pay_nothing(schema, kind, gpt2_compiler,
                                                                                        tokenizers, vocabs):
    grammar = _compile(gpt2_compiler, schema, kind)
    assert wrapped(grammar, PlainKeysGrammar) is None
    if kind == "json_object":
        assert _accepts(grammar, tokenizers["gpt2"], vocabs["gpt2"], '{"\\u0061": 1}')


@pytest.mark.parametrize("schema, needed", [
    (OPEN, True),
    (PATTERNED, True),
    ({"type": "object", "required": ["a"]}, True),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}}, True),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, True),
    ({"type": "array", "items": {"$ref": "#/$defs/o"}, "$defs": {"o": OPEN}}, True),
    ({"type": "object", "properties": {"a": OPEN}, "additionalProperties": False}, True),  # the inner one
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": False}, False),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, False),
    ({"type": "string"}, False),
    (None, False),
])
def test_which_schemas_need_plain_keys(schema, needed):
    assert keys_need_plain_spelling(schema) == needed


@pytest.mark.parametrize("name", ["gpt2", "phi3", "qwen2"])
def test_no_allowed_token_writes_a_unicode_escape_in_a_key_on_each_tokenizer(name, tokenizers, vocabs):
    """After `{"\\` (a key's escape begun) no allowed token starts with `u`; a short escape still fits. In a value
    string the same point allows `u` tokens."""
    vocab = vocabs[name]
    compiler = GrammarCompiler(vocab, tokenizers[name], backend="llguidance")
    try:
        grammar = _compile(compiler, OPEN)
    finally:
        compiler.close()
    byte_token = {b: t for t, b in enumerate(vocab.token_bytes) if b is not None and len(b) == 1}

    def allowed_after(prefix: bytes) -> list[bytes]:
        m = grammar.matcher()
        for b in prefix:
            assert m.accept(byte_token[bytes([b])])
        bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
        m.fill_bitmask(bitmask, 0)
        return [vocab.token_bytes[t] for t in allowed_ids(bitmask).tolist() if t < len(vocab.token_bytes)]

    in_key = allowed_after(b'{"\\')
    assert b"n" in in_key and b'"' in in_key
    assert not [b for b in in_key if b and b.startswith(b"u")]
    in_key_start = allowed_after(b'{"')
    assert not [b for b in in_key_start if b and b"\\u" in b.split(b'"')[0]]
    assert [b for b in allowed_after(b'{"b": "\\') if b and b.startswith(b"u")]


def test_a_token_that_closes_a_value_and_opens_a_key_is_judged_on_the_key():
    in_string = ("string", False, (False,), b"")
    assert writes_key_escape(in_string, b'", "\\u')
    assert not writes_key_escape(in_string, b'\\u00e9", "')
    assert not writes_key_escape(("value", False, (True,), b""), b'"\\u')  # an array item, not a key
    assert writes_key_escape(("value", False, (True,), b""), b'{"\\u')
    assert writes_key_escape(("key", True, (False,), b""), b"u00")
    assert not writes_key_escape(("key", True, (False,), b""), b"\\u")  # an escaped backslash, then u


def test_walks_that_try_to_escape_every_key_end_in_valid_documents_with_plain_keys(gpt2_compiler, vocabs):
    """Walks through the mask that take, when allowed, a token holding `\\u`, else after a backslash a token
    starting with `u`, else often a token starting with a backslash, end in documents that validate, with plain
    keys (without the check, such walks write `{"\\u0061": ...}`-like keys)."""
    vocab = vocabs["gpt2"]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "patternProperties": {"^x": {"type": "boolean"}}, "required": ["a"]}
    grammar = _compile(gpt2_compiler, schema)
    spelled = [b or b"" for b in vocab.token_bytes]
    holding = np.array([b"\\u" in b for b in spelled])
    starting_u = np.array([b[:1] == b"u" for b in spelled])
    starting_backslash = np.array([b[:1] == b"\\" for b in spelled])
    eos = sorted(vocab.eos_token_ids)
    rng = random.Random(7)
    ended = 0
    for _ in range(20):
        m = grammar.matcher()
        bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
        text = b""
        for step in range(40):
            m.fill_bitmask(bitmask, 0, tokens_left=40 - step)
            ids = allowed_ids(bitmask)
            ids = ids[~np.isin(ids, eos)]
            if m.is_terminated() or (m.can_end() and rng.random() < 0.1):
                break
            pending = len(text) - len(text.rstrip(b"\\")) == 1
            pools = [ids[holding[ids]], ids[starting_u[ids]] if pending else ids[:0],
                     ids[starting_backslash[ids]] if rng.random() < 0.5 else ids[:0], ids]
            pool = next(p for p in pools if len(p))
            tok = m.vet(int(pool[rng.randrange(len(pool))]), 40 - step)
            assert m.accept(tok)
            text += spelled[tok]
        if m.can_end():
            ended += 1
            doc = json.loads(text)
            assert jsonschema.Draft202012Validator(schema).is_valid(doc), doc
            assert not ESCAPED_KEY.search(text.decode()), text
    assert ended >= 10


@pytest.mark.parametrize("schema, at", [
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": False,
      "allOf": [{"anyOf": [{"properties": {"a": False}}, {"required": ["a"]}]}]}, None),  # merged: closed
    ({"type": "object", "properties": {"a": {}}, "anyOf": [{"properties": {"a": False}}]}, ""),
    ({"type": "object", "properties": {"o": {"type": "object", "properties": {"a": {}}, "additionalProperties": False,
                                             "oneOf": [{"properties": {"a": False}}]}}, "required": ["o"],
      "additionalProperties": False}, None),
    ({"type": "object", "properties": {"o": OPEN}, "additionalProperties": False}, "/properties/o"),
    ({"type": "object", "additionalProperties": False, "allOf": [{"properties": {"o": OPEN}}]},
     "/allOf/0/properties/o"),  # (a member's values are objects of their own)
    # values are not schemas: a `default` or `enum` object with a key `properties` is no open object...
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": False, "default": {"properties": 1},
      "enum": [{"a": {"required": []}}], "examples": [{"properties": {}}]}, None),
    # ...but a property named `default` or `enum` is a schema
    ({"type": "object", "properties": {"default": OPEN}, "additionalProperties": False}, "/properties/default"),
    ({"type": "object", "properties": {"enum": {}}, "$defs": {"const": OPEN}, "additionalProperties": False},
     "/$defs/const"),
    # ...and so is a value a `$ref` points at or into
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/h/default"}}, "additionalProperties": False,
      "$defs": {"h": {"default": OPEN}}}, "/$defs/h/default"),
    ({"type": "object", "properties": {"x": {"$ref": "#/x-lib/enum/0"}}, "additionalProperties": False,
      "x-lib": {"enum": [OPEN]}}, "/x-lib/enum/0"),
    # a node that takes no objects is no open object, whatever object keywords it keeps (a `$ref` points into one)
    ({"type": "object", "properties": {"t": {"type": "string", "properties": {"a": {"type": "integer"}}},
                                       "r": {"$ref": "#/properties/t/properties/a"}}, "additionalProperties": False},
     None),
    ({"type": "object", "properties": {"t": {"type": ["string", "object"], "properties": {"a": {}}}},
      "additionalProperties": False}, "/properties/t"),
    # a closed `allOf` member closes its siblings and the node around them (llguidance merges them all)
    ({"allOf": [{"type": "object", "properties": {"x": {}}, "additionalProperties": False}, {"required": ["x"]}]},
     None),
    ({"properties": {"y": {}}, "anyOf": [{"required": ["y"]}],
      "allOf": [{"type": "object", "properties": {"x": {}}, "additionalProperties": False}]}, None),
    ({"allOf": [{"$ref": "#/$defs/c"}, {"required": ["x"]}],  # (closed only through a reference: not told)
      "$defs": {"c": {"type": "object", "properties": {"x": {}}, "additionalProperties": False}}}, "/allOf/1"),
    ({"allOf": [OPEN, {"required": ["a"]}]}, "/allOf/1"),
])
def test_members_of_a_closed_object_are_closed_and_an_open_object_is_named_where_it_is(schema, at):
    """llguidance merges `allOf`/`anyOf`/`oneOf` members into the object around them (QA toolfmt2 F3), and so a
    closed `allOf` member closes the node and its other members too (the XML tool formats' `allOf` of a key's
    schemas, a closed object and one that requires its keys, was named open: QA xmlreal F2). Values
    (`default`, `enum`...) were looked into as schemas: a strict function with a `default` object holding a key
    `properties` was refused in the XML tool-call formats."""
    assert open_object_at(schema) == at
