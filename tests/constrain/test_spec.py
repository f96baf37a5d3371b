"""spec_from_request: every request shape maps to one ConstraintSpec or a ConstraintError naming the field."""

from __future__ import annotations

import json
import random

import pytest

from constrain import ConstraintError, ConstraintSpec, spec_from_request
from constrain.spec import normalise_schema
from tests.constrain.conftest import accepts_document, accepts_value, decode, ended_walks_valid, random_walk, takes_text

DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"

S = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False}


def test_text_and_nothing_mean_no_constraint():
    assert spec_from_request() is None
    assert spec_from_request(response_format={"type": "text"}) is None


def test_response_format_shapes():
    assert spec_from_request(response_format={"type": "json_object"}) == ConstraintSpec(kind="json_object")
    hosted = spec_from_request(response_format={"type": "json_object", "schema": S})
    assert hosted.kind == "json_schema" and hosted.schema == S
    openai = spec_from_request(response_format={"type": "json_schema",
                                                "json_schema": {"name": "n", "schema": S, "strict": True}})
    assert openai.kind == "json_schema" and openai.strict and openai.schema == S


@pytest.mark.parametrize("rf, param", [
    ({"type": "xml"}, "response_format"), ("json", "response_format"), ({"type": "json_schema"}, "response_format"),
    ({"type": "json_schema", "json_schema": {"schema": S, "strict": "yes"}}, "response_format.json_schema.strict"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}, "response_format"),
    ({"type": "json"}, "response_format.value"), ({"type": "regex", "value": ""}, "response_format"),
    ({"type": "json_object", "value": S, "schema": S}, "response_format.schema"),
    ({"type": "json_schema", "value": S}, "response_format.value")])
def test_malformed_response_format_is_a_client_error(rf, param):
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format=rf)
    assert exc.value.param == param


@pytest.mark.parametrize("rf, kind", [
    ({"type": "json_object", "value": S}, "json_schema"), ({"type": "json", "value": json.dumps(S)}, "json_schema"),
    ({"type": "json_schema", "value": {"name": "s", "schema": S}}, "json_schema"),
    ({"type": "regex", "value": "[0-9]+"}, "regex")])
def test_tgis_chat_grammar_in_response_format_is_the_same_constraint(rf, kind):
    """TGI's chat takes its grammar as `response_format` (`{"type": "json_object", "value": SCHEMA}` in its docs):
    read as the same constraint as in its `grammar` field, where it was a 400 (QA migration)."""
    spec = spec_from_request(response_format=rf)
    assert spec.kind == kind and not spec.strict
    assert spec.key == spec_from_request(other_fields={"grammar": rf}).key


@pytest.mark.parametrize("rf, param", [
    ({"type": "json_object", "json_schema": {"name": "x", "schema": {"type": "integer"}}},
     "response_format.json_schema"),
    ({"type": "text", "schema": {"type": "integer"}}, "response_format.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": S}, "schema": S}, "response_format.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "json_schema": S}},
     "response_format.json_schema.json_schema"),
    ({"type": "json_object", "strict": True}, "response_format.strict"),
])
def test_a_field_of_response_format_the_server_does_not_read_is_refused_naming_it(rf, param):
    """A schema under a key its shape does not have (OpenAI's `json_schema` beside `json_object`) left the output
    unconstrained, and said nothing."""
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format=rf)
    assert exc.value.param == param and exc.value.code == "unknown_parameter"
    assert f"Unknown parameter: '{param}'" in exc.value.message


def test_a_field_of_response_format_set_to_null_counts_as_not_sent():
    assert spec_from_request(response_format={"type": "json_object", "json_schema": None}).kind == "json_object"
    assert spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": S, "description": None}}).schema == S


def test_named_schema_reference():
    """`schema: null` is no schema, as any field set to null (clients that write every optional field sent it, and
    got a 400 "a JSON Schema must be an object or a boolean": QA ops F3)."""
    for json_schema in ({"name": "user"}, {"name": "user", "schema": None}):
        spec = spec_from_request(response_format={"type": "json_schema", "json_schema": json_schema},
                                 named_schemas={"user": S})
        assert spec.schema == S
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "nope"}},
                          named_schemas={"user": S})
    assert "nope" in exc.value.message and exc.value.param == "response_format.json_schema.name"


def test_json_schema_names_follow_openais_rule_and_may_be_omitted():
    for name in ("a", "my_schema-2", "x" * 64):
        spec = spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": name, "schema": S}})
        assert spec.extra["name"] == name
    assert spec_from_request(response_format={"type": "json_schema", "json_schema": {"schema": S}}).schema == S


def test_regex_choice_backend_and_conflicts():
    assert spec_from_request(regex="[a-z]+", backend="outlines").backend == "outlines"
    assert spec_from_request(choice=["a", "b", "a"]).choices == ("a", "b")
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(choice=[])
    assert exc.value.param == "choice"
    with pytest.raises(ConstraintError):
        spec_from_request(regex="a", choice=["a"])
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(regex="a", backend="xgrammar")
    assert exc.value.param == "backend"


def test_a_choice_is_bounded_in_entries_and_in_characters():
    """Two entries of 3.5 million characters each took ~1 GB of the server's memory to compile, kept after the
    400 it ended in (QA hostile F4); one of 262,144 ~50 MB as answers went through it (review of 3833cdf)."""
    widest = [f"{i:x}" * 4_096 for i in range(16)]  # (16 entries of 4,096 characters: 65,536 in all)
    assert len(spec_from_request(choice=widest).choices) == 16
    for choice, said in ((widest + ["x"], "more than 65536 characters"),
                         ([str(i) for i in range(10_001)], "more than 10000 entries")):
        with pytest.raises(ConstraintError) as exc:
            spec_from_request(choice=choice)
        assert said in exc.value.message and exc.value.param == "choice" and exc.value.code == "schema_too_large"
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(other_fields={"guided_choice": ["a" * 70_000]})
    assert exc.value.param == "guided_choice"


@pytest.mark.parametrize("fields, kind, param", [
    ({"guided_json": S}, "json_schema", "guided_json"),
    ({"guided_json": '{"type": "integer"}'}, "json_schema", "guided_json"),
    ({"json_schema": S}, "json_schema", "json_schema"),
    ({"structured_outputs": {"json": S, "whitespace_pattern": " ?"}}, "json_schema", "structured_outputs.json"),
    ({"grammar": {"type": "json", "value": S}}, "json_schema", "grammar"),
    ({"guided_regex": "[0-9]+"}, "regex", "guided_regex"),
    ({"structured_outputs": {"regex": "[0-9]+"}}, "regex", "structured_outputs.regex"),
    ({"grammar": {"type": "regex", "value": "[0-9]+"}}, "regex", "grammar"),
    ({"guided_choice": ["a", "b"]}, "choice", "guided_choice"),
    ({"structured_outputs": {"choice": ["a", "b"]}}, "choice", "structured_outputs.choice"),
    ({"structured_outputs": {"json_object": True}}, "json_object", "structured_outputs.json_object"),
    ({"grammar": {"type": "json_object"}}, "json_object", "grammar"),
    ({"grammar": {"type": "json_object", "value": S}}, "json_schema", "grammar"),  # (TGI: an alias of `json`)
    ({"grammar": {"type": "json_schema", "value": {"name": "s", "schema": S}}}, "json_schema", "grammar"),
    ({"format": S}, "json_schema", "format"),  # (Ollama's)
    ({"format": "json"}, "json_object", "format"),
])
def test_other_servers_constraint_fields_are_the_same_constraints(fields, kind, param):
    spec = spec_from_request(other_fields={"unrelated": 1, **fields})
    assert spec.kind == kind and spec.param == param and not spec.strict
    usual = {"json_schema": spec_from_request(response_format={"type": "json_object", "schema": S}),
             "regex": spec_from_request(regex="[0-9]+"), "choice": spec_from_request(choice=["a", "b"]),
             "json_object": spec_from_request(response_format={"type": "json_object"})}[kind]
    if fields != {"guided_json": '{"type": "integer"}'}:
        assert spec.key == usual.key  # the same grammar, from the same cache entry


@pytest.mark.parametrize("fields, param, said", [
    ({"guided_grammar": 'root ::= "a"'}, "guided_grammar", "grammar language"),
    ({"grammar": 'root ::= "a"'}, "grammar", "grammar language"),
    ({"ebnf": 'root ::= "a"'}, "ebnf", "grammar language"),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "structured_outputs.grammar", "grammar language"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag", "grammar language"),
    ({"structured_outputs": "json"}, "structured_outputs", "must be an object"),
    ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs.json_object", "must be a boolean"),
    ({"grammar": {"type": "lark", "value": "x"}}, "grammar", "grammar.type must be"),
    ({"structured_outputs": {"json_schema": S}}, "structured_outputs.json_schema", "Unknown parameter"),
    ({"structured_outputs": {"schema": S}}, "structured_outputs.schema", "Unknown parameter"),
    ({"structured_outputs": {}}, "structured_outputs", "names no constraint"),
    ({"structured_outputs": {"disable_fallback": True}}, "structured_outputs", "names no constraint"),
    ({"structured_outputs": {"json": S, "disable_additional_properties": True}},
     "structured_outputs.disable_additional_properties", "additionalProperties: false"),
    ({"grammar": {"type": "json"}}, "grammar.value", "grammar.value is required"),
    ({"grammar": {"type": "regex", "value": None}}, "grammar.value", "grammar.value is required"),
    ({"grammar": {"type": "json", "value": S, "schema": S}}, "grammar.schema", "Unknown parameter"),
    ({"grammar": {"type": "json_object", "value": {"type": "strin"}}}, "grammar", "invalid JSON Schema at /type"),
    ({"grammar": {"type": "json_schema", "value": S}}, "grammar.value", '{"name": ..., "schema": {...}}'),
    ({"grammar": {"type": "json_schema", "value": {"schema": S, "strict": True}}}, "grammar.value.strict",
     "Unknown parameter"),
    ({"format": "yaml"}, "format", 'must be "json" or a JSON schema'),
    ({"format": {"type": "strin"}}, "format", "invalid JSON Schema at /type"),
    ({"guided_json": "{not json"}, "guided_json", "JSON text"),
    ({"guided_json": '{"type": "string", "pattern": "^\\ud800$"}'}, "guided_json", "holds a lone surrogate"),
    ({"grammar": {"type": "json", "value": '{"enum": ["\\udc00x"]}'}}, "grammar", "holds a lone surrogate"),
    ({"structured_outputs": {"json": '{"properties": {"\\ud83d": {}}}'}}, "structured_outputs.json",
     "holds a lone surrogate"),
    # (past 500 levels on any Python: 3.12 read 5,000 and said a list is no schema)
    ({"guided_json": "[" * 5000 + "]" * 5000}, "guided_json",
     "guided_json nests arrays and objects deeper than 500 levels, which this server does not read"),
    ({"guided_json": "[" * 501 + "]" * 501}, "guided_json", "nests arrays and objects deeper than 500 levels"),
    ({"structured_outputs": {"json": "[" * 5000 + "]" * 5000}}, "structured_outputs.json", "deeper than 500"),
    ({"guided_json": {"type": "strin"}}, "guided_json", "invalid JSON Schema at /type"),
    ({"guided_regex": "(a"}, "guided_regex", "invalid regex in guided_regex"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_choice", "only one output constraint"),
])
def test_other_servers_constraint_fields_are_refused_when_malformed_or_a_grammar_language(fields, param, said):
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(other_fields=fields)
    assert exc.value.param == param and said in exc.value.message
    assert "_backend" not in exc.value.message  # (vLLM's private fields are taken, never offered: QA readme F5)


@pytest.mark.parametrize("strict", ["true", 1, {}])
def test_a_strict_that_is_not_a_boolean_is_refused_naming_it(strict):
    """LM Studio's documentation sends `"strict": "true"`: refused, as OpenAI does, and the error names the field,
    not the whole response_format (QA migration F3)."""
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": S,
                                                                                  "strict": strict}})
    assert exc.value.param == "response_format.json_schema.strict" and exc.value.code == "invalid_request"
    assert repr(strict) in exc.value.message


@pytest.mark.parametrize("kind", ["structural_tag", "grammar", "ebnf"])
def test_a_response_format_holding_a_grammar_is_refused_as_the_grammar_fields_are(kind):
    """vLLM's `response_format: {"type": "structural_tag"}` got "type must be 'text', ..." and `invalid_constraint`,
    where the other ways to send a grammar get `unsupported_parameter` (README; QA readme F5)."""
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": kind, kind: {}})
    assert exc.value.param == "response_format" and exc.value.code == "unsupported_parameter"
    assert "grammar language" in exc.value.message
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(other_fields={"grammar": 'root ::= "a"'})
    assert exc.value.code == "unsupported_parameter"


