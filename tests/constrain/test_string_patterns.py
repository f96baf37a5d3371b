"""String patterns: through the llguidance mask, negated classes refuse '"' and '\\' (llguidance 1.9.1 alone lets
their escapes through) and `not: {enum: [strings]}` (rewritten to a complement pattern) refuses exactly its
strings; outlines only gets patterns and property names that cannot hold a character JSON escapes."""

from __future__ import annotations

import json

import pytest

from constrain import ConstraintError, ConstraintSpec, GrammarCompiler
from constrain.spec import normalise_schema
from constrain.support import json_safe_pattern, outlines_unsupported
from tests.constrain.conftest import accepts_document, accepts_value, takes_text


@pytest.fixture(scope="module")
def llg(tokenizers, vocabs):
    c = GrammarCompiler(vocabs["qwen2"], tokenizers["qwen2"], backend="llguidance")
    yield c, tokenizers["qwen2"], vocabs["qwen2"]
    c.close()


def _accepts(llg, schema, value) -> bool:
    compiler, tok, vocab = llg
    g = compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True))
    return accepts_value(g, tok, vocab, value)


def _object(value_schema):
    return {"type": "object", "properties": {"v": value_schema}, "required": ["v"], "additionalProperties": False}


@pytest.mark.parametrize("pattern,refused,accepted", [
    ('^[^"]*$', ['a"b', '"'], ["ab", "a'b", "a\\b"]),
    ("^[^\\\\]+$", ["a\\b", "\\"], ['a"b', "x"]),
    ('^[^,"<>]+$', ['x"', "a,b", "<"], ["plain text"]),
    ('^[^\\x22]$', ['"'], ["a"]),
])
def test_negated_classes_refuse_quote_and_backslash(llg, pattern, refused, accepted):
    schema = _object({"type": "string", "pattern": pattern})
    assert [v for v in refused if _accepts(llg, schema, v)] == []
    assert [v for v in accepted if not _accepts(llg, schema, v)] == []


def test_not_enum_of_strings_refuses_exactly_those_strings(llg):
    words = ["delayed", "de", "x.y", "é😀", "[", ""]
    schema = _object({"not": {"enum": words}})
    assert [w for w in words if _accepts(llg, schema, w)] == []
    others = ["d", "del", "delayedx", "dex", "x.", "x.yz", "é", "é😀!", "[[", " ", 7, None, ["de"]]
    assert [w for w in others if not _accepts(llg, schema, w)] == []
    typed = _object({"type": "string", "not": {"const": "upstart"}})
    assert not _accepts(llg, typed, "upstart") and _accepts(llg, typed, "systemd")
    assert not _accepts(llg, typed, 1)


SAFE = ["^[a-z]+$", "^\\d{4}-\\d{2}$", "^[A-Za-z0-9_\\-]+$", "^\\w+@\\w+\\.com$", "^[!#-\\[\\]-~]+$", "^(a|b)\\b$",
        "^\\x41\\u00e9$"]
UNSAFE = ["^.+$", "^[^,]+$", "^[ -~]+$", '^a"b$', "^a\\\\b$", "^\\s+$", "^\\S+$", "^[\\s\\S]*$", "^\\x22$",
          "^[\\x00-\\x7f]$", "^[\\b]$", "^\\p{L}+$", "^\\n$", "^[!-#]$", "^\\u{22}$", "^a\\x{41", "^[\\u{41"]


def test_outlines_takes_only_patterns_that_cannot_match_what_json_escapes():
    """outlines-core writes a pattern between the quotes unescaped: `^.+$` would let a bare '"' end the string."""
    assert [p for p in SAFE if not json_safe_pattern(p)] == []
    assert [p for p in UNSAFE if json_safe_pattern(p)] == []
    for p in SAFE + UNSAFE:
        schema = _object({"type": "string", "pattern": p})
        takes = p in SAFE and "\\b" not in p  # (safe, but outlines-core builds no word boundary: ad6dc11)
        assert outlines_unsupported(schema) == ([] if takes else ["/properties/v/pattern"]), p


def test_outlines_takes_no_property_name_json_escapes():
    schema = {"type": "object", "properties": {'a"b': {"type": "integer"}, "c\\d": {"type": "integer"},
                                               "e.f(g)": {"type": "integer"}}, "additionalProperties": False}
    assert outlines_unsupported(schema) == ["/properties/a\"b", "/properties/c\\d"]


