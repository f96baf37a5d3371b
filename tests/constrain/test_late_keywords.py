"""oneOf with overlapping branches, enforced while decoding (constrain/one_of.py): where the backend cannot prove the
branches disjoint, a value is refused token by token unless exactly one branch holds when it is finished."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from constrain import ConstraintSpec, GrammarCompiler, spec_from_request
from constrain.maskbench import walk_instance
from constrain.late_keywords import LateGrammar, plan_late_keywords
from constrain.rewrite import as_read_where_unasserted, validator_class
from constrain.spec import normalise_schema
from tests.constrain.conftest import (accepts_document, accepts_value, allowed_ids, decode, ended_walks_valid,
                                      offered_walk)

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
    (_object(ARRAYS), ("/properties/v",)),
    ({"$defs": {"a": ARRAYS}, "type": "array", "items": {"$ref": "#/$defs/a"}}, ("/$defs/a",)),
    ({"allOf": [_object(ARRAYS)]}, ("/allOf/0/properties/v",)),
    # in a branch, which one applies is not known: the value around the choice is checked whole
    ({"anyOf": [_object(ARRAYS), {"type": "null"}]}, ("",)),
    ({"type": "object", "properties": {"w": {"patternProperties": {"^v": ARRAYS}}}}, ("/properties/w",)),
    ({"type": "array", "items": [{"type": "integer"}, ARRAYS]}, ("",)),
    ({"not": _object(ARRAYS)}, ("",)),
    (_object(PATTERNED), ("/properties/v",)),  # (the pattern is decided on its automaton, never run)
    (_object({"oneOf": [{"type": "array", "items": {"pattern": "^(?=a)"}}, {"type": "array"}]}), None),
    (_object({"oneOf": [{"type": "object", "patternProperties": {"^a": {}}}, {"type": "object"}]}),
     ("/properties/v",)),
    # reached exactly through x, through a branch from y: both values are checked
    ({"$defs": {"a": ARRAYS}, "type": "object",
      "properties": {"x": {"$ref": "#/$defs/a"}, "y": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}},
     ("/$defs/a", "/properties/y")),
    # below a choice inside a governed value: that value's check covers it; exactly placed: checked itself too
    ({"anyOf": [{"type": "object", "properties": {"v": {"not": {"const": 1}}}}, {"type": "null"}]}, ("",)),
    (_object({"type": "array", "contains": {"const": 1}, "items": {"type": "integer", "not": {"const": 2}}}),
     ("/properties/v", "/properties/v/items")),
    (_object({"type": "array", "uniqueItems": False}), None),
    # a nested $id moves what the $refs inside its subschema mean (there the checks cannot follow the schema),
    # not those outside it; a plain-name fragment moves nothing
    ({"type": "object", "properties": {"v": {"$id": "/v", "not": {"const": 1}}}}, ("/properties/v",)),
    ({"type": "object", "$defs": {"d": {"type": "integer"}},
      "properties": {"v": {"$id": "/v", "not": {"const": 1}}, "w": {"$ref": "#/$defs/d"}}}, ("/properties/v",)),
    ({"type": "object", "$defs": {"d": {"type": "integer"}}, "properties": {
        "v": {"$id": "/v", "not": {"const": 1}, "properties": {"w": {"$ref": "#/$defs/d"}}}}}, None),
    ({"type": "object", "$defs": {"d": {"type": "integer"}}, "properties": {
        "v": {"$id": "#v", "not": {"const": 1}, "properties": {"w": {"$ref": "#/$defs/d"}}}}}, ("/properties/v",)),
])
def test_which_values_are_checked_when_finished(schema, governed):
    plan = plan_late_keywords(schema, one_of=True)
    assert (plan.pointers if plan is not None else None) == governed
    if plan is not None:
        text = json.dumps(plan.schema)
        assert all(f'"{k}"' not in text for k in ("oneOf", "not", "contains"))
        assert json.dumps(schema) != text  # the input is not changed


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


# a count in an allOf/anyOf member, beside optional properties another node declares
COUNT_IN_ALL_OF = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "allOf": [{"maxProperties": 1}]}
COUNT_IN_ANY_OF = {"type": "object", "properties": {"a": {"type": "integer"}},
                   "anyOf": [{"minProperties": 2}, {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}
EIGHT_KEYS = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdefgh"}, "minProperties": 2,
              "maxProperties": 3, "additionalProperties": False}
LATE_CASES = [  # (schema, accepted, refused): keywords no grammar of the backend's expresses, and no rewrite
    # a number at the root ends with the output: checked at the end of output
    ({"type": "integer", "not": {"multipleOf": 3}}, ["4", "-1", "10"], ["3", "0", "12"]),
    (_object({"type": "integer", "not": {"multipleOf": 3}}), ['{"v": 4}', '{"v": -10}'], ['{"v": 3}', '{"v": 0}']),
    (_object({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}),
     ['{"v": [5]}', '{"v": [1, 5, 2]}'], ['{"v": []}', '{"v": [1, 2]}']),
    (_object({"type": "array", "uniqueItems": True, "items": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}}),
     ['{"v": [{"a": 1}, {"a": 2}]}', '{"v": []}'], ['{"v": [{"a": 1}, {"a": 1}]}', '{"v": [{"a": 1}, {"a": 1.0}]}']),
    # a oneOf in an anyOf branch: the whole document is checked
    ({"anyOf": [_object(ARRAYS), {"type": "null"}]}, ['{"v": [-1]}', "null"], ['{"v": [1]}', '{"v": []}']),
    # (beside anyOf, which properties count as evaluated depends on the value: no rewrite)
    (_object({"type": "object", "anyOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"c": {}}}],
              "unevaluatedProperties": False}), ['{"v": {"a": 1}}', '{"v": {}}'], ['{"v": {"a": 1, "b": 2}}']),
    # a format under `not`, checked by jsonschema's FormatChecker
    (_object({"type": "string", "maxLength": 12, "not": {"format": "ipv4"}}), ['{"v": "a"}', '{"v": "1.2.3"}'],
     ['{"v": "1.2.3.4"}']),
    # min/maxProperties beside more optional properties than the rewrites lay out
    (_object(EIGHT_KEYS),
     ['{"v": {"a": 1, "h": 2}}', '{"v": {"b": 1, "c": 2, "d": 3}}'],
     ['{"v": {"a": 1}}', '{"v": {}}', '{"v": {"a": 1, "b": 2, "c": 3, "d": 4}}']),
    # `not` of names matched by a pattern: decided on the pattern's automaton
    (_object({"type": "object", "additionalProperties": {"type": "integer"},
              "not": {"patternProperties": {"^x": {"type": "integer"}}, "required": ["x1"]}}),
     ['{"v": {"y": 1}}', '{"v": {}}'], ['{"v": {"x1": 1}}', '{"v": {"y": 2, "x1": 1}}']),
    # a definition whose only keyword is late (`{"not": ...}`, {} once it is taken out), reached through allOf
    # and $ref: still checked
    ({"type": "object", "allOf": [{"$ref": "#/$defs/a"}], "additionalProperties": {"type": "integer"},
      "$defs": {"a": {"not": {"patternProperties": {"a": {"type": "integer", "maximum": 0}}}}}},
     ['{"ab": 1}', '{"ab": 1, "a": -1}'], ['{"ab": -1}', '{"b": 1}', '{}']),
    # a count in one allOf/anyOf member beside optional properties another node declares: llguidance judges the
    # object they make up, and refused the schema, strict or not (QA fuzz F5)
    (COUNT_IN_ALL_OF, ['{"a": 1}', '{}', '{"b": 2}'], ['{"a": 1, "b": 2}', '{"a": 1, "c": 2}']),
    (COUNT_IN_ANY_OF, ['{"a": 1, "c": 2}', '{"b": 2}', '{"a": 1, "b": "x"}'], ['{"a": 1}', '{}', '{"c": 1}']),
    # a late keyword in a property beside `patternProperties` and a count: the value below the count's rewrite
    # (an `anyOf`) was checked against the root too, whose pattern the plan had not searched, so every object but
    # {} was refused (QA fuzz4 F2)
    *[({"type": "object", "properties": {"d": d}, "patternProperties": {"^z": {}}, "maxProperties": 1},
       ['{"d": 1}', '{"zz": 1}', '{"q": 1}', '{}'], ['{"d": 1, "q": 2}', '{"zz": 1, "q": 2}', bad])
      for d, bad in [({"uniqueItems": True}, '{"d": [1, 1]}'), ({"not": {"multipleOf": 3}}, '{"d": 3}')]],
    # a `$schema` where the checks evolve their validator: jsonschema took its own class there, which compares
    # floats (`0.1` passed `not: {const: 0.1}`, QA review9 F1)
    ({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "number",
      "not": {"anyOf": [{"const": 0.1}, {"multipleOf": 7}]}}, ["0.2", "1.5"], ["0.1", "14"]),
    (_object({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "array", "items": {"type": "number"},
              "not": {"contains": {"minimum": 0.1, "maximum": 0.1}}}), ['{"v": [0.2]}'], ['{"v": [0.1]}']),
    # minProperties where keys may repeat: the backend counts pairs, and {"": 1, "": 2} is one property
    (_object({"type": "object", "minProperties": 2}), ['{"v": {"a": 1, "b": 2}}', '{"v": {"": 1, "a": 1}}'],
     ['{"v": {"a": 1, "a": 2}}', '{"v": {"": 1, "": 2}}', '{"v": {"a": 1}}']),
]


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
@pytest.mark.parametrize("schema, good, bad", CASES + LATE_CASES)
def test_values_their_schema_refuses_are_refused_token_by_token(schema, good, bad, name, tokenizers, vocabs):
    """CASES: a value valid in two oneOf branches; LATE_CASES: the other keywords checked late."""
    from constrain import GrammarCompiler

    compiler = GrammarCompiler(vocabs[name], tokenizers[name], backend="llguidance")
    try:
        g = _compile(compiler, schema)
        assert isinstance(g, LateGrammar) and g.unenforced == ()
        validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
        for text in good:
            assert validator.is_valid(json.loads(text)) and _accepts(g, tokenizers[name], vocabs[name], text), text
        for text in bad:
            assert not validator.is_valid(json.loads(text))
            assert not _accepts(g, tokenizers[name], vocabs[name], text), text
    finally:
        compiler.close()


DRAFT_4, DRAFT_7 = "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#"
DRAFT_6 = "http://json-schema.org/draft-06/schema#"


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("dialect, node, good, bad, backend", [
    (DRAFT_4, {"type": "array", "items": {"type": "integer"}, "contains": {"enum": [2]}}, [[2], [3, 2]], [[], [3]],
     "llguidance"),
    (DRAFT_4, {"type": "array", "items": {"type": "integer"}, "contains": {"enum": [2]}}, [[3, 2]], [[], [3]],
     "outlines"),
    (DRAFT_4, {"type": "object", "propertyNames": {"not": {"minLength": 2}},
               "additionalProperties": {"type": "integer"}}, [{}, {"a": 1}], [{"ab": 1}], "llguidance"),
    (DRAFT_6, {"type": "integer", "if": {"multipleOf": 3}, "then": {"minimum": 10}}, [4, 12], [3], "llguidance"),
    (DRAFT_6, {"type": "integer", "if": {"multipleOf": 3}, "then": {"minimum": 10}}, [4, 12], [3], "outlines"),
])
def test_a_keyword_a_later_draft_defines_is_enforced_where_its_node_only_asserts(dialect, node, good, bad, backend,
                                                                                 strict, gpt2_compiler, tokenizers,
                                                                                 vocabs):
    """README (Drafts): a keyword the draft does not define, left where its node only asserts, is enforced as the
    later draft defines it. llguidance leaves draft 4's `contains`, `propertyNames`, `if` (draft 6's `if`) out
    without a word, and the late checks read the draft: `{"v": []}` and `[3]` were written under `contains`, strict,
    and nothing was named unenforced (QA typedrop F6). Walks end valid as draft 7 reads the schema."""
    schema = {"$schema": dialect, **_object(node)}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=strict,
                                             backend=backend))
    assert g.unenforced == ()
    for value in good:
        assert accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value), value
    for value in bad:
        assert not accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value), value
    ended = ended_walks_valid(g, vocabs["gpt2"], {**schema, "$schema": DRAFT_7}, seed=0, walks=12, max_tokens=40)
    # (under outlines, no walk ends beside a `contains` checked late, in draft 7 either)
    assert ended > 0 or (backend == "outlines" and "contains" in node)


DRAFT_2019, DRAFT_2020 = "https://json-schema.org/draft/2019-09/schema", "https://json-schema.org/draft/2020-12/schema"
PREFIXED = {"type": "array", "prefixItems": [{"type": "integer"}]}


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("dialect, node, good, bad, reading", [
    (DRAFT_7, PREFIXED, [[], [1], [1, "a"]], [["a"], ["a", 1]], DRAFT_2020),
    (DRAFT_4, PREFIXED, [[1, "a"]], [["a"]], DRAFT_2020),
    (DRAFT_2019, PREFIXED, [[1, "a"]], [["a"]], DRAFT_2020),
    # (the old draft's `items` still holds every item: valid under either reading)
    (DRAFT_7, {**PREFIXED, "items": {"type": "number"}}, [[1, 2.5]], [[1, "a"], [2.5]], None),
    (DRAFT_7, {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}, "minContains": 2},
     [[1, 1], [2, 1, 1]], [[1], [2, 1]], DRAFT_2019),
    # (`contains` asks for one item at least before 2019-09, whatever `minContains` says)
    (DRAFT_7, {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}, "minContains": 0,
               "maxContains": 1}, [[1], [2, 1, 2]], [[], [2], [1, 1]], None),
    (DRAFT_6, {"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False},
     [{}, {"a": 1}], [{"b": 1}], DRAFT_2019),
    (DRAFT_7, {"type": "array", "items": [{"type": "integer"}], "unevaluatedItems": False}, [[], [1]], [[1, 2]],
     DRAFT_2019),
])
def test_a_keyword_draft_2019_09_or_2020_12_brings_is_enforced_in_an_earlier_draft(dialect, node, good, bad, reading,
                                                                                   strict, gpt2_compiler, tokenizers,
                                                                                   vocabs):
    """README (Drafts): `prefixItems` before 2020-12, `minContains`/`maxContains` and `unevaluated*` before 2019-09
    are enforced where their node only asserts, as the draft that brought them defines them. llguidance leaves them
    out without a word there, and the late checks read the declared draft: draft 7's `prefixItems: [{"type":
    "integer"}]` took `["a"]`, strict, and nothing was named unenforced. Walks end valid as the later draft reads
    the schema."""
    schema = {"$schema": dialect, **_object(node)}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=strict,
                                             backend="llguidance"))
    assert g.unenforced == ()
    for value in good:
        assert accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value), value
    for value in bad:
        assert not accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value), value
    if reading is not None:
        assert ended_walks_valid(g, vocabs["gpt2"], {**schema, "$schema": reading}, seed=0, walks=12, max_tokens=40)


@pytest.mark.parametrize("dialect, node", [
    (DRAFT_7, {**PREFIXED, "items": {"type": "number"}, "maxItems": 3}),
    (DRAFT_7, {**PREFIXED, "additionalItems": False, "maxItems": 3}),
    (DRAFT_7, {"type": "array", "prefixItems": [{"type": "integer"}] * 2, "items": [{"type": "number"}],
               "additionalItems": {"type": "number"}, "maxItems": 3}),
    (DRAFT_4, {**PREFIXED, "items": {"type": "number"}, "maxItems": 3}),
    (DRAFT_2019, {**PREFIXED, "items": {"type": "number"}, "maxItems": 3}),
])
def test_a_later_drafts_prefix_items_leaves_every_answer_a_way_to_end(dialect, node, gpt2_compiler, vocabs):
    """llguidance ignores `prefixItems` before 2020-12, and the late checks refused the array only once it closed:
    `[1.5` under draft 7's `prefixItems: [{"type": "integer"}]` beside `items: {"type": "number"}` was written,
    and nothing could follow it (the matcher gave up). Written as the draft's own `items` list, the grammar holds
    each item as it is written. Every walk ends valid under either reading (2020-12's, where it reads `items`)."""
    schema = {"$schema": dialect, **node}
    g = _compile(gpt2_compiler, schema)
    for reading in [schema] + ([{**schema, "$schema": DRAFT_2020}] if isinstance(node.get("items"), dict) else []):
        assert ended_walks_valid(g, vocabs["gpt2"], reading, seed=0, walks=25, max_tokens=60) > 0


def test_a_later_drafts_prefix_items_holding_a_recursive_reference_still_compiles(gpt2_compiler, tokenizers,
                                                                                 vocabs):
    """Written as an `items` list, the recursive `$ref` met the `items` schema in an `allOf`, which llguidance
    refuses ("circular references with sibling keys are not supported"): a 400 for a schema `{"kids": [{}]}`
    satisfies. Such a `prefixItems` is left to the late checks."""
    tree = {"type": "object", "properties": {"kids": {"type": "array", "prefixItems": [{"$ref": "#/definitions/t"}],
                                                      "items": {"type": "object"}, "maxItems": 2}},
            "additionalProperties": False}
    g = _compile(gpt2_compiler, {"$schema": DRAFT_7, "$ref": "#/definitions/t", "definitions": {"t": tree}})
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    assert accepts_document(g, tok, vocab, {"kids": [{}]}) and not accepts_document(g, tok, vocab, {"kids": [1]})


@pytest.mark.parametrize("schema", [
    {"$schema": DRAFT_7, "enum": [{"a": 1}, {"b": 1}], "properties": {"a": {}}, "unevaluatedProperties": False},
    {"$schema": DRAFT_6, "type": "object", "properties": {"a": {"type": "integer"}},
     "allOf": [{"properties": {"b": {"type": "string"}}}], "unevaluatedProperties": False},
    {"$schema": DRAFT_4, "type": "array", "items": [{"type": "integer"}], "unevaluatedItems": {"type": "string"},
     "maxItems": 3},
])
def test_a_later_drafts_unevaluated_keyword_leaves_every_answer_a_way_to_end(schema, gpt2_compiler, vocabs):
    """Enforced before 2019-09 (README, Drafts) but left to the late checks, the value was refused only once
    finished: an answer that wrote `{"b": 1` under the enum had no way to end (the matcher gave up). Every walk ends
    valid under either reading."""
    g = _compile(gpt2_compiler, schema)
    for reading in (schema, {**schema, "$schema": DRAFT_2019}):
        assert ended_walks_valid(g, vocabs["gpt2"], reading, seed=0, walks=25, max_tokens=60) > 0


@pytest.mark.parametrize("backend", ["llguidance", "auto"])
@pytest.mark.parametrize("node, good, bad", [
    ({"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"]}, [{"a": 1}], [{"a": 2}, {"a": "x"}]),
    ({"type": "array", "items": [{"const": "x"}], "uniqueItems": True, "maxItems": 3}, [["x"], ["x", 1]],
     [["y"], ["x", "x"]]),
    ({"type": "array", "items": {"const": [1]}, "enum": [[[1]], [[2]], []]}, [[[1]], []], [[[2]]]),
])
def test_draft_4s_const_is_enforced_where_its_node_only_asserts(node, good, bad, backend, gpt2_compiler, tokenizers,
                                                                  vocabs):
    """README (Drafts): draft 4's `const` is enforced as draft 6 defines it where its node only asserts.
    llguidance ignores it in draft 4 without a word and nothing checked it late: `properties: {"a": {"const":
    1}}` took `{"a": 2}`, strict, named nothing unenforced, and random walks wrote any value there."""
    schema = {"$schema": DRAFT_4, "type": "object", "properties": {"v": node}, "required": ["v"]}
    g = _compile(gpt2_compiler, schema, backend)
    assert g.unenforced == ()
    for value in good:
        assert accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value), value
    for value in bad:
        assert not accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value), value
    assert ended_walks_valid(g, vocabs["gpt2"], {**schema, "$schema": DRAFT_6}, seed=0, walks=12, max_tokens=40)


def test_a_later_drafts_keyword_in_a_one_of_member_is_read_as_the_draft_reads_it(gpt2_compiler, tokenizers, vocabs):
    """Where a value may fail it, a keyword the draft lacks means nothing, as the draft says: the first member of
    this `oneOf` takes every array in draft 7, so only arrays the second refuses pass."""
    schema = {"$schema": DRAFT_7, **_object({"type": "array", "oneOf": [PREFIXED, {"maxItems": 1}]})}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))
    for value, valid in (([1], False), (["a"], False), (["a", 1], True), ([1, 1], True)):
        assert accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value) == valid, value


def test_a_functions_draft_4_contains_is_enforced_as_draft_7_defines_it(gpt2_compiler, tokenizers, vocabs):
    """The calls' schema names no draft; llguidance reads the function's `$schema` there, and left its `contains`
    out without a word (QA typedrop F6)."""
    params = {"$schema": DRAFT_4, "type": "object", "additionalProperties": False, "required": ["v"],
              "properties": {"v": {"type": "array", "items": {"type": "integer"}, "contains": {"enum": [2]}}}}
    spec = spec_from_request(tools=[{"type": "function", "function": {"name": "f", "parameters": params}}],
                             tool_choice="required", tool_format="json_array", backend="llguidance")
    g = gpt2_compiler.compile(spec)
    assert g.unenforced == ()
    for v, valid in (([], False), ([3], False), ([2], True), ([3, 2], True)):
        call = [{"name": "f", "arguments": {"v": v}}]
        assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], call) == valid, v


@pytest.mark.parametrize("dialect, parameters, arguments", [
    (DRAFT_4, {"properties": {"n": {"type": "number"}}, "required": ["n"],
               "not": {"properties": {"n": {"maximum": 5, "exclusiveMaximum": True}}}},
     [('{"n": 7}', True), ('{"n": 5}', True), ('{"n": 3}', False)]),
    (DRAFT_4, {"properties": {"n": {"type": "number", "not": {"maximum": 5, "exclusiveMaximum": True}}},
               "required": ["n"]}, [('{"n": 5}', True), ('{"n": 3}', False)]),
    (DRAFT_4, {"properties": {"n": {"type": "number", "not": {"type": "integer"}}}, "required": ["n"]},
     [('{"n": 1.0}', True), ('{"n": 1.5}', True), ('{"n": 2}', False)]),
    (DRAFT_7, {"properties": {"n": {"type": "array", "not": {"items": [{"type": "string"}],
                                                             "additionalItems": False}}}, "required": ["n"]},
     [('{"n": [1]}', True), ('{"n": ["a", 1]}', True), ('{"n": ["a"]}', False)]),
    # (draft 7 has no `maxContains`; where its node only asserts, it is enforced as 2019-09 defines it, README
    # Drafts, by the member check and the check of the finished value alike: QA review11 F3 had the one without the
    # other)
    (DRAFT_7, {"properties": {"n": {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1},
                                    "maxContains": 1}}, "required": ["n"]},
     [('{"n": [1, 1]}', False), ('{"n": [1]}', True), ('{"n": [2, 1, 2]}', True), ('{"n": [2]}', False)]),
    (DRAFT_7, {"properties": {"n": {"type": "array", "items": {"type": "integer"}, "oneOf": [
        {"contains": {"const": 1}, "maxContains": 1}]}}, "required": ["n"]},
     [('{"n": [1, 1]}', True), ('{"n": [1]}', True), ('{"n": [2]}', False)]),
])
def test_a_functions_parameters_are_checked_in_the_draft_they_name(dialect, parameters, arguments, gpt2_compiler,
                                                                    tokenizers, vocabs):
    """The calls' schema names no draft; a function's parameters keep theirs, and the checks read them in it: a
    draft-4 boolean `exclusiveMaximum` was read as the bound 1 (`{"n": 3}` passed a `not` that refuses it), and
    draft 7's list `items` as nothing any value passed (QA review10 F1)."""
    params = {"$schema": dialect, "type": "object", "additionalProperties": False, **parameters}
    spec = spec_from_request(tools=[{"type": "function", "function": {"name": "f", "parameters": params}}],
                             tool_choice="required", tool_format="json_array", backend="llguidance")
    g = gpt2_compiler.compile(spec)
    assert isinstance(g, LateGrammar) and g.unenforced == ()
    validator = validator_class(params, later_keywords=True)(as_read_where_unasserted(params))  # (README, Drafts)
    for text, valid in arguments:
        assert validator.is_valid(json.loads(text)) == valid, text
        call = '[{"name": "f", "arguments": ' + text + '}]'
        assert _accepts(g, tokenizers["gpt2"], vocabs["gpt2"], call) == valid, text


def test_a_subschema_naming_its_dialect_keeps_the_checks():
    """jsonschema's `evolve` takes its own validator class for a subschema that names a `$schema`: floats, and
    Python's `re` on the client's regex (`^(a+)+$` ran for seconds on the engine thread: QA review9 F2). The
    checks' class stays, whatever a subschema names."""
    from constrain.late_keywords import plan_late_keywords

    dialect = "https://json-schema.org/draft/2020-12/schema"
    schema = {"$schema": dialect, "type": "array", "items": {"$schema": dialect, "type": "string"},
              "contains": {"$schema": dialect, "pattern": "^(a+)+$"}}
    plan = plan_late_keywords(schema, one_of=False)
    for node in (schema, schema["items"], schema["contains"]):
        assert type(plan.validator.evolve(schema=node)) is type(plan.validator)
    assert not plan.holds(schema, ["a" * 40 + "!"]) and plan.holds(schema, ["aa", "b"])


@pytest.mark.parametrize("schema", [
    {"anyOf": [_object(ARRAYS), {"type": "null"}]},
    {"type": "object", "properties": {"w": {"anyOf": [{"type": "null"}, _object(ARRAYS)]}}, "required": ["w"]},
])
def test_a_value_below_a_choice_is_refused_when_it_is_finished_not_with_the_document(schema, gpt2_compiler,
                                                                                     tokenizers, vocabs):
    """`[1]` holds in both oneOf branches under every choice of the anyOf: its "]" is refused (it could no
    longer be repaired once the document around it is closed)."""
    g = _compile(gpt2_compiler, schema)
    tok = tokenizers["gpt2"]
    prefix = '{"v": [1' if "anyOf" in schema else '{"w": {"v": [1'
    bitmask = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    for last, allowed in [("1", False), ("-1", True)]:
        m = g.matcher()
        assert all(m.accept(t) for t in tok.encode(prefix[:-1] + last, add_special_tokens=False))
        m.fill_bitmask(bitmask, 0)
        close = tok.convert_tokens_to_ids("]")
        assert bool((bitmask[0, close // 32] >> (close % 32)) & 1) == allowed


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_a_member_that_breaks_its_container_for_good_is_refused_when_it_is_written(name, tokenizers, vocabs):
    """uniqueItems, propertyNames and maxProperties cannot be repaired by what follows: the container so far is
    checked as each member is finished, so the member's last token is refused (here the "}" of a repeated
    object, the quote closing a refused name or a repeated key), not only the container's end. Nor can a key
    after which too few declared properties are left for minProperties."""
    from constrain import GrammarCompiler

    names = {"type": "object", "propertyNames": {"anyOf": [{"maxLength": 2}, {"const": "long"}]},
             "additionalProperties": {"type": "integer"}}
    # (one-character keys, too many names to declare them: constrain/rewrite.py declares up to 64)
    letters = {"type": "object", "patternProperties": {"^[a-z\u0100-\u017f]$": True}, "additionalProperties": False,
               "minProperties": 2}
    compiler = GrammarCompiler(vocabs[name], tokenizers[name], backend="llguidance")
    try:
        for schema, prefix, last, allowed in [
            (UNIQUE_OBJECTS, '{"v": [{"a": "x"}, {"a": "x"', "}", False),
            (UNIQUE_OBJECTS, '{"v": [{"a": "x"}, {"a": "y"', "}", True),
            (_object(names), '{"v": {"ab": 1', ",", True),
            (_object(names), '{"v": {"long": 1', ",", True),
            (_object(names), '{"v": {"abc', '":', False),  # (the name itself, as its quote closes)
            (_object(names), '{"v": {"ab', '":', True),
            # where the backend counts pairs towards minProperties, a repeated key (which would count twice)
            (_object({"type": "object", "minProperties": 2}), '{"v": {"a": 1, "a', '":', False),
            (_object({"type": "object", "minProperties": 2}), '{"v": {"a": 1, "b', '":', True),
            # ... and where the key has no other ending, the token that writes it again is refused while another
            # key may follow (constrain/distinct_keys.py looks one token ahead)
            (_object(letters), '{"v": {"a": 1, "', "a", False),
            (_object(letters), '{"v": {"a": 1, "', "b", True),
            # min/maxProperties 2..3 over keys written in the declared order a..h: after "g" one key may follow;
            # after three members, no comma (a fourth key could never end the object)
            (_object(EIGHT_KEYS), '{"v": {"g', '":', True),
            (_object(EIGHT_KEYS), '{"v": {"a": 1, "h', '":', True),
            (_object(EIGHT_KEYS), '{"v": {"a": 1, "b": 2, "c": 3', ",", False),
            (_object(EIGHT_KEYS), '{"v": {"a": 1, "b": 2, "c": 3', "}", True),
            (_object(EIGHT_KEYS), '{"v": {"a": 1, "b": 2', ",", True),
            # maxProperties counts key/value pairs as written: at the limit no comma follows (a repeated key, which
            # counted again, is not written at all now: constrain/distinct_keys.py)
            (_object({"type": "object", "maxProperties": 2, "propertyNames": {"not": {"const": "z"}}}),
             '{"v": {"a": 1, "b": 2', ",", False),
            (_object({"type": "object", "maxProperties": 2, "propertyNames": {"not": {"const": "z"}}}),
             '{"v": {"a": 1', ",", True),
        ]:
            g = _compile(compiler, schema)
            assert isinstance(g, LateGrammar)
            m = g.matcher()
            assert all(m.accept(t) for t in tokenizers[name].encode(prefix, add_special_tokens=False)), prefix
            bitmask = torch.zeros((1, vocabs[name].words), dtype=torch.int32)
            m.fill_bitmask(bitmask, 0)
            tid = tokenizers[name].convert_tokens_to_ids(last)
            assert bool((bitmask[0, tid // 32] >> (tid % 32)) & 1) == allowed, (prefix, last)
    finally:
        compiler.close()


def test_a_number_at_the_root_that_its_schema_refuses_neither_ends_nor_counts_as_complete(gpt2_compiler, tokenizers,
                                                                                         vocabs):
    g = _compile(gpt2_compiler, LATE_CASES[0][0])
    eos = min(vocabs["gpt2"].eos_token_ids)
    bitmask = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    for text, valid in [("12", False), ("13", True)]:
        m = g.matcher()
        assert all(m.accept(t) for t in tokenizers["gpt2"].encode(text, add_special_tokens=False))
        m.fill_bitmask(bitmask, 0)
        assert bool((bitmask[0, eos // 32] >> (eos % 32)) & 1) == valid
        assert m.can_end() == valid and (not m.is_terminated() if not valid else True)


UNIQUE_OBJECTS = _object({"type": "array", "uniqueItems": True, "items": {
    "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False}})


@pytest.mark.parametrize("schema", [_object({"type": "integer", "minimum": 1, "not": {"multipleOf": 3}}),
                                    UNIQUE_OBJECTS, LATE_CASES[4][0]])
def test_random_walks_end_in_documents_valid_against_keywords_checked_late(schema, gpt2_compiler, vocabs):
    """Values that can always be continued: from 1 up (a 0, a multiple of 3, could not be, and its end stays
    refused), strings in unique objects (an object repeating an earlier one is refused at its "}", and its string
    goes on instead). `contains` is left out: random tokens seldom write the value it asks for, and the budget
    rule's closing does not know of it."""
    assert ended_walks_valid(_compile(gpt2_compiler, schema), vocabs["gpt2"], schema, seed=3) >= 15


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("schema", [COUNT_IN_ALL_OF, COUNT_IN_ANY_OF])
def test_a_count_beside_optional_properties_of_another_member_is_checked_strict_or_not(schema, strict, gpt2_compiler,
                                                                                      vocabs):
    """llguidance refused such a count whether the schema was strict or not (a 400 without a pointer); every
    count is now taken out for it and checked late, and answers end valid."""
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=strict))
    assert isinstance(g, LateGrammar) and g.unenforced == ()
    assert ended_walks_valid(g, vocabs["gpt2"], schema, seed=5) >= 15


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2}, "contains": {"const": 1},
     "minContains": 0, "maxContains": 0, "minItems": 2, "maxItems": 4},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2}, "contains": {"const": 1},
     "maxContains": 1, "minItems": 3, "maxItems": 4},
])
def test_an_item_past_max_contains_is_refused_as_it_is_written(schema, gpt2_compiler, vocabs):
    """maxContains was checked at the array's `]` only: a `1` beyond it was written, after which every way on was
    refused, and the request was a 400 constraint_too_complex (greedy too: `[1 ,2 ,2 , 1`). The array so far is now
    checked as each item is finished, as uniqueItems is."""
    assert ended_walks_valid(_compile(gpt2_compiler, schema), vocabs["gpt2"], schema, seed=3, max_tokens=30) >= 20


@pytest.mark.parametrize("schema", [
    {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    {"type": "number", "not": {"type": "integer"}},
    {"type": "object", "properties": {"n": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}, "required": ["n"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "number", "not": {"multipleOf": 1}}, "minItems": 1},
])
def test_a_number_that_must_not_be_an_integer_never_writes_an_exponent_that_leads_nowhere(schema, gpt2_compiler,
                                                                                           vocabs):
    """An exponent written without `-` only grows: once `765e2` or `1.5e+` reads as an integer, so does every
    exponent after it, and each digit looked like a way on to the one-token lookahead: most random walks gave up
    there (constraint_too_complex). The lookahead now reads the exponents still reachable."""
    assert ended_walks_valid(_compile(gpt2_compiler, schema), vocabs["gpt2"], schema, seed=2, walks=40,
                             max_tokens=40) >= 30


@pytest.mark.parametrize("backend", ["llguidance", "auto"])
def test_max_contains_holds_arrays_only(backend, gpt2_compiler, tokenizers, vocabs):
    """`contains` takes any value but an array, so `maxContains` says nothing of an object: its check, as each
    member is finished, refused every object with a member (`{"b": 1}`; found by a differential fuzz)."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "contains": {"minimum": 1},
              "maxContains": 2}
    g = _compile(gpt2_compiler, schema, backend)
    validator = validator_class(schema)(schema)
    for value in ({"b": 1}, {"a": [1, 1, 1], "b": "s"}, {}, "s", 5, [1, 1], [1, 1, 1], [0], []):
        assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], value) == validator.is_valid(value), value


@pytest.mark.parametrize("schema", [_object(ARRAYS), CASES[3][0]])
def test_random_walks_end_in_documents_valid_against_the_one_of(schema, gpt2_compiler, vocabs):
    assert ended_walks_valid(_compile(gpt2_compiler, schema), vocabs["gpt2"], schema, seed=11) >= 15


def test_schemas_the_backend_takes_as_they_are_are_not_wrapped(gpt2_compiler):
    disjoint = _object({"oneOf": [{"type": "string"}, {"type": "integer"}]})
    assert not isinstance(_compile(gpt2_compiler, disjoint), LateGrammar)


def test_a_tool_parameter_one_of_is_kept_exact(gpt2_compiler, tokenizers, vocabs):
    spec = spec_from_request(tools=[{"type": "function", "function": {"name": "f", "strict": True,
                                                                      "parameters": _object(ARRAYS)}}],
                             tool_choice="required")
    g = gpt2_compiler.compile(spec)
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    assert _accepts(g, tok, vocab, '[{"name": "f", "arguments": {"v": [-1]}}]')
    assert not _accepts(g, tok, vocab, '[{"name": "f", "arguments": {"v": [3]}}]')


def _under_an_unknown_key(key: str, ref: str) -> dict:
    """A oneOf under `full`, no keyword: only the $ref that names it leads there (JsonSchemaStore's vtestunit)."""
    return {"$ref": f"#/definitions/{ref}/full", "definitions": {key: {"full": {
        "type": "object", "properties": {"v": {"type": "array", "items": {"oneOf": [
            {"type": "object", "properties": {"x": {"type": "integer"}}, "additionalProperties": False},
            {"type": "object", "properties": {"y": {"type": "integer"}}, "additionalProperties": False}]}}},
        "required": ["v"], "additionalProperties": False}}}}


@pytest.mark.parametrize("key, ref", [("a", "a"), ("a b", "a%20b"), ("é", "%C3%A9")])
def test_a_one_of_that_only_a_ref_leads_to_is_checked_without_strict_too(key, ref, gpt2_compiler, tokenizers,
                                                                         vocabs):
    """llguidance said `oneOf` was left unenforced, and the keyword was looked for only where a walk of the schema
    goes: none was found, the root `/` was named, and so no check took it up: `{"v": [{}]}` (both branches match)
    was served without strict, where strict checked it (QA soundness F2). A $ref is percent-encoded as a URI
    fragment is (review of 97238d0)."""
    spec = ConstraintSpec(kind="json_schema", schema=normalise_schema(_under_an_unknown_key(key, ref)),
                          strict=False, backend="llguidance")
    g = gpt2_compiler.compile(spec)
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    assert g.unenforced == ()
    assert _accepts(g, tok, vocab, '{"v": [{"x": 1}, {"y": 2}]}')
    assert not _accepts(g, tok, vocab, '{"v": [{}]}')


NESTED = {"type": "object", "properties": {"v": {
    "type": "object", "oneOf": [{"properties": {"t": {"items": {"type": "integer"}}}},
                                {"properties": {"t": {"items": {"type": "number", "minimum": 0}}}}],
    "properties": {"t": {"type": "array"}, "w": ARRAYS}, "required": ["t"], "additionalProperties": False}},
    "required": ["v"], "additionalProperties": False}


def test_a_one_of_inside_a_governed_value_is_kept_exact_too(gpt2_compiler, tokenizers, vocabs):
    """`w` is held by the value's own `properties` (not by a branch): both oneOfs are checked, each when its
    value is finished, also by one token finishing both."""
    g = _compile(gpt2_compiler, NESTED)
    assert isinstance(g, LateGrammar) and len(g.plan.pointers) == 2
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
    assert isinstance(g, LateGrammar)
    assert _accepts(g, tokenizers["gpt2"], vocabs["gpt2"], '{"v": [-1]}')
    assert not _accepts(g, tokenizers["gpt2"], vocabs["gpt2"], '{"v": [1]}')


def test_formats_are_checked_where_jsonschema_can_and_host_names_and_durations_as_the_grammar_writes_them(
        gpt2_compiler, tokenizers, vocabs):
    """Dates or strings of at most 10 characters: "2024-01-01" is both (refused), "2024-13-01" only the second.
    jsonschema checks durations and host names only with packages not installed here, and a format it cannot check
    counted as holding: "Px" was refused though it is no duration, and `propertyNames: {format: hostname}` let any
    key through (QA). They are checked as the grammar writes them (constrain/formats.py)."""
    dates = _object({"oneOf": [{"type": "array", "items": {"type": "string", "format": "date"}},
                               {"type": "array", "items": {"type": "string", "maxLength": 10}}]})
    g = _compile(gpt2_compiler, dates)
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    assert _accepts(g, tok, vocab, '{"v": ["2024-13-01"]}') and _accepts(g, tok, vocab, '{"v": ["abc"]}')
    assert not _accepts(g, tok, vocab, '{"v": ["2024-01-01"]}')
    durations = _object({"oneOf": [{"type": "array", "items": {"type": "string", "format": "duration"}},
                                   {"type": "array", "items": {"type": "string", "pattern": "^P[a-z]"}}]})
    g = _compile(gpt2_compiler, durations)
    assert _accepts(g, tok, vocab, '{"v": ["P1D"]}') and _accepts(g, tok, vocab, '{"v": ["Px"]}')
    hosts = _object({"oneOf": [{"type": "array", "items": {"type": "string", "format": "hostname"}},
                               {"type": "array", "items": {"type": "string", "maxLength": 3}}]})
    g = _compile(gpt2_compiler, hosts)
    assert _accepts(g, tok, vocab, '{"v": ["a b"]}') and _accepts(g, tok, vocab, '{"v": ["abcd.ef"]}')
    assert not _accepts(g, tok, vocab, '{"v": ["abc"]}')


@pytest.mark.parametrize("schema", [
    # a oneOf under properties of a node that also has patternProperties: the property's schema applies for sure
    {"type": "object", "properties": {"v": ARRAYS}, "patternProperties": {"^x": {}}, "required": ["v"]},
    # allOf of a tuple array and an array of governed items: the second still names the items exactly
    {"type": "array", "allOf": [{"prefixItems": [{}]}, {"items": ARRAYS}], "minItems": 1},
])
def test_a_governed_value_is_found_where_other_subschemas_beside_are_not_followed(schema, gpt2_compiler, tokenizers,
                                                                                   vocabs):
    g = _compile(gpt2_compiler, schema)
    assert isinstance(g, LateGrammar)
    text = '{"v": [1]}' if schema["type"] == "object" else "[[1]]"  # valid in both branches: refused
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    assert not _accepts(g, tokenizers["gpt2"], vocabs["gpt2"], text)
    good = '{"v": [-1]}' if schema["type"] == "object" else "[[-1]]"
    assert _accepts(g, tokenizers["gpt2"], vocabs["gpt2"], good)


def test_a_one_of_in_draft_7_dependencies_is_checked_with_the_object_that_holds_it(gpt2_compiler, tokenizers,
                                                                                   vocabs):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}},
              "dependencies": {"a": {"properties": {"v": ARRAYS}}}}
    g = _compile(gpt2_compiler, schema)
    assert isinstance(g, LateGrammar)
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    for text, valid in [('{"a": 1, "v": [-1]}', True), ('{"v": [1]}', True), ('{"a": 1, "v": [1]}', False)]:
        assert jsonschema.Draft7Validator(schema).is_valid(json.loads(text)) == valid
        assert _accepts(g, tok, vocab, text) == valid, text


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
    assert isinstance(g, LateGrammar)
    m = g.matcher()
    for t in tokenizers["gpt2"].encode('{"v": [2 ', add_special_tokens=False):  # (one space at most)
        assert m.accept(t)
    with pytest.raises(ConstraintError) as exc:  # only "]" could follow, and [2] is in both branches
        m.fill_bitmask(torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32), 0)
    assert exc.value.code == "constraint_too_complex" and "oneOf" in exc.value.message


def test_the_checks_wrap_the_outlines_backend_too(gpt2_compiler, tokenizers, vocabs):
    """The wrapper only reads masks and bytes: outlines serves the schema without the late keyword."""
    schema = LATE_CASES[1][0]
    g = _compile(gpt2_compiler, schema, backend="outlines")
    assert isinstance(g, LateGrammar) and g.backend == "outlines"
    for text, valid in [('{"v": 4}', True), ('{"v": 3}', False), ('{"v": 12}', False), ('{"v": 13}', True)]:
        assert _accepts(g, tokenizers["gpt2"], vocabs["gpt2"], text) == valid, text


INTEGER_OR_NONNEGATIVE = _object({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]})


def _write_vetted(m, tok, vocab, text: str) -> torch.Tensor:
    """Writes `text`'s tokens through the mask and `vet` (each must stand) and fills the next step's mask."""
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    for t in tok.encode(text, add_special_tokens=False):
        m.fill_bitmask(bitmask, 0)
        assert m.vet(t, None) == t and m.accept(t)
    m.fill_bitmask(bitmask, 0)
    return bitmask


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_a_token_that_leads_to_a_dead_end_is_replaced_by_one_with_a_way_on(name, tokenizers, vocabs):
    """`-0` under integers-or-numbers >= 0: only the integer branch goes on after `-`, and `-0` can only end as 0,
    which both branches hold. The mask cannot see that one token ahead; `vet` does, and takes another digit."""
    tok, vocab = tokenizers[name], vocabs[name]
    compiler = GrammarCompiler(vocab, tok, backend="llguidance", background_outlines=False)
    m = _compile(compiler, INTEGER_OR_NONNEGATIVE).matcher()
    bitmask = _write_vetted(m, tok, vocab, '{"v": -')
    zero = tok.convert_tokens_to_ids("0")
    assert zero in allowed_ids(bitmask)  # the mask allows it: the dead end is a token further on
    replaced = m.vet(zero, None)
    assert replaced != zero and m.accept(replaced)
    assert vocab.token_bytes[replaced][:1].isdigit()
    m.fill_bitmask(bitmask, 0)  # a way on: the output can end valid from here
    closers = [i for i in allowed_ids(bitmask).tolist() if vocab.token_bytes[i] == b"}"]
    assert closers and m.accept(closers[0]) and m.can_end()


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_a_key_after_which_too_few_properties_are_left_is_replaced(name, tokenizers, vocabs):
    """minProperties: 2 over keys the backend writes in the declared order a..h: a first key "h" leaves no key to
    follow it, so the object could never close. Its name is refused as its quote closes, and the lookahead
    replaces the `h` that leads there; after another key, "h" stands."""
    tok, vocab = tokenizers[name], vocabs[name]
    compiler = GrammarCompiler(vocab, tok, backend="llguidance", background_outlines=False)
    try:
        g = _compile(compiler, EIGHT_KEYS)
        h = tok.convert_tokens_to_ids("h")
        m = g.matcher()
        bitmask = _write_vetted(m, tok, vocab, '{"')
        assert h in allowed_ids(bitmask)  # the grammar takes it: the dead end is a token further on
        replaced = m.vet(h, None)
        assert replaced != h and m.accept(replaced)
        m = g.matcher()
        _write_vetted(m, tok, vocab, '{"a": 1, "')
        assert m.vet(h, None) == h and m.accept(h)
        _write_vetted(m, tok, vocab, '": 2}')
        assert m.can_end()
    finally:
        compiler.close()


UNIQUE_DIGITS = {"type": "array", "uniqueItems": True, "maxItems": 4, "items": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"],
    "additionalProperties": False}}


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_the_lookahead_sees_past_whitespace(backend, tokenizers, vocabs):
    """After `[{"a": 0}, {"a": 0` only a space may follow, and after it only `}`, which would repeat an item:
    the `0` is a dead end two tokens deep, past the whitespace, and is replaced by another digit. (On outlines
    the lookahead was skipped: repeats of such a schema, which `auto` serves with outlines, ended in a 400
    `constraint_too_complex` mid-answer, 4 seeds in 30.)"""
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    compiler = GrammarCompiler(vocab, tok, backend=backend, background_outlines=False)
    try:
        digits = {**UNIQUE_DIGITS, "items": {**UNIQUE_DIGITS["items"], "properties": {"a": {"enum": list(range(10))}}}}
        grammar = _compile(compiler, digits, backend)  # (outlines enforces no minimum or maximum)
        assert grammar.backend == backend
        m = grammar.matcher()
        _write_vetted(m, tok, vocab, '[{"a": 0}, {"a": ')
        zero = tok.convert_tokens_to_ids("0")
        replaced = m.vet(zero, None)
        assert replaced != zero and vocab.token_bytes[replaced][:1].isdigit() and m.accept(replaced)
        _write_vetted(m, tok, vocab, "}]")
        assert m.can_end()
    finally:
        compiler.close()


@pytest.mark.parametrize("schema, ended", [(INTEGER_OR_NONNEGATIVE, 150),
                                            (_object({"type": "integer", "not": {"multipleOf": 3}}), 195),
                                            (UNIQUE_DIGITS, 190), (EIGHT_KEYS, 195)])
def test_walks_under_late_checks_never_reach_a_dead_end(schema, ended, tokenizers, vocabs):
    """On Qwen2's vocabulary, before the lookahead: 8 of 200 walks wrote `-0` under the overlapping oneOf, and
    about 1 in 11 wrote a `0` (which cannot go on) under `not: {multipleOf: 3}`; each ended in a dead-end error.
    Before it looked past whitespace, 24 of 200 walks wrote an item of a uniqueItems array that could only end
    as a repeat (`{"a": 0` then a space, then only `}`). Before keys and commas were checked against the
    property counts, 44 of 200 walks under EIGHT_KEYS wrote a first key after which too few were left, or a
    fourth member, and could never close the object (a number then runs to the limit)."""
    compiler = GrammarCompiler(vocabs["qwen2"], tokenizers["qwen2"], backend="llguidance", background_outlines=False)
    assert ended_walks_valid(_compile(compiler, schema), vocabs["qwen2"], schema, seed=0, walks=200) >= ended


MISREAD = [  # (number keywords, the excluded end as written, a value inside)
    ({"exclusiveMinimum": 0, "maximum": 0.5}, "0", "0.25"),
    ({"exclusiveMinimum": 0, "exclusiveMaximum": 0.99}, "0", "0.5"),
    ({"exclusiveMinimum": -0.5, "exclusiveMaximum": 0}, "-0", "-0.25"),
    ({"exclusiveMinimum": 2, "maximum": 2.5}, "2", "2.1"),
    ({"minimum": -1.5, "exclusiveMaximum": -1}, "-1", "-1.25"),
    ({"minimum": 0, "exclusiveMinimum": True, "maximum": 0.5}, "0", "0.25"),  # (draft 4's form)
]


@pytest.mark.parametrize("bounds, end, inside", MISREAD, ids=[m[1] + str(i) for i, m in enumerate(MISREAD)])
def test_a_number_interval_llguidance_misreads_never_takes_its_excluded_end(gpt2_compiler, tokenizers, vocabs,
                                                                            bounds, end, inside):
    """llguidance 1.x takes an interval's excluded integer end when the other end is less than 1 away: 9 of 10
    answers under `exclusiveMinimum: 0, maximum: 0.5` were `{"x": 0}`. The end is made inclusive for it and the
    interval checked on the finished number."""
    schema = {"type": "object", "properties": {"x": {"type": "number", **bounds}}, "required": ["x"],
              "additionalProperties": False}
    if bounds.get("exclusiveMinimum") is True:
        schema["$schema"] = "http://json-schema.org/draft-04/schema#"
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    for backend in ("llguidance", "auto"):
        g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                                 backend=backend))
        assert not _accepts(g, tok, vocab, '{"x": %s}' % end)
        assert _accepts(g, tok, vocab, '{"x": %s}' % inside) and _accepts(g, tok, vocab, '{"x": %s.1}' % end)
    assert ended_walks_valid(g, vocab, schema, seed=5, walks=12, max_tokens=40, prefer_end=0.3) == 12


NO_WAY_ON = [  # (number keywords, the excluded ends as written, a value inside)
    ({"exclusiveMinimum": 0, "exclusiveMaximum": 1}, ["0", "1"], "0.5"),  # (pydantic's `gt=0, lt=1`)
    ({"minimum": 0.5, "exclusiveMaximum": 1}, ["1"], "0.75"),
    ({"exclusiveMinimum": 0.5, "exclusiveMaximum": 1}, ["1"], "0.75"),
    ({"minimum": 1.5, "exclusiveMaximum": 2}, ["2"], "1.75"),
    ({"exclusiveMinimum": -1, "maximum": -0.5}, ["-1"], "-0.75"),
    ({"exclusiveMinimum": -1, "exclusiveMaximum": 0}, ["-1", "0", "-0"], "-0.5"),
]


@pytest.mark.parametrize("bounds, ends, inside", NO_WAY_ON, ids=[str(i) for i in range(len(NO_WAY_ON))])
def test_an_excluded_end_no_digit_after_could_leave_is_never_begun(gpt2_compiler, tokenizers, vocabs, bounds, ends,
                                                                   inside):
    """`(0, 1)` (pydantic's `Field(gt=0, lt=1)`) answered `0`: the backend's own rewrite moved the upper end to
    0.999999999999999, which left an interval llguidance misreads (QA frameworks F1). And an excluded end made
    inclusive for it at `1` (or `-1` below) let the answer write `1`, then `.000...` to `max_tokens`, since every
    number that begins so is out (F2: half the answers under `ge=0.5, lt=1`). Such an end becomes the nearest
    15-digit decimal inside: neither it nor its spellings are begun, and every walk ends valid."""
    schema = {"type": "object", "properties": {"x": {"type": "number", **bounds}}, "required": ["x"],
              "additionalProperties": False}
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    for backend in ("llguidance", "auto"):
        g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                                 backend=backend))
        assert [end for end in ends if _accepts(g, tok, vocab, '{"x": %s}' % end)
                or _accepts(g, tok, vocab, '{"x": %s.0}' % end)] == []
        assert _accepts(g, tok, vocab, '{"x": %s}' % inside)
    assert ended_walks_valid(g, vocab, schema, seed=5, walks=16, max_tokens=30, prefer_end=0.3) == 16


@pytest.mark.parametrize("bounds, end, inside", [
    ({"exclusiveMinimum": 0, "maximum": 1e-16}, "0", "0.00000000000000005"),
    ({"exclusiveMinimum": 1, "maximum": 1.000000000000005}, "1", "1.000000000000003")])
def test_an_excluded_end_whose_neighbour_passes_the_other_end_is_checked_late(gpt2_compiler, tokenizers, vocabs,
                                                                              bounds, end, inside):
    """The nearest 15-digit decimal inside `(0, 1e-16]` is 1e-15, past its other end: compiled so, the interval
    held no number and `0` was answered (`(1, 1.000000000000005]` was refused as unsatisfiable; QA review F1, F2).
    There the end is made inclusive at `k` and the finished number checked, as before."""
    schema = {"type": "object", "properties": {"x": {"type": "number", **bounds}}, "required": ["x"],
              "additionalProperties": False}
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))
    assert not _accepts(g, tok, vocab, '{"x": %s}' % end) and _accepts(g, tok, vocab, '{"x": %s}' % inside)
    assert ended_walks_valid(g, vocab, schema, seed=5, walks=8, max_tokens=40, prefer_end=0.3) > 0


SPLIT_INTERVALS = [  # (the number's schema, the excluded end, values inside)
    ({"type": "number", "maximum": 1.5, "not": {"const": 1}}, "1", ["0.5", "1.2", "1.5"]),
    ({"type": "number", "maximum": 1.5, "anyOf": [{"exclusiveMaximum": 1}, {"exclusiveMinimum": 1}]}, "1",
     ["0.5", "1.2"]),
    ({"type": "number", "exclusiveMinimum": 1, "anyOf": [{"maximum": 1.5}]}, "1", ["1.2"]),
    ({"allOf": [{"type": "number", "exclusiveMinimum": 1}, {"type": "number", "maximum": 1.5}]}, "1", ["1.2"]),
    ({"type": "number", "exclusiveMaximum": 1.5, "allOf": [{"anyOf": [{"exclusiveMinimum": 1}]}]}, "1", ["1.2"]),
]


@pytest.mark.parametrize("number, end, inside", SPLIT_INTERVALS)
def test_an_interval_split_between_a_node_and_its_members_never_takes_its_excluded_end(
        gpt2_compiler, tokenizers, vocabs, number, end, inside):
    """The bounds of a node meet those of its allOf/anyOf/oneOf members only in llguidance's intersection, where
    it misreads the interval as above (a cross-validator sweep found `1` under `maximum: 1.5, not: {const: 1}`):
    the members hold the node's bounds too, so the check sees the interval."""
    schema = {"type": "object", "properties": {"x": number}, "required": ["x"], "additionalProperties": False}
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))
    assert not _accepts(g, tok, vocab, '{"x": %s}' % end)
    assert [v for v in inside if not _accepts(g, tok, vocab, '{"x": %s}' % v)] == []


def test_a_one_of_beside_a_misread_interval_is_checked_when_the_schema_is_not_strict(gpt2_compiler, tokenizers,
                                                                                      vocabs):
    """The misread interval takes the late path from the start; that path took the first plan the backend
    compiled, which, not strict, left the `oneOf` (kept whole by the `$ref` into it) unenforced: `"ab"`, valid in
    both branches, was taken (QA review F6). The plan that checks it is taken, as for any schema not strict."""
    schema = {"$schema": D2020, "type": "object",
              "properties": {"n": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5},
                             "o": {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]},
                             "r": {"$ref": "#/properties/o/oneOf/1"}}, "required": ["n", "o"],
              "additionalProperties": False}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=False))
    assert g.unenforced == ()
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    assert accepts_document(g, tok, vocab, {"n": 0.1, "o": "abc"})
    assert not accepts_document(g, tok, vocab, {"n": 0.1, "o": "ab"})
    assert not accepts_document(g, tok, vocab, {"n": 0, "o": "abc"})


def test_intervals_llguidance_reads_right_keep_to_the_backend():
    """Only the misread intervals take the late path: `gt=0, le=100` (pydantic's everyday bounds) does not, nor
    `(1e15, 1e15 + 1)`, whose ends the backend's rewrite leaves alone (taken, its upper end ran to max_tokens:
    QA review F3)."""
    from constrain.late_keywords import late_from_the_start
    assert late_from_the_start({"type": "number", "exclusiveMinimum": 0, "maximum": 0.5})
    assert late_from_the_start({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1})
    for bounds in ({"exclusiveMinimum": 0, "maximum": 100}, {"exclusiveMinimum": 0.5, "maximum": 0.75},
                   {"exclusiveMinimum": 0, "maximum": 1}, {"exclusiveMinimum": 0},
                   {"exclusiveMinimum": 1e15, "exclusiveMaximum": 1e15 + 1},
                   {"exclusiveMinimum": -1e15 - 1, "exclusiveMaximum": -1e15}):
        assert not late_from_the_start({"type": "number", **bounds})
    assert not late_from_the_start({"type": "integer", "exclusiveMinimum": 0, "maximum": 5})


@pytest.mark.parametrize("schema", [
    {"type": "number", "not": {"multipleOf": 8}},
    {"type": "number", "allOf": [{"anyOf": [{"multipleOf": 33}, {"multipleOf": 12}]},
                                 {"not": {"multipleOf": 8}}]},
])
def test_the_budget_rule_never_ends_an_output_a_late_check_holds_open(gpt2_compiler, vocabs, schema):
    """Near max_tokens the backend's vet returns an EOS id where its own grammar is complete and the sampled
    token would leave it incomplete; the late check's wrapper passed it on even where the client's schema
    refused the value written (an 8 under `not: {multipleOf: 8}`): the answer ended invalid. Such an EOS is not
    taken now (the walk's check: an EOS only where the matcher can end)."""
    import random

    from constrain.walkbench import random_walk

    grammar = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema),
                                                   strict=True, backend="llguidance"))
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(0)
    for max_tokens in [3, 4, 5, 6, 8, 10] * 6:
        tokens, ended = random_walk(grammar, vocabs["gpt2"], rng, max_tokens, budget=True)
        if ended:
            assert validator.is_valid(json.loads(b"".join(vocabs["gpt2"].token_bytes[t] for t in tokens)))


@pytest.mark.parametrize("schema, limits", [
    (_object({"type": "number", "exclusiveMinimum": 0, "maximum": 0.5}), [8, 10, 12, 16]),  # the walk wrote `0`
    ({"type": "array", "items": {"type": "string", "format": "email"}, "uniqueItems": True, "minItems": 4},
     [40, 60, 80]),  # `"a@a.aa"` twice: a hint where its closing quote is refused, not letters first
    ({"type": "object", "properties": {"a": {"type": "string"}}, "minProperties": 2},  # `{}`, `{"a": ""}`
     [12, 16, 20, 30]),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 7}},  # `[]`: it needs a value's 7
     [12, 16, 20, 30]),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 5}, [16, 20, 30]),  # `"", ""`
    # (eight items ask ~70 questions: past the walk's first limit, 64, 1 walk in 6 ended; README)
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 8}, [60, 100]),
    (_object({"type": "array", "items": {"enum": ["alpha", "beta", "gamma"]}, "uniqueItems": True, "minItems": 2}),
     [16, 20, 30]),
    # `[0,0`, then `0.0`, `0.00`... until the walk gave up: no completion (QA budgetsweep2 F3)
    ({"type": "array", "items": {"type": "number"}, "uniqueItems": True, "minItems": 2}, [8, 10, 12, 16]),
    (_object({"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "minItems": 3}), [12, 16, 20]),
    # every integer is a multiple of 0.5: `-1e+0000...` until the walk gave up, where `-1.1` ends
    (_object({"type": "number", "not": {"multipleOf": 0.5}}), [10, 12, 16]),  # (`3520e0`: no way on; README)
    ({"type": "number", "not": {"multipleOf": 0.5}}, [6, 8, 12]),
    # `[0,0,0...`: the walk never wrote an item `contains` takes (QA latechecks F6)
    ({"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5}}, [12, 16, 20]),
    ({"type": "array", "items": {"type": "string"}, "contains": {"pattern": "^x"}}, [12, 16, 20]),
    # a `oneOf` of open objects: where every key so far suits both (`{"q":1}`), only a container under a name of
    # the pattern (or `rows: []`) ends it; the walk wrote scalars, and 6 answers in 6 ran to 160 tokens (QA walks,
    # JSONSchemaBench Github_trivial o9817)
    ({"oneOf": [{"type": "object", "patternProperties": {"^[a-z]{1,255}$": {"type": ["string", "number", "boolean",
                                                                                     "null"]}}},
                {"type": "object", "properties": {"rows": {"type": "array"}}}]}, [12, 16, 24]),
], ids=["interval", "unique-emails", "minProperties", "contains", "unique-strings", "eight-unique", "unique-enum",
        "unique-numbers", "unique-integers", "not-multiple", "not-multiple-root", "contains-bound",
        "contains-pattern", "one-of-open-objects"])
def test_budget_completions_write_what_the_checks_applied_while_decoding_accept(gpt2_compiler, vocabs, schema,
                                                                                 limits):
    """Near max_tokens the backend's completion steers the answer; it knew nothing of the keywords checked as
    values are finished, so where the check refused the completion the answer ran to the limit, cut (0 to 20
    walks in 30 ended). The completion now asks the checks (with their values as hints, and the schema's strings
    where a closing quote is refused): every walk whose limit holds a document from where the budget rule takes
    over ends complete and valid."""
    import random

    from constrain.walkbench import random_walk, validator_for

    grammar = _compile(gpt2_compiler, schema)
    validator = validator_for(schema)
    rng = random.Random(0)
    for max_tokens in limits * 5:
        tokens, ended = random_walk(grammar, vocabs["gpt2"], rng, max_tokens, budget=True)
        text = b"".join(vocabs["gpt2"].token_bytes[t] for t in tokens).decode("utf-8", "replace")
        assert ended, (max_tokens, text)
        assert validator.is_valid(json.loads(text)), text


def test_a_refused_scalar_leaves_budget_completions_writing_scalars(gpt2_compiler, tokenizers, vocabs):
    """Under a checked `oneOf` a completion may write `[]` or `{}` as a value (for the `oneOf` of open objects
    above), but only once a close was refused: after the checks refused `0` for `k` it wrote `[]` for each of the
    properties that take anything, where `""` is shorter (37 tokens from `{`, not 30), and an answer begun as
    `{"k": 0` with as many tokens left as the completion of `""`s takes ran to the limit writing `.000...`
    (budgeted random walks: 43 of 80 ended, 54 before)."""
    properties = {"k": {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]}}
    properties |= {f"p{i}": {} for i in range(8)}
    schema = {"type": "object", "properties": properties, "required": list(properties),
              "additionalProperties": False}
    grammar = _compile(gpt2_compiler, schema)
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    rest = ".1," + ",".join(f'"p{i}":""' for i in range(8)) + "}"
    out = offered_walk(grammar, vocab, tok.encode('{"k": 0'), [], len(tok.encode(rest)))
    assert validator_class(schema)(schema).is_valid(json.loads('{"k": 0' + decode(vocab, out)))


def test_a_negative_number_begun_near_the_limit_closes_where_its_zero_would_be_refused(gpt2_compiler, tokenizers,
                                                                                      vocabs):
    """Under `oneOf: [integer, number >= 0]` the checks refuse `-0` and every `-0.x`: a budget completion after
    `-` that began with the walk's first digit, `0`, wrote zeros until it gave up (and the rule then steered away
    from the `-`: 8 answers in 32 ran to the limit through the server, 3 before the walks asked the checks). It
    writes another digit there."""
    import random

    schema = _object({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]})
    grammar = _compile(gpt2_compiler, schema)
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    rng = random.Random(0)
    bm = torch.zeros((1, vocab.words), dtype=torch.int32)
    for _ in range(10):
        m = grammar.matcher()
        written = tok.encode('{"v": -', add_special_tokens=False)
        assert all(m.accept(t) for t in written)
        for left in (3, 2, 1):
            m.fill_bitmask(bm, 0, tokens_left=left)
            choices = allowed_ids(bm)
            token = m.vet(int(choices[rng.randrange(len(choices))]), left)
            if token in vocab.eos_token_ids:
                break
            assert m.accept(token)
            written.append(token)
        assert m.can_end(), tok.decode(written)
        assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(tok.decode(written)))


def test_auto_compiles_a_schema_with_late_checks_on_llguidance_though_outlines_built_it(tokenizers, vocabs):
    """Under auto, a schema whose `contains` is checked as its arrays finish was served from outlines once an
    automaton of it was built (by a request naming outlines, or in the background for repeats): outlines' exact
    distances know nothing of the checks, so answers near max_tokens were steered to documents the checks
    refuse, and ran to max_tokens (3 of 3 at 24 tokens; QA latechecks F2). llguidance's completions ask them."""
    from constrain.walkbench import random_walk

    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    # (items as a pattern, not `maxLength: 8`: outlines built that in 35-60 s, past the compile time limit under load)
    items = {"type": "string", "pattern": "^[a-z]{0,8}$"}
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": items,
                                                        "contains": {"const": "urgent"}}},
              "required": ["tags"], "additionalProperties": False}

    def spec(backend=None):
        return spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "t", "schema": schema}}, backend=backend)

    compiler = GrammarCompiler(vocab, tok, backend="auto", background_outlines=False)
    try:
        assert compiler.compile(spec("outlines")).backend == "outlines"
        grammar = compiler.compile(spec())
        assert grammar.backend == "llguidance"
        budget = len(tok.encode('{"tags":["urgent"]}')) + 2
        rng = random.Random(0)
        for _ in range(8):
            toks, ended = random_walk(grammar, vocab, rng, budget, budget=True)
            assert ended, decode(vocab, toks)
            document = json.loads(decode(vocab, toks))
            assert "urgent" in document["tags"], document
    finally:
        compiler.close()


D2020 = "https://json-schema.org/draft/2020-12/schema"
# `a` always; then `b` (a string) or `c` (a boolean), which only the branch that holds evaluates.
UNEVALUATED_BESIDE_ANY_OF = {
    "$schema": D2020, "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
    "anyOf": [{"properties": {"b": {"type": "string"}}, "required": ["b"]},
              {"properties": {"c": {"type": "boolean"}}, "required": ["c"]}],
    "unevaluatedProperties": False}


def test_unevaluated_properties_beside_a_choice_holds_the_backend_to_the_names_some_branch_declares():
    """Checked late only, `unevaluatedProperties: false` beside an `anyOf` left every other key open to the
    backend: answers wrote one as free text and ran to max_tokens (QA latechecks F1). The backend now takes only
    the names some branch declares, each under its declarations; the check still decides which branch holds."""
    plan = plan_late_keywords(UNEVALUATED_BESIDE_ANY_OF, one_of=False)
    assert plan.schema["properties"] == {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}}
    assert plan.schema["additionalProperties"] is False and "unevaluatedProperties" not in plan.schema
    assert plan.holds(UNEVALUATED_BESIDE_ANY_OF, {"a": 1, "c": True})
    assert not plan.holds(UNEVALUATED_BESIDE_ANY_OF, {"a": 1, "b": "x", "c": 5})  # (c: evaluated by no branch)
    # a name declared once: under that declaration, late keywords taken out (as everywhere in the backend's
    # schema); declared twice, differently: anything (the check decides)
    once = {**UNEVALUATED_BESIDE_ANY_OF, "oneOf": [{"properties": {"d": {"type": "integer", "not": {"const": 0}}}},
                                                   {"properties": {"e": {"type": "string"}}}]}
    assert plan_late_keywords(once, one_of=True).schema["properties"]["d"] == {"type": "integer"}
    twice = {**once, "oneOf": [once["oneOf"][0], {"properties": {"d": {"type": "string"}}}]}
    assert plan_late_keywords(twice, one_of=True).schema["properties"]["d"] == {}


@pytest.mark.parametrize("schema", [
    {**UNEVALUATED_BESIDE_ANY_OF, "$schema": "http://json-schema.org/draft-07/schema#"},  # (asserts nothing there)
    {**UNEVALUATED_BESIDE_ANY_OF, "allOf": [{"patternProperties": {"^x": {}}}]},
    {**UNEVALUATED_BESIDE_ANY_OF, "anyOf": [{"additionalProperties": {"type": "integer"}}, {"required": ["a"]}]},
    {**UNEVALUATED_BESIDE_ANY_OF, "unevaluatedProperties": {"type": "integer"}},
    {**UNEVALUATED_BESIDE_ANY_OF, "anyOf": [{"$dynamicRef": "#meta"}, {"required": ["a"]}]},
])
def test_unevaluated_properties_stays_open_to_the_backend_where_other_names_may_count(schema):
    """Where a draft without the keyword, a pattern, `additionalProperties`, a schema for the unevaluated ones or
    a reference the plan cannot follow makes other names valid, the backend keeps them open (checked late)."""
    plan = plan_late_keywords(schema, one_of=False)
    assert plan is None or "additionalProperties" not in plan.schema


def test_unevaluated_items_beside_a_choice_holds_the_backend_to_the_longest_prefix():
    """`unevaluatedItems: false` beside an `anyOf` of prefixes: at most the longest prefix's items, each under
    its one schema at its place where the prefixes agree (2019-09 writes a prefix as `items`)."""
    schema = {"$schema": D2020, "type": "array", "unevaluatedItems": False,
              "anyOf": [{"prefixItems": [{"type": "integer"}]},
                        {"prefixItems": [{"type": "string"}, {"type": "string"}]}]}
    plan = plan_late_keywords(schema, one_of=False)
    assert plan.schema["maxItems"] == 2
    assert plan.schema["prefixItems"] == [{}, {"type": "string"}]
    d2019 = {**schema, "$schema": "https://json-schema.org/draft/2019-09/schema",
             "anyOf": [{"items": [{"type": "integer"}]}, {"items": [{"type": "integer"}, {"type": "null"}]}]}
    plan = plan_late_keywords(d2019, one_of=False)
    assert plan.schema["maxItems"] == 2 and plan.schema["items"] == [{"type": "integer"}, {"type": "null"}]
    for evaluating_more in ({"contains": {"type": "null"}}, {"items": {"type": "null"}}):
        assert "maxItems" not in plan_late_keywords({**schema, "allOf": [evaluating_more]}, one_of=False).schema
    assert "maxItems" not in plan_late_keywords({**d2019, "allOf": [{"items": {"type": "null"}}]}, one_of=False).schema


def test_walks_end_where_unevaluated_properties_sits_beside_a_choice(gpt2_compiler, vocabs):
    """Before, 4 of 10 of these walks wrote an undeclared key as free text and never ended."""
    grammar = _compile(gpt2_compiler, UNEVALUATED_BESIDE_ANY_OF)
    assert ended_walks_valid(grammar, vocabs["gpt2"], UNEVALUATED_BESIDE_ANY_OF, seed=1, walks=10, max_tokens=80,
                             prefer_end=0.05) == 10


@pytest.mark.parametrize("text, finite", [("1e500", False), ("-345770005077263e+877", False), ("9" * 309, False),
                                          ("1" + "0" * 5000, False), ("1.5", True), ("1.5e-3", True)])
def test_a_number_clients_read_as_infinity_never_passes_a_late_check(gpt2_compiler, tokenizers, vocabs, text,
                                                                     finite):
    """`1e500` is an integer, yet it read as `inf`, which is not: `not: {type: integer}` let 5 answers in 10 end
    as `662E930`, `88e1222`..., which Python and JavaScript read as ±Infinity (QA testsuite F1). A number past the
    largest double is refused by every check."""
    vocab = vocabs["gpt2"]
    grammar = _compile(gpt2_compiler, {"type": "number", "not": {"type": "integer"}})
    assert _accepts(grammar, tokenizers["gpt2"], vocab, text) is finite
    # byte by byte, as those answers were written: past `1e50` (refused: an integer) only a third exponent digit
    # was left, and the two-digit cap gave way to it
    single = {b: i for i, b in enumerate(vocab.token_bytes) if b is not None and len(b) == 1}
    tokens = [single[bytes([c])] for c in text.encode()]
    assert walk_instance(grammar, tokens, min(vocab.eos_token_ids), torch.zeros((1, vocab.words), dtype=torch.int32),
                         []) is finite


def test_an_integer_past_the_largest_double_never_passes_a_late_check(gpt2_compiler, tokenizers, vocabs):
    """JavaScript reads such an integer as Infinity (and Python reads no JSON integer of more than 4,300 digits)."""
    grammar = _compile(gpt2_compiler, {"type": "integer", "not": {"multipleOf": 7}})
    assert _accepts(grammar, tokenizers["gpt2"], vocabs["gpt2"], "1" + "0" * 300)
    assert not _accepts(grammar, tokenizers["gpt2"], vocabs["gpt2"], "1" + "0" * 310)


def test_a_type_two_one_of_branches_take_whole_is_taken_out_of_what_the_backend_compiles(gpt2_compiler, vocabs):
    """Any string or number passes both branches of an "exactly one of these properties" `oneOf` that does not say
    `type: object`, so fails it; read as `anyOf`, the backend let an answer open one, whose end the check then
    refused: every walk (and 6 answers in 6 through the server) ran to the limit (QA testsuite F2)."""
    schema = {"$schema": D2020, "properties": {"foo": {"type": "string"}}, "unevaluatedProperties": False,
              "oneOf": [{"properties": {"bar": {"const": "bar"}}, "required": ["bar"]},
                        {"properties": {"baz": {"const": "baz"}}, "required": ["baz"]}]}
    assert plan_late_keywords(schema, one_of=True).schema["type"] == "object"
    assert ended_walks_valid(_compile(gpt2_compiler, schema), vocabs["gpt2"], schema, seed=2, walks=12,
                             max_tokens=40) == 12
    # strings pass the first two branches, null the first and last; what one branch alone takes stays
    mixed = {"oneOf": [{"required": ["a"]}, {"type": "string"}, {"type": ["object", "null"], "required": ["b"]}]}
    assert plan_late_keywords(mixed, one_of=True).schema["type"] == ["object", "array", "number", "boolean"]
    bounded = {"type": ["number", "string"], "oneOf": [{"minimum": 2}, {"maxLength": 3}]}
    assert plan_late_keywords(bounded, one_of=True).schema["type"] == ["number", "string"]
    # through references (QA testsuite2 F2); and on the branches as written, not as their late keywords leave them
    refs = {"$defs": {"a": {"required": ["a"]}, "b": {"$ref": "#/$defs/c"}, "c": {"required": ["b"]}},
            "oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]}
    assert plan_late_keywords(refs, one_of=True).schema["type"] == "object"
    negated = {"type": ["string", "null"], "oneOf": [{"not": {"type": "string"}}, {}]}  # (a string: one branch)
    assert "string" in plan_late_keywords(negated, one_of=True).schema["type"]


def _discriminated(n: int) -> dict:
    """OpenAPI 3.1's union: a base object, a `oneOf` of branches told apart by a `kind` const, nothing else."""
    return {"$schema": D2020, "type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id", "kind"],
            "oneOf": [{"properties": {"kind": {"const": f"k{i}"},
                                      "data": {"type": "object", "properties": {f"d{i}": {"type": "string"}},
                                               "required": [f"d{i}"]}},
                       "required": ["data"]} for i in range(n)],
            "unevaluatedProperties": False}


@pytest.mark.parametrize("n", [3, 100])
def test_a_discriminated_union_beside_unevaluated_properties_compiles_strict(gpt2_compiler, vocabs, n):
    """Bounded with the `anyOf` of each name's declarations, `kind` hid the discriminator from llguidance, which
    then refused the `oneOf` (a 400 under strict, the keyword unenforced without), and 100 branches sharing `data`
    made the schema too large (QA review F1, F2). A name declared differently is `{}` there now."""
    schema = _discriminated(n)
    grammar = _compile(gpt2_compiler, schema)
    assert grammar.unenforced == ()
    assert ended_walks_valid(grammar, vocabs["gpt2"], schema, seed=3, walks=6, max_tokens=80) >= 1
    assert plan_late_keywords(schema, one_of=False).schema["properties"]["data"] == {}


def test_declarations_that_differ_only_as_python_values_stay_apart(gpt2_compiler, tokenizers, vocabs):
    """`{"enum": [0, 1]}` == `{"enum": [False, True]}` in Python: one was kept as the name's only declaration, and
    `true` was refused where the other branch takes it (QA review F3)."""
    schema = {"$schema": D2020, "type": "object", "required": ["mode", "flag"], "unevaluatedProperties": False,
              "oneOf": [{"properties": {"mode": {"const": "legacy"}, "flag": {"enum": [0, 1]}}},
                        {"properties": {"mode": {"const": "modern"}, "flag": {"enum": [False, True]}}}]}
    assert accepts_document(_compile(gpt2_compiler, schema), tokenizers["gpt2"], vocabs["gpt2"],
                            {"mode": "modern", "flag": True})


def test_a_bound_the_backend_refuses_gives_way_to_the_plan_without_it(gpt2_compiler, monkeypatch):
    """What the bound declares may keep llguidance from compiling what it compiled without (a discriminator it no
    longer sees, a union too large): the plan without the bound is compiled then, and a `oneOf` refused there is
    read as `anyOf`."""
    from constrain import late_keywords

    def breaking(node, key, root, source, one_of, originals):  # (the bound as first written: each name's `anyOf`)
        node["properties"] = {**node.get("properties", {}),
                              "kind": {"anyOf": [{"const": f"k{i}"} for i in range(3)]}}
        node["additionalProperties"] = False
        return True

    monkeypatch.setattr(late_keywords, "_bound_unevaluated", breaking)
    schema = _discriminated(4)  # (not one compiled before: the compiler keeps the plans it compiled)
    grammar = _compile(gpt2_compiler, schema)
    assert grammar.unenforced == () and "additionalProperties" not in grammar.plan.schema


PETS = {"$schema": D2020, "type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id", "kind"],
        "oneOf": [{"properties": {"kind": {"const": "cat"}, "meow": {"type": "boolean"}}, "required": ["meow"]},
                  {"properties": {"kind": {"const": "dog"}, "bark": {"type": "integer"}}, "required": ["bark"]},
                  {"properties": {"kind": {"const": "fish"}}}],
        "unevaluatedProperties": False}


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_a_key_only_a_branch_the_object_fails_declares_is_refused_as_it_is_written(name, tokenizers, vocabs):
    """After `"kind": "dog"` only the dog branch can hold, so the cat's `meow` (which the backend takes: it is
    declared, and comes before `bark`) could never be evaluated: refused only with the whole object, the key was
    written and the answer ran to max_tokens (5 answers in 10 of a 3-branch union; QA review). The key is
    refused as it is written now, and a comma after which no key is left is not written."""
    tok, vocab = tokenizers[name], vocabs[name]
    compiler = GrammarCompiler(vocab, tok, backend="llguidance", background_outlines=False)
    m = _compile(compiler, PETS).matcher()
    bitmask = _write_vetted(m, tok, vocab, '{"id": 1, "kind": "dog", "')
    allowed = [vocab.token_bytes[i] for i in allowed_ids(bitmask).tolist()]
    assert allowed and all(b'bark"'.startswith(b) or b.startswith(b'bark"') for b in allowed)
    m = _compile(compiler, PETS).matcher()
    bitmask = _write_vetted(m, tok, vocab, '{"id": 1, "kind": "cat", "meow": true')
    comma = tok.convert_tokens_to_ids(",")
    assert comma in allowed_ids(bitmask) and m.vet(comma, None) != comma  # (the backend takes `"bark"` after it)


# `x` only where `kind` is "a", `y` only where it is not (the `if` holds for good once `kind` is written).
CONDITIONAL = {"$schema": D2020, "type": "object", "properties": {"kind": {"enum": ["a", "b"]}}, "required": ["kind"],
               "if": {"properties": {"kind": {"const": "a"}}}, "then": {"properties": {"x": {"type": "integer"}}},
               "else": {"properties": {"y": {"type": "string"}}}, "unevaluatedProperties": False}


@pytest.mark.parametrize("schema", [PETS, CONDITIONAL], ids=["union", "if-then-else"])
def test_walks_over_a_choice_of_names_end(gpt2_compiler, vocabs, schema):
    """Before, 6 (union) and 4 (if/then/else) of 10 such walks ended; the rest wrote a key of a branch the object
    already failed (`"y"` after `"kind": "a"`) and never closed."""
    grammar = _compile(gpt2_compiler, schema)
    assert ended_walks_valid(grammar, vocabs["gpt2"], schema, seed=5, walks=10, max_tokens=120, prefer_end=0.05) == 10


OWNED_PETS = {"$schema": D2020, "type": "object", "properties": {"owner": {"type": "string", "maxLength": 10}},
              "required": ["owner"], "unevaluatedProperties": False,
              "$defs": {"Cat": {"properties": {"petType": {"const": "cat"}, "name": {"type": "string"},
                                               "lives": {"type": "integer"}}, "required": ["petType"]},
                        "Dog": {"properties": {"petType": {"const": "dog"}, "name": {"type": "string"},
                                               "good": {"type": "boolean"}}, "required": ["petType", "good"]},
                        "Lizard": {"properties": {"petType": {"const": "lizard"}, "scales": {"type": "number"}},
                                   "required": ["petType"]}},
              "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"$ref": "#/$defs/Lizard"}]}
BILLING = {"$schema": D2020, "type": "object", "properties": {"card": {"type": "string"}, "name": {"type": "string"}},
           "dependentSchemas": {"card": {"properties": {"billing": {"type": "string"}}, "required": ["billing"]}},
           "unevaluatedProperties": False}


def test_names_dependencies_declares_count_as_evaluated_in_no_2019_draft(gpt2_compiler, tokenizers, vocabs):
    """A 2019-09 validator applies `dependencies` (as drafts 4-7 read it) but counts no name it evaluates: `x` was
    offered after `"t": 1`, and refused at `}`; the budget rule then wrote digits to max_tokens (QA review F3)."""
    schema = {"$schema": D2020, "type": "object", "properties": {"t": {"type": "integer"}}, "required": ["t"],
              "dependencies": {"t": {"properties": {"x": {"type": "integer"}}}}, "unevaluatedProperties": False}
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    g = _compile(gpt2_compiler, schema)
    m = g.matcher()
    bitmask = _write_vetted(m, tok, vocab, '{"t": 1')
    comma = tok.convert_tokens_to_ids(",")
    assert comma not in allowed_ids(bitmask) or m.vet(comma, None) != comma
    assert accepts_document(g, tok, vocab, {"t": 1}) and not accepts_document(g, tok, vocab, {"t": 1, "x": 2})


@pytest.mark.parametrize("schema, written", [
    (OWNED_PETS, '{"owner": "", "petType": "dog", "good": true'),  # (only the lizard's `scales` comes after `good`)
    (BILLING, '{"name": "x"'),  # (`billing` only after its trigger `card`, which comes before `name`)
])
def test_no_comma_where_the_names_left_in_the_backends_order_cannot_be_evaluated(gpt2_compiler, tokenizers, vocabs,
                                                                                 schema, written):
    """The names were judged without the order the backend writes keys in: a comma was let through after which the
    only key the backend offered was refused (`constraint_too_complex`; QA review F2)."""
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    m = _compile(gpt2_compiler, schema).matcher()
    bitmask = _write_vetted(m, tok, vocab, written)
    comma = tok.convert_tokens_to_ids(",")
    assert comma in allowed_ids(bitmask) and m.vet(comma, None) != comma


@pytest.mark.parametrize("schema, valid, invalid", [
    ({"type": "object", "oneOf": [{"properties": {"w": {"type": "integer"}}}],
      "properties": {"v": {"$ref": "#/oneOf/0/properties/w"}}, "required": ["v"]}, {"v": 12}, {"v": "foo"}),
    ({"type": "object", "if": {"properties": {"a": {"const": 1}}},
      "then": {"properties": {"n": {"type": "integer", "minimum": 0}}},
      "properties": {"m": {"$ref": "#/then/properties/n"}}, "required": ["m"]}, {"m": 3}, {"m": -1}),
    ({"type": "object", "not": {"properties": {"q": {"type": "string"}}, "required": ["q"]},
      "properties": {"m": {"$ref": "#/not/properties/q"}}, "required": ["m"]}, {"m": "x"}, {"m": 1}),
    # (the exact rewrite of `unevaluatedProperties` took the keyword away: QA fuzz F3)
    ({"$schema": D2020, "type": "object", "properties": {"a": {"type": "integer"}, "m": {
        "$ref": "#/unevaluatedProperties"}}, "unevaluatedProperties": {"type": "string"}}, {"a": 1, "m": "x", "z": "s"},
     {"a": 1, "m": "x", "z": 3}),
    # (conditionals merged on one discriminator left `{}` in the member a `$ref` named: QA review F1)
    ({"type": "object", "properties": {"k": {"type": "string"}, "other": {"$ref": "#/allOf/1"}},
      "allOf": [{"if": {"properties": {"k": {"const": "a"}}}, "then": {"required": ["x"]}},
                {"if": {"properties": {"k": {"const": "b"}}}, "then": {"required": ["y"]}}]},
     {"k": "c", "other": {"y": 1, "k": "b"}}, {"k": "c", "other": {"k": "b"}}),
], ids=["oneOf", "then", "not", "unevaluated", "merged-conditionals"])
@pytest.mark.parametrize("strict", [True, False])
def test_a_reference_into_a_rewritten_or_late_keyword_still_finds_its_subschema(gpt2_compiler, tokenizers, vocabs,
                                                                                 schema, valid, invalid, strict):
    """A `$ref` into a `oneOf` branch, a `then`, a `not` named a place the rewrites (`oneOf` of one branch as
    `anyOf`, `if`/`then` as `anyOf`) or the late keywords' removal left empty: every request was a 400 (`Pointer
    '/then/properties/n' does not exist`; QA testsuite2 F1). Such a step leaves the keyword as it is, and a
    target the late keywords took out is kept under `$defs`."""
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=strict,
                                             backend="llguidance"))
    assert g.unenforced == ()
    assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], valid)
    assert not accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], invalid)


def test_a_digit_that_takes_a_number_past_the_doubles_is_refused_as_it_is_written(gpt2_compiler, vocabs):
    """Refused only when the number ended, `1e309` could be written on (the exponent cap gives way where every
    ending is refused) and never end (QA review2 F1: 3 answers in 6 at max_tokens). More digits only make it
    larger, so the digit is refused; `1e308` is a double."""
    vocab = vocabs["gpt2"]
    single = {b: i for i, b in enumerate(vocab.token_bytes) if b is not None and len(b) == 1}
    m = _compile(gpt2_compiler, {"type": "number", "not": {"type": "integer"}}).matcher()
    assert all(m.accept(single[bytes([c])]) for c in b"1e30")
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    m.fill_bitmask(bitmask, 0)
    allowed = set(allowed_ids(bitmask).tolist())
    assert single[b"8"] in allowed and single[b"9"] not in allowed


def test_names_of_branches_that_list_them_in_other_orders_are_not_held_to_one(gpt2_compiler, tokenizers, vocabs):
    """llguidance writes a branch's keys in the branch's order: held to one order for the whole object, the valid
    `{"y": "s", "k": "q"}` was refused, and 3 walks in 30 ended in a dead end (QA review3 F1)."""
    schema = {"$schema": D2020, "type": "object", "unevaluatedProperties": False,
              "oneOf": [{"properties": {"k": {"const": "p"}, "y": {"type": "integer"}}, "required": ["k"]},
                        {"properties": {"y": {"type": "string"}, "k": {"const": "q"}}, "required": ["k"]}]}
    grammar = _compile(gpt2_compiler, schema)
    assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"y": "s", "k": "q"})
    assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"k": "p", "y": 1})
    assert ended_walks_valid(grammar, vocabs["gpt2"], schema, seed=1, walks=12, max_tokens=60) == 12


def test_a_late_check_under_a_copied_declaration_finds_the_clients_subschema(gpt2_compiler, tokenizers, vocabs):
    """The bound copies `b`'s declaration into the object; the checks looked up the client's node of each node
    they met, and a copy's was missing: a `KeyError` as `b`'s value began, a 500 (QA fuzz F1)."""
    schema = {"$schema": D2020, "type": "object", "unevaluatedProperties": False,
              "anyOf": [{"properties": {"b": {"oneOf": [{}, {"type": "integer"}]}}}, {"required": ["x"]}]}
    grammar = _compile(gpt2_compiler, schema)
    assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"b": "s"})
    assert not accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"b": 1})  # (both branches hold)


@pytest.mark.parametrize("schema", [
    {"oneOf": [{"anyOf": [{}], "oneOf": [{}, {"type": "integer"}]}]},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "object"}, {}],
                                            "oneOf": [{"anyOf": [{"minimum": 0}], "oneOf": [{}, {"type": "integer"}]},
                                                      {"type": "string"}]}}},
])
def test_a_one_of_beside_an_any_of_below_a_choice_is_checked_without_a_fault(schema, gpt2_compiler, tokenizers,
                                                                              vocabs):
    """The `oneOf` beside an `anyOf` is taken out as a new `allOf` member (`{"anyOf": branches}`), which the checks
    met below a choice and looked up among the client's nodes: a `KeyError` as any value began, a 500."""
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    grammar = _compile(gpt2_compiler, schema)
    validator = jsonschema.Draft202012Validator(schema)
    for value in ({}, [], "s", 1.5, 1, None, {"v": 1}, {"v": 1.5}, {"v": "s"}, {"v": -1.5}):
        assert accepts_document(grammar, tok, vocab, value) == validator.is_valid(value), value


def test_max_contains_holds_the_array_so_far_to_its_count_alone(gpt2_compiler, tokenizers, vocabs):
    """The array so far was checked against `contains` too: `["a", 1]` was refused at its first item (QA fuzz F4).
    In draft 7 `maxContains` is counted as 2019-09 defines it where its node only asserts (README, Drafts); in a
    `oneOf` member it means nothing, as in draft 7."""
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    schema = {"type": "array", "contains": {"type": "integer"}, "maxContains": 1}
    for dialect in (DRAFT_7, D2020):
        grammar = _compile(gpt2_compiler, {"$schema": dialect, **schema})
        assert accepts_document(grammar, tok, vocab, ["a", 1]) and not accepts_document(grammar, tok, vocab, [1, 2])
    member = _compile(gpt2_compiler, {"$schema": DRAFT_7, "type": "array", "oneOf": [schema]})
    assert accepts_document(member, tok, vocab, ["a", 1]) and accepts_document(member, tok, vocab, [1, 2])


# Numbers as the decimals they spell (QA fuzz4 F1): jsonschema's floats took `0.3` under `not: {multipleOf: 0.1}`
# (0.3 / 0.1 = 2.9999999999999996), and `100.3`, not `0.3`, under the `oneOf`. The bounds, `enum` and `type` cases
# guard the schema's floats, read as written beside the exact numbers (`0.1` is not below `minimum: 0.1`).
DECIMAL_CASES = [
    (_object({"type": "number", "not": {"multipleOf": 0.1}}), ['{"v": 0.35}', '{"v": 1.25}'],
     ['{"v": 0.3}', '{"v": 0.7}', '{"v": 3e-1}']),
    (_object({"oneOf": [{"type": "number", "multipleOf": 0.1}, {"type": "number", "minimum": 100}]}),
     ['{"v": 0.3}', '{"v": 0.5}', '{"v": 100.25}'], ['{"v": 100.3}', '{"v": 100}']),
    (_object({"type": "number", "not": {"multipleOf": 0.1, "minimum": 0.1}}), ['{"v": 0.05}', '{"v": 0.15}'],
     ['{"v": 0.1}', '{"v": 0.100}', '{"v": 0.3}']),
    (_object({"oneOf": [{"enum": [0.1, 2.5, "a"]}, {"type": "number", "multipleOf": 0.1}]}),
     ['{"v": 0.2}', '{"v": "a"}'], ['{"v": 0.10}', '{"v": 2.5}', '{"v": 2.55}']),
    (_object({"type": "number", "not": {"multipleOf": 0.5, "type": "integer"}}), ['{"v": 1.5}'],
     ['{"v": 1.0}', '{"v": 1e2}', '{"v": 2}']),
]


@pytest.mark.parametrize("schema, good, bad", DECIMAL_CASES)
def test_a_late_check_judges_numbers_as_the_decimals_they_spell(schema, good, bad, gpt2_compiler, tokenizers,
                                                                 vocabs):
    from constrain.walkbench import validator_for

    grammar, oracle = _compile(gpt2_compiler, schema), validator_for(schema)  # (the oracle's multipleOf is decimal)
    assert isinstance(grammar, LateGrammar) and grammar.unenforced == ()
    for text in good:
        assert oracle.is_valid(json.loads(text)) and _accepts(grammar, tokenizers["gpt2"], vocabs["gpt2"], text), text
    for text in bad:
        assert not oracle.is_valid(json.loads(text))
        assert not _accepts(grammar, tokenizers["gpt2"], vocabs["gpt2"], text), text


def test_an_integer_a_big_exponent_writes_counts_in_both_branches_it_meets(gpt2_compiler, vocabs):
    """`3E000225` is 6 * 10**224 * 5, valid under `integer, multipleOf: 5` and `number` both; as a float,
    3e225 % 5 != 0, and a walk (digit by digit: the token `225` is masked) ended there (QA fuzz4 F1c)."""
    from constrain.grammar import ConstraintError

    schema = {"type": "object", "additionalProperties": False, "properties": {"a": {"oneOf": [
        {"enum": [2.5, 7, True]}, {"type": "integer", "multipleOf": 5}, {"type": "number"}]}}}
    grammar, vocab = _compile(gpt2_compiler, schema), vocabs["gpt2"]
    ids = vocab.ids_by_bytes()

    def ends(text: bytes) -> bool:
        m = grammar.matcher()
        bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
        try:
            for c in text:
                m.fill_bitmask(bitmask, 0)
                if ids[bytes([c])] not in set(allowed_ids(bitmask).tolist()) or not m.accept(ids[bytes([c])]):
                    return False
        except ConstraintError:  # (a dead end: no digit after `3E2` leaves an integer short of the doubles)
            return False
        return m.can_end()

    assert ends(b'{"a":3E0}') and ends(b'{"a":7.5}')  # (3 and 7.5: a number, in no other branch)
    assert not ends(b'{"a":3E000225}') and not ends(b'{"a":3E225}') and not ends(b'{"a":7}')


@pytest.mark.parametrize("node, text, holds", [
    ({"multipleOf": 5}, "3E000225", True),
    ({"multipleOf": 7}, "3E225", False),
    ({"multipleOf": 0.1}, "0.3", True),
    ({"multipleOf": 0.1}, "100.3", True),
    ({"multipleOf": 0.01}, "550.44", True),
    ({"multipleOf": 0.1}, "0.35", False),
    ({"multipleOf": 0.1}, "1e-999999999", False),  # (no multiple as written)
    ({"not": {"multipleOf": 0.1}}, "1e-999999999", False),  # (clients read 0.0, a multiple)
    ({"not": {"multipleOf": 0.1}}, "0.30000000000000001", False),  # (clients read 0.3)
    ({"not": {"const": 0}}, "1e-400", False),
    ({"minimum": 0.1}, "0.1", True),
    ({"exclusiveMaximum": 1}, "0.99999999999999999", False),  # (below 1 as written; clients read 1.0)
    ({"const": 0.1}, "0.10", True),
    ({"enum": [[1.5, True]]}, "[1.50, true]", True),
    ({"enum": [True]}, "1", False),
    ({"uniqueItems": True}, "[1, 1.0]", False),
    ({"uniqueItems": True}, "[0.1, 0.10000000000000001]", False),
    ({"not": {"uniqueItems": True}}, "[0.1, 0.10000000000000001]", False),
    ({"type": "integer"}, "2.50e1", True),
    ({"type": "integer"}, "2.5", False),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}, "1.0", False),
])
def test_numbers_are_read_exactly_and_in_bounded_work(node, text, holds):
    """What the late checks decide (both readings of `_readings`, each put to `LatePlan.holds`), without ever
    expanding an exponent (`1e-999999999` would be a billion digits). The draft is the root's, as a document
    names it."""
    from constrain.late_keywords import _readings

    dialect = {"$schema": node["$schema"]} if "$schema" in node else {}
    plan = plan_late_keywords({**dialect, "not": {"const": None}, "allOf": [node]}, one_of=True)
    assert all(plan.holds(node, value) for value in _readings(text)) is holds


@pytest.mark.parametrize("text", ["1e999999999", "-1E+400", "1e-99999999999999999999", "1e99999999999999999999"])
def test_a_number_past_the_doubles_or_past_a_decimals_exponent_is_read_as_no_number(text):
    """(past 10**18 no Decimal holds the exponent: never read exactly, never judged valid)"""
    from constrain.late_keywords import _NotFinite, _readings

    with pytest.raises(_NotFinite):
        _readings(text)


@pytest.mark.parametrize("name", ["a b", "a%20b"])
def test_a_strict_refusal_the_late_checks_cannot_answer_names_the_keyword_that_still_stands(name, gpt2_compiler):
    """Where a late plan still leaves a keyword nothing enforces (`format: regex`), the 400 names it, not the one
    the late checks enforce (`contains`). A name holding a percent was read as a URI fragment (`a%20b` as `a b`),
    its keyword found nowhere, and the 400 named `contains` (QA review D)."""
    from constrain.grammar import ConstraintError

    schema = {"type": "object", "required": [name], "properties": {
        name: {"type": "string", "format": "regex", "not": {"const": "x"}},
        "q": {"type": "array", "contains": {"const": 1}, "not": {"maxItems": 2}}}}
    with pytest.raises(ConstraintError) as refused:
        gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": schema, "strict": True}}))
    assert refused.value.pointer == f"/properties/{name}/format"