@pytest.mark.parametrize("regex", ["a++a", "a{2}+", "(ab)*+c", "x?+", "(?>ab)c"])
def test_possessive_quantifiers_and_atomic_groups_are_refused_in_a_regex_and_a_pattern(regex):
    """Python 3.11 reads `a{2}+` as `aa` held possessively, ECMA-262 as a syntax error, and both backends as a repeat
    of a repeat: every answer under `a++a` failed the client's pattern (QA regex F1)."""
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(regex=regex)
    assert exc.value.param == "regex" and ("possessive" in exc.value.message or "atomic" in exc.value.message)
    for schema, pointer in (({"type": "object", "properties": {"v": {"type": "string", "pattern": regex}}},
                             "/properties/v/pattern"), ({"patternProperties": {regex: {}}}, "/patternProperties")):
        with pytest.raises(ConstraintError) as exc:
            spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
        assert exc.value.pointer == pointer and "ECMA-262" in exc.value.message, exc.value.message
    assert spec_from_request(regex=regex.replace("+", "", 1).replace("?>", "?:")).kind == "regex"  # (the plain forms)
    assert spec_from_request(regex="[+]+\\++a{2,3}?").kind == "regex"  # (a class, an escaped `+`, a lazy count)


def test_an_other_servers_field_beside_response_format_is_two_constraints():
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_object"}, other_fields={"guided_regex": "a"})
    assert exc.value.param == "guided_regex" and "response_format and guided_regex" in exc.value.message
    assert spec_from_request(response_format={"type": "text"}, other_fields={"guided_regex": "a"}).kind == "regex"
    assert spec_from_request(other_fields={"structured_outputs": {"json_object": False}}) is None


def test_strict_schema_with_unenforceable_keyword_names_its_pointer(gpt2_compiler):
    schema = {"type": "object", "properties": {"tags": {"type": "string", "not": {"pattern": "(a)\\1"}}}}
    strict = spec_from_request(response_format={"type": "json_schema",
                                                 "json_schema": {"name": "t", "schema": schema, "strict": True}})
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(strict)
    assert exc.value.pointer == "/properties/tags/not" and exc.value.pointer in exc.value.message
    lax = spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
    g = gpt2_compiler.compile(lax)
    assert g.unenforced == ("/properties/tags/not",)


def test_the_boolean_schema_true_takes_any_value_and_false_is_refused_as_unsatisfiable(gpt2_compiler, vocabs,
                                                                                       tokenizers):
    """`true` (and what rewrites to it) accepts every JSON value, as `{}` does; `false` (and `{"not": {}}`) accepts
    none: a 400 that says so, not a backend's message about options it could not attach to a boolean."""
    for schema in (True, {"not": {"not": {}}}):
        spec = spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
        g = gpt2_compiler.compile(spec)
        for value in ([1, "a"], "text", None, 2.5, {"k": {}}):
            assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], value), value
        assert ended_walks_valid(g, vocabs["gpt2"], {}, seed=3, walks=10) > 0
    for schema in (False, {"not": {}}):
        spec = spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "f", "schema": schema}})
        with pytest.raises(ConstraintError) as exc:
            gpt2_compiler.compile(spec)
        assert "Unsatisfiable" in exc.value.message and exc.value.param == "response_format"



# `else` becomes an anyOf branch under a generated allOf: the keyword it cannot enforce sits at
# /properties/tags/allOf/0/anyOf/1/not in the compiled schema, a place the client's schema does not have.
REWRITTEN_AROUND_NOT = {"type": "object", "properties": {"tags": {
    "if": {"type": "array"}, "else": {"type": "string", "not": {"pattern": "(a)\\1"}}}}}


def test_a_pointer_into_a_rewritten_subschema_names_the_clients_subschema(gpt2_compiler):
    spec = spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "t", "schema": REWRITTEN_AROUND_NOT, "strict": True}})
    assert "if" not in spec.schema["properties"]["tags"]  # (the rewrite happened)
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec)
    # (named where the client wrote it, the one `not` of that value below the rewritten subschema)
    assert exc.value.pointer == "/properties/tags/else/not"
    assert "at /properties/tags/else/not (not)" in exc.value.message and "rewritten" not in exc.value.message
    # where the client wrote the keyword more than once there, the subschema the rewrite replaced is named
    twice = {"type": "object", "properties": {"tags": {
        "if": {"type": "array"}, "then": {"not": {"pattern": "(a)\\1"}}, "else": REWRITTEN_AROUND_NOT["properties"][
            "tags"]["else"]}}}
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "t", "schema": twice, "strict": True}}))
    assert exc.value.pointer == "/properties/tags" and "rewritten" in exc.value.message


@pytest.mark.parametrize("schema, said", [
    ({"allOf": [{"enum": [1]}, {"not": {"enum": [True]}}]}, "serves only objects and arrays at the root"),
    ({}, "takes any JSON value, or none"),
    ({"type": "object"}, "the object at the root takes properties it does not declare"),
])
def test_outlines_names_the_root_in_words_and_as_rfc_6901_does(schema, said, gpt2_compiler):
    """The root was written `/`, which RFC 6901 reads as a property named "", and "the keyword at /" named no
    keyword (QA realworld F4)."""
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "r", "schema": schema}}, backend="outlines"))
    assert said in exc.value.message and " /" not in exc.value.message and "at /;" not in exc.value.message
    assert exc.value.pointer in ("", "/type")


@pytest.mark.parametrize("pointer,expected", [
    ("/properties/a/oneOf/1/not", "/properties/a/oneOf/1/not"),  # in the client's schema: kept
    ("/properties/a/anyOf/0/allOf/1/not", "/properties/a"),  # generated branches: the subschema they replace
    ("/allOf/2/anyOf", ""),  # past the client's allOf list: the node that holds it, the root (RFC 6901's "")
    ("/allOf/0/if/required", "/allOf/0/if"),
    ("/patternProperties/^(?:a|b)$/not", ""),  # a generated pattern key
    ("/properties/a~1b/enum", "/properties/a~1b/enum"),
])
def test_client_pointer(pointer, expected):
    from constrain.support import client_pointer

    source = {"properties": {"a": {"oneOf": [{"type": "string"}, {"not": {"multipleOf": 2}}]},
                             "a/b": {"enum": [1]}},
              "allOf": [{"if": {"minimum": 1}}, {"type": "object"}], "patternProperties": {"^a": {}}}
    assert client_pointer(source, pointer) == expected

def test_strict_schema_names_the_format_it_cannot_enforce_and_ignores_formats_json_schema_does_not_define(
        gpt2_compiler):
    props = {"when": {"type": "string", "format": "date-time"}, "site": {"type": "string", "format": "url"},
             "size": {"type": "integer", "format": "int64"}, "host": {"type": "string", "format": "regex"}}

    def spec(properties, strict):
        schema = {"type": "object", "properties": properties, "required": list(properties),
                  "additionalProperties": False}
        return spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "t", "schema": schema, "strict": strict}})

    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec(props, True))
    assert exc.value.pointer == "/properties/host/format" and "/properties/host/format" in exc.value.message
    assert gpt2_compiler.compile(spec(props, False)).unenforced == ("/properties/host/format",)
    known = {k: v for k, v in props.items() if k != "host"}
    assert gpt2_compiler.compile(spec(known, True)).unenforced == ()


def test_a_format_it_cannot_enforce_is_named_wherever_it_recurs(gpt2_compiler):
    """llguidance reports a warning given more than once as one, `Unknown format: regex (2 times)`: that format
    name was not known, so two `format: regex` went unenforced and unnamed, strict included."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "format": "regex"},
                                               "b": {"type": "string", "format": "regex"}},
              "required": ["a", "b"], "additionalProperties": False}

    def spec(strict):
        return spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "t", "schema": schema, "strict": strict}})

    assert gpt2_compiler.compile(spec(False)).unenforced == ("/properties/a/format", "/properties/b/format")
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec(True))
    assert exc.value.pointer in ("/properties/a/format", "/properties/b/format")


def test_a_schema_that_is_not_strict_gets_every_keyword_the_late_checks_enforce(gpt2_compiler, tokenizers, vocabs):
    """llguidance's lenient pass (which ignores an unenforceable keyword) would take this oneOf as anyOf and name
    it. A schema sent without `strict` (OpenAI's default) gets it checked as each value is finished, as a strict
    one does: only what nothing here enforces (`format: regex`) is named."""
    schema = {"type": "object", "properties": {"host": {"type": "string", "format": "regex"},
                                               "n": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}}
    lax = spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
    g = gpt2_compiler.compile(lax)
    assert g.unenforced == ("/properties/host/format",)
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    assert accepts_document(g, tok, vocab, {"host": "a+", "n": 1.5})
    assert not accepts_document(g, tok, vocab, {"host": "a+", "n": 1})  # (an integer is a number too: both hold)
    strict = spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "t", "schema": schema, "strict": True}})
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(strict)
    assert exc.value.pointer in ("/properties/host/format", "/properties/n/oneOf")


@pytest.mark.parametrize("schema, pointer", [
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "/$ref"),
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/a", "description": "loops"}}, "required": ["x"],
      "$defs": {"a": {"$ref": "#/$defs/b", "title": "a"}, "b": {"$ref": "#/$defs/a"}}}, None),
    ({"$ref": "#"}, "/$ref"),
    # through combinators: the only branch, or a member every value must match, leads back
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"],
      "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}}, "/properties/x/$ref"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}, {"type": "object"}]},
                                     "b": {"oneOf": [{"$ref": "#/$defs/a"}]}}}, "/$ref"),
])
def test_references_that_only_refer_to_one_another_are_refused_naming_one(schema, pointer):
    """They name no schema: llguidance allowed no token (a 400 "too complex" from the first step) or the first two
    and then failed mid-output."""
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert exc.value.pointer.startswith("/") and exc.value.pointer.endswith("/$ref")
    assert pointer is None or exc.value.pointer == pointer
    assert "never reaches a schema" in exc.value.message


def test_a_refused_pattern_a_rewrite_moved_is_named_where_the_client_wrote_it(gpt2_compiler):
    """`if`/`then` is rewritten into branches before compiling: a pattern llguidance cannot read in the `then` was
    named at `/`, the subschema the rewrite replaced."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
              "if": {"required": ["a"]}, "then": {"properties": {"b": {"type": "string", "pattern": "(?<=a)b"}}}}
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": schema, "strict": True}}))
    assert exc.value.pointer == "/then/properties/b/pattern" and exc.value.pointer in exc.value.message
    assert "equivalent form" not in exc.value.message


@pytest.mark.parametrize("schema, pointer", [
    ({"$defs": {"x": {"if": {"$ref": "#/$defs/x"}, "then": {"type": "integer"}}}, "$ref": "#/$defs/x"},
     "/$defs/x"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "string"}]}}}, "/$defs/a"),
    ({"type": "object", "properties": {"a": {"type": "object", "not": {"$ref": "#/properties/a"}}},
      "required": ["a"]}, "/properties/a"),
    ({"type": "object", "dependentSchemas": {"k": {"$ref": "#"}}}, ""),
    ({"type": "array", "items": {"$ref": "#/$defs/b"},
      "$defs": {"b": {"oneOf": [{"type": "null"}, {"allOf": [{"else": {"$ref": "#/$defs/b"}}]}]}}}, "/$defs/b"),
])
def test_a_schema_that_applies_itself_to_the_same_value_is_refused_naming_it(schema, pointer):
    """Checking a value against it never ends: jsonschema recursed into a panic of its Rust registry while a late
    check validated a value mid-output, which ended the engine thread (found by a fuzzer)."""
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert exc.value.pointer == pointer, exc.value.pointer
    assert "applies itself to the value it checks" in exc.value.message


@pytest.mark.parametrize("schema, pointer", [
    ({"const": float("inf")}, "/const"),
    ({"enum": [float("-inf"), 2]}, "/enum/0"),
    ({"type": "object", "properties": {"a": {"const": float("nan")}}, "required": ["a"]}, "/properties/a/const"),
    ({"type": "number", "maximum": float("inf")}, "/maximum"),
])
def test_a_number_json_cannot_write_is_refused_naming_it(schema, pointer):
    """`1e999` in a request body reads as infinity (and NaN, Infinity are taken as Python reads them): llguidance
    wrote `null` for `{"const": 1e999}` (found by a fuzzer)."""
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert exc.value.pointer == pointer, exc.value.pointer
    assert "a number JSON cannot write" in exc.value.message


_ENDLESS = {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "required": ["a"]}


@pytest.mark.parametrize("schema, pointer", [
    ({"$defs": {"n": _ENDLESS}, "$ref": "#/$defs/n"}, "/$defs/n"),
    ({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}}, "$ref": "#/$defs/n"},
     "/$defs/n"),
    ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, ""),
    ({"$defs": {"n": {"anyOf": [{"type": "array", "prefixItems": [{"type": "null"}, {"$ref": "#/$defs/n"}],
                                 "minItems": 2}, {"type": "array", "contains": {"$ref": "#/$defs/n"}}]}},
      "type": "object", "properties": {"v": {"$ref": "#/$defs/n"}}, "required": ["v"]}, "/$defs/n"),
])
def test_a_schema_no_finite_document_satisfies_is_refused_naming_the_recursion(schema, pointer):
    """Each value must hold another without end: llguidance compiled it, and the answer ran to the end of the
    context (4,077 tokens on the built-in model) as `{"a":{"a":{"a": ...`, cut there, not JSON."""
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert exc.value.pointer == pointer, exc.value.pointer
    assert "no JSON document satisfies the schema" in exc.value.message


