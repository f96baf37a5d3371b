"""Random walks through the mask: whenever the automaton ends, the text parses and validates (jsonschema)."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from constrain import ConstraintError, spec_from_request
from tests.constrain.conftest import decode, random_walk, takes_text

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c d"]}, "maxItems": 3},
    "kind": {"anyOf": [{"const": 1}, {"type": "boolean"}, {"type": "null"}]}},
    "required": ["name", "age"], "additionalProperties": False}
OPEN = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}  # extra keys allowed

SHAPES = [
    ({"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}, PERSON),
    ({"type": "json_schema", "json_schema": {"name": "open", "schema": OPEN}}, OPEN),
    ({"type": "json_object", "schema": PERSON}, PERSON),
    ({"type": "json_object"}, {"type": "object"}),
]


def _walks(compiler, vocab, spec, n=6, max_tokens=60):
    g = compiler.compile(spec)
    rng = random.Random(1234)
    texts = []
    for _ in range(n):
        toks, ended = random_walk(g, vocab, rng, max_tokens, budget=g.backend == "outlines", prefer_end=0.3)
        if ended:
            texts.append(decode(vocab, toks))
    return g, texts


@pytest.mark.parametrize("backend", ["llguidance", "outlines", None])
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_every_response_format_shape_yields_valid_json(shape, backend, gpt2_compiler, vocabs):
    rf, schema = SHAPES[shape]
    spec = spec_from_request(response_format=rf, backend=backend)
    if backend == "outlines" and shape in (1, 3):
        with pytest.raises(Exception) as exc:  # outlines refuses what it cannot enforce exactly, with a pointer
            gpt2_compiler.compile(spec)
        assert "outlines" in str(exc.value)
        return
    g, texts = _walks(gpt2_compiler, vocabs["gpt2"], spec, n=12, max_tokens=150)
    assert texts, "no walk ended"
    for text in texts:
        jsonschema.validate(json.loads(text), schema)
    if backend:
        assert g.backend == backend


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_regex_walks_fullmatch_the_pattern(backend, gpt2_compiler, vocabs):
    pattern = r"(\+1 )?[0-9]{3}-[0-9]{4}( ext\. [0-9]{1,3})?"
    spec = spec_from_request(regex=pattern, backend=backend)
    _, texts = _walks(gpt2_compiler, vocabs["gpt2"], spec, n=8, max_tokens=40)
    assert texts
    assert all(re.fullmatch(pattern, t) for t in texts)


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_a_regex_anchored_at_its_ends_is_the_same_whole_match(backend, gpt2_compiler, tokenizers):
    """`^...$` around a regex changes nothing in a whole match; outlines-core refused it ("anchored universal start
    state doesn't exist"), so a client's anchored regex was a 400 on the outlines backend."""
    grammar = gpt2_compiler.compile(spec_from_request(regex=r"^[0-9]{3}-[a-z]+$", backend=backend))
    assert grammar.backend == backend
    assert takes_text(grammar, tokenizers["gpt2"], "123-abc", base="gpt2")
    for text in ("123-", "12-abc", "123-abc$", "^123-abc"):
        assert not takes_text(grammar, tokenizers["gpt2"], text, base="gpt2"), text


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_regex_shorthands_mean_what_every_dialect_means(backend, gpt2_compiler, tokenizers):
    """`\\d` and `\\w` took any Unicode digit or letter (both backends read them as Python and Rust do): a phone
    pattern `\\d{3}-\\d{4}` was answered "౬꧘᠑-３6႕0" on a small model. They now read as JSON Schema patterns do
    (constrain/pattern_dialects.py): what ECMA-262, Python and Rust all take, so ASCII digits and word
    characters, and any dialect's fullmatch accepts the answer."""
    grammar = gpt2_compiler.compile(spec_from_request(regex=r"\d{3}-\w{2}\s\S", backend=backend))
    assert takes_text(grammar, tokenizers["gpt2"], "123-a_ x", base="gpt2")
    for text in ("\u0c6c23-ab x", "\uff13\u0036\u0036-ab x", "123-\u00e9b x", "123-ab\u0085x", "123-ab \ufeff"):
        assert not takes_text(grammar, tokenizers["gpt2"], text, base="gpt2"), text


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_choice_walks_produce_one_of_the_choices(backend, gpt2_compiler, vocabs):
    choices = ["yes", "no", "but (maybe) [x]*", "日本"]
    spec = spec_from_request(choice=choices, backend=backend)
    _, texts = _walks(gpt2_compiler, vocabs["gpt2"], spec, n=10, max_tokens=20)
    assert texts and set(texts) <= set(choices)


@pytest.mark.parametrize("choices", [["a", "ab", "abc"], ["yes", "no", "yes please", "nope"], ["1", "12", "1.5"]])
def test_a_choice_where_an_entry_begins_another_is_served_whole_or_refused_by_outlines(choices, gpt2_compiler,
                                                                                        tokenizers):
    """outlines-core drops its automaton's transitions out of an accepting state: under outlines, `["a", "ab",
    "abc"]` answered `a` 12 times in 12 (QA regex F2). llguidance serves every entry; outlines refuses such a
    choice, saying which entry begins which."""
    grammar = gpt2_compiler.compile(spec_from_request(choice=choices, backend="llguidance"))
    for entry in choices:
        assert takes_text(grammar, tokenizers["gpt2"], entry, base="gpt2"), entry
    for other in ("abcd", "ye", "yes pleas", "1.", "125"):
        assert not takes_text(grammar, tokenizers["gpt2"], other, base="gpt2"), other
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec_from_request(choice=choices, backend="outlines"))
    assert exc.value.code == "unsupported_schema" and "begins" in exc.value.message, exc.value.message
    assert gpt2_compiler.compile(spec_from_request(choice=["yes", "no"], backend="outlines")).backend == "outlines"


