"""A `pattern`'s shorthands and `.` take only what every regex dialect takes: ECMA-262 (ajv), Python's `re`
(jsonschema) and Rust's `regex` (pydantic), whichever backend serves the schema; so do the names' patterns of an
object that takes no other keys."""

from __future__ import annotations

import re
import unicodedata

import pytest

from constrain import ConstraintError, ConstraintSpec, GrammarCompiler, spec_from_request
from constrain.pattern_dialects import portable_pattern, unicode_properties
from constrain.spec import normalise_schema
from tests.constrain.conftest import accepts_document, accepts_value, takes_text


@pytest.fixture(scope="module")
def qwen2(tokenizers, vocabs):
    compilers = {backend: GrammarCompiler(vocabs["qwen2"], tokenizers["qwen2"], backend=backend)
                 for backend in ("llguidance", "outlines")}
    yield compilers, tokenizers["qwen2"], vocabs["qwen2"]
    for c in compilers.values():
        c.close()


def _accepts(qwen2, backend, pattern, value) -> bool:
    compilers, tok, vocab = qwen2
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": pattern}}, "required": ["v"],
              "additionalProperties": False}
    g = compilers[backend].compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True))
    assert g.backend == backend
    return accepts_value(g, tok, vocab, value)


# (pattern, values some dialect refuses, values every dialect takes)
LLGUIDANCE_CASES = [
    ("^\\d+$", ["\u0663", "\uff13"], ["42"]),  # Arabic-Indic and full-width digits: not ECMA-262's \d
    ("^\\w+$", ["\u00e9"], ["a_1"]),
    ("^\\D$", ["\u0663"], ["a", "-"]),  # Python's \D refuses every Unicode digit
    ("^\\W$", ["\u00e9", "\u0663"], ["-", " "]),
    ("^[^\\d]$", ["\u0663", "7"], ["x"]),
    ("^[a\\D]$", ["\u0663"], ["a", "b"]),
    ("^\\s$", ["\x85", "\x1c", "\ufeff"], [" ", "\t", "\u3000", "\u00a0"]),
    ("^\\S$", ["\ufeff", "\x85", " "], ["a", "\u00e9"]),
    ("^.$", ["\r", "\u2028", "\u2029", "\n"], ["a", "\u00e9", "\t"]),
    ("^a.c$", ["a\rc"], ["abc", "a c"]),
    ("^[\\s\\S]$", [], ["\x85", "\ufeff", "\n", "a"]),  # anything, in every dialect
    ('^[^"\\s]+$', ['a"b', "a b"], ["ab", "a\\b"]),
    ("^[^\\s\\\\]+$", ["a\\b", "a b"], ['a"b']),
]


@pytest.mark.parametrize("pattern,refused,accepted", LLGUIDANCE_CASES)
def test_llguidance_writes_only_what_every_dialect_matches(qwen2, pattern, refused, accepted):
    assert [v for v in refused if _accepts(qwen2, "llguidance", pattern, v)] == []
    assert [v for v in accepted if not _accepts(qwen2, "llguidance", pattern, v)] == []


@pytest.mark.parametrize("pattern,refused,accepted", [
    ("^[a&&b]$", [], ["a", "b", "&"]),  # Rust: the intersection of a and b, nothing
    ("^[^\\x00-\\uffff&&b]$", ["+", "c", "\ufe89"], ["\U0001F600"]),
    ("^[+--]$", [], ["+", ",", "-"]),  # (ECMA-262: the range from + to -)
    ("^[a-c~~b]$", ["d"], ["a", "b", "~"]),
])
def test_class_set_operators_are_read_as_ecma_reads_them(qwen2, pattern, refused, accepted):
    """Rust's regex takes `&&`, `--` and `~~` in a class for set operations, ECMA-262 for the characters they
    are: such a class is written out as its characters (helper-24: `[^\\x00-\\uffff&&b]` gave `+`)."""
    assert [v for v in refused if _accepts(qwen2, "llguidance", pattern, v)] == []
    assert [v for v in accepted if not _accepts(qwen2, "llguidance", pattern, v)] == []