@pytest.mark.parametrize("schema", [
    {"$defs": {"n": {**_ENDLESS, "type": ["object", "null"]}}, "$ref": "#/$defs/n"},
    {"$defs": {"n": {"anyOf": [_ENDLESS, {"type": "string"}]}}, "$ref": "#/$defs/n"},
    {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"},
    {"$defs": {"n": {"type": "array", "contains": {"$ref": "#/$defs/n"}, "minContains": 0}}, "$ref": "#/$defs/n"},
    {"$defs": {"n": {**_ENDLESS, "required": []}}, "$ref": "#/$defs/n"},
])
def test_a_recursion_a_value_can_leave_is_taken(schema):
    assert spec_from_request(response_format={"type": "json_object", "schema": schema}).schema == schema


_D4, _D7 = "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#"
_D2019 = "https://json-schema.org/draft/2019-09/schema"


@pytest.mark.parametrize("schema, instance", [
    # (where a value may fail them, a `oneOf` member, `prefixItems` and `contains` are read as the draft reads them,
    # as nothing; where a node only asserts, as the later draft does: README, Drafts)
    ({"$schema": _D7, "type": "array", "minItems": 1, "oneOf": [{"prefixItems": [{"$ref": "#"}]}]}, [1]),
    ({"$schema": _D2019, "type": "array", "minItems": 1, "oneOf": [{"prefixItems": [{"$ref": "#"}]}]}, [1]),
    ({"$schema": _D2019, "type": "array", "minItems": 1, "items": [{"type": "integer"}], "oneOf": [{"prefixItems": [
        {"$ref": "#"}]}]}, [1]),
    ({"$schema": _D4, "type": "array", "contains": {"$ref": "#"}}, []),
    ({"$schema": _D7, "definitions": {"tree": {"type": "object", "properties": {
        "kids": {"type": "array", "items": {"$ref": "#/definitions/tree"}}}}},
      "$ref": "#/definitions/tree", "type": "object", "required": ["root"], "properties": {"root": {"$ref": "#"}}}, {}),
])
def test_a_recursion_only_a_later_drafts_keyword_would_make_endless_is_taken(gpt2_compiler, tokenizers, vocabs,
                                                                               schema, instance):
    """The check read `prefixItems` and `contains` in drafts that do not have them, and a draft-07 `$ref`'s
    siblings, which the draft ignores (and the compiled schema drops beside a recursive reference): a 400 "no
    JSON document satisfies" for schemas whose instances validate."""
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_object", "schema": schema},
                                                      backend="llguidance"))
    assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], instance)


@pytest.mark.parametrize("schema", [
    {"$schema": _D7, "type": "array", "minItems": 1, "prefixItems": [{"$ref": "#"}]},
    {"$schema": _D2019, "type": "array", "minItems": 1, "prefixItems": [{"$ref": "#"}]},
    {"$schema": _D7, "type": "array", "contains": {"$ref": "#"}, "minContains": 0},
])
def test_a_recursion_a_later_drafts_keyword_makes_endless_where_it_is_enforced_is_refused(schema):
    """Enforced where its node only asserts (README, Drafts), draft 7's `prefixItems: [{"$ref": "#"}]` beside
    `minItems: 1` asks for an array in an array without end, and the check read it as nothing: the grammar refused
    `[1]` and every answer ran to max_tokens. `contains` asks for one item at least before 2019-09, whatever
    `minContains` says."""
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_object", "schema": schema})
    assert "no JSON document satisfies the schema" in exc.value.message


def test_a_ref_into_an_endless_subschema_leaves_the_schema_as_it_was(gpt2_compiler, tokenizers, vocabs):
    """Written `false`, the endless `n` (and its `properties`) was gone, and `#/$defs/n/properties/x` named
    nothing: a 400 for a schema `{"y": 1}` satisfies."""
    schema = {"$defs": {"n": {"$ref": "#/$defs/m", "properties": {"x": {"type": "integer"}}},
                        "m": {"type": "object", "required": ["a"], "properties": {"a": {"$ref": "#/$defs/n"}}}},
              "type": "object", "additionalProperties": False, "required": ["y"],
              "properties": {"opt": {"$ref": "#/$defs/n"}, "y": {"$ref": "#/$defs/n/properties/x"}}}
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_object", "schema": schema},
                                                      backend="llguidance"))
    assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"y": 1})


@pytest.mark.parametrize("unknown", [{"discriminator": {"propertyName": "kind"}}, {"x-order": 1},
                                     {"nullable": True}])
def test_a_keyword_json_schema_does_not_know_beside_a_recursive_reference_is_no_sibling(gpt2_compiler, tokenizers,
                                                                                        vocabs, unknown):
    """pydantic writes `discriminator` beside the `oneOf` of a recursive discriminated union (a tree, an AST), and
    generators write `x-*` keys beside `$ref`s: llguidance counted them as sibling keys of a reference it was
    still compiling, a 400 "circular references with sibling keys" for `client.chat.completions.parse(Tree)`.
    They assert nothing (validators ignore them) and are left out."""
    leaf = {"type": "object", "properties": {"kind": {"const": "leaf"}, "v": {"type": "integer"}},
            "required": ["kind", "v"], "additionalProperties": False}
    kid = {**unknown, "oneOf": [{"$ref": "#/$defs/Leaf"}, {"$ref": "#/$defs/Br"}]}
    branch = {"type": "object", "properties": {"kind": {"const": "br"}, "kids": {"type": "array", "items": kid}},
              "required": ["kind", "kids"], "additionalProperties": False}
    schema = {"$defs": {"Leaf": leaf, "Br": branch}, "type": "object", "properties": {"root": kid},
              "required": ["root"], "additionalProperties": False}
    tree = {"root": {"kind": "br", "kids": [{"kind": "leaf", "v": 1}, {"kind": "br", "kids": []}]}}
    for strict in (True, False):
        grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "tree", "schema": schema, "strict": strict}}, backend="llguidance"))
        assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], tree)
        assert not accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"root": {"kind": "br"}})
    node = {"$defs": {"Node": {"type": "object", "properties": {"kids": {"type": "array", "items": {
        "$ref": "#/$defs/Node", **unknown}}}}}, "$ref": "#/$defs/Node"}
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_object", "schema": node},
                                                      backend="llguidance"))
    assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"kids": [{"kids": []}, {}]})


def test_a_key_json_schema_does_not_know_that_a_reference_points_into_is_kept(gpt2_compiler, tokenizers, vocabs):
    """The keywords left out beside a recursive reference (above) were left out of every object, the root's
    `components` too, which OpenAPI-style schemas keep their definitions in: a 400 "Pointer '/components/Color'
    does not exist" for a valid recursive schema."""
    schema = {"type": "object", "properties": {"color": {"$ref": "#/components/Color"},
                                               "child": {"allOf": [{"$ref": "#"}, {"x-order": 2}]},
                                               "next": {"$ref": "#", "x-order": 1}},
              "required": ["color"], "components": {"Color": {"enum": ["red", "green"]}}}
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_object", "schema": schema},
                                                      backend="llguidance"))
    assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"color": "red", "next": {"color": "green"}})
    assert not accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"color": "blue"})


@pytest.mark.parametrize("backend", ["llguidance", "auto"])
def test_an_optional_part_no_finite_value_satisfies_is_never_begun(gpt2_compiler, tokenizers, vocabs, backend):
    """An optional property whose schema has no finite value is served as `false`: llguidance let the output
    begin it, and such an output could never end."""
    schema = {"$defs": {"n": _ENDLESS}, "type": "object", "additionalProperties": False,
              "properties": {"x": {"$ref": "#/$defs/n"}, "y": {"type": "integer"}}}
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_object", "schema": schema},
                                                      backend=backend))
    tokenizer, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    assert accepts_document(grammar, tokenizer, vocab, {"y": 1})
    matcher = grammar.matcher()
    assert not all(matcher.accept(t) for t in tokenizer.encode('{"x": {"a": {"a'))
    assert ended_walks_valid(grammar, vocab, schema, seed=3, walks=10, max_tokens=30) == 10


def test_recursion_into_the_value_is_taken():
    """Recursion through properties, items or additionalProperties moves into the value, and ends."""
    for schema in ({"$defs": {"t": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
                        "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}}}]}}, "$ref": "#/$defs/t"},
                   {"type": "object", "additionalProperties": {"not": {"$ref": "#"}}},
                   {"if": {"type": "object"}, "then": {"properties": {"a": {"$ref": "#"}}},
                    "else": {"type": "integer"}}):
        assert spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "x",
                                                                                          "schema": schema}})


def test_references_that_reach_a_schema_are_taken_recursive_or_not():
    for schema in ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"type": "integer"}}, "$ref": "#/$defs/a"},
                   {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
                    "$ref": "#/$defs/node"},
                   {"$defs": {"a": {"title": "anything"}}, "$ref": "#/$defs/a"},
                   {"type": "object", "$defs": {"unused": {"$ref": "#/$defs/unused"}}},  # (never followed)
                   {"$ref": "#/$defs/t", "$defs": {"t": {"allOf": [{"type": "object"}, {"properties": {
                       "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}}}]}}},
                   # a nested $id moves the base: "#/$defs/b" inside `a` is a's own b, an integer
                   {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"],
                    "$defs": {"a": {"$id": "http://x.example/a", "$ref": "#/$defs/b",
                                    "$defs": {"b": {"type": "integer"}}},
                              "b": {"$ref": "#/$defs/a"}}}):
        assert spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "x",
                                                                                          "schema": schema}})


@pytest.mark.parametrize("schema,valid,invalid", [
    # a pointer into z's resource reaches a reference z's `$id` reads: z's `a`, an integer, not the root's string
    ({"type": "object", "$defs": {"a": {"type": "string"}}, "properties": {
        "z": {"$id": "http://x.example/z", "$defs": {"a": {"type": "integer"}},
              "properties": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}},
        "w": {"$ref": "#/properties/z/properties/a/anyOf/0"}}, "required": ["w"]},
     [{"w": 1}, {"z": {"a": 2}, "w": 1}], [{"w": "s"}, {"z": {"a": "s"}, "w": 1}]),
    # the same through z's own URI; a relative `$id`; an anchor; draft 4's `id`; draft 7's `$id` with a `#`
    ({"type": "object", "$defs": {"a": {"type": "string"}}, "properties": {
        "z": {"$id": "z.json", "$defs": {"a": {"type": "integer", "$anchor": "A"}},
              "properties": {"a": {"$ref": "#/$defs/a"}, "b": {"$ref": "#A"}}},
        "w": {"$ref": "z.json#/properties/a"}, "v": {"$ref": "#/properties/z/properties/b"}}},
     [{"w": 1, "v": 2}, {"z": {"a": 1, "b": 2}}], [{"w": "s"}, {"v": "s"}, {"z": {"b": "s"}}]),
    ({"$schema": DRAFT4, "type": "object", "definitions": {"a": {"type": "string"}}, "properties": {
        "z": {"id": "http://x.example/z", "definitions": {"a": {"type": "integer"}},
              "properties": {"a": {"$ref": "#/definitions/a"}}},
        "w": {"$ref": "#/properties/z/properties/a"}}, "required": ["w"]},
     [{"w": 1}, {"z": {"a": 2}, "w": 1}], [{"w": "s"}, {"z": {"a": "s"}, "w": 1}]),
    ({"$schema": DRAFT7, "type": "object", "definitions": {"a": {"type": "string"}}, "properties": {
        "z": {"$id": "http://x.example/z.json#", "definitions": {"a": {"type": "integer"}},
              "properties": {"a": {"$ref": "#/definitions/a"}}},
        "w": {"$ref": "#/properties/z/properties/a"}}, "required": ["w"]},
     [{"w": 1}], [{"w": "s"}]),
    # a resource inside a resource: y's `$id` is read against z's; y names z's `a` through a relative URI
    ({"type": "object", "$defs": {"a": {"type": "string"}}, "properties": {
        "z": {"$id": "http://x.example/dir/z", "$defs": {"a": {"type": "integer"}}, "properties": {
            "y": {"$id": "y", "$defs": {"a": {"type": "boolean"}},
                  "properties": {"a": {"$ref": "#/$defs/a"}, "b": {"$ref": "z#/$defs/a"}}}}},
        "w": {"$ref": "#/properties/z/properties/y/properties/a"},
        "v": {"$ref": "#/properties/z/properties/y/properties/b"}}},
     [{"z": {"y": {"a": False, "b": 2}}, "w": True, "v": 1}], [{"w": 1}, {"v": True}, {"z": {"y": {"a": 1}}}]),
    # recursion to a nested resource's root, reached through a pointer into it
    ({"type": "object", "$defs": {"n": {"type": "string"}}, "properties": {
        "t": {"$id": "http://x.example/tree", "type": "object", "$defs": {"n": {"type": "integer"}},
              "properties": {"v": {"$ref": "#/$defs/n"},
                             "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#"}}},
              "required": ["v"], "additionalProperties": False},
        "u": {"$ref": "#/properties/t/properties/kids"}}, "additionalProperties": False},
     [{"t": {"v": 1, "kids": [{"v": 2}]}}, {"u": [{"v": 3, "kids": []}]}],
     [{"t": {"v": "s"}}, {"u": [{"v": "s"}]}, {"t": {"v": 1, "kids": [{"v": "x"}]}}]),
])
def test_references_inside_a_nested_resource_read_its_base_however_it_is_entered(gpt2_compiler, tokenizers, vocabs,
                                                                                  schema, valid, invalid):
    """llguidance read the `$ref`s of a subschema reached through a pointer into a nested `$id`'s resource against
    the root's base (`{"w": "s"}` was taken, `{"w": 1}` refused): they are handed to it resolved
    (`llg_backend._refs_resolved_in_resources`)."""
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "r", "schema": schema}}, backend="llguidance"))
    for document in valid:
        assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], document), document
    for document in invalid:
        assert not accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], document), document
    assert ended_walks_valid(grammar, vocabs["gpt2"], schema, seed=3, walks=15, max_tokens=80) > 0


