"""A recursive definition meeting other keywords (constrain/recursive_meets.py): llguidance refused every such
schema ("circular references with sibling keys are not supported"), a 400. Written out before it compiles, each
compiles, and takes exactly what the schema takes."""

from __future__ import annotations

import random

import pytest
from jsonschema import Draft202012Validator

from constrain import ConstraintError, ConstraintSpec, parse_tool_calls, spec_from_request
from constrain.llg_backend import checked_grammar_text, grammar_text, llguidance_json
from constrain.recursive_meets import intersected_recursive_meetings
from constrain.spec import _in_place_loop, normalise_schema
from tests.constrain.conftest import (accepts_document, compiling, decode, ended_walks_valid, random_walk,
                                      valid_calls)

# CWL's layout (Github_ultra o69206): an array type whose `items` a derived record narrows to a type that holds
# the array type again, through `allOf` inheritance.
CWL = {
    "type": "object", "properties": {"t": {"$ref": "#/definitions/InputType"}}, "required": ["t"],
    "additionalProperties": False,
    "definitions": {
        "Primitive": {"type": "string", "enum": ["int", "string"]},
        "InputType": {"anyOf": [{"$ref": "#/definitions/Primitive"}, {"$ref": "#/definitions/InputArray"},
                                {"$ref": "#/definitions/InputRecord"}]},
        "ArrayBase": {"type": "object", "properties": {"type": {"const": "array"},
                                                       "items": {"$ref": "#/definitions/Primitive"}},
                      "required": ["type", "items"], "additionalProperties": False},
        "InputArray": {"allOf": [{"$ref": "#/definitions/ArrayBase"},
                                 {"properties": {"items": {"$ref": "#/definitions/InputType"}}}]},
        "InputRecord": {"type": "object", "properties": {"type": {"const": "record"},
                                                         "fields": {"type": "array", "maxItems": 2,
                                                                    "items": {"$ref": "#/definitions/InputType"}}},
                        "required": ["type", "fields"], "additionalProperties": False},
    },
}

# Two recursive definitions of one tree, each asking its own of every node (llguidance's own "problem child").
TWO_TREES = {
    "allOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
    "$defs": {
        "a": {"type": "object", "properties": {"a": {"type": "integer"}, "kid": {"$ref": "#/$defs/a"}},
              "required": ["a"]},
        "b": {"type": "object", "properties": {"b": {"type": "boolean"}, "kid": {"$ref": "#/$defs/b"}},
              "required": ["b"]},
    },
}

# A `type` beside an `anyOf` of references to the root (WashingtonPost wp_4), and a discriminated branch
# whose other alternatives the `const` rules out.
PROMO = {
    "type": "object",
    "properties": {"kind": {"enum": ["story", "ref"]}, "basic": {"type": "object", "anyOf": [
        {"$ref": "#"}, {"$ref": "#/definitions/ref"}]}},
    "required": ["kind"], "additionalProperties": False,
    "definitions": {"ref": {"type": "object", "properties": {"kind": {"const": "ref"}, "id": {"type": "string"}},
                            "required": ["kind", "id"], "additionalProperties": False}},
}

# Names a regex takes in one place, declared in another that takes no other name, at every depth.
NAMED = {
    "$ref": "#/$defs/both",
    "$defs": {
        "both": {"allOf": [{"$ref": "#/$defs/node"}, {"$ref": "#/$defs/xs"}]},
        "node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}, "x1": {"type": "number"}},
                 "additionalProperties": False},
        "xs": {"type": "object", "properties": {"next": {"$ref": "#/$defs/xs"}},
               "patternProperties": {"^x": {"type": "integer"}}},
    },
}


# A definition read chunk by chunk: its `additionalProperties: false` beside its first chunk's `properties`, its
# second chunk declaring `b`. Where it meets a chunk holding that second chunk's `properties` with
# `additionalProperties: false` of its own, that chunk forbids `a`: it is not implied by the definition.
INHERITED = {
    "$ref": "#/$defs/t",
    "$defs": {"t": {"type": "object", "additionalProperties": False,
                    "properties": {"a": {"type": "integer"}, "w": {"allOf": [
                        {"properties": {"kid": {"$ref": "#/$defs/t"}}},
                        {"properties": {"kid": {"properties": {"b": {"type": "integer"}},
                                                "additionalProperties": False}}}]}},
                    "allOf": [{"properties": {"b": {"type": "integer"}}}]}},
}