SIBLINGS = {"$defs": {"s": {"type": "string", "maxLength": 4}}}


@pytest.mark.parametrize("value, pointer", [
    # outlines-core builds an object from its first of properties/anyOf/enum/const/$ref and reads nothing else
    ({"$ref": "#/$defs/s", "pattern": "^[xy]{2}$"}, "/properties/v/pattern"),
    ({"type": "string", "anyOf": [{"enum": ["a", 1]}, {"type": "boolean"}]}, "/properties/v/type"),
    ({"type": "string", "enum": ["a", 1]}, "/properties/v/type"),
    ({"$ref": "#/$defs/s", "minLength": 2}, "/properties/v/minLength"),
    ({"type": "object", "properties": {"g": {"type": "string"}}, "additionalProperties": False,
      "anyOf": [{"required": ["g"]}]}, "/properties/v/anyOf"),
    # (what such a node builds keeps to them anyway: exact)
    ({"type": "string", "enum": ["a", "b"]}, None),
    ({"type": "string", "anyOf": [{"type": "string", "maxLength": 3}, {"enum": ["long one"]}]}, None),
    ({"$ref": "#/$defs/s", "type": "string", "description": "d"}, None),
    ({"type": "object", "properties": {"g": {"type": "string"}}, "required": ["g"], "additionalProperties": False,
      "maxLength": 3}, None),
])
def test_outlines_takes_no_keyword_it_would_build_a_node_without(value, pointer, tokenizers, vocabs):
    """Keywords beside the one outlines-core builds a node from were dropped: `{"$ref": ..., "pattern": ...}`
    took any string, from the third request of a schema on under the auto policy (helper-20's sweep)."""
    schema = {**_object(value), **SIBLINGS}
    assert outlines_unsupported(normalise_schema(schema)) == ([pointer] if pointer else [])
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", background_outlines=False)
    try:
        if pointer:
            with pytest.raises(ConstraintError) as exc:
                c.compile(ConstraintSpec(kind="json_schema", schema=schema, strict=True))
            assert exc.value.pointer == pointer
        else:
            assert c.compile(ConstraintSpec(kind="json_schema", schema=schema, strict=True)).backend == "outlines"
    finally:
        c.close()


def test_outlines_counts_a_surrogate_pair_escape_as_one_character(gpt2_compiler, tokenizers):
    """`\\ud83d\\ude00` is one character (😀): as two escapes it passed `minLength: 2` (helper-20's sweep)."""
    schema = _object({"type": "string", "minLength": 2, "maxLength": 2})
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, backend="outlines"))
    assert g.backend == "outlines"
    for text, taken in [('{"v":"\\ud83d\\ude00x"}', True), ('{"v":"\\u0061b"}', True),
                        ('{"v":"\\ud83d\\ude00"}', False), ('{"v":"\\ud83dx"}', False)]:
        assert takes_text(g, tokenizers["gpt2"], text, "gpt2") == taken, text


def test_the_outlines_size_limit_counts_the_schema_not_the_spelling_of_escapes(gpt2_compiler):
    """Surrogate pairs made each string's escape alternative three times longer: an object of 200 strings then
    passed the 30,000-character limit (34,893), which it had not (helper-22's review)."""
    schema = {"type": "object", "properties": {f"s{i}": {"type": "string"} for i in range(200)},
              "required": [f"s{i}" for i in range(200)], "additionalProperties": False}
    spec = ConstraintSpec(kind="json_schema", schema=schema, backend="outlines")
    regex = gpt2_compiler._outlines_regex(spec)  # (no error: within the limit)
    assert len(regex) > gpt2_compiler.max_outlines_regex_chars


def test_outlines_backend_refuses_a_pattern_that_could_break_the_json(tokenizers, vocabs):
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", background_outlines=False)
    try:
        with pytest.raises(ConstraintError) as exc:
            c.compile(ConstraintSpec(kind="json_schema", schema=_object({"type": "string", "pattern": "^.+$"}),
                                     strict=True))
        assert exc.value.pointer == "/properties/v/pattern"
        g = c.compile(ConstraintSpec(kind="json_schema", schema=_object({"type": "string", "pattern": "^[a-z]+$"}),
                                     strict=True))
        assert g.backend == "outlines"
    finally:
        c.close()