@pytest.mark.parametrize("schema,valid,invalid", [
    ({"type": "array", "prefixItems": [{"type": "integer"}], "additionalItems": False}, [[1], [1, 2]],
     [[True], ["x"]]),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"}, "additionalItems": False},
     [[1, "a"]], [[True], [1, 2]]),
    ({"$schema": "https://json-schema.org/draft/2019-09/schema", "type": "array", "items": [{"type": "integer"}],
      "additionalItems": False}, [[1]], [[1, 2], ["x"]]),  # (beside a list it means what it says)
    ({"$schema": DRAFT7, "type": "array", "items": {"type": "integer"}, "additionalItems": False}, [[1, 2]], [["x"]]),
    # a reference into one it drops still names it
    ({"type": "object", "properties": {"a": {"type": "array", "additionalItems": {"type": "integer"}},
                                       "b": {"$ref": "#/properties/a/additionalItems"}}},
     [{"b": 1}, {"a": ["x"]}], [{"b": "x"}]),
])
def test_additional_items_that_mean_nothing_are_left_out(gpt2_compiler, tokenizers, vocabs, schema, valid, invalid):
    """llguidance read `additionalItems` beside `prefixItems` as the old drafts read it beside an `items` list, and
    dropped the `prefixItems`: `[true]` was taken under `prefixItems: [integer], additionalItems: false` in
    2020-12, where `additionalItems` is no keyword (QA fuzz2 F1, unsound; F2, `[1, "a"]` refused)."""
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "a", "schema": schema, "strict": True}}, backend="llguidance"))
    for document in valid:
        assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], document), document
    for document in invalid:
        assert not accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], document), document
    assert ended_walks_valid(grammar, vocabs["gpt2"], schema, seed=2, walks=10, max_tokens=40) > 0


def test_outlines_refuses_references_below_a_nested_id(gpt2_compiler):
    """outlines-core reads every `$ref` against the root: z's `#/$defs/a` was the root's string, and the auto
    policy serves repeats with outlines (`{"z": {"a": "s"}}` was taken)."""
    schema = {"type": "object", "$defs": {"a": {"type": "string"}}, "properties": {
        "z": {"$id": "http://x.example/z", "$defs": {"a": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/a"}},
              "required": ["a"], "additionalProperties": False}}, "required": ["z"], "additionalProperties": False}
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "r", "schema": schema}}, backend="outlines"))
    assert exc.value.pointer == "/properties/z/properties/a/$ref"


def test_outlines_refuses_values_whose_object_keys_its_regex_would_read_as_operators(gpt2_compiler, tokenizers,
                                                                                       vocabs):
    """outlines-core puts the keys of a `const`/`enum` object into its regex unescaped: `{"a.b": 1}` took `a神b`
    (unsound; the auto policy serves repeats with outlines), and `$ref` compiled to nothing. Keys of letters,
    digits, spaces, `_` and `-` are served."""
    def compiled(value, backend):
        schema = {"type": "object", "properties": {"v": {"enum": [value, 1]}}, "required": ["v"],
                  "additionalProperties": False}
        return gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "r", "schema": schema}}, backend=backend))
    for value in ({"a.b": 1}, [{"$ref": "#"}], {"x": {"k?": 1}}, {"q\"": 1}):
        with pytest.raises(ConstraintError) as exc:
            compiled(value, "outlines")
        assert exc.value.pointer == "/properties/v/enum"
        grammar = compiled(value, "auto")
        assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"v": value})
    grammar = compiled({"a b-c_1é": [1]}, "outlines")
    assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"v": {"a b-c_1é": [1]}})
    assert not accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"v": {"a bXc_1é": [1]}})


@pytest.mark.parametrize("schema", [
    # 2020-12: an `id` is an annotation; draft 4: a `$id` is (its keyword is `id`)
    {"type": "object", "$defs": {"a": {"type": "integer"}}, "properties": {"z": {
        "id": "zid", "$defs": {"a": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"],
        "additionalProperties": False}}, "required": ["z"], "additionalProperties": False},
    {"$schema": DRAFT4, "type": "object", "definitions": {"a": {"type": "integer"}}, "properties": {"z": {
        "$id": "http://x/z", "definitions": {"a": {"type": "string"}}, "properties": {"a": {"$ref": "#/definitions/a"}},
        "required": ["a"], "additionalProperties": False}}, "required": ["z"], "additionalProperties": False},
])
@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_an_id_keyword_of_another_draft_moves_no_base(schema, backend, gpt2_compiler, tokenizers, vocabs):
    """Such references read against the root, and outlines serves them (it refused them: review R3)."""
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "r", "schema": schema}}, backend=backend))
    assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"z": {"a": 1}})
    assert not accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"z": {"a": "s"}})


def test_a_schema_found_valid_is_not_checked_again_and_an_invalid_one_always_is(monkeypatch):
    from constrain import spec as spec_module

    checks: list[dict] = []
    real_check = spec_module._check_schema
    monkeypatch.setattr(spec_module, "_check_schema", lambda s, p, b: (checks.append(s), real_check(s, p, b)))
    good = {"type": "object", "properties": {"memo_probe": {"type": "integer", "minimum": 3}}}
    for _ in range(3):
        spec_module.validate_schema(dict(good), "response_format")
    assert len(checks) == 1
    bad = {"type": "object", "properties": {"memo_probe": {"type": "integer", "minimum": "three"}}}
    for _ in range(2):
        with pytest.raises(ConstraintError):
            spec_module.validate_schema(bad, "response_format")
    assert len(checks) == 3


@pytest.mark.parametrize("uri", ["https://json-schema.org/draft-07/schema#", "http://json-schema.org/schema#",
                                 "https://spec.openapis.org/oas/3.1/dialect/base",
                                 "http://json-schema.org/draft-04/schema",
                                 "http://json-schema.org/draft-07/hyper-schema#",
                                 "https://json-schema.org/draft/2020-12/hyper-schema",
                                 "https://json-schema.org/draft/next/schema", "",
                                 "http://json-schema.org/hyper-schema#"])
def test_the_usual_spellings_of_a_draft_compile(uri, gpt2_compiler, tokenizers, vocabs):
    """llguidance fetches a `$schema` it does not know as a document: the https form of draft-07, the old "latest"
    and OpenAPI 3.1's dialect were a 400 "cannot compile constraint: Resource ... is not present in a registry".
    Hyper-Schema's dialects (their drafts'), the draft in the making and an empty `$schema` were served before
    unknown dialects were refused, and are again (review of b6db193)."""
    schema = {"$schema": uri, "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "s", "schema": schema, "strict": True}}))
    assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], {"a": 1})


def test_an_unknown_dollar_schema_is_refused_naming_it():
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "s", "schema": {"$schema": "http://example.com/my-dialect", "type": "object"}}})
    assert exc.value.pointer == "/$schema" and "unknown $schema" in exc.value.message


@pytest.mark.parametrize("response_format", [
    {"type": "json_object", "schema": {"type": "object", "properties": {"a": 5}}},
    {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "properties": {"a": 5}}}},
])
def test_an_invalid_response_format_schema_is_named_by_a_pointer_into_the_schema(response_format):
    """As a keyword that cannot be enforced is (and the `x-structgen-unenforced` header): an invalid schema's
    pointer began `/json_schema/schema` (or `/schema`), so a client could not tell which base a pointer had."""
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format=response_format)
    assert exc.value.param == "response_format" and exc.value.pointer == "/properties/a", exc.value.pointer
    assert "invalid JSON Schema at /properties/a" in exc.value.message


@pytest.mark.parametrize("strict", [True, False])
def test_a_draft_03_schema_is_refused_naming_its_dollar_schema(strict):
    """Draft-03 passed jsonschema's check (its own metaschema) and was compiled with 2020-12's keywords: a
    property's `required: true`, `divisibleBy` and `disallow` were dropped, strict or not, and nothing said so."""
    schema = {"$schema": "http://json-schema.org/draft-03/schema#", "type": "object", "properties": {
        "a": {"type": "integer", "required": True}}}
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "s", "schema": schema, "strict": strict}})
    assert exc.value.pointer.endswith("/$schema") and "draft-03" in exc.value.message
    assert exc.value.code == "unsupported_schema"


@pytest.mark.parametrize("schema, pointer", [
    ({"$schema": DRAFT7, "type": "array", "prefixItems": 3}, "/prefixItems"),
    ({"$schema": DRAFT7, "type": "array", "prefixItems": [{"type": "integr"}]}, "/prefixItems/0/type"),
    ({"$schema": DRAFT7, "type": "array", "contains": {}, "minContains": "2"}, "/minContains"),
    ({"$schema": DRAFT7, "properties": {"a": {"unevaluatedProperties": 3}}}, "/properties/a/unevaluatedProperties"),
    ({"$schema": DRAFT4, "type": "array", "contains": 5}, "/contains"),
    # (a draft-4 subschema, checked as draft 4: its boolean `exclusiveMinimum` passes, an integer one does not)
    ({"$schema": DRAFT4, "contains": {"minimum": 0, "exclusiveMinimum": 1}}, "/contains/exclusiveMinimum"),
    ({"$schema": "https://json-schema.org/draft/2019-09/schema", "prefixItems": [5]}, "/prefixItems/0"),
])
def test_a_later_drafts_keyword_the_draft_lacks_is_checked_against_the_later_meta_schema(schema, pointer):
    """The product enforces a keyword its draft does not define as the later draft does (README, Drafts), where
    the draft's meta-schema never looks: draft 7's `prefixItems: 3` compiled to a grammar that refused every array,
    so that no answer could end. Its value is checked as the later draft's meta-schema checks it, a subschema in it
    as the node's own draft's does."""
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    assert exc.value.pointer == pointer and f"invalid JSON Schema at {pointer}" in exc.value.message
    fine = {"$schema": DRAFT4, "contains": {"minimum": 0, "exclusiveMinimum": True}, "prefixItems": [{}]}
    assert spec_from_request(response_format={"type": "json_object", "schema": fine}) is not None


@pytest.mark.parametrize("schema, pointer", [({"type": "number", "enum": [1, 2.5e30]}, "/enum"),
                                             ({"const": 1.5e300}, "/const")])
def test_a_const_or_enum_float_past_2_53_is_refused_strict_and_named_otherwise(gpt2_compiler, schema, pointer):
    """`enum: [2.5e+30]`: llguidance writes 2500000000000000000000000000000, which Python reads as an integer other
    than the double 2.5e30 (jsonschema refuses the answer), and 1.5e+300 as 301 digits; nothing said so."""
    def compiled(strict):
        return gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": schema, "strict": strict}}, backend="llguidance"))

    with pytest.raises(ConstraintError) as exc:
        compiled(True)
    assert exc.value.pointer == pointer and exc.value.code == "unsupported_schema"
    assert compiled(False).unenforced == (pointer,)
    fine = {"enum": [1e-7, 2.5, 1e15]}
    assert gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": fine, "strict": True}}, backend="llguidance")).unenforced == ()