# A chunk that looks like the definition's own but for a `const` of `true` where the definition's is `1` (equal
# to Python): it still holds, and the top `v` can be written in neither (`k` is `t` alone).
CONST_TRUE = {
    "allOf": [{"$ref": "#/$defs/t"}, {"properties": {"k": {"$ref": "#/$defs/t"}, "v": {"const": True}}}],
    "$defs": {"t": {"type": "object", "properties": {"k": {"$ref": "#/$defs/t"}, "v": {"const": 1}}}},
}


# An alternative that comes out `false` (the property it requires meets an object tree and an array tree), before
# one a `$ref` names by its place; TWO_TREES beside, which llguidance refuses as it is.
SHIFTED = {
    "type": "object",
    "properties": {"s": {"$ref": "#/$defs/x/anyOf/1"}, "x": {"$ref": "#/$defs/x"},
                   "c": {"allOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]}},
    "$defs": {"x": {"anyOf": [{"type": "object", "required": ["p"],
                               "allOf": [{"properties": {"p": {"$ref": "#/$defs/t"}}},
                                         {"properties": {"p": {"$ref": "#/$defs/u"}}}]},
                              {"type": "string"}, {"type": "integer"}]},
              "t": {"type": "object", "properties": {"k": {"$ref": "#/$defs/t"}}},
              "u": {"type": "array", "items": {"$ref": "#/$defs/u"}}, **TWO_TREES["$defs"]},
}


# Two recursive objects whose regexes overlap, merged at every depth (llguidance wants one object's disjoint).
OVERLAP = {
    "allOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
    "$defs": {"a": {"type": "object", "properties": {"kid": {"$ref": "#/$defs/a"}},
                    "patternProperties": {"^x": {"type": "integer"}}},
              "b": {"type": "object", "properties": {"kid": {"$ref": "#/$defs/b"}},
                    "patternProperties": {"^xy": {"minimum": 5}}}},
}


# Two recursive objects closed by `additionalProperties: false`, whose regexes overlap: `x٣` (an Arabic-Indic digit)
# is found by `^x` but not by `^x\D` (Python's `\D`, as the schema is read, is no digit of any script), so `b`
# takes no such name. The regions cut from the two are read by llguidance, whose `\d` is ASCII.
DIGITS = {
    "allOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
    "$defs": {"a": {"type": "object", "properties": {"kid": {"$ref": "#/$defs/a"}},
                    "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False},
              "b": {"type": "object", "properties": {"kid": {"$ref": "#/$defs/b"}},
                    "patternProperties": {"^x\\D": {"type": "integer"}}, "additionalProperties": False}},
}


# TWO_TREES below the root, with their definitions beside the meeting that is written out (as a function's
# parameters hold theirs, at `#/$defs/tool<i>`): references into them still find them.
_W = "#/properties/w/$defs/"
NESTED_DEFS = {
    "type": "object",
    "properties": {"w": {"allOf": [{"$ref": _W + "a"}, {"$ref": _W + "b"}], "$defs": {
        "a": {"type": "object", "properties": {"a": {"type": "integer"}, "kid": {"$ref": _W + "a"}}, "required": ["a"]},
        "b": {"type": "object", "properties": {"b": {"type": "boolean"}, "kid": {"$ref": _W + "b"}}, "required": ["b"]},
    }}},
}

# `xb` is declared in `n` and found by its own `^x`: the value meets both (as JSON Schema reads one object, and
# llguidance too), at every depth.
OWN_PATTERN = {
    "type": "object", "properties": {"n": {"$ref": "#/$defs/n", "minProperties": 1}},
    "$defs": {"n": {"type": ["object", "integer"], "minimum": 1, "properties": {"xb": {}},
                    "patternProperties": {"^x": {"$ref": "#/$defs/n"}}}},
}


def _compile(compiler, schema: dict, backend: str):
    return compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                           backend=backend))


@pytest.mark.parametrize("backend", ["llguidance", "auto"])
@pytest.mark.parametrize("schema, good, bad", [
    (CWL, [{"t": "int"}, {"t": {"type": "array", "items": "string"}},
           {"t": {"type": "record", "fields": [{"type": "array", "items": "int"}, "string"]}}],
     # the derived array's items meet the base's: only a primitive (an array of records or of arrays is refused)
     [{"t": {"type": "array", "items": {"type": "record", "fields": []}}},
      {"t": {"type": "array", "items": {"type": "array", "items": "int"}}},
      {"t": {"type": "record", "fields": [{"type": "array", "items": {"type": "record", "fields": []}}]}},
      {"t": "float"}]),
    (TWO_TREES, [{"a": 1, "b": True}, {"a": 1, "kid": {"a": 2, "kid": {"a": 3, "b": True}, "b": True}, "b": False}],
     [{"a": 1, "b": True, "kid": {"a": 2}}, {"a": 1, "b": True, "kid": {"a": 2, "b": True, "kid": {"b": True}}},
      {"a": 1, "b": True, "kid": 1}, {"a": 1, "b": True, "kid": {"a": 2, "b": True, "kid": {"a": 3, "b": 1}}}]),
    (PROMO, [{"kind": "story"}, {"kind": "story", "basic": {"kind": "ref", "id": "x"}},
             {"kind": "ref", "basic": {"kind": "story", "basic": {"kind": "ref"}}}],
     [{"kind": "story", "basic": {"kind": "other"}}, {"kind": "story", "basic": {"id": "x"}},
      {"kind": "story", "basic": {"kind": "story", "basic": {"kind": "ref", "x": 1}}}]),
    # (`x1` is declared in one and found by the other's regex: a number and an integer, at every depth)
    (NAMED, [{"next": {"next": {}, "x1": -3}, "x1": 2}, {}],
     [{"x1": 1.5}, {"next": {"x1": 1.5}}, {"x2": 1}, {"next": {"x2": 1}}, {"x1": "a"}]),
    # (tests/constrain/test_rewrite.py names llguidance's refusal of these, where it still stands)
    ({"type": "object", "properties": {"kid": {"allOf": [{"$ref": "#"}, {"required": ["n"]}]},
                                       "n": {"type": "string"}}},
     [{"kid": {"kid": {"n": "b"}, "n": "a"}}, {}], [{"kid": {}}, {"kid": {"kid": {}, "n": "a"}}]),
    ({"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
      "$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n", "minProperties": 1}}}}},
     [{"n": {"c": {"x": 1}}}, {"n": {"c": {"c": {"y": 2}}}}], [{"n": {"c": {}}}, {"n": {"c": {"c": {}}}}]),
    (OVERLAP, [{"kid": {"kid": {}, "xy": 5}, "x1": -1, "xy": 7, "k": "s"}],
     [{"xy": 3}, {"kid": {"xy": 3}}, {"x1": 1.5}, {"kid": {"kid": {"x": "s"}}}]),
    # (`t`'s second chunk declares `b`, its first forbids every name but `a` and `w`: `kid` takes `{}` alone)
    (INHERITED, [{}, {"a": 1}, {"w": {"kid": {}}}, {"a": 1, "w": {}}],
     [{"w": {"kid": {"a": 1}}}, {"w": {"kid": {"b": 1}}}, {"w": {"kid": {"w": {}}}}, {"b": 1}]),
    (CONST_TRUE, [{}, {"k": {"v": 1}}], [{"v": 1}, {"v": True}, {"k": {"v": True}}]),
    (DIGITS, [{"xa": 1}, {"kid": {"xb": 2}, "x-": 3}, {}],
     [{"x\u0663": 1}, {"kid": {"x\u0663": 1}}, {"x5": 1}, {"xa": "s"}]),
    (NESTED_DEFS, [{}, {"w": {"a": 1, "b": True}}, {"w": {"a": 1, "kid": {"a": 2, "b": False}, "b": True}}],
     [{"w": {"a": 1}}, {"w": {"a": 1, "kid": {"a": 2}, "b": True}}, {"w": {"a": 1, "kid": {"b": True}, "b": True}}]),
    # (`s` is `x`'s string, wherever the `false` alternative before it went)
    (SHIFTED, [{"s": "a"}, {"x": 5}, {"x": "a"}, {"c": {"a": 1, "b": True}}],
     [{"s": 5}, {"x": {"p": {}}}, {"c": {"a": 1}}]),
    (OWN_PATTERN, [{"n": {"xb": 1}}, {"n": {"xb": {"xb": 2}, "xa": 3}}, {}],
     [{"n": {"xb": 0}}, {"n": {"xb": {"xb": 0}}}, {"n": {}}, {"n": {"xa": 0}}]),
])
def test_a_recursive_definition_meeting_other_keywords_compiles_and_takes_what_the_schema_takes(
        schema, good, bad, backend, gpt2_compiler, tokenizers, vocabs):
    g = _compile(gpt2_compiler, schema, backend)
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    for document in good:
        assert accepts_document(g, tok, vocab, document), document
    for document in bad:
        assert not accepts_document(g, tok, vocab, document), document
    assert ended_walks_valid(g, vocab, schema, seed=0, walks=20, max_tokens=60) > 0