@pytest.mark.parametrize("pattern,refused,accepted", [
    ("^\\d{2}$", ["\u0663\u0664", "\uff11\uff12"], ["42"]),
    ("^[\\w-]+$", ["\u00e9t\u00e9"], ["a-b_9"]),
])
def test_outlines_reads_shorthands_as_ecma_does(qwen2, pattern, refused, accepted):
    assert [v for v in refused if _accepts(qwen2, "outlines", pattern, v)] == []
    assert [v for v in accepted if not _accepts(qwen2, "outlines", pattern, v)] == []


@pytest.mark.parametrize("pattern", ["\\d", "\\D", "\\w", "\\W", "\\s", "\\S", ".", "[^\\d]", "[^\\w]", "[^\\s]",
                                     "[a-f\\d]", "[^a-f\\D]", "[\\s\\S]", "[^\\S\\n]", "[\\W_]"])
def test_the_portable_spelling_matches_no_character_python_refuses(pattern):
    """Python's own `re` checks the rewrite: nothing the portable class takes is refused by the original."""
    portable, original = re.compile(portable_pattern(pattern)), re.compile(pattern)
    taken = [c for c in map(chr, range(0x30000)) if portable.fullmatch(c)]
    assert taken and [c for c in taken if not original.fullmatch(c)] == []


@pytest.mark.parametrize("pattern", ["^[a-z]+$", "^\\x41\\u00e9[\\-.]$", "^(a|b)\\b$", "^\\p{L}$", "[]a]"])
def test_patterns_without_shorthands_or_dots_or_that_cannot_be_read_stay_as_written(pattern):
    assert portable_pattern(pattern) == pattern


@pytest.mark.parametrize("pattern,portable", [
    ("^[\\a]?\\d{3}$", "^[\\a]?[0-9]{3}$"),
    ("[\\101\\d]\\w", "[\\101\\d][0-9A-Z\\u005Fa-z]"),
    ("[\\N{LATIN SMALL LETTER A}]\\d", "[\\N{LATIN SMALL LETTER A}][0-9]"),
    ("[\\a\\]]\\d", "[\\a\\]][0-9]"),
])
def test_a_class_that_cannot_be_read_stays_as_written_and_the_rest_is_still_rewritten(pattern, portable):
    """A class holding a member read differently across dialects (`\\a`, octal, `\\N{..}`) left the whole pattern
    as written, so a `\\d` elsewhere kept the backends' Unicode reading: the regex `[\\a]?\\d{10}` wrote U+10D45,
    which even Python's `\\d` refuses (llguidance's Unicode tables are newer)."""
    assert portable_pattern(pattern) == portable


@pytest.mark.parametrize("pattern, taken, refused", [
    ("[[:alpha:]]+", ["a]", ":]", "[]"], ["a", "abc", "1]"]),  # (the class {[, :, a, l, p, h}, then a `]`)
    ("[\\w&&[a-c]]", ["b]", "&]", "[]", "x]"], ["b", "-]"]),
    ("[[a]]", ["a]", "[]"], ["a"]),
    ("[\\a[]x", ["[x", "\ax"], ["ax"]),
])
@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
@pytest.mark.filterwarnings("ignore::FutureWarning")  # (Python's `re` on these patterns: the reading checked here)
def test_a_bracket_in_a_class_is_the_character_as_python_and_ecma_read_it(qwen2, backend, pattern, taken, refused):
    """Rust's regex (both backends) reads `[[:alpha:]]` as a POSIX class and `[\\w&&[a-c]]` as an intersection,
    where Python's `re` and ECMA-262 read a class holding `[`, then a `]`: the pattern was left as written, and
    `[[:alpha:]]+` wrote `abc`, which jsonschema refuses. The `[` is now written escaped."""
    compilers, tok, _ = qwen2
    g = compilers[backend].compile(ConstraintSpec(kind="regex", pattern=pattern, backend=backend))
    for text in taken:
        assert re.fullmatch(pattern, text) and takes_text(g, tok, text), text
    for text in refused:
        assert not re.fullmatch(pattern, text) and not takes_text(g, tok, text), text


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_the_regex_extension_reads_a_shorthand_beside_an_unreadable_class_as_every_dialect_does(qwen2, backend):
    compilers, tok, _ = qwen2
    g = compilers[backend].compile(ConstraintSpec(kind="regex", pattern="[\\a]?\\d{3}", backend=backend))
    assert not takes_text(g, tok, "\u0663\u0663\u0663") and not takes_text(g, tok, "\U00010d45" * 3)
    assert takes_text(g, tok, "123")


