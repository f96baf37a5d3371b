"""uniqueItems over objects with few values, steered while decoding (constrain/unique_objects.py): inside an item,
the tokens after which it could only become a used value are refused, so walks through the mask end in arrays
that validate instead of reaching an item that can only repeat (the late check would then refuse every token)."""

from __future__ import annotations

import pytest
import torch

from constrain import ConstraintSpec
from constrain.checked import allowed_ids
from constrain.spec import normalise_schema
from constrain.unique_objects import plan_unique_objects
from tests.constrain.conftest import ended_walks_valid


def _objects(properties: dict, required: list[str], **extra) -> dict:
    return {"type": "array", "uniqueItems": True, **extra, "items": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}


BIT = {"type": "integer", "minimum": 0, "maximum": 1}
SCHEMAS = [
    _objects({"a": BIT, "b": BIT}, ["a", "b"], minItems=3),  # gave up in 12 of 20 walks
    _objects({"k": {"enum": ["x", "y", "z"]}}, ["k"], minItems=2),  # 13 of 20
    _objects({"k": {"enum": ["xa", "xb", "y"]}, "on": {"type": "boolean"}}, ["k"], minItems=2),
    _objects({"day": {"enum": ["mon", "tue"]}, "open": {"const": True}}, ["day", "open"], minItems=2),
]


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_walks_end_in_unique_arrays_and_never_reach_an_item_that_can_only_repeat(schema, name, tokenizers,
                                                                                  vocabs):
    from constrain.compiler import GrammarCompiler

    compiler = GrammarCompiler(vocabs[name], tokenizers[name], backend="llguidance", background_outlines=False)
    try:
        grammar = compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema),
                                                  strict=True, backend="llguidance"))
        # (a walk that reached a dead end raises the constraint error, failing the test)
        assert ended_walks_valid(grammar, vocabs[name], schema, seed=2, walks=20, max_tokens=80) >= 15
    finally:
        compiler.close()


def test_a_string_member_that_could_only_close_as_a_used_value_is_refused(gpt2_compiler, tokenizers, vocabs):
    schema = SCHEMAS[1]
    grammar = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema),
                                                   strict=True, backend="llguidance"))
    m = grammar.matcher()
    for t in tokenizers["gpt2"].encode('[{"k": "x"}, {"k": "', add_special_tokens=False):
        assert m.accept(t)
    bitmask = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    m.fill_bitmask(bitmask, 0)
    allowed = {vocabs["gpt2"].token_bytes[i] for i in allowed_ids(bitmask[0].numpy()).tolist()}
    assert b"y" in allowed and b"z" in allowed and not any(t.startswith(b"x") for t in allowed)


def test_only_flat_objects_with_few_values_are_steered():
    assert plan_unique_objects(SCHEMAS[0]) is not None
    many = _objects({"n": {"type": "integer", "minimum": 0, "maximum": 99}}, ["n"])  # 100 values
    nested = _objects({"k": {"enum": [[1], [2]]}}, ["k"])
    free = _objects({"s": {"type": "string"}}, ["s"])
    scalars = {"type": "array", "uniqueItems": True, "items": {"enum": ["a", "b"]}}  # (constrain/unique_items.py)
    for schema in (many, nested, free, scalars, {"not": SCHEMAS[0]}):
        assert plan_unique_objects(schema) is None, schema