def test_only_the_meetings_of_recursive_definitions_are_written_out():
    """A schema without recursion, or whose recursive definitions meet nothing, is handed on as it is."""
    plain = {"allOf": [{"$ref": "#/$defs/a"}, {"properties": {"x": {"type": "integer"}}}],
             "$defs": {"a": {"type": "object", "properties": {"x": {"minimum": 0}}}}}
    tree = {"$ref": "#/$defs/t", "$defs": {"t": {"type": "object", "properties": {"kid": {"$ref": "#/$defs/t"}}}}}
    for schema in (plain, tree):
        assert intersected_recursive_meetings(schema) is schema
    met = intersected_recursive_meetings(TWO_TREES)
    assert met is not TWO_TREES and "allOf" not in met  # (the trees merged into one definition)


def test_a_meeting_llguidance_compiles_itself_is_handed_on_unchanged(gpt2_compiler):
    """Met outside its own cycle, the tree is compiled by llguidance before the meeting needs it: that schema (and
    the grammar every answer to it was written by) stays as it was; only a refusal has the meetings written out."""
    schema = {"type": "object", "properties": {"v": {"type": "object", "anyOf": [{"$ref": "#/$defs/t"}]}},
              "$defs": {"t": {"type": "object", "properties": {"kid": {"$ref": "#/$defs/t"}}}}}
    assert intersected_recursive_meetings(schema) is not schema  # (it has a meeting to write out)
    text, _, written_out = checked_grammar_text(gpt2_compiler.lltokenizer(), "json", schema=schema)
    assert not written_out and text == grammar_text("json", schema=schema)
    _, _, written_out = checked_grammar_text(gpt2_compiler.lltokenizer(), "json", schema=PROMO)
    assert written_out