def _accepts_document(qwen2, schema, document) -> bool:
    compilers, tok, vocab = qwen2
    g = compilers["llguidance"].compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema),
                                                       strict=True))
    return accepts_document(g, tok, vocab, document)


@pytest.mark.parametrize("names, refused, accepted", [
    ({"patternProperties": {"^\\D+$": {}}}, ["\u07c0"], ["ab"]),  # an NKo digit: Python's \D refuses it
    ({"patternProperties": {"^\\W+$": {}}}, ["\u00e9"], ["-"]),
    ({"propertyNames": {"pattern": "^\\W+$"}}, ["\u00e9"], ["-"]),
    ({"patternProperties": {"^\\s+$": {}}}, ["\x85"], [" "]),  # not ECMA-262's space
    ({"patternProperties": {"^[\\w\\s]+$": {}}}, ["\x85", "\u00e9"], ["a b"]),
    ({"patternProperties": {"^.+$": {}}}, ["\r", "\u2028"], ["ab"]),
    ({"propertyNames": {"pattern": "^.+$"}}, ["\r"], ["ab"]),
    ({"patternProperties": {"^\\s$": {}}}, ["\x85", "\x1c"], [" ", "\t"]),  # (finitely many: declared names)
])
def test_a_closed_object_writes_only_names_every_dialect_matches(qwen2, names, refused, accepted):
    """Where the names' patterns are the only keys an object takes, a name some dialect does not match would make
    the object invalid there: such names are refused."""
    closed = {"additionalProperties": False} if "patternProperties" in names else {}
    schema = {"type": "object", **names, **closed}
    assert [k for k in refused if _accepts_document(qwen2, schema, {k: 1})] == []
    assert [k for k in accepted if not _accepts_document(qwen2, schema, {k: 1})] == []


@pytest.mark.parametrize("pattern, matched, unmatched", [
    ("^\\w+$", "\u00e9", "-"),  # Python's and Rust's \w take é; ECMA-262's and llguidance's do not
    ("^\\d+$", "\u0663", "x"),  # an Arabic-Indic digit
    ("^.+$", "\r", ""),  # Python's and Rust's `.` take \r
    ("^\\s+$", "\x85", "x"),  # so do their \s U+0085
    ("^[\\w-]+$", "\u00e9-", " "),
])
def test_an_open_object_gives_a_name_any_dialect_matches_the_patterns_schema(qwen2, pattern, matched, unmatched):
    """Where the other keys may hold anything, a name that some dialect's reading of a pattern matches takes the
    pattern's schema: that dialect asks for it, and one that does not match the name asks nothing of its value.
    (llguidance's ASCII `\\w` let `{"é": ""}` through under an object schema, which jsonschema refuses: a random
    walk under JSONSchemaBench's Github_medium o76905 wrote such keys.)"""
    schema = {"type": "object", "patternProperties": {pattern: {"type": "object"}}}
    assert not _accepts_document(qwen2, schema, {matched: ""})
    assert _accepts_document(qwen2, schema, {matched: {}})
    assert _accepts_document(qwen2, schema, {unmatched: ""})