def test_integers_llguidance_would_round_are_refused_strict_named_otherwise_or_served_exactly(gpt2_compiler,
                                                                                               tokenizers, vocabs):
    """llguidance reads a schema's numbers as 64-bit floats: `const: 9007199254740993` (2**53 + 1) enforced
    9007199254740992, silently. Such a keyword is now refused under strict (with its pointer) or named
    unenforced; outlines, exact there, serves an object it can compile; past 64 bits, always a 400."""
    def compiled(schema, strict, backend="auto"):
        return gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": schema, "strict": strict}}, backend=backend))

    big = {"const": 2 ** 53 + 1}
    with pytest.raises(ConstraintError) as exc:
        compiled(big, True)
    assert exc.value.pointer == "/const" and exc.value.code == "unsupported_schema" and "2**53" in exc.value.message
    assert compiled(big, False).unenforced == ("/const",)
    ranged = {"type": "integer", "minimum": 2 ** 53 + 2, "maximum": 2 ** 58}  # (no end to narrow: all past 2**53)
    assert set(compiled(ranged, False, "llguidance").unenforced) == {"/minimum", "/maximum"}
    assert compiled({"type": "integer", "minimum": 5, "maximum": 2 ** 53}, True).unenforced == ()
    with pytest.raises(ConstraintError) as exc:
        compiled({"type": "integer", "minimum": 10 ** 30}, False)
    assert exc.value.pointer == "/minimum"
    with pytest.raises(ConstraintError) as exc:  # (the message quoted 9223372036854775808: QA numbers F2)
        compiled({"type": "integer", "exclusiveMaximum": -(2 ** 63)}, True)
    assert "the integer -9223372036854775808 at /exclusiveMaximum" in exc.value.message, exc.value.message
    record = {"type": "object", "properties": {"id": {"const": 12345678901234567890}}, "required": ["id"],
              "additionalProperties": False}
    exact = compiled(record, True)
    assert exact.backend == "outlines"
    assert accepts_document(exact, tokenizers["gpt2"], vocabs["gpt2"], {"id": 12345678901234567890})
    assert not accepts_document(exact, tokenizers["gpt2"], vocabs["gpt2"], {"id": 12345678901234567168})


@pytest.mark.parametrize("schema", [
    {"type": "integer", "minimum": -(2 ** 63), "maximum": 2 ** 63 - 1},  # int64, as protobuf/Go schemas bound it
    {"type": "integer", "minimum": 0, "maximum": 2 ** 64 - 1},  # uint64
    {"type": "number", "exclusiveMinimum": -1e300, "maximum": 1.7e308},
    {"type": "integer", "maximum": 10 ** 19, "minimum": -5},
    {"type": "number", "maximum": 2 ** 64 - 1, "minimum": -1.971},  # (and -1.9 added back: both on one node)
])
def test_bounds_past_2_53_are_narrowed_for_llguidance_and_enforced(gpt2_compiler, tokenizers, vocabs, schema):
    """llguidance reads a schema's numbers as doubles and builds no range past ~1e18: an int64 or uint64 bound
    was a 400 (strict, or past 64 bits), `maximum: 1e300` a 400 without a pointer. A bound past 2**53 on the side
    that only excludes numbers beyond it is narrowed to ±2**53: enforced, every answer within the client's
    range; the numbers past 2**53 are never written."""
    document = {"type": "object", "properties": {"v": schema}, "required": ["v"], "additionalProperties": False}
    for strict in (True, False):
        grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": document, "strict": strict}}, backend="llguidance"))
        assert grammar.unenforced == ()
        for value, taken in ((0, True), (2 ** 53, True), (-(2 ** 53), schema.get("minimum", 0) <= -(2 ** 53)),
                             (2 ** 53 + 1, False), (-(2 ** 53) - 1, False)):
            assert accepts_value(grammar, tokenizers["gpt2"], vocabs["gpt2"], value) == taken, value
        assert ended_walks_valid(grammar, vocabs["gpt2"], document, seed=3, walks=10) >= 5


@pytest.mark.parametrize("schema, prefixes", [
    ({"type": "number", "minimum": 0, "maximum": 0.99}, [0.9]),
    ({"type": "number", "maximum": 2.635}, [2.6, 2.63]),
    ({"type": "number", "exclusiveMaximum": 2.84, "exclusiveMinimum": 0.17}, [2.8]),
    ({"type": ["number", "null"], "minimum": -1.971}, [-1.9, -1.97]),
    ({"minimum": -2.218, "exclusiveMaximum": -0.5}, [-2.2, -2.21]),
    ({"type": "number", "minimum": 2.95, "maximum": 3.05}, []),  # (3.0 is 3, which llguidance takes)
    ({"type": "number", "maximum": 0.15, "multipleOf": 0.1}, [0.1]),  # (only numbers up to 0 could be written)
    ({"type": "number", "minimum": -1.891, "multipleOf": 0.01}, [-1.8, -1.89]),
    ({"type": "number", "maximum": 2.635, "multipleOf": 0.5}, []),  # (2.6 and 2.63 are no multiples)
])
def test_numbers_that_begin_a_bounds_digits_are_taken(gpt2_compiler, tokenizers, vocabs, schema, prefixes):
    """llguidance 1.9 refuses a decimal the bound on the magnitude side begins with: 0.9 under `maximum: 0.99`,
    2.6 and 2.63 under `maximum: 2.635`, -1.9 under `minimum: -1.971` (a model writing 0.9 was pushed to 0.90
    or another number). Those numbers are added back as an `enum` beside the range; nothing out of range is."""
    from constrain.walkbench import validator_for  # (multipleOf decided in decimal: -2.3 is a multiple of 0.1)

    document = {"type": "object", "properties": {"v": schema}, "required": ["v"], "additionalProperties": False}
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": document, "strict": True}}, backend="llguidance"))
    check = validator_for(schema)
    probes = prefixes + [-3, -2.3, -2.22, -2.21, -2, -1.98, -1.97, -0.6, -0.5, 0, 0.17, 0.18, 0.5, 0.99, 1, 1.5,
                         2.6, 2.63, 2.64, 2.8, 2.84, 3, 3.05, 3.1]
    for value in probes:
        assert accepts_value(grammar, tokenizers["gpt2"], vocabs["gpt2"], value) == check.is_valid(value), value
    assert ended_walks_valid(grammar, vocabs["gpt2"], document, seed=5, walks=10) >= 5


def test_members_left_with_the_nodes_bounds_alone_ask_nothing_of_llguidance(gpt2_compiler, tokenizers, vocabs):
    """JSONSchemaBench's Handwritten/num4: the `allOf` members' `multipleOf`s join into one (lcm 8721), and the
    members left held only the bounds `bounds_on_members` copied into them; each took an enum of the numbers its
    bounds begin with, and llguidance found the grammar too large (a 400 for a schema that compiled before)."""
    schema = {"allOf": [{"multipleOf": 0.75}, {"multipleOf": 3}, {"multipleOf": 1.5}, {"multipleOf": 0.25}],
              "not": {"anyOf": [{"multipleOf": 2}, {"multipleOf": 5}, {"multipleOf": 7}]},
              "exclusiveMinimum": 10, "exclusiveMaximum": 100,
              "$ref": "#/$defs/n", "$defs": {"n": {"not": {"const": 57}}}}
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": schema, "strict": True}}))
    for value, valid in ((33, True), (99, True), (57, False), (12, False), (15, False), (21, False), (34, False),
                         (9, False)):
        assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], value) == valid, value


@pytest.mark.parametrize("schema, probes", [
    ({"anyOf": [{"const": 0.3}, {"const": 0.35}], "multipleOf": 0.1}, [0.3, 0.35]),  # (a 400: no member left)
    ({"oneOf": [{"const": 0.3}, {"const": 0.35}], "multipleOf": 0.1}, [0.3, 0.35]),
    ({"anyOf": [{"enum": [0.3, 0.7, 0.35, "a"]}, {"type": "number", "minimum": 1, "maximum": 2}], "multipleOf": 0.1},
     [0.3, 0.7, 0.35, "a", 1.1, 1.15, 2.5]),
    ({"anyOf": [{"const": -0.07}, {"const": -0.035}, {"const": 0.03}], "multipleOf": 0.01, "maximum": 0},
     [-0.07, -0.035, 0.03]),
    ({"allOf": [{"multipleOf": 0.1}, {"anyOf": [{"const": 0.3}, {"const": 0.35}]}]}, [0.3, 0.35]),
    ({"anyOf": [{"const": 0.3}, {"const": 0.35}], "allOf": [{"multipleOf": 0.1}, {"minimum": 0}]}, [0.3, 0.35]),
    ({"oneOf": [{"enum": [0.3, 1.1, 1.15]}, {"type": "number", "minimum": 1, "maximum": 3}], "multipleOf": 0.1},
     [0.3, 1.1, 1.15, 1.2]),  # (rewritten to an allOf of the enum and the ranges between its values)
    ({"anyOf": [{"maximum": 0.35}, {"const": 2}], "multipleOf": 0.1}, [0.3, 0.35, 2]),  # (0.3 begins 0.35)
    ({"$defs": {"m": {"anyOf": [{"const": 0.7}, {"type": "string"}], "multipleOf": 0.1}}, "$ref": "#/$defs/m"},
     [0.7, "a"]),
])
def test_a_multiple_meeting_a_const_or_enum_through_members_is_decided_in_decimal(gpt2_compiler, tokenizers, vocabs,
                                                                                schema, probes):
    """llguidance reads a `const`/`enum` number as a range from it to itself and asks, in binary floats, whether
    a multiple lies in it: `anyOf: [{const: 0.3}, {const: 0.35}], multipleOf: 0.1` was a 400 ("range [0.4,
    0.30000000000000004] does not contain a multiple of 0.1") though 0.3 is a multiple, and where another member
    was left, 0.3 was silently refused. Every number such a schema names is taken where it is a multiple in
    decimal and refused where it is not, strict or not, under llguidance and auto, as the value or a property."""
    from constrain.walkbench import validator_for

    value_schema = {k: v for k, v in schema.items() if k != "$defs"}
    document = {"type": "object", "properties": {"v": value_schema}, "required": ["v"], "additionalProperties": False,
                **{k: v for k, v in schema.items() if k == "$defs"}}
    check = validator_for(schema)
    for backend in ("llguidance", "auto"):
        for strict in (True, False):
            for root in (schema, document):
                grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema",
                    "json_schema": {"name": "x", "schema": root, "strict": strict}}, backend=backend))
                assert grammar.unenforced == ()
                for value in probes:
                    taken = accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"],
                                             value if root is schema else {"v": value})
                    assert taken == check.is_valid(value), (backend, strict, value)
    assert ended_walks_valid(grammar, vocabs["gpt2"], document, seed=7, walks=10) >= 5


@pytest.mark.parametrize("schema, probes", [
    ({"type": "number", "minimum": 0.25, "maximum": 0.3, "multipleOf": 0.1}, [0.3, 0.2, 0.25]),  # (a 400)
    ({"type": ["number", "null"], "minimum": 0.69, "maximum": 0.7, "multipleOf": 0.1}, [0.7, 0.6, None]),
    ({"type": "number", "exclusiveMinimum": 0.2, "maximum": 0.3, "multipleOf": 0.1}, [0.3, 0.2]),
    ({"type": "number", "minimum": -0.3, "maximum": -0.25, "multipleOf": 0.1}, [-0.3, -0.2]),
    ({"type": "number", "minimum": 0.07, "maximum": 0.07, "multipleOf": 0.01}, [0.07, 0.06]),
    ({"anyOf": [{"type": "number", "minimum": 0.3, "maximum": 0.3}, {"type": "string"}], "multipleOf": 0.1},
     [0.3, "a"]),  # (0.3 was refused: the member left out)
])
def test_a_range_whose_only_multiples_are_its_ends_takes_them(gpt2_compiler, tokenizers, vocabs, schema, probes):
    """llguidance asks in binary floats whether a range holds a multiple: `minimum: 0.25, maximum: 0.3,
    multipleOf: 0.1` was a 400 ("range [0.30000000000000004, 0.2] does not contain a multiple of 0.1") though
    0.3 is valid. Those multiples are taken, and nothing else, strict or not, under llguidance and auto."""
    from constrain.walkbench import validator_for

    document = {"type": "object", "properties": {"v": schema}, "required": ["v"], "additionalProperties": False}
    check = validator_for(schema)
    for backend in ("llguidance", "auto"):
        for strict in (True, False):
            grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema",
                "json_schema": {"name": "x", "schema": document, "strict": strict}}, backend=backend))
            assert grammar.unenforced == ()
            for value in probes:
                assert accepts_value(grammar, tokenizers["gpt2"], vocabs["gpt2"], value) == check.is_valid(value), \
                    (backend, strict, value)
    assert ended_walks_valid(grammar, vocabs["gpt2"], document, seed=9, walks=10) >= 5


@pytest.mark.parametrize("schema, probes", [
    ({"type": "integer", "multipleOf": 123457, "minimum": 10000, "maximum": 1000000},
     [123457, 987656, 0, 1111113, 123456, 246913]),
    ({"type": "integer", "multipleOf": 8721, "exclusiveMinimum": -100000, "exclusiveMaximum": -10000},
     [-95931, -17442, -26163, -8721, -104652, -26164]),
    ({"type": "integer", "multipleOf": 3, "minimum": 0.5, "exclusiveMaximum": 9.0}, [3, 6, 0, 9, 4]),
    # (a divisor llguidance cannot read at all, 12,345,678 remainders: left out, a 400 under strict; QA review F4)
    ({"type": "integer", "multipleOf": 12345678, "minimum": 0, "maximum": 10 ** 9},
     [0, 12345678, 987654240, 12345679, 1000000000, -12345678]),
])
def test_a_range_of_few_multiples_of_a_large_divisor_takes_them(gpt2_compiler, tokenizers, vocabs, schema, probes):
    """llguidance's lexer crosses a divisor's remainders with the range's digits: `multipleOf: 123457` between
    10000 and 1000000 ran out of its work per token on the first mask, at every level we give it (the request
    compiled, then every answer failed as constraint_too_complex). Few multiples are their enum: each is taken,
    nothing else is, and answers end valid."""
    from constrain.llg_backend import llguidance_schema
    from constrain.walkbench import validator_for

    assert "enum" in llguidance_schema(schema)
    document = {"type": "object", "properties": {"v": schema}, "required": ["v"], "additionalProperties": False}
    check = validator_for(schema)
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema",
        "json_schema": {"name": "x", "schema": document, "strict": True}}, backend="llguidance"))
    for value in probes:
        assert accepts_value(grammar, tokenizers["gpt2"], vocabs["gpt2"], value) == check.is_valid(value), value
    assert ended_walks_valid(grammar, vocabs["gpt2"], document, seed=5, walks=10) == 10