def test_meetings_are_written_out_where_llguidance_reads_the_schema_leniently(gpt2_compiler, tokenizers, vocabs):
    """Beside a keyword llguidance leaves to the checks on finished values (`uniqueItems` over objects), the schema
    is read in llguidance's lenient mode, whose refusal of the meeting was a 400 without `strict`."""
    tags = {"type": "array", "items": {"type": "object"}, "uniqueItems": True}
    schema = {**PROMO, "properties": {"kind": PROMO["properties"]["kind"], "tags": tags,
                                      "basic": PROMO["properties"]["basic"]}}
    g = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "promo", "schema": schema, "strict": False}}))
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    assert accepts_document(g, tok, vocab, {"kind": "story", "tags": [{"a": 1}], "basic": {"kind": "ref", "id": "x"}})
    assert not accepts_document(g, tok, vocab, {"kind": "story", "tags": [{}, {}]})
    assert not accepts_document(g, tok, vocab, {"kind": "story", "basic": {"kind": "ref", "id": 1}})
    assert ended_walks_valid(g, vocab, schema, seed=0, walks=12, max_tokens=60) > 0


@pytest.mark.parametrize("tool_format", ["json_array", "hermes", "qwen3_coder"])
@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_a_function_whose_parameters_meet_a_recursive_definition_can_be_called(tool_format, tool_choice,
                                                                              tmp_path_factory):
    """The tool-call grammars (the calls' schema, hermes' call items, XML formats' parameter values) hand
    llguidance the meetings written out too: such a function was a 400 whatever the format."""
    from tests.conftest import build_qwen3_coder_tokenizer, build_qwen_tools_tokenizer

    tokenizer = (build_qwen_tools_tokenizer if tool_format == "hermes" else build_qwen3_coder_tokenizer)(
        tmp_path_factory.mktemp(tool_format))
    tools = [{"type": "function", "function": {"name": "promo", "parameters": PROMO}}]
    spec = spec_from_request(tools=tools, tool_choice=tool_choice, tool_format=tool_format, backend="llguidance")
    with compiling(tokenizer, "qwen2") as (_, vocab, compiler):
        g = compiler.compile(spec)
        rng = random.Random(0)
        called = 0
        for _ in range(12):
            toks, done = random_walk(g, vocab, rng, 120, budget=True, prefer_end=0.5)
            if done and (tool_choice == "required" or parse_tool_calls(decode(vocab, toks), spec) is not None):
                called += len(valid_calls(decode(vocab, toks), spec, {"promo": PROMO}))
        assert called or tool_choice == "auto"  # (under "auto" a walk may answer in text alone)