def test_a_matcher_past_llguidance_work_limit_raises_a_constraint_error_not_an_empty_mask(llg):
    """llguidance 1.9.1 runs out of lexer work per token on this pattern bounded to 10,000 characters, at its
    default and at our raised levels (`_STEP_FUEL`; the matcher enters an error state): the fill says so, so the
    request ends with a message naming the cause."""
    import torch

    compiler, tok, vocab = llg
    schema = {"type": "string", "pattern": "^(?:\\S+\\s+){0,99}\\S+$", "maxLength": 10000}
    m = compiler.compile(ConstraintSpec(kind="json_schema", schema=schema)).matcher()
    with pytest.raises(ConstraintError) as exc:
        m.fill_bitmask(torch.zeros((1, vocab.words), dtype=torch.int32), 0)
    assert exc.value.code == "constraint_too_complex"
    # MaskBench counts such an instance as not accepted, and goes on with the next one
    from constrain.maskbench import walk_instance

    grammar = compiler.compile(ConstraintSpec(kind="json_schema", schema=schema))
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    assert walk_instance(grammar, tok.encode('"a b"'), min(vocab.eos_token_ids), bitmask, []) is False


@pytest.mark.parametrize("pattern", [r"^(\w+) \1$", r"^a(?<!b)c$", r"\bfoo\b", r"^a(?=b)b$"],
                         ids=["backreference", "lookbehind", "word-boundary", "inner-lookahead"])
@pytest.mark.parametrize("backend", ["llguidance", "auto"])
def test_a_pattern_llguidance_cannot_read_is_named_unenforced_or_refused_with_its_pointer(gpt2_compiler, tokenizers,
                                                                                          vocabs, pattern, backend):
    """Such a pattern was a 400 whatever `strict` said, with llguidance's regex error and no pointer (under auto,
    outlines' "Failed to build DFA"). Now, as the README says: without strict the rest is enforced and the pattern
    named in `unenforced`; with strict, a 400 naming it."""
    schema = _object({"type": "string", "pattern": pattern, "maxLength": 4})
    spec = ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=False, backend=backend)
    g = gpt2_compiler.compile(spec)
    assert g.unenforced == ("/properties/v/pattern",)
    assert accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], "zz")
    assert not accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], "zzzzz")  # (maxLength still holds)
    with pytest.raises(ConstraintError) as refused:
        gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend=backend))
    assert refused.value.pointer == "/properties/v/pattern" and refused.value.code == "unsupported_schema"


# An RFC 1123 name (Kubernetes' subdomains): llguidance 1.9.1 cannot prove within its budget that it meets a
# `maxLength: 253` (it does where the last label is written as the others are).
RFC1123 = r"^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9][a-z0-9-]{0,61}[a-z0-9]$"


@pytest.mark.parametrize("backend", ["llguidance", "auto"])
def test_a_length_llguidance_cannot_meet_with_its_pattern_is_named_unenforced_or_refused_with_its_pointer(
        gpt2_compiler, tokenizers, vocabs, backend):
    """Such a schema was a 400 whatever `strict` said ("Unable to determine if regex is empty", pointing at no
    keyword), though the pattern alone and the length alone compile. Without strict the pattern is enforced and the
    length bound named in `unenforced`, as for a pattern llguidance cannot read; with strict, a 400 naming it."""
    from tests.constrain.conftest import ended_walks_valid

    schema = _object({"type": "string", "pattern": RFC1123, "maxLength": 253})
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=False,
                                             backend=backend))
    assert g.unenforced == ("/properties/v/maxLength",)
    for value, valid in (("api.example.com", True), ("a-b.c9", True), ("api..example.com", False),
                         ("-api.example.com", False), ("localhost", False), ("API.example.com", False)):
        assert accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value) == valid, value
    as_enforced = _object({"type": "string", "pattern": RFC1123})
    assert ended_walks_valid(g, vocabs["gpt2"], as_enforced, seed=4, walks=8, max_tokens=24) == 8
    with pytest.raises(ConstraintError) as refused:
        gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend=backend))
    assert refused.value.pointer == "/properties/v/maxLength" and refused.value.code == "unsupported_schema"
    assert refused.value.message.count("/properties/v/") == 1  # (the client's terms replace that one, for tools)