def test_a_name_pattern_llguidance_cannot_read_is_a_400_naming_it(qwen2):
    """`^\\ud83d\\ude00$` names two lone surrogates, which no JSON key spells: it was compiled as six U+FFFD."""
    schema = {"type": "object", "patternProperties": {"^\\ud83d\\ude00$": {}}, "additionalProperties": False}
    with pytest.raises(ConstraintError) as err:
        _accepts_document(qwen2, schema, {"\U0001F600": 1})
    assert err.value.pointer == "/patternProperties/^\\ud83d\\ude00$"


@pytest.mark.parametrize("pattern, refused, accepted", [
    ("^\\D$", ["\u0663", "a"], ["3", "ab"]),  # ECMA-262's \D matches an Arabic-Indic digit
    ("^\\W$", ["\u00e9", "-"], ["a", "--"]),  # ECMA-262's \W matches é
    ("^\\S$", ["\ufeff", "a"], [" ", "ab"]),  # Python's \S matches U+FEFF
    ("^\\s$", ["\x85", "\ufeff", " "], ["a"]),  # Python's \s matches U+0085, ECMA-262's U+FEFF
    ("^.$", ["\r", "\u2028", "a"], ["\n", "ab"]),  # Python's and Rust's `.` match \r and U+2028
    ("^[\\D3]$", ["\u0663", "3"], ["4"]),
])
def test_a_negated_pattern_refuses_what_any_dialect_matches(qwen2, pattern, refused, accepted):
    """`not: {pattern}` holds only where no dialect's reading of the pattern matches: the complement is spelled
    through the same portable classes as a pattern is."""
    schema = {"type": "object", "properties": {"v": {"type": "string", "not": {"pattern": pattern}}},
              "required": ["v"], "additionalProperties": False}
    assert [v for v in refused if _accepts_document(qwen2, schema, {"v": v})] == []
    assert [v for v in accepted if not _accepts_document(qwen2, schema, {"v": v})] == []


@pytest.mark.parametrize("pattern", ["\\p{L}", "\\p{Lu}", "\\P{N}", "\\p{Letter}", "\\p{gc=Nd}", "[\\p{L}\\d_-]",
                                     "[^\\p{L}]", "[^\\P{Lu}a]", "\\p{LC}", "\\p{General_Category=Punctuation}",
                                     "\\p{C}", "\\P{Other}"])
def test_a_unicode_property_is_spelled_as_the_characters_every_dialect_gives_it(pattern):
    """ECMA-262 (u flag) and Rust read `\\p{L}`; Python's `re` has no `\\p` (a schema using it was a 400, strict or
    not). It is spelled as the characters Python's Unicode tables give the category: no wider than the `regex`
    package's reading (newer tables) but for a few characters a newer Unicode moved, and taking every character
    those tables assign to it, less such moves."""
    import regex

    portable = re.compile(unicode_properties(pattern))
    reference = regex.compile(pattern)
    scalars = [chr(c) for c in range(0x30000) if not 0xD800 <= c <= 0xDFFF]
    taken = [c for c in scalars if portable.fullmatch(c)]
    wider = [c for c in taken if not reference.fullmatch(c)]
    assert taken and len(wider) < 5 and all(unicodedata.category(c) != "Cn" for c in wider), wider
    assigned = [c for c in scalars if unicodedata.category(c) != "Cn"]
    missed = [c for c in assigned if reference.fullmatch(c) and not portable.fullmatch(c)]
    assert len(missed) < 20, [hex(ord(c)) for c in missed[:20]]  # (a few characters a newer Unicode moved)


def test_cntrl_is_the_control_characters():
    """ECMA-262 takes Unicode's value aliases, `cntrl` for Cc among them (`\\p{C}` and `\\p{cntrl}` were a 400)."""
    assert unicode_properties("\\p{cntrl}") == unicode_properties("\\p{Cc}") != "\\p{cntrl}"


def test_a_script_or_an_unknown_property_stays_as_written():
    assert unicode_properties("\\p{Greek}+") == "\\p{Greek}+"
    assert unicode_properties("\\\\p{L}") == "\\\\p{L}"  # (a backslash, then "p{L}")