@pytest.mark.parametrize("schema", [
    {"type": "integer", "multipleOf": 2 ** 53 - 11, "minimum": 2 ** 53 - 10, "maximum": 1e17},
    {"type": "integer", "maximum": 1e20, "minimum": 1, "multipleOf": 10 ** 18 + 7},
])
def test_an_unreadable_divisor_whose_range_is_narrowed_is_left_out(gpt2_compiler, schema):
    """Its few multiples were to be their enum, so the divisor was kept; but the bound past 2**53 is narrowed to it
    first, which leaves the range no multiple (or none listed), the enum was not written, and llguidance refused the
    divisor: a 400 without a pointer, strict or not. It is left out, as any divisor llguidance cannot read."""
    document = {"type": "object", "properties": {"v": schema}, "required": ["v"], "additionalProperties": False}

    def compiled(strict: bool):
        return gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": document, "strict": strict}}, backend="llguidance"))

    assert compiled(False).unenforced == ("/properties/v/multipleOf",)
    with pytest.raises(ConstraintError) as refused:
        compiled(True)
    assert refused.value.pointer == "/properties/v/multipleOf"


@pytest.mark.parametrize("schema, refused, taken", [
    ({"type": "number", "exclusiveMaximum": 1}, ["0.99999999999999999", "1"], ["0.999999999999999", "0.5", "0"]),
    ({"exclusiveMinimum": 2.5, "maximum": 3}, ["2.50000000000000001", "2.5"], ["2.50000000000001", "3"]),
    ({"type": "number", "not": {"const": 1}}, ["1.0000000000000001", "0.99999999999999999"], ["1.5", "0.9"]),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "maximum": -0.1,
      "exclusiveMaximum": True}, ["-0.10000000000000000001"], ["-0.100000000000001", "-5"]),
    ({"$ref": "#/x/y"}, ["0.99999999999999999"], ["0.5"]),  # (`x` below: a place no keyword names; review R2)
])
def test_a_number_that_parsers_read_as_an_exclusive_end_is_not_written(gpt2_compiler, tokenizers, vocabs, schema,
                                                                       refused, taken):
    """llguidance compares the decimal an answer spells; parsers read the nearest double, and
    `0.99999999999999999` (below 1) reads as 1.0, which `exclusiveMaximum: 1` refuses: such answers were valid as
    written and invalid as read (QA semantics F1). An exclusive end is now held at its nearest 15-digit neighbour."""
    import json

    import jsonschema
    import torch

    from tests.constrain.conftest import walk_instance

    document = {"type": "object", "properties": {"v": schema}, "required": ["v"], "additionalProperties": False}
    if "$schema" in schema:
        document = {"$schema": schema["$schema"], **document, "properties": {"v": {
            k: v for k, v in schema.items() if k != "$schema"}}}
    if "$ref" in schema:
        document["x"] = {"y": {"type": "number", "exclusiveMaximum": 1}}
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": document, "strict": True}}, backend="llguidance"))
    validator = jsonschema.validators.validator_for(document)(document)

    def takes(number: str) -> bool:
        tokens = tokenizers["gpt2"].encode('{"v": ' + number + "}", add_special_tokens=False)
        bitmask = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
        return walk_instance(grammar, tokens, min(vocabs["gpt2"].eos_token_ids), bitmask, [])

    for number in refused:
        assert not validator.is_valid(json.loads('{"v": ' + number + "}")), number  # (as parsers read it)
        assert not takes(number), number
    for number in taken:
        assert validator.is_valid(json.loads('{"v": ' + number + "}")) and takes(number), number


@pytest.mark.parametrize("schema", [
    {"allOf": [{"not": {"const": 1}}, {"not": {"const": 0}}]},
    {"oneOf": [{"not": {"const": 1}}, {"const": 0}]},
    {"allOf": [{"anyOf": [{"type": "number", "exclusiveMaximum": 1}, {"type": "number", "exclusiveMinimum": 1}]},
               {"anyOf": [{"type": "number", "exclusiveMaximum": 0}, {"type": "number", "exclusiveMinimum": 0}]}]},
    {"allOf": [{"not": {"const": 1e15}}, {"not": {"const": 1e15 + 0.5}}]},
    {"allOf": [{"not": {"const": -1e15}}, {"not": {"const": -1e15 - 0.5}}]},
    {"allOf": [{"not": {"const": 2 ** 52}}, {"not": {"const": 2 ** 52 + 0.5}}]},
])
def test_an_interval_llguidance_forms_across_two_any_ofs_does_not_take_its_excluded_end(gpt2_compiler, tokenizers,
                                                                                        vocabs, schema):
    """llguidance misreads an interval whose excluded end is an integer with the other end less than 1 away, and
    forms one itself where the members of two `anyOf`s meet: `x < 1` and `x > 0` took `0` (QA review14 F1), as
    did `1e15 + 0.5` beside `1e15` (review15 F1). An excluded end of 0 is compiled as 1e-15 (or -1e-15), as other
    ends are held at their 15-digit neighbours, and from 1e15 up at the nearest integer inside."""
    from constrain.walkbench import validator_for

    document = {"type": "object", "properties": {"v": schema}, "required": ["v"], "additionalProperties": False}
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": document, "strict": True}}, backend="llguidance"))
    check = validator_for(schema)
    for value in [0, -0.0, 0.0, 1, 0.5, 2, -1, 1e-15, 1e15, 1e15 + 0.5, -1e15, -1e15 - 0.5, 2 ** 52, 2 ** 52 + 0.5]:
        taken = accepts_value(grammar, tokenizers["gpt2"], vocabs["gpt2"], value)
        assert not taken or check.is_valid(value), value
    assert accepts_value(grammar, tokenizers["gpt2"], vocabs["gpt2"], 0.5)
    assert ended_walks_valid(grammar, vocabs["gpt2"], document, seed=3, walks=20) >= 10


def test_an_excluded_end_from_1e15_up_is_compiled_as_the_nearest_integer_inside():
    """15-digit decimals are 10 apart there and every integer below 2**53 is a double; an end whose bound would
    reach the node's other end is left alone (llguidance reads `(1e15, 1e15 + 1)` right), as is one past 2**53."""
    from constrain.llg_backend import moved_end

    assert moved_end({"exclusiveMinimum": 1e15}, "exclusiveMinimum") == 1e15 + 1
    assert moved_end({"exclusiveMaximum": 1e15 + 0.5}, "exclusiveMaximum") == 1e15
    assert moved_end({"exclusiveMaximum": -1e15}, "exclusiveMaximum") == -1e15 - 1
    assert moved_end({"exclusiveMaximum": 2 ** 53 - 1}, "exclusiveMaximum") == 2 ** 53 - 2
    assert moved_end({"exclusiveMaximum": 999999999999999.5}, "exclusiveMaximum") == 999999999999999
    assert moved_end({"exclusiveMinimum": 2 ** 53}, "exclusiveMinimum") is None
    for node in ({"exclusiveMinimum": 1e15, "exclusiveMaximum": 1e15 + 1}, {"exclusiveMinimum": 1e15,
                                                                           "maximum": 1e15 + 0.5}):
        assert moved_end(node, "exclusiveMinimum") is None
    assert moved_end({"minimum": 0, "maximum": 1e-16, "exclusiveMinimum": True}, "exclusiveMinimum") is None


@pytest.mark.parametrize("schema, pointer", [
    ({"type": "number", "minimum": 1e308}, "/properties/v/minimum"),
    ({"type": "number", "exclusiveMaximum": -1e19}, "/properties/v/exclusiveMaximum"),
    ({"type": "integer", "minimum": 10 ** 18}, "/properties/v/minimum"),
])
def test_a_bound_past_1e18_that_leaves_only_larger_numbers_is_a_400_naming_it(gpt2_compiler, schema, pointer):
    """(It was a 400 with llguidance's "Failed to generate regex for float range" and no pointer; an integer's
    blamed floats' 2**53, which is the reason under `strict` only: QA readme F2.)"""
    document = {"type": "object", "properties": {"v": schema}, "required": ["v"]}
    for strict in (True, False):
        with pytest.raises(ConstraintError) as exc:
            gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": document, "strict": strict}}, backend="llguidance"))
        assert exc.value.pointer == pointer and exc.value.code == "unsupported_schema"
        assert "past ±1e18" in exc.value.message and "2**53" not in exc.value.message


@pytest.mark.parametrize("pattern, gap", [
    ("^[\\x00-\\x1f]{3}$", True), ("[\\x00-\\x1fa]", True), ("[\\u0000-\\u001F\"]", True), ("[\\x00-\\x20]", True),
    ("[\\x00-\\x08\\x0e-\\x1f\\s]", True), ("[\\x00-\\x09\\x0b-\\x21\\x23-\\x7f]", True),  # (every control but \\n)
    ("[\\x00-\\x09\\x0b\\x0c\\x0e-\\x21\\x23-\\x7f]", False), ("[\\x00-\\x08\\x0a-\\x1f]", False),
    ("[\\x00-\\x1e]", False), ("[^\"]", False), ("[\\s\\S]", False), ("[\\x00-\\x7f]", False),
    ("[\\x00-\\x1f\"\\\\]", False), ("\\[\\x00-\\x1f]", False), ("[\\x00-\\x1f\\W]", False),
])
def test_the_classes_llguidance_would_let_escapes_through_are_told_apart(pattern, gap):
    from constrain.support import llguidance_escape_gap

    assert llguidance_escape_gap(pattern) == gap


def test_a_key_a_pattern_takes_beside_a_declared_one_holding_a_quote_gets_the_declared_schema(gpt2_compiler,
                                                                                              tokenizers, vocabs):
    """The pattern's names less `x"q` were written as a class of every character but '"' and `\\n`, which
    llguidance let `\\"` through as if it were a control character: the declared key `x"q` took the pattern's
    schema, not its own (`{"x\\"q": 1}` was accepted beside `minimum: 3`; QA review2 of session 43)."""
    schema = {"type": "object", "properties": {"x\"q": {"minimum": 3}}, "patternProperties": {"^x.": {"maximum": 10}}}
    g = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": schema, "strict": False}}))
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    assert not accepts_document(g, tok, vocab, {"x\"q": 1}) and not accepts_document(g, tok, vocab, {"x\"q": 11})
    assert accepts_document(g, tok, vocab, {"x\"q": 5}) and accepts_document(g, tok, vocab, {"xa": 1})


def test_a_pattern_llguidance_would_let_escapes_through_is_refused_strict_and_named_otherwise(gpt2_compiler):
    """llguidance 1.x takes `\\"` and `\\\\` for control characters in a class holding all of them but not both
    '"' and '\\' (`^[\\x00-\\x1f]{3}$` answered `"\\"\\\\"` 9 times in 10): never silently."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[\\x00-\\x1f]{3}$"}},
              "required": ["s"], "additionalProperties": False}

    def compiled(strict):
        return gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": schema, "strict": strict}}))

    with pytest.raises(ConstraintError) as exc:
        compiled(True)
    assert exc.value.pointer == "/properties/s/pattern" and exc.value.code == "unsupported_schema"
    assert compiled(False).unenforced == ("/properties/s/pattern",)


@pytest.mark.parametrize("schema", [
    {"const": "e\u0301"},  # e and a combining accent
    {"type": "string", "enum": ["\u2126", "k\u2126"]},  # the Ohm sign, as unit lists spell it
    {"type": "object", "properties": {"cafe\u0301": {"type": "integer"}}, "required": ["cafe\u0301"],
     "additionalProperties": False},
])
def test_text_a_grammar_forces_is_written_as_it_is_not_as_its_normal_form(tokenizers, vocabs, schema):
    """transformers loads Qwen2's tokenizer with an NFC normaliser, and llguidance tokenized the bytes a grammar
    forces with it: "e\\u0301" became the token "é", the mask allowed it alone, and the grammar refused it (the
    answer failed mid-output with finish_reason "error")."""
    from constrain import GrammarCompiler

    compiler = GrammarCompiler(vocabs["qwen2"], tokenizers["qwen2"], backend="llguidance", background_outlines=False)
    try:
        grammar = compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": schema, "strict": True}}))
        assert ended_walks_valid(grammar, vocabs["qwen2"], schema, seed=1, walks=8, max_tokens=24) == 8
    finally:
        compiler.close()


@pytest.mark.parametrize("request_fields, expected", [
    ({"choice": ["\u2581"]}, {"\u2581"}),
    ({"regex": "[ab]\u2581x"}, {"a\u2581x", "b\u2581x"}),
    ({"regex": "\\u2581y"}, {"\u2581y"}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
        "type": "object", "properties": {"\u2581k": {"const": "\u2581v"}}, "required": ["\u2581k"],
        "additionalProperties": False}}}}, {'{"\u2581k":"\u2581v"}'}),
])
def test_a_forced_space_marker_is_written_as_the_character_on_sentencepiece(tokenizers, vocabs, request_fields,
                                                                          expected):
    """SentencePiece reads the text "\u2581x" as it reads " x" (it writes spaces as U+2581), and llguidance forced
    the bytes of a '\u2581' the grammar required as the tokenizer's piece for them, which spells a space: the mask
    allowed that token alone and the grammar refused it (a 500 mid-output). Grammars that may force the character
    are built without forcing; the output is the character's own bytes."""
    from constrain import GrammarCompiler

    compiler = GrammarCompiler(vocabs["phi3"], tokenizers["phi3"], backend="llguidance", background_outlines=False)
    try:
        grammar = compiler.compile(spec_from_request(**request_fields))
        outputs = set()
        for seed in range(6):  # (random_walk fails where the matcher refuses a token its mask allowed)
            tokens, ended = random_walk(grammar, vocabs["phi3"], random.Random(seed), 30)
            assert ended
            outputs.add(decode(vocabs["phi3"], tokens).replace(" ", ""))
        assert outputs <= expected and outputs
    finally:
        compiler.close()