def test_a_length_llguidance_cannot_meet_with_a_pattern_and_a_format_is_named_unenforced_or_refused(
        gpt2_compiler, tokenizers, vocabs):
    """Addresses of one domain (`format: email`, `pattern: "@example\\.com$"`) beside `maxLength: 100`: the pattern
    and the format meet, and llguidance cannot prove within its budget that the length meets both. It was a 400
    strict or not, as the probe asked about the pattern alone, which decides it."""
    schema = _object({"type": "string", "format": "email", "pattern": r"@example\.com$", "maxLength": 100})
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=False,
                                             backend="llguidance"))
    assert g.unenforced == ("/properties/v/maxLength",)
    for value, valid in (("ann@example.com", True), ("ann@example.org", False), ("ann example.com", False),
                         ("a b@example.com", False)):
        assert accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value) == valid, value
    with pytest.raises(ConstraintError) as refused:
        gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))
    assert refused.value.pointer == "/properties/v/maxLength" and refused.value.code == "unsupported_schema"


@pytest.mark.parametrize("node", [
    {"type": "string", "maxLength": 253, "allOf": [{"pattern": RFC1123}]},
    {"type": "string", "allOf": [{"$ref": "#/$defs/name"}], "maxLength": 253},
    {"type": "string", "$ref": "#/$defs/name", "maxLength": 253},
    {"type": "string", "allOf": [{"allOf": [{"pattern": RFC1123}]}], "maxLength": 253},
    {"type": "string", "anyOf": [{"pattern": RFC1123}], "maxLength": 253},
    {"type": "string", "anyOf": [{"$ref": "#/$defs/name"}, {"enum": ["localhost"]}], "maxLength": 253},
    {"anyOf": [{"type": "string", "allOf": [{"pattern": RFC1123}]}, {"type": "integer"}], "maxLength": 253},
])
def test_a_length_llguidance_cannot_meet_with_a_members_or_a_referenced_pattern_is_named_unenforced_or_refused(
        gpt2_compiler, tokenizers, vocabs, node):
    """The RFC 1123 name in an `allOf` member (or a nested one), as a definition its users reference, or in an
    `anyOf` branch (llguidance meets the node's length with each branch), beside `maxLength: 253`: only a node's
    own pattern was asked about, and the schema was a 400 strict or not, some without a pointer."""
    schema = {**_object(node), "$defs": {"name": {"pattern": RFC1123}}}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=False,
                                             backend="llguidance"))
    assert g.unenforced == ("/properties/v/maxLength",)
    localhost = "localhost" in json.dumps(node)
    for value, valid in (("api.example.com", True), ("api..example.com", False), ("localhost", localhost)):
        assert accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value) == valid, value
    with pytest.raises(ConstraintError) as refused:
        gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))
    assert refused.value.pointer == "/properties/v/maxLength" and "patterns" in refused.value.message


@pytest.mark.parametrize("schema, named", [
    (_object({"type": "string", "pattern": RFC1123, "allOf": [{"maxLength": 253}]}), "/properties/v/allOf/0/maxLength"),
    ({"type": "object", "allOf": [{"properties": {"v": {"type": "string", "pattern": RFC1123}}},
                                  {"properties": {"v": {"maxLength": 253}}}], "required": ["v"]},
     "/allOf/1/properties/v/maxLength"),
    ({"type": "object", "properties": {"v": {"type": "string", "pattern": RFC1123}},
      "allOf": [{"$ref": "#/$defs/short"}], "required": ["v"], "$defs": {"short": {"properties": {"v": {
          "maxLength": 253}}}}}, "/$defs/short/properties/v/maxLength"),
])
def test_a_length_apart_from_the_pattern_it_meets_is_named_unenforced_or_refused(gpt2_compiler, tokenizers, vocabs,
                                                                                  schema, named):
    """The length in an `allOf` member, the RFC 1123 name on the node (the probe asked only the member, which holds
    no pattern); a base object and a length added to one of its properties by another `allOf` member or a
    referenced model (llguidance merges the objects and meets the property's two schemas): each was a 400 strict
    or not ("Unable to determine if regex is empty")."""
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=False,
                                             backend="llguidance"))
    assert g.unenforced == (named,)
    for value, valid in (("api.example.com", True), ("api..example.com", False), ("localhost", False)):
        assert accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value) == valid, value
    with pytest.raises(ConstraintError) as refused:
        gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))
    assert refused.value.pointer == named