def test_whitespace_is_bounded_in_json_mode(gpt2_compiler, vocabs, tokenizers):
    """After '{' only a bounded amount of whitespace may follow: a walk that always picks whitespace stops."""
    g = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_object"}))
    m = g.matcher()
    import torch
    bm = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    assert m.accept(tokenizers["gpt2"].encode("{")[0])
    spaces = [i for i, b in enumerate(vocabs["gpt2"].token_bytes) if b and b.strip() == b"" and len(b) <= 4]
    taken = 0
    for _ in range(50):
        m.fill_bitmask(bm, 0)
        ok = [t for t in spaces if (int(bm[0, t >> 5]) >> (t & 31)) & 1]
        if not ok:
            break
        assert m.accept(ok[0])
        taken += 1
    assert taken <= 2


@pytest.mark.parametrize("text, accepted", [
    ('{"a": 1e5, "c": [1, 2]}', True), ('{"a": 1.5E10, "c": []}', True),  # (an exponent's sign is optional)
    ('{"a": 1, "c": [1 ,2]}', True), ('{"a": 1 , "c": [ 1 , 2 ]}', True),  # (whitespace before any comma)
    ('{"a": 1e, "c": []}', False), ('{"a": 1, "c": [1 , , 2]}', False),
])
def test_both_backends_take_the_same_numbers_and_whitespace(text, accepted, gpt2_compiler, tokenizers):
    """outlines-core's number wanted a sign after `e` and its arrays no whitespace before a comma, where JSON and
    llguidance take both: under auto, a prefill `{"a":1e5,"c":[` was served twice by llguidance, then a 400 once
    the schema had moved to outlines (QA backends F2, F3)."""
    schema = {"type": "object", "properties": {"a": {"type": "number"}, "c": {"type": "array", "items": {
        "type": "integer"}}}, "required": ["a", "c"], "additionalProperties": False}
    format_ = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}
    for backend in ("outlines", "llguidance"):
        grammar = gpt2_compiler.compile(spec_from_request(response_format=format_, backend=backend))
        assert takes_text(grammar, tokenizers["gpt2"], text, "gpt2") == accepted, (backend, text)