@pytest.mark.parametrize("tool_format", ["json_array", "hermes", "llama3_json", "qwen3_coder"])
def test_a_function_whose_parameters_are_a_meeting_themselves_can_be_called(tool_format, tmp_path_factory):
    """TWO_TREES as a function's parameters, beside a function that needs nothing written out: the meeting is
    their root, `#/$defs/tool1`, and their own definitions (`#/$defs/tool1/$defs/a`) were dropped with it, so
    the references into them gave the write-out up: a 400 in every format, where the same schema compiles as a
    `response_format`."""
    from tests.conftest import build_qwen3_coder_tokenizer, build_qwen_tools_tokenizer

    tokenizer = (build_qwen3_coder_tokenizer if tool_format == "qwen3_coder" else build_qwen_tools_tokenizer)(
        tmp_path_factory.mktemp(tool_format))
    plain = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    tools = [{"type": "function", "function": {"name": "plain", "parameters": plain}},
             {"type": "function", "function": {"name": "trees", "parameters": TWO_TREES}}]
    spec = spec_from_request(tools=tools, tool_choice={"type": "function", "function": {"name": "trees"}},
                             tool_format=tool_format, backend="llguidance")
    with compiling(tokenizer, "qwen2") as (_, vocab, compiler):
        g = compiler.compile(spec)
        rng = random.Random(0)
        called = 0
        for _ in range(8):
            toks, done = random_walk(g, vocab, rng, 150, budget=True, prefer_end=0.5)
            if done:
                called += len(valid_calls(decode(vocab, toks), spec, {"plain": plain, "trees": TWO_TREES}))
        assert called


def test_a_reference_into_a_place_that_would_be_written_anew_leaves_the_schema_as_it_is():
    """The place `#/$defs/d/allOf/1/properties/v` names is gone once `d` is written out as one object: such a
    schema is handed on unchanged (llguidance's refusal stands) rather than with a reference to nothing."""
    schema = {"type": "object", "properties": {"d": {"$ref": "#/$defs/d"},
                                               "v": {"$ref": "#/$defs/d/allOf/1/properties/v"}},
              "$defs": {"d": {"allOf": [{"$ref": "#/$defs/t"}, {"properties": {"v": {"type": "string"}}}]},
                        "t": {"type": "object", "properties": {"kid": {"$ref": "#/$defs/d"}}}}}
    assert intersected_recursive_meetings(schema) is schema