def test_a_schema_or_a_regex_naming_unicode_properties_is_enforced(qwen2):
    compilers, tok, vocab = qwen2
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^\\p{Lu}\\p{Ll}+$"}},
              "required": ["name"], "additionalProperties": False}
    spec = spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": schema}})
    grammar = compilers["llguidance"].compile(spec)
    assert accepts_document(grammar, tok, vocab, {"name": "Émile"})
    assert not accepts_document(grammar, tok, vocab, {"name": "émile"})
    assert not accepts_document(grammar, tok, vocab, {"name": "E1"})
    regex_grammar = compilers["llguidance"].compile(spec_from_request(regex="[\\p{L} ]+"))
    assert takes_text(regex_grammar, tok, "Ünïcode text") and not takes_text(regex_grammar, tok, "a1")


def test_a_script_property_or_too_many_properties_are_a_400_naming_the_pattern():
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^\\p{Greek}$"}}}
    with pytest.raises(ConstraintError) as err:
        spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert err.value.pointer == "/properties/a/pattern"
    many = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": "^\\p{L}$"} for i in range(65)}}
    with pytest.raises(ConstraintError) as err:
        spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": many}})
    assert "more than 64 Unicode properties" in err.value.message
    with pytest.raises(ConstraintError):
        spec_from_request(regex="\\p{L}" * 65)


# (an ECMA-262 pattern as ajv reads it (`u` flag), values it refuses, values it takes)
ECMA_SPELLINGS = [
    ("^(?<year>[0-9]{4})-(?<month>[0-9]{2})$", ["2024-1", "24-01"], ["2024-01"]),  # named groups
    ("^\\u{1F600}+$", ["\U0001F601", "u"], ["\U0001F600\U0001F600"]),  # a code point escape
    ("^\\uD83D\\uDE00$", ["\U0001F601"], ["\U0001F600"]),  # a surrogate pair: one character
    ("^[\\uD83D\\uDE00-\\uD83D\\uDE4F]+$", ["\U0001F650", "a"], ["\U0001F600\U0001F64F"]),  # a range of them
    ("^a\\0b$", ["a0b", "ab"], ["a\x00b"]),  # NUL, not a backreference
    ("^\\cJ\\cia$", ["cJcia", "\na"], ["\n\ta"]),  # control letters
    ("^x[\\b]$", ["x", "xb"], ["x\x08"]),  # a backspace in a class
]


@pytest.mark.parametrize("pattern,refused,accepted", ECMA_SPELLINGS)
def test_ecma_spellings_that_python_and_rust_read_otherwise_are_enforced_as_ecma_reads_them(qwen2, pattern, refused,
                                                                                             accepted):
    """These were a 400 (Python's `re` refused the schema as invalid, or llguidance refused the pattern: it reads
    `\\0` as a backreference and `[\\b]` not at all), strict or not."""
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": pattern}}, "required": ["v"],
              "additionalProperties": False}
    spec = spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": schema}})
    compilers, tok, vocab = qwen2
    grammar = compilers["llguidance"].compile(spec)
    assert [v for v in refused if accepts_value(grammar, tok, vocab, v)] == []
    assert [v for v in accepted if not accepts_value(grammar, tok, vocab, v)] == []


def test_an_ecma_named_backreference_is_refused_as_a_backreference_with_its_pointer(qwen2):
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": "^(?<n>a)-\\k<n>$"}}}
    spec = spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": schema}})  # (a valid schema: no longer "not a 'regex'")
    with pytest.raises(ConstraintError) as err:
        qwen2[0]["llguidance"].compile(spec)
    assert err.value.pointer == "/properties/v/pattern" and "backreference" in err.value.message