@pytest.mark.parametrize("pattern", ["^[0-9]+(,[ ]?[0-9]+)*$", "^([0-9]+)(,[ ]?([0-9]+))*$"])
@pytest.mark.parametrize("text, accepted", [('{"v": "1,2"}', True), ('{"v": "1, 2"}', True), ('{"v": "1 ,2"}', False)])
def test_a_pattern_holding_a_comma_group_keeps_its_meaning_on_outlines(text, accepted, pattern, gpt2_compiler,
                                                                       tokenizers):
    """The whitespace put before an array's comma went into a string's pattern holding `(,[ ]?` too: outlines took
    "1 ,2" under `^[0-9]+(,[ ]?[0-9]+)*$`, which jsonschema and llguidance refuse (review of bc16746); and still
    where the pattern's first item is a group, its text then that of outlines-core's item separator (review of
    443a5b7): the separator is now rewritten with the patterns held out."""
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": pattern}},
              "required": ["v"], "additionalProperties": False}
    format_ = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}
    for backend in ("outlines", "llguidance"):
        grammar = gpt2_compiler.compile(spec_from_request(response_format=format_, backend=backend))
        assert takes_text(grammar, tokenizers["gpt2"], text, "gpt2") == accepted, (backend, text)


@pytest.mark.parametrize("backend", ["outlines", "auto"])
def test_integers_past_64_bits_in_const_and_enum_are_written_exactly(backend, gpt2_compiler, tokenizers):
    """outlines-core reads an integer past its 64 bits as a double: `const: 18446744073709551617` was written
    `1.8446744073709552e+19`, which jsonschema refuses; auto served it so (llguidance refuses it) (QA hostile F1)."""
    wide, wider = 2**64 + 1, -(2**70) - 3
    schema = {"type": "object", "properties": {"a": {"const": wide}, "b": {"enum": [[wider], 3]}},
              "required": ["a", "b"], "additionalProperties": False}
    format_ = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}
    grammar = gpt2_compiler.compile(spec_from_request(response_format=format_, backend=backend))
    for text, accepted in [(f'{{"a": {wide}, "b": [{wider}]}}', True), (f'{{"a": {wide}, "b": 3}}', True),
                           ('{"a": 1.8446744073709552e+19, "b": 3}', False),
                           (f'{{"a": {wide}, "b": [-1.1805916207174113e+21]}}', False)]:
        assert takes_text(grammar, tokenizers["gpt2"], text, "gpt2") == accepted, text
        assert accepted == jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))


@pytest.mark.parametrize("spelled", ["\ue0020\ue003", "\ue000i0\ue001", "\ue0000\ue001", "\ue000p0\ue001"])
def test_a_string_that_spells_a_placeholder_stays_that_string_on_outlines(spelled, gpt2_compiler, tokenizers):
    """A string const spelling the placeholder of a held-out integer was written as that integer: a strict 200
    that broke its schema (review of 7678bcb F4). Placeholders are now marked with characters the schema holds
    nowhere."""
    wide = 2**64 + 1
    schema = {"type": "object", "properties": {"a": {"const": spelled}, "b": {"const": wide},
                                               "c": {"type": "string", "pattern": "^x$"}},
              "required": ["a", "b", "c"], "additionalProperties": False}
    format_ = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}
    grammar = gpt2_compiler.compile(spec_from_request(response_format=format_, backend="outlines"))
    for document, accepted in [({"a": spelled, "b": wide, "c": "x"}, True), ({"a": wide, "b": wide, "c": "x"}, False),
                               ({"a": "x", "b": wide, "c": "x"}, False)]:
        text = json.dumps(document, ensure_ascii=False)
        assert takes_text(grammar, tokenizers["gpt2"], text, "gpt2") == accepted, text