@pytest.mark.parametrize("most, named", [(None, ("/properties/v/format",)), (100, ("/properties/v/maxLength",)),
                                         (300, ("/properties/v/format", "/properties/v/maxLength"))])
def test_a_hostnames_own_length_beside_a_pattern_is_named_by_its_format(gpt2_compiler, tokenizers, vocabs, most,
                                                                       named):
    """`format: hostname` beside the RFC 1123 name: the product holds a hostname to 253 characters (RFC 1034), a
    bound written after the probe, and the schema was a 400 without a pointer, strict or not. That bound is left
    out, and named by the format where the client's `maxLength` does not say as much (and by that `maxLength`,
    left out with it)."""
    node = {"type": "string", "format": "hostname", "pattern": RFC1123}
    schema = _object(node if most is None else {**node, "maxLength": most})
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=False,
                                             backend="llguidance"))
    assert tuple(sorted(g.unenforced)) == named
    for value, valid in (("api.example.com", True), ("api..example.com", False), ("API.example.com", False)):
        assert accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value) == valid, value
    with pytest.raises(ConstraintError) as refused:
        gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))
    assert refused.value.pointer in named and "253" in refused.value.message if most is None \
        else refused.value.pointer in named


def test_a_length_left_out_of_a_subschema_the_rewrites_share_is_named(gpt2_compiler, tokenizers, vocabs):
    """A recursive definition two `allOf`s name is copied once and shared (rewrite.py
    `_inline_recursive_meetings`): its name's `maxLength` was left out twice over, a KeyError, and the request a
    500 without strict."""
    node = {"type": "object", "properties": {"host": {"type": "string", "pattern": RFC1123, "maxLength": 253},
                                             "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}
    schema = {"type": "object", "properties": {"a": {"allOf": [{"$ref": "#/$defs/node"}]},
                                               "b": {"allOf": [{"$ref": "#/$defs/node"}]}},
              "required": ["a"], "additionalProperties": False, "$defs": {"node": node}}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=False,
                                             backend="llguidance"))
    assert "/$defs/node/properties/host/maxLength" in g.unenforced
    for host, valid in (("api.example.com", True), ("api..example.com", False)):
        assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], {"a": {"host": host}}) == valid, host


def test_a_length_beside_its_own_pattern_is_named_however_many_unions_the_schema_holds(gpt2_compiler):
    """Properties that name a union of 16 branches of 32 subschemas each spent the probe's budget for the whole
    schema (`_MEETING_READS`, counted a keyword at a time) before it reached the RFC 1123 name beside its own
    `maxLength`, which was then compiled: a 400 pointing at one of the unions' `allOf`s, strict or not."""
    union = {"anyOf": [{"allOf": [{"minLength": i} for i in range(32)]} for _ in range(16)]}
    properties = {"host": {"type": "string", "pattern": RFC1123, "maxLength": 253}}
    properties |= {f"p{i}": {"type": "string", "allOf": [{"$ref": "#/$defs/union"}], "description": str(i)}
                   for i in range(60)}
    schema = {"type": "object", "properties": properties, "$defs": {"union": union}}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=False,
                                             backend="llguidance"))
    assert "/properties/host/maxLength" in g.unenforced
    with pytest.raises(ConstraintError) as refused:
        gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))
    assert refused.value.pointer == "/properties/host/maxLength"