def test_a_pattern_beside_a_definitions_own_properties_is_not_read_as_implied_by_it():
    """`t`'s `^x` takes no name `t` declares (as llguidance reads it): `xa` is a string there. The same regex in a
    chunk that declares nothing takes `xa` too, so that chunk still holds where it meets `t`: `xa` is refused."""
    pattern = {"^x": {"type": "integer"}}
    schema = {"type": "object",
              "properties": {"w": {"allOf": [{"properties": {"kid": {"$ref": "#/$defs/t"}}},
                                             {"properties": {"kid": {"patternProperties": pattern}}}]}},
              "$defs": {"t": {"type": "object", "properties": {"xa": {"type": "string"}, "kid": {"$ref": "#/$defs/t"}},
                              "patternProperties": pattern}}}
    met = intersected_recursive_meetings(schema)
    kid = met["properties"]["w"]["properties"]["kid"]
    assert kid != {"$ref": "#/$defs/t"}  # (the chunk was dropped: `{"xa": "s"}` taken)
    assert met["$defs"][kid["$ref"].rsplit("/", 1)[1]]["properties"]["xa"] is False


def test_a_root_whose_meetings_refuse_every_value_is_left_as_it_is(gpt2_compiler):
    """The property the root requires meets an object tree and an array tree: its definition comes out `false`,
    and so does the root. That was a TypeError out of the rewrite (a 500); it is llguidance's 400, as before."""
    schema = {"type": "object", "required": ["p"],
              "allOf": [{"properties": {"p": {"$ref": "#/$defs/t"}}}, {"properties": {"p": {"$ref": "#/$defs/u"}}}],
              "$defs": {"t": {"type": "object", "properties": {"k": {"$ref": "#/$defs/t"}}},
                        "u": {"type": "array", "items": {"$ref": "#/$defs/u"}}}}
    assert intersected_recursive_meetings(schema) is schema
    with pytest.raises(ConstraintError):
        _compile(gpt2_compiler, schema, "llguidance")


def test_a_fault_while_writing_meetings_out_leaves_llguidances_refusal(monkeypatch, caplog, gpt2_compiler):
    """Only schemas llguidance refused come here: a fault in the rewrite is logged and the refusal (a 400) stands,
    never a 500."""
    import constrain.recursive_meets as recursive_meets

    def broken(self):
        raise KeyError("a fault")

    monkeypatch.setattr(recursive_meets._Meetings, "rewritten", broken)
    assert intersected_recursive_meetings(PROMO) is PROMO
    assert "writing out recursive meetings failed" in caplog.text
    with pytest.raises(ConstraintError, match="circular references with sibling keys"):
        _compile(gpt2_compiler, {**PROMO, "title": "a schema no other test compiles"}, "llguidance")


def test_an_any_of_and_a_one_of_of_the_same_branches_are_both_asserted(gpt2_compiler, tokenizers, vocabs):
    """Beside two recursive trees, an `anyOf` and a `oneOf` of the same nine overlapping branches (the `oneOf` is
    left as it is, for the checks as each value ends). Parts were keyed by their branches' text alone, so the
    `oneOf` was dropped as a repeat of the `anyOf`: `{"a": 1}` (two branches hold) was taken."""
    at_least = [{"properties": {"a": {"minimum": i}}} for i in range(9)]
    trees = {"a": {"type": "object", "properties": {"a": {"type": "integer"}, "kid": {"$ref": "#/$defs/a"}}},
             "b": {"type": "object", "properties": {"b": {"type": "integer"}, "kid": {"$ref": "#/$defs/b"}}}}
    schema = {"allOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}, {"anyOf": at_least}, {"oneOf": at_least}],
              "$defs": trees}
    _, _, written_out = checked_grammar_text(gpt2_compiler.lltokenizer(), "json", schema=normalise_schema(schema))
    assert written_out
    g = _compile(gpt2_compiler, schema, "llguidance")
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    for document in ({"a": 0}, {"a": 0, "kid": {"a": 5, "b": 1}}):
        assert accepts_document(g, tok, vocab, document), document
    for document in ({"a": 1}, {"a": 8}, {}, {"a": -1}, {"a": 0, "b": "s"}):
        assert not accepts_document(g, tok, vocab, document), document