@pytest.mark.parametrize("request_fields, expected", [
    ({"choice": ["\u2581"]}, {"\u2581"}),
    ({"regex": "[ab]\u2581x"}, {"a\u2581x", "b\u2581x"}),
])
def test_a_token_forced_that_the_grammar_refuses_turns_forcing_off_for_that_grammar(tokenizers, vocabs, monkeypatch,
                                                                                    request_fields, expected):
    """Whatever normaliser makes a forced token spell other bytes (here '▁' on SentencePiece, with the check that
    sees it coming switched off), the matcher notices the one-token mask its grammar refuses and goes on without
    forcing, instead of failing mid-output."""
    import constrain.llg_backend as llg_backend
    from constrain import GrammarCompiler

    monkeypatch.setattr(llg_backend, "forcing_safe", lambda text: text)
    compiler = GrammarCompiler(vocabs["phi3"], tokenizers["phi3"], backend="llguidance", background_outlines=False)
    try:
        grammar = compiler.compile(spec_from_request(**request_fields))
        assert grammar.forcing
        outputs = set()
        for seed in range(4):
            tokens, ended = random_walk(grammar, vocabs["phi3"], random.Random(seed), 30)
            assert ended
            outputs.add(decode(vocabs["phi3"], tokens).replace(" ", ""))
        assert outputs and outputs <= expected
        assert not grammar.forcing
    finally:
        compiler.close()


def test_every_matcher_of_a_grammar_that_stopped_forcing_recovers(tokenizers, vocabs, monkeypatch):
    """Matchers copied before the grammar stopped forcing (n > 1, or requests sharing a cached grammar) check their
    own copy: the second row's one-token mask held the refused token, and its choice failed."""
    import torch

    import constrain.llg_backend as llg_backend
    from constrain import GrammarCompiler
    from constrain.walkbench import allowed_ids

    monkeypatch.setattr(llg_backend, "forcing_safe", lambda text: text)
    vocab = vocabs["phi3"]
    compiler = GrammarCompiler(vocab, tokenizers["phi3"], backend="llguidance", background_outlines=False)
    try:
        grammar = compiler.compile(spec_from_request(choice=["\u2581"]))
        bitmask = torch.zeros((2, vocab.words), dtype=torch.int32)
        matchers = [grammar.matcher(), grammar.matcher()]  # (two rows, started together)
        for row, m in enumerate(matchers):
            m.fill_bitmask(bitmask, row)
            allowed = allowed_ids(bitmask[row:row + 1]).tolist()
            assert allowed and m.accept(allowed[0]), row
    finally:
        compiler.close()


def test_a_hostname_is_held_to_253_characters(gpt2_compiler, tokenizers, vocabs):
    """llguidance's `hostname` limits each label to 63 characters but not the name: 300 characters passed."""
    for schema in ({"type": "string", "format": "hostname"}, {"type": "string", "format": "hostname", "maxLength": 9}):
        grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {"v": schema}, "required": ["v"],
                                    "additionalProperties": False}, "strict": True}}, backend="llguidance"))
        most = schema.get("maxLength", 253)
        for length in (5, 9, 10, 253, 254, 300):
            name = ".".join(["h" * 50] * 10)[:length]  # (labels of 50 characters: each one valid)
            name = name[:-1] + "h" if name.endswith(".") else name
            assert accepts_value(grammar, tokenizers["gpt2"], vocabs["gpt2"], name) == (length <= most), length


@pytest.mark.parametrize("multiple", [0.07, 10**20, 123456789, 12345678.0, 1234567.1, 12345.67, 7e-09, 3e-12])
def test_a_multiple_of_llguidance_cannot_read_is_refused_strict_and_named_otherwise(gpt2_compiler, multiple):
    """`multipleOf: 0.07` (also 0.14, 0.007, ...) was a 400 with llguidance's "too many digits" and no pointer,
    strict or not; an integer past 64 bits a 400 "ValueError: Value is not JSON serializable" (QA hostile F8);
    12345678 held a compile thread and a core for 149 s, 123456789 for more than 9 minutes (QA parity F1), and
    1234567.1 (12345671 remainders) the first mask for 115 s (QA review F3); 7e-09 and 3e-12 passed llguidance's
    check and every walk wrote a number that is not a multiple (QA review2 P1)."""
    schema = {"type": "object", "properties": {"p": {"type": "number", "multipleOf": multiple, "minimum": 0}},
              "required": ["p"]}

    def compiled(strict):
        return gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": schema, "strict": strict}}, backend="llguidance"))

    with pytest.raises(ConstraintError) as exc:
        compiled(True)
    assert exc.value.pointer == "/properties/p/multipleOf" and exc.value.code == "unsupported_schema"
    assert compiled(False).unenforced == ("/properties/p/multipleOf",)
    readable = {"type": "number", "multipleOf": 0.25}
    assert gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "y", "schema": readable, "strict": True}})).unenforced == ()


@pytest.mark.parametrize("keyword, kind", [("minLength", "string"), ("maxLength", "string"), ("minItems", "array"),
                                           ("maxItems", "array"), ("maxProperties", "object")])
def test_counts_past_what_any_output_holds_are_served_as_such(gpt2_compiler, tokenizers, keyword, kind):
    """A count past 64 bits: outlines-core read `minLength: 2**64 + 1` as no bound (strict answers of 2 characters),
    llguidance failed with "ValueError: Value is not JSON serializable" (review of 7678bcb and eb5673d). Past
    2**32 - 1 a count is that count: no output reaches either."""
    schema = {"type": "object", "properties": {"a": {"type": kind, keyword: 2**64 + 1}}, "required": ["a"],
              "additionalProperties": False}
    response_format = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": True}}
    grammar = gpt2_compiler.compile(spec_from_request(response_format=response_format, backend="llguidance"))
    empty = {"string": '""', "array": "[]", "object": "{}"}[kind]
    assert takes_text(grammar, tokenizers["gpt2"], f'{{"a": {empty}}}', "gpt2") == keyword.startswith("max")
    assert gpt2_compiler.compile(spec_from_request(response_format=response_format)).backend == "llguidance"
    if kind == "string":  # (outlines cannot hold such a length: a 400, never no bound)
        with pytest.raises(ConstraintError) as exc:
            gpt2_compiler.compile(spec_from_request(response_format=response_format, backend="outlines"))
        assert exc.value.code == "schema_too_large"


@pytest.mark.parametrize("backend", ["outlines", "llguidance", "auto"])
def test_counts_written_with_a_fraction_are_the_integers_they_are(gpt2_compiler, tokenizers, backend):
    """`maxLength: 2.0` is the integer 2 to JSON Schema: outlines ignored it (auto served strict answers of any
    length from it), llguidance refused the schema (review of 7e00bd7 F1)."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 2.0},
                                               "b": {"type": "array", "items": {"type": "integer"}, "minItems": 1e0}},
              "required": ["a", "b"], "additionalProperties": False}
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "f", "schema": schema, "strict": True}}, backend=backend))
    for text, accepted in (('{"a": "ab", "b": [1]}', True), ('{"a": "abc", "b": [1]}', False),
                           ('{"a": "ab", "b": []}', False)):
        assert takes_text(grammar, tokenizers["gpt2"], text, "gpt2") == accepted, (backend, text)


def test_a_least_count_past_its_most_stays_past_it_where_both_are_lowered(gpt2_compiler):
    """`minLength: 2**64 + 5, maxLength: 2**64` both became 2**32 - 1, and the schema no document meets was
    served (review of 7e00bd7 F4)."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 2**64 + 5, "maxLength": 2**64}},
              "required": ["a"], "additionalProperties": False}
    for backend in ("auto", "llguidance", "outlines"):
        with pytest.raises(ConstraintError):  # (each backend's own words)
            gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
                "name": "u", "schema": schema, "strict": True}}, backend=backend))


@pytest.mark.parametrize("annotation", [{"default": 2**70}, {"examples": [2**70]}, {"x-max": 2**70}])
def test_integers_past_64_bits_in_keywords_that_assert_nothing_compile(gpt2_compiler, tokenizers, annotation):
    """llguidance was handed the schema as Python objects and took no integer past 64 bits anywhere: a 400 "Value
    is not JSON serializable", without a pointer, strict or not (review of 7e00bd7 F8)."""
    schema = {"type": "object", "properties": {"a": {"type": "integer", **annotation}}, "required": ["a"],
              "additionalProperties": False}
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "n", "schema": schema, "strict": True}}, backend="llguidance"))
    assert takes_text(grammar, tokenizers["gpt2"], '{"a": 12}', "gpt2")
    assert not takes_text(grammar, tokenizers["gpt2"], '{"a": "12"}', "gpt2")




def _compiled(compiler, schema, strict=True):
    return compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "s", "schema": schema, "strict": strict}}))


@pytest.mark.parametrize("schema, refused, accepted", [
    # WashingtonPost's shape: `type: object` beside a root $ref to a definition that names no type. Draft 4
    # ignores the type (`null` is valid there); ajv applies it, and so does every answer now.
    ({"$schema": DRAFT4, "$ref": "#/definitions/d", "type": "object",
      "definitions": {"d": {"properties": {"a": {"type": "string"}}}}}, [None, 3, "x"], [{"a": "x"}, {}]),
    # A late keyword beside a $ref (checked on the finished value, by a validator of the schema's own draft).
    ({"$schema": DRAFT7, "type": "object", "properties": {"s": {"$ref": "#/definitions/s", "not": {"const": "x"}}},
      "required": ["s"], "definitions": {"s": {"type": "string"}}}, [{"s": "x"}], [{"s": "y"}]),
    # `$id` beside a $ref would move its base: it is dropped, and the siblings still apply.
    ({"$schema": DRAFT7, "type": "object", "properties": {"s": {"$ref": "#/definitions/a", "$id": "http://e.com/x",
                                                                "maxItems": 1}},
      "required": ["s"], "definitions": {"a": {"type": "array", "items": {"type": "integer"}}}},
     [{"s": [1, 2]}, {"s": "x"}], [{"s": [1]}]),
    # The root's own `id` stays: a reference beside it may be resolved against it.
    ({"$schema": DRAFT4, "id": "http://e.com/s.json", "$ref": "s.json#/definitions/a", "type": "string",
      "definitions": {"a": {"maxLength": 3}}}, ["abcd", 3], ["ab"]),
    # An `allOf` beside a $ref keeps its members where they were: a $ref elsewhere names one by its index (the
    # reference went in first and shifted them, so `y` was held to `#/definitions/o` alone: fuzz F2a).
    ({"$schema": DRAFT7, "type": "object", "properties": {
        "x": {"$ref": "#/definitions/o", "allOf": [{"required": ["k"]}]}, "y": {"$ref": "#/properties/x/allOf/0"}},
      "required": ["y"], "definitions": {"o": {"type": "object"}}}, [{"y": {}}, {"y": {"j": 1}}], [{"y": {"k": 1}}]),
    # Siblings whose type shares none with the reference's would accept nothing: dropped, as the draft says.
    ({"$schema": DRAFT7, "type": "object", "properties": {"s": {"$ref": "#/definitions/o", "type": "string"}},
      "required": ["s"], "definitions": {"o": {"type": "object"}}}, [{"s": "x"}], [{"s": {}}]),
    # ... and a $ref elsewhere into them still names what it did (a 400 "Pointer ... does not exist": fuzz F2b)
    ({"$schema": DRAFT7, "type": "object", "properties": {
        "x": {"$ref": "#/definitions/o", "type": "string", "properties": {"k": {"type": "integer"}}},
        "y": {"$ref": "#/properties/x/properties/k"}}, "required": ["y"], "definitions": {"o": {"type": "object"}}},
     [{"y": "a"}, {"x": "s", "y": 1}], [{"y": 1}, {"x": {"k": "k"}, "y": 2}]),
    # (so it does beside a reference to a plain-name `$id`, which moves no base: QA review3 F2)
    ({"$schema": DRAFT7, "type": "object", "properties": {
        "x": {"$ref": "#/definitions/o", "type": "string", "properties": {"k": {"type": "integer"}}},
        "y": {"$ref": "#/properties/x/properties/k"}, "n": {"$ref": "#num"}}, "required": ["y"],
      "definitions": {"o": {"type": "object"}, "num": {"$id": "#num", "type": "integer"}}},
     [{"y": "a"}, {"y": 1, "n": "s"}], [{"y": 1}, {"y": 1, "n": 2}]),
])
def test_keywords_beside_a_ref_in_drafts_4_to_7_are_applied_as_ajv_applies_them(gpt2_compiler, tokenizers,
                                                                                  vocabs, schema, refused, accepted):
    """Every answer is valid under both readings of a `$ref` with siblings: the spec's (siblings ignored) and
    ajv's (siblings applied)."""
    for strict in (True, False):
        g = _compiled(gpt2_compiler, schema, strict)
        assert [d for d in refused if accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], d)] == []
        assert [d for d in accepted if not accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], d)] == []