def test_two_names_spelled_alike_keep_both_schemas():
    """`^a\\0$` and `^a\\x00$` are one name once spelled for Python and Rust: the second's schema replaced the
    first's (helper-26). Both match the same keys, which must pass both schemas: so they still do."""
    import jsonschema

    from constrain.pattern_dialects import with_python_patterns

    schema = {"type": "object", "patternProperties": {"^a\\0$": {"type": "string"}, "^a\\x00$": {"maxLength": 3}}}
    spelled = with_python_patterns(schema)
    assert len(spelled["patternProperties"]) == 1
    for value, valid in (("ab", True), ("abcd", False), (5, False)):
        assert jsonschema.Draft202012Validator(spelled).is_valid({"a\x00": value}) is valid
        assert jsonschema.Draft202012Validator(schema).is_valid({"a\x00": value}) is valid


def test_a_shorthand_beside_a_spelled_property_is_still_made_portable():
    """The spelled categories name astral characters as `\\U0001D400`, which the class reader now reads: `\\d` in
    `[\\p{L}\\d]` was left as written (Unicode digits on the backends)."""
    assert "\\d" not in portable_pattern(unicode_properties("[\\p{L}\\d]"))
    assert portable_pattern("[\\U0001F600\\d]") == "[0-9\\U0001F600]"


@pytest.mark.parametrize("pattern", ["^\\bfoo\\b$", "^\\<ab$", "^ab\\>$"])
def test_an_anchored_pattern_with_a_word_boundary_is_served_as_llguidance_serves_it_under_auto(gpt2_compiler,
                                                                                                pattern):
    """outlines-core cannot build a word boundary into its automaton (its syntax reads `\\<` and `\\>` as ones too),
    but an anchored pattern went to it under `auto` (the exact backend for anchored patterns): a 400 from its build,
    strict or not. It is llguidance's, which leaves the pattern out and names it (strict: a 400 with the pointer)."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}, "required": ["s"],
              "additionalProperties": False}

    def spec(strict: bool):
        return spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "s", "schema": schema, "strict": strict}})

    grammar = gpt2_compiler.compile(spec(False))
    assert grammar.backend == "llguidance" and grammar.unenforced == ("/properties/s/pattern",)
    with pytest.raises(ConstraintError) as refused:
        gpt2_compiler.compile(spec(True))
    assert refused.value.pointer == "/properties/s/pattern"


@pytest.mark.parametrize("schema, name", [
    ({"type": "object", "patternProperties": {"^ab$": {"type": "object"}}}, "ab"),
    ({"type": "object", "properties": {"ab": {"type": "object"}}, "patternProperties": {"b$": {"type": "object"}}},
     "ab"),
    ({"type": "object", "allOf": [{"patternProperties": {"^.{1,3}$": False}},
                                  {"patternProperties": {"a": True}, "additionalProperties": False}]}, "abcd"),
], ids=["open", "folded-into-a-property", "all-of"])
def test_no_key_ends_with_a_newline_where_a_names_pattern_holds_a_dollar(qwen2, schema, name):
    """Python's `$` matches before a final newline, ECMA-262's and llguidance's do not: `{"ab\\n": ""}` passed the
    grammar (and ajv) where jsonschema asks `"ab\\n"` for the pattern's schema (random walks under JSONSchemaBench
    Handwritten allOfPProp1/3 wrote `{"ba\\n": ""}` under `^.{1,3}$: false`; review of QA round 22). Such a key is
    not written where a names' pattern holds a `$`, whatever its value; other keys and newlines are."""
    assert not _accepts_document(qwen2, schema, {name + "\n": ""})
    assert not _accepts_document(qwen2, schema, {name + "\n": {}})
    assert not _accepts_document(qwen2, schema, {name: {}, "x" + name + "\n": {}})
    assert _accepts_document(qwen2, schema, {name: {}})
    assert _accepts_document(qwen2, schema, {"a\nbcd": {}})


def test_a_key_may_end_with_a_newline_where_no_names_pattern_holds_a_dollar(qwen2):
    schema = {"type": "object", "patternProperties": {"^ab": {"type": "object"}}}
    assert _accepts_document(qwen2, schema, {"ab\n": {}})
    assert not _accepts_document(qwen2, schema, {"ab\n": ""})
