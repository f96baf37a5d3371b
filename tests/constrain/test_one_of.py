"""oneOf with overlapping branches, enforced while decoding (constrain/one_of.py): where the backend cannot prove the
branches disjoint, a value is refused token by token unless exactly one branch holds when it is finished."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from constrain import ConstraintSpec, spec_from_request
from constrain.maskbench import walk_instance
from constrain.one_of import OneOfGrammar, plan_one_of
from constrain.spec import normalise_schema
from tests.constrain.conftest import ended_walks_valid

# Arrays of integers, or of numbers >= 0: [1] and [] are both (refused), [-1] and [0.5] one each.
ARRAYS = {"oneOf": [{"type": "array", "items": {"type": "integer"}},
                    {"type": "array", "items": {"type": "number", "minimum": 0}}]}


# Arrays of strings starting with "a", or of strings of at most 3 characters.
PATTERNED = {"oneOf": [{"type": "array", "items": {"type": "string", "pattern": "^a"}},
                       {"type": "array", "items": {"type": "string", "maxLength": 3}}]}


def _object(v: dict) -> dict:
    return {"type": "object", "properties": {"v": v}, "required": ["v"], "additionalProperties": False}


def _compile(compiler, schema: dict, backend: str = "llguidance"):
    return compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                           backend=backend))


def _accepts(grammar, tokenizer, vocab, text: str) -> bool:
    tokens = tokenizer.encode(text, add_special_tokens=False)
    return walk_instance(grammar, tokens, min(vocab.eos_token_ids), torch.zeros((1, vocab.words), dtype=torch.int32),
                         [])


@pytest.mark.parametrize("schema, governed", [
    (_object(ARRAYS), ("/properties/v/oneOf",)),
    ({"$defs": {"a": ARRAYS}, "type": "array", "items": {"$ref": "#/$defs/a"}}, ("/$defs/a/oneOf",)),
    ({"allOf": [_object(ARRAYS)]}, ("/allOf/0/properties/v/oneOf",)),
    ({"anyOf": [_object(ARRAYS), {"type": "null"}]}, None),  # a branch: which one applies is not known
    ({"type": "object", "patternProperties": {"^v": ARRAYS}}, None),
    ({"not": _object(ARRAYS)}, None),
    (_object(PATTERNED), ("/properties/v/oneOf",)),  # (the pattern is decided on its automaton, never run)
    (_object({"oneOf": [{"type": "array", "items": {"pattern": "^(?=a)"}}, {"type": "array"}]}), None),
    (_object({"oneOf": [{"type": "object", "patternProperties": {"^a": {}}}, {"type": "object"}]}), None),
    ({"$defs": {"a": ARRAYS}, "type": "object",
      "properties": {"x": {"$ref": "#/$defs/a"}, "y": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}}, None),
])
def test_which_one_ofs_are_kept_exact_while_decoding(schema, governed):
    plan = plan_one_of(schema)
    assert (plan.pointers if plan is not None else None) == governed
    if plan is not None:
        assert "oneOf" not in json.dumps(plan.schema) and "oneOf" in json.dumps(schema)  # the input is not changed


CASES = [  # (schema, accepted, refused): the refused ones are what anyOf alone would take
    (_object(PATTERNED), ['{"v": ["abcd"]}', '{"v": ["bcd", "b"]}', '{"v": ["abcd", "a1234"]}'],
     ['{"v": ["ab"]}', '{"v": []}', '{"v": ["abc", "a"]}', '{"v": ["abcd", "xyz1"]}']),
    (_object(ARRAYS), ['{"v": [-1]}', '{"v": [0.5]}', '{"v": [-1, 2]}', '{"v": [2, 0.5]}'],
     ['{"v": [1]}', '{"v": []}', '{"v": [1, 2, 3]}']),
    (_object({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]}),
     ['{"v": -1}', '{"v": 0.5}', '{"v": -7}'], ['{"v": 1}', '{"v": 0}', '{"v": 12}']),
    ({"type": "array", "items": _object({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                                                    "required": ["a"]},
                                                   {"type": "object", "properties": {"b": {"type": "integer"}},
                                                    "required": ["b"], "minProperties": 1}]})},
     ['[{"v": {"a": 1}}, {"v": {"b": 2}}]', '[]'],
     ['[{"v": {"a": 1, "b": 2}}]', '[{"v": {"b": 1}}, {"v": {"a": 1, "b": 1}}]']),
]


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
@pytest.mark.parametrize("schema, good, bad", CASES)
def test_a_value_valid_in_two_branches_is_refused_token_by_token(schema, good, bad, name, tokenizers, vocabs):
    from constrain import GrammarCompiler

    compiler = GrammarCompiler(vocabs[name], tokenizers[name], backend="llguidance")
    try:
        g = _compile(compiler, schema)
        assert isinstance(g, OneOfGrammar) and g.unenforced == ()
        validator = jsonschema.Draft202012Validator(schema)
        for text in good:
            assert validator.is_valid(json.loads(text)) and _accepts(g, tokenizers[name], vocabs[name], text), text
        for text in bad:
            assert not validator.is_valid(json.loads(text))
            assert not _accepts(g, tokenizers[name], vocabs[name], text), text
    finally:
        compiler.close()


@pytest.mark.parametrize("schema", [_object(ARRAYS), CASES[3][0]])
def test_random_walks_end_in_documents_valid_against_the_one_of(schema, gpt2_compiler, vocabs):
    assert ended_walks_valid(_compile(gpt2_compiler, schema), vocabs["gpt2"], schema, seed=11) >= 15


def test_schemas_the_backend_takes_as_they_are_are_not_wrapped(gpt2_compiler):
    disjoint = _object({"oneOf": [{"type": "string"}, {"type": "integer"}]})
    assert not isinstance(_compile(gpt2_compiler, disjoint), OneOfGrammar)


def test_a_tool_parameter_one_of_is_kept_exact(gpt2_compiler, tokenizers, vocabs):
    spec = spec_from_request(tools=[{"type": "function", "function": {"name": "f", "strict": True,
                                                                      "parameters": _object(ARRAYS)}}],
                             tool_choice="required")
    g = gpt2_compiler.compile(spec)
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    assert _accepts(g, tok, vocab, '[{"name": "f", "arguments": {"v": [-1]}}]')
    assert not _accepts(g, tok, vocab, '[{"name": "f", "arguments": {"v": [3]}}]')


NESTED = {"type": "object", "properties": {"v": {
    "type": "object", "oneOf": [{"properties": {"t": {"items": {"type": "integer"}}}},
                                {"properties": {"t": {"items": {"type": "number", "minimum": 0}}}}],
    "properties": {"t": {"type": "array"}, "w": ARRAYS}, "required": ["t"], "additionalProperties": False}},
    "required": ["v"], "additionalProperties": False}


def test_a_one_of_inside_a_governed_value_is_kept_exact_too(gpt2_compiler, tokenizers, vocabs):
    """`w` is held by the value's own `properties` (not by a branch): both oneOfs are checked, each when its
    value is finished, also by one token finishing both."""
    g = _compile(gpt2_compiler, NESTED)
    assert isinstance(g, OneOfGrammar) and len(g.plan.pointers) == 2
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    validator = jsonschema.Draft202012Validator(NESTED)
    for text in ['{"v": {"t": [-1]}}', '{"v": {"t": [0.5], "w": [-1]}}', '{"v": {"t": [-1], "w": [0.5]}}']:
        assert validator.is_valid(json.loads(text)) and _accepts(g, tok, vocab, text), text
    for text in ['{"v": {"t": [1]}}', '{"v": {"t": [-1], "w": [1]}}', '{"v": {"t": [-1], "w": [0.5, -1]}}',
                 '{"v": {"t": [2], "w": [-1]}}']:
        assert not validator.is_valid(json.loads(text)) and not _accepts(g, tok, vocab, text), text


def test_a_one_of_beside_an_any_of_is_followed_through_the_nodes_own_properties(gpt2_compiler, tokenizers, vocabs):
    schema = {"type": "object", "anyOf": [{"required": ["v"]}, {"required": ["x"]}],
              "properties": {"v": ARRAYS, "x": {"type": "null"}}, "additionalProperties": False}
    g = _compile(gpt2_compiler, schema)
    assert isinstance(g, OneOfGrammar)
    assert _accepts(g, tokenizers["gpt2"], vocabs["gpt2"], '{"v": [-1]}')
    assert not _accepts(g, tokenizers["gpt2"], vocabs["gpt2"], '{"v": [1]}')


def test_formats_are_checked_where_jsonschema_can_and_otherwise_count_as_holding(gpt2_compiler, tokenizers, vocabs):
    """Dates or strings of at most 10 characters: "2024-01-01" is both (refused), "2024-13-01" only the second.
    A uri jsonschema cannot check counts as holding: "./a" is refused though it is no absolute uri (stricter
    than asked, never weaker)."""
    dates = _object({"oneOf": [{"type": "array", "items": {"type": "string", "format": "date"}},
                               {"type": "array", "items": {"type": "string", "maxLength": 10}}]})
    g = _compile(gpt2_compiler, dates)
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    assert _accepts(g, tok, vocab, '{"v": ["2024-13-01"]}') and _accepts(g, tok, vocab, '{"v": ["abc"]}')
    assert not _accepts(g, tok, vocab, '{"v": ["2024-01-01"]}')
    uris = _object({"oneOf": [{"type": "array", "items": {"type": "string", "format": "uri"}},
                              {"type": "array", "items": {"type": "string", "pattern": "^[.]/"}}]})
    g = _compile(gpt2_compiler, uris)
    assert _accepts(g, tok, vocab, '{"v": ["http://a.b/c"]}') and not _accepts(g, tok, vocab, '{"v": ["./a"]}')


@pytest.mark.parametrize("schema", [
    # a oneOf under properties of a node that also has patternProperties: the property's schema applies for sure
    {"type": "object", "properties": {"v": ARRAYS}, "patternProperties": {"^x": {}}, "required": ["v"]},
    # allOf of a tuple array and an array of governed items: the second still names the items exactly
    {"type": "array", "allOf": [{"prefixItems": [{}]}, {"items": ARRAYS}], "minItems": 1},
])
def test_a_governed_value_is_found_where_other_subschemas_beside_are_not_followed(schema, gpt2_compiler, tokenizers,
                                                                                   vocabs):
    g = _compile(gpt2_compiler, schema)
    assert isinstance(g, OneOfGrammar)
    text = '{"v": [1]}' if schema["type"] == "object" else "[[1]]"  # valid in both branches: refused
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    assert not _accepts(g, tokenizers["gpt2"], vocabs["gpt2"], text)
    good = '{"v": [-1]}' if schema["type"] == "object" else "[[-1]]"
    assert _accepts(g, tokenizers["gpt2"], vocabs["gpt2"], good)


def test_a_one_of_in_draft_7_dependencies_is_not_exactly_placed():
    schema = {"type": "object", "properties": {"a": {}}, "dependencies": {"a": {"properties": {"v": ARRAYS}}}}
    assert plan_one_of(schema) is None


def test_unique_items_and_an_overlapping_one_of_are_kept_together(gpt2_compiler, tokenizers, vocabs):
    schema = {"type": "object", "properties": {"v": ARRAYS, "tags": {"type": "array", "items": {"type": "string"},
                                                                     "uniqueItems": True}},
              "required": ["v", "tags"], "additionalProperties": False}
    g = _compile(gpt2_compiler, schema)
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    assert _accepts(g, tok, vocab, '{"v": [-1], "tags": ["a", "b"]}')
    assert not _accepts(g, tok, vocab, '{"v": [-1], "tags": ["a", "a"]}')
    assert not _accepts(g, tok, vocab, '{"v": [1], "tags": ["a"]}')
    assert ended_walks_valid(g, vocab, schema, seed=5) >= 15


def test_a_value_that_can_only_finish_in_two_branches_ends_the_output_with_a_constraint_error(gpt2_compiler,
                                                                                             tokenizers, vocabs):
    from constrain import ConstraintError

    schema = _object({"oneOf": [{"type": "array", "items": {"enum": [1, 2]}, "maxItems": 1},
                                {"type": "array", "items": {"enum": [2, 3]}, "maxItems": 1}]})
    g = _compile(gpt2_compiler, schema)
    assert isinstance(g, OneOfGrammar)
    m = g.matcher()
    for t in tokenizers["gpt2"].encode('{"v": [2 ', add_special_tokens=False):  # (one space at most)
        assert m.accept(t)
    with pytest.raises(ConstraintError) as exc:  # only "]" could follow, and [2] is in both branches
        m.fill_bitmask(torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32), 0)
    assert exc.value.code == "constraint_too_complex" and "oneOf" in exc.value.message