def test_a_reference_to_a_meeting_that_refuses_every_value_leaves_the_schema_as_it_is(gpt2_compiler):
    """`t` is an integer and an object at once: the root's meeting with it comes out `false`. The root, a `$ref`
    beside `$defs`, was kept as a reference to a definition no longer written; the schema is handed on as it is,
    and llguidance's refusal (a 400) stands."""
    schema = {"$ref": "#/$defs/t", "required": ["a"],
              "$defs": {"t": {"type": "integer", "properties": {"k": {"$ref": "#/$defs/t"}},
                              "anyOf": [{"type": "object"}]}}}
    assert intersected_recursive_meetings(schema) is schema
    with pytest.raises(ConstraintError):
        _compile(gpt2_compiler, schema, "llguidance")


# -- random recursive schemas: written out, each takes exactly the values the schema takes --------------------------

_NAMES = ["a", "b", "xa", "xb", "c"]
_PATTERNS = ["^x", "a$", "^xb$", "b"]


def _random_schema(rng: random.Random, depth: int, definitions: int) -> dict:
    if depth <= 0 or rng.random() < 0.2:
        return rng.choice([{"$ref": f"#/$defs/D{rng.randrange(definitions)}"}, {"type": "integer"}, {"minimum": 1},
                           {"maximum": 3}, {"type": "object"}, {}, {"type": "string"}, {"enum": [1, 2, "s"]}])
    node: dict = {}
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(["type", "min", "max", "props", "pp", "ap", "req", "items", "allOf", "anyOf", "oneOf",
                          "ref"])
        below = lambda: _random_schema(rng, depth - 1, definitions)  # noqa: E731
        if key == "type":
            node["type"] = rng.choice(["object", "integer", "array", ["object", "integer"]])
        elif key == "min":
            node["minimum"] = rng.randint(0, 3)
        elif key == "max":
            node["maximum"] = rng.randint(0, 4)
        elif key == "props":
            node["properties"] = {n: below() for n in rng.sample(_NAMES, rng.randint(1, 2))}
        elif key == "pp":
            node["patternProperties"] = {p: below() for p in rng.sample(_PATTERNS, rng.randint(1, 2))}
        elif key == "ap":
            node["additionalProperties"] = rng.choice([False, below()])
        elif key == "req":
            node["required"] = rng.sample(_NAMES, rng.randint(1, 2))
        elif key == "items":
            node["items"] = below()
        elif key == "ref":
            node["$ref"] = f"#/$defs/D{rng.randrange(definitions)}"
        else:
            node[key] = [below() for _ in range(rng.randint(1, 3))]
    return node


def _random_value(rng: random.Random, depth: int = 3):
    r = rng.random()
    if depth <= 0 or r < 0.35:
        return rng.choice([0, 1, 2, 3, 5, "s", None, True])
    if r < 0.85:
        return {n: _random_value(rng, depth - 1) for n in rng.sample(_NAMES, rng.randint(0, 3))}
    return [_random_value(rng, depth - 1) for _ in range(rng.randint(0, 2))]


def test_random_recursive_schemas_written_out_take_exactly_what_they_took():
    """Random schemas of up to three definitions that reach each other (seeds 600-899; among them 644, where a
    name's own `patternProperties` was dropped, and 873, whose root came out a reference to nothing), as the
    product hands them to llguidance: where the meetings are written out, JSON Schema takes the same of 150 random
    values from either."""
    written = 0
    for seed in range(600, 900):
        rng = random.Random(seed)
        definitions = rng.randint(1, 3)
        schema = _random_schema(rng, 3, definitions)
        schema["$defs"] = {f"D{i}": _random_schema(rng, 3, definitions) for i in range(definitions)}
        out = llguidance_json(schema, write_out_meetings=True)
        if out == schema or _in_place_loop(schema) is not None:  # (a 400: JSON Schema leaves it undefined)
            continue
        written += 1
        before, after = Draft202012Validator(schema), Draft202012Validator(out)
        for value in (_random_value(rng) for _ in range(150)):
            assert before.is_valid(value) == after.is_valid(value), (seed, value)
    assert written > 40
