"""Keywords that read each other, parted in the schema object by an in-place applicator (constrain/llg_backend.py
`_read_together`). llguidance reads a keyword beside those of its own chunk only, chunks cut at each `$ref`,
`allOf`, `anyOf`, `oneOf`, `enum` and `const`: parted so, `additionalProperties: false` refused every name
`patternProperties` takes, `additionalItems: false` let items past an array `items` through, and draft 4's
`exclusiveMinimum: true` left `minimum` inclusive. Served as JSON Schema reads them, whatever their order."""

from __future__ import annotations

import pytest

from constrain import ConstraintSpec
from constrain.llg_backend import _read_together, llguidance_schema
from constrain.rewrite import validator_class
from constrain.spec import normalise_schema
from tests.constrain.conftest import accepts_document, ended_walks_valid

D4 = "http://json-schema.org/draft-04/schema#"
D7 = "http://json-schema.org/draft-07/schema#"

CASES = [
    ({"type": "object", "patternProperties": {"^x-": {"type": "integer"}}, "anyOf": [{"required": ["a"]}, {}],
      "additionalProperties": False},
     [{"x-a": 1}, {}], [{"a": 1}, {"x-a": "s"}]),
    ({"type": "object", "additionalProperties": {"type": "string"}, "$ref": "#/$defs/o",
      "patternProperties": {"^x-": {"type": "integer"}}, "$defs": {"o": {"type": "object", "minProperties": 1}}},
     [{"x-a": 1}, {"a": "s"}, {"x-a": 1, "a": "s"}], [{"x-a": "s"}, {"a": 1}, {}]),
    ({"type": "object", "patternProperties": {"^b$": {}}, "const": {"b": 0}, "additionalProperties": False},
     [{"b": 0}], [{"b": 1}, {"c": 0}]),
    ({"$schema": D7, "type": "array", "items": [{"type": "integer"}], "allOf": [{"type": "array"}],
      "additionalItems": False},
     [[1], []], [[1, 2], ["s"]]),
    ({"$schema": D4, "type": "integer", "minimum": 1, "allOf": [{"maximum": 9}], "exclusiveMinimum": True},
     [2, 9], [1, 0, 10]),
    ({"$schema": D4, "type": "number", "exclusiveMaximum": True, "anyOf": [{"minimum": 0}], "maximum": 3},
     [0, 2.5], [3, -1]),
]


@pytest.mark.parametrize("backend", ["llguidance", "auto"])
@pytest.mark.parametrize("schema, valid, invalid", CASES)
def test_keywords_parted_by_an_applicator_still_read_each_other(schema, valid, invalid, backend, gpt2_compiler,
                                                                   tokenizers, vocabs):
    check = validator_class(schema)(schema)
    assert all(check.is_valid(v) for v in valid) and not any(check.is_valid(v) for v in invalid)
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend=backend))
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    for document in valid:
        assert accepts_document(g, tok, vocab, document), document
    for document in invalid:
        assert not accepts_document(g, tok, vocab, document), document
    assert ended_walks_valid(g, vocab, schema, seed=0, walks=15, max_tokens=40) > 0


def test_only_the_order_of_keys_changes_and_only_where_an_applicator_parts_them():
    schema = {"type": "object", "properties": {"a": {"type": "object", "additionalProperties": False,
                                                     "allOf": [{}], "patternProperties": {"^x": {}}}},
              "additionalProperties": False, "patternProperties": {"^y": {}}}
    out = llguidance_schema(schema)
    assert out == schema and list(out["properties"]["a"]) == ["type", "additionalProperties", "patternProperties",
                                                              "allOf"]
    assert list(schema["properties"]["a"]) == ["type", "additionalProperties", "allOf", "patternProperties"]
    together = {"type": "object", "patternProperties": {"^x": {}}, "additionalProperties": False, "allOf": [{}]}
    assert _read_together(together) is together