def test_a_value_that_looks_like_a_schema_with_a_ref_is_data_not_a_schema(gpt2_compiler, tokenizers, vocabs):
    """A `const` or `enum` value holding `$ref` and other keys is written as it is (it was cut to its `$ref`)."""
    value = {"$ref": "#/x", "type": "note"}
    schema = {"$schema": DRAFT7, "type": "object", "properties": {"v": {"const": value}, "w": {"enum": [value, 1]}},
              "required": ["v", "w"], "additionalProperties": False}
    g = _compiled(gpt2_compiler, schema)
    assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], {"v": value, "w": value})
    assert not accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], {"v": {"$ref": "#/x"}, "w": 1})


@pytest.mark.parametrize("schema, accepted", [
    # beside a recursive reference (llguidance: "circular references with sibling keys are not supported")
    ({"$schema": DRAFT7, "$ref": "#/definitions/n", "maxProperties": 1, "definitions": {"n": {
        "type": "object", "properties": {"c": {"$ref": "#/definitions/n"}}}}}, {"c": {"c": {}}, "d": 1}),
    # a pattern llguidance cannot read (a lookahead past the start)
    ({"$schema": DRAFT7, "type": "object", "properties": {"u": {"$ref": "#/definitions/s", "pattern": "^((?!ab).)*$"}},
      "definitions": {"s": {"type": "string"}}}, {"u": "ab"}),
])
def test_siblings_of_a_ref_the_backend_could_not_compile_beside_it_are_read_as_the_draft_says(
        gpt2_compiler, tokenizers, vocabs, schema, accepted):
    """Applying such siblings would turn a schema that compiles under its draft into a 400: they are ignored, as
    the draft says."""
    g = _compiled(gpt2_compiler, schema, strict=True)
    assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], accepted)


def test_a_type_beside_a_percent_encoded_ref_is_known_kept_by_its_target_as_beside_a_plain_one():
    """outlines builds a node with a `$ref` from the target alone: a `type` beside it is dropped unless the target
    keeps to it. The target of `#/$defs/a%20b` is `a b`, as `resolve_ref` reads it (a second, plainer lookup
    missed it, and named the `type` as dropped)."""
    from constrain.support import outlines_unsupported

    for name, ref in (("ab", "#/$defs/ab"), ("a b", "#/$defs/a%20b")):
        schema = {"$defs": {name: {"type": "string"}}, "type": "object",
                  "properties": {"x": {"type": "string", "$ref": ref}}, "required": ["x"]}
        assert "/properties/x/type" not in outlines_unsupported(schema), ref


def test_outlines_serves_a_union_of_closed_objects_at_the_root(gpt2_compiler, tokenizers, vocabs):
    """A zod discriminated union (or a RootModel union of `extra="forbid"` models) has no `type` at its root: it
    was refused at `/type` as if it were a scalar, though outlines-core builds it exactly (QA unions F2). A root
    that may be a scalar still is."""
    from constrain.support import outlines_unsupported

    branch = {"type": "object", "properties": {"t": {"const": "a"}, "x": {"type": "integer"}},
              "required": ["t", "x"], "additionalProperties": False}
    other = {**branch, "properties": {"t": {"const": "b"}, "y": {"type": "string"}}, "required": ["t", "y"]}
    schema = {"anyOf": [branch, {"$ref": "#/$defs/b"}], "$defs": {"b": other}}
    assert outlines_unsupported(schema) == []
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="outlines"))
    assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], {"t": "b", "y": "s"})
    assert not accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], {"t": "a", "y": "s"})
    assert "/type" in outlines_unsupported({"anyOf": [branch, {"type": "string"}]})


@pytest.mark.parametrize("strict", [True, False])
def test_a_unicode_property_other_than_a_category_is_named_as_one_that_cannot_be_enforced(strict):
    """`\\p{Greek}` (zod's `.emoji()` writes `\\p{Extended_Pictographic}`) is valid ECMA-262, which Python's `re`
    (so jsonschema and the checks here) cannot read: it was called an invalid JSON Schema (`is not a 'regex'`,
    `invalid_constraint`), where it is one this server cannot enforce (QA schemagen F2)."""
    for pattern in ("^\\p{Greek}+$", "^(\\p{Extended_Pictographic}|\\p{Emoji_Component})+$", "^[\\p{L}\\p{Emoji}]$"):
        schema = {"type": "object", "properties": {"e": {"type": "string", "pattern": pattern}}}
        with pytest.raises(ConstraintError) as exc:
            spec_from_request(response_format={"type": "json_schema", "json_schema": {
                "name": "e", "schema": schema, "strict": strict}})
        assert (exc.value.code, exc.value.pointer) == ("unsupported_schema", "/properties/e/pattern"), pattern
        assert "cannot be enforced" in exc.value.message and "Unicode property `\\p{" in exc.value.message
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(regex="\\p{Greek}+")
    assert "cannot be enforced" in exc.value.message and exc.value.param == "regex"
    assert exc.value.code == "unsupported_schema"  # (as in a schema: review)
    escaped = {"type": "string", "pattern": "^\\\\p{x}$"}  # (a backslash, then `p{x}`: no property)
    assert spec_from_request(response_format={"type": "json_object", "schema": escaped}).kind == "json_schema"


@pytest.mark.parametrize("schema, pointer", [
    ({"type": "integer", "minimum": 5, "maximum": 3}, "/minimum"),
    ({"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": 3, "maximum": 3}},
      "required": ["x"]}, "/properties/x/exclusiveMinimum"),
    ({"type": "object", "properties": {"a": {
        "type": "object", "properties": {"b": {"type": "string", "minLength": 5, "maxLength": 3}}, "required": ["b"]}},
      "required": ["a"]}, "/properties/a/properties/b/minLength"),
    ({"type": "array", "items": {"type": "string"}, "minItems": 5, "maxItems": 3}, "/minItems"),
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 3},
                                       "b": {"type": "integer", "minimum": 9, "maximum": 1}}, "required": ["b"]},
     "/properties/b/minimum"),
    # no bounds: the required property llguidance names, where the schema declares it once
    ({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"type": "integer"}]}}, "required": ["a"]},
     "/properties/a"),
    ({"type": "object", "properties": {"a": {"enum": [1, 2], "const": 3}}, "required": ["a"]}, "/properties/a"),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {"a": {"type": "string"}}}},
      "allOf": [{"properties": {"a": {"type": "integer"}}}], "required": ["a"]}, "/properties/a"),
    # (`a` falls to additionalProperties: not the `a` another object declares, QA review3 F3)
    ({"type": "object", "required": ["a"], "additionalProperties": {"allOf": [{"type": "string"}, {"type": "integer"}]},
      "properties": {"o": {"type": "object", "properties": {"a": {"type": "string"}}}}}, None)])
def test_bounds_no_value_meets_are_a_400_naming_the_lower_one(gpt2_compiler, schema, pointer):
    """llguidance's "Unsatisfiable schema: minimum (5) is greater than maximum (3)" named no place (nor, for a
    required property, which bounds: "required property 'x' is unsatisfiable"); where outlines could be tried
    (an array's counts), auto answered with its "Failed to build DFA error building NFA" instead. Without such
    bounds, the required property it names is pointed at where it has one declaration."""
    for strict in (True, False):
        with pytest.raises(ConstraintError) as exc:
            gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
                "name": "u", "schema": schema, "strict": strict}}))
        assert exc.value.pointer == pointer and "Unsatisfiable schema" in exc.value.message
        assert exc.value.message.endswith(f"(at {pointer})") or pointer is None


@pytest.mark.parametrize("pattern", ["^(a)\\1$", "(?<=a)b"])
def test_property_names_of_a_pattern_no_backend_reads_are_named_not_refused_without_strict(gpt2_compiler, pattern):
    """`propertyNames: {pattern: "^(a)\\1$"}` became a name pattern of `patternProperties`, which llguidance must
    read: a 400 without `strict` too, where the README names such keywords in x-structgen-unenforced (QA
    latechecks F5). Under strict it is a 400 naming `/propertyNames`."""
    schema = {"type": "object", "propertyNames": {"pattern": pattern}, "additionalProperties": {"type": "integer"}}

    def compiled(strict):
        return gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "p", "schema": schema, "strict": strict}}))

    assert compiled(False).unenforced == ("/propertyNames",)
    with pytest.raises(ConstraintError) as exc:
        compiled(True)
    assert exc.value.pointer == "/propertyNames"


# JSONSchemaBench Handwritten/notnames9 (its comments left out): a reference llguidance cannot intersect
_RECURSIVE_WITH_SIBLINGS = json.loads(
    '{"type": "object", "allOf": [{"$ref": "#/definitions/npn1"}, {"$ref": "#/definitions/npn2"}, {"$ref": '
    '"#/definitions/npn3"}, {"$ref": "#/definitions/pp"}, {"propertyNames": {"pattern": "^(\\\\w\\\\w\\\\d)+$"}}, '
    '{"maxProperties": 1}], "definitions": {"npn1": {"not": {"propertyNames": {"not": {"pattern": "a5b"}}}}, "npn2": '
    '{"not": {"propertyNames": {"not": {"pattern": "(^[^5]*$)|7"}}}}, "npn3": {"not": {"propertyNames": {"not": '
    '{"pattern": "(^[^7]*$)|9"}}}}, "pp": {"patternProperties": {"7": {"$ref": "#/definitions/al7"}, "9": {"$ref": '
    '"#/definitions/al9"}}}, "al7": {"allOf": [{"$ref": "#/definitions/npn1"}, {"$ref": "#/definitions/pp"}, '
    '{"propertyNames": {"pattern": "^(\\\\w\\\\d)+$"}}, {"maxProperties": 1}]}, "al9": {"allOf": [{"$ref": '
    '"#/definitions/npn2"}, {"$ref": "#/definitions/pp"}, {"propertyNames": {"pattern": "^(\\\\w\\\\d)+$"}}, '
    '{"maxProperties": 1}]}}}')


def test_llguidances_names_for_places_are_the_clients_pointers(gpt2_compiler):
    """llguidance names a place `json-schema:///#/definitions/al7`, an address the client never wrote (QA realworld
    F3): the message names the client's pointer."""
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "r", "schema": _RECURSIVE_WITH_SIBLINGS}}, backend="llguidance"))
    assert "json-schema:" not in exc.value.message and "/definitions/al7" in exc.value.message, exc.value.message
    spaced = json.loads(json.dumps(_RECURSIVE_WITH_SIBLINGS).replace('/al7"', '/al%207"').replace('"al7"', '"al 7"'))
    with pytest.raises(ConstraintError) as exc:  # (percent-encoded there: named "the root", QA review6 F5)
        gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "r", "schema": spaced}}, backend="llguidance"))
    assert "/definitions/al 7" in exc.value.message, exc.value.message


def test_unenforced_keywords_are_named_where_the_client_wrote_them_and_the_root_never_as_nothing(gpt2_compiler):
    """A root `if`/`then` rewritten into branches named the root (`/`, then "" once the root was RFC 6901's: an
    empty `x-structgen-unenforced` read as nothing unenforced, QA review6 F4): the keyword's own place is named
    where the client wrote it so, and an unmappable place the root as `#`."""
    from constrain.compiler import _unenforced_place, unenforced_in_client_terms

    schema = {"if": {"type": "string"}, "then": {"pattern": "(a)\\1"}, "else": {"type": "integer"}}
    spec = spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
                             backend="llguidance")
    assert unenforced_in_client_terms(spec, gpt2_compiler.compile(spec)) == ("/then/pattern",)
    made = ConstraintSpec(kind="json_schema", schema={"anyOf": [{"not": {"multipleOf": 3}}]},
                          extra={"source": {"not": {"type": "object"}}})
    assert _unenforced_place(made, "/anyOf/0/not") == "#"