@pytest.mark.parametrize("resource, ref", [
    ({"$id": "http://x/z.json", "$defs": {"name": {"pattern": RFC1123}}}, "#/$defs/name"),
    ({"$id": "z.json", "$defs": {"name": {"pattern": RFC1123}}}, "#/$defs/name"),
    ({"$id": "z.json"}, "root.json#/$defs/name"),
])
def test_a_length_beside_a_pattern_a_reference_below_a_nested_id_names_is_named_unenforced_or_refused(
        gpt2_compiler, tokenizers, vocabs, resource, ref):
    """A `$ref` below a nested `$id` names a place in that resource: the probe read it against the root (where
    `#/$defs/name` names another subschema, or nothing) or not at all (as llguidance is given it, the URI it
    resolves to), never met the pattern with the length, and the schema was a 400 without a pointer, strict or
    not."""
    inner = {"type": "object", "properties": {"a": {"type": "string", "$ref": ref, "maxLength": 253}},
             "required": ["a"], **resource}
    schema = {"$id": "http://x/root.json", "type": "object", "properties": {"z": inner}, "required": ["z"],
              "$defs": {"name": {"pattern": RFC1123} if "root.json" in ref else {"type": "string"}}}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=False,
                                             backend="llguidance"))
    assert g.unenforced == ("/properties/z/properties/a/maxLength",)
    for value, valid in (("api.example.com", True), ("api..example.com", False)):
        assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], {"z": {"a": value}}) == valid, value
    with pytest.raises(ConstraintError) as refused:
        gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))
    assert refused.value.pointer == "/properties/z/properties/a/maxLength"


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"v": {"$id": "http://[::1/z", "type": "string", "pattern": "^a",
                                            "maxLength": 3, "$ref": "#/$defs/n", "$defs": {"n": {"pattern": "b$"}}}}},
    {"$id": "http://[::1/y#", "type": "object", "properties": {"v": {
        "$id": "z.json", "type": "string", "pattern": "^a", "maxLength": 3, "$ref": "#/$defs/n",
        "$defs": {"n": {"pattern": "b$"}}}}},
])
def test_an_id_no_uri_parser_reads_beside_lengths_and_patterns_is_a_400(gpt2_compiler, schema):
    """A nested `$id` of `http://[::1/z` is written into the references below it; the lengths probe, following
    them, raised Python's ValueError ("Invalid IPv6 URL", uncaught) where the compile refuses the URI (a 400)."""
    for strict in (False, True):
        with pytest.raises(ConstraintError, match="URI"):
            gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=strict,
                                                 backend="llguidance"))


@pytest.mark.parametrize("names, named", [
    (["api.example.com", "a.bc", "x"], ()),
    (["a.bc", ".".join(["a" * 63] * 4), "API.io"], ("/properties/v/maxLength",)),  # (255 characters)
])
def test_a_length_beside_a_pattern_and_an_enum_is_asked_about_with_the_enum(gpt2_compiler, tokenizers, vocabs,
                                                                           names, named):
    """llguidance meets an `enum` with the patterns and lengths beside it, and decides some such meetings that it
    cannot without the enum: the probe must ask the same question. Asked without the enum, a length llguidance
    enforces there was left out and named (a 400 under strict); not asked at all, one it cannot decide (255
    characters of labels the RFC 1123 name takes) was a 400 without a pointer, strict or not."""
    schema = _object({"type": "string", "pattern": RFC1123, "maxLength": 253, "enum": names})
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=False,
                                             backend="llguidance"))
    assert g.unenforced == named
    for value in names:
        valid = value in ("a.bc", "api.example.com") or (bool(named) and len(value) > 253)  # (left out: taken)
        assert accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value) == valid, value
    if named:
        with pytest.raises(ConstraintError) as refused:
            gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                                 backend="llguidance"))
        assert refused.value.pointer == named[0]
    else:
        gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))


def test_a_length_llguidance_meets_beside_one_it_cannot_stays_enforced(gpt2_compiler, tokenizers, vocabs):
    """`minLength: 1` beside the RFC 1123 name's `maxLength: 253`: llguidance decides the pattern with the
    minLength alone, and only the maxLength is left out. Both were: the minLength named unenforced, and under
    strict the 400 pointed at it rather than at the maxLength."""
    schema = _object({"type": "string", "pattern": RFC1123, "minLength": 5, "maxLength": 253})
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=False,
                                             backend="llguidance"))
    assert g.unenforced == ("/properties/v/maxLength",)
    for value, valid in (("a.bc", False), ("a.bcd", True), ("api.example.com", True)):
        assert accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], value) == valid, value
    with pytest.raises(ConstraintError) as refused:
        gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))
    assert refused.value.pointer == "/properties/v/maxLength"


def test_a_length_llguidance_meets_with_its_pattern_stays_enforced(gpt2_compiler, tokenizers, vocabs):
    """Only the lengths llguidance cannot meet are left out: the same name written label by label keeps its
    `maxLength` (a 254-character name is refused)."""
    label = "[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
    schema = _object({"type": "string", "pattern": rf"^{label}(?:\.{label})+$", "maxLength": 253})
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))
    assert g.unenforced == ()
    name = ".".join(["a" * 60] * 4)  # (243 characters)
    assert accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], name)
    assert not accepts_value(g, tokenizers["gpt2"], vocabs["gpt2"], name + ".abcdefghij")  # (254)
