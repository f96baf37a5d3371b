"""Hostile constraints are refused with a ConstraintError (a 400), quickly and without compiling them."""

from __future__ import annotations

import json

import pytest

from constrain import ConstraintError, ConstraintSpec, spec_from_request
from tests.constrain.conftest import ended_walks_valid


def _nested(depth: int) -> dict:
    s: dict = {"type": "string"}
    for _ in range(depth):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


@pytest.mark.parametrize("schema, what", [
    (_nested(200), "nesting"),
    ({"enum": [f"v{i}" for i in range(50_000)]}, "enum"),
    ({"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100}
                                       for i in range(12_000)}}, "bytes"),
    ({"type": "string", "pattern": "(a|aa)*" * 400}, "pattern"),
])
def test_oversized_schemas_are_refused_before_compiling(schema, what):
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "h", "schema": schema}})
    assert exc.value.param == "response_format"
    assert exc.value.code == "schema_too_large"


LONG = "m" * 4097


@pytest.mark.parametrize("schema, pointer", [
    ({"const": LONG}, "/const"),
    ({"type": "object", "properties": {"a": {"enum": ["x", {"k": [LONG]}]}}}, "/properties/a/enum"),
    ({"const": {LONG: 1}}, "/const"),
    ({"type": "object", "properties": {LONG: {"type": "integer"}}}, "/properties"),
    ({"type": "object", "required": [LONG]}, "/required"),
    ({"$ref": "#/x/y", "x": {"y": {"const": LONG}}}, "/x/y/const"),  # (reached through a $ref only)
])
def test_a_string_the_output_spells_whole_is_bounded(schema, pointer):
    """A 200 KB `const` was within every limit, and its masks then held every row of the batch: 2 s at the first,
    ~100 ms at each later one (QA dos F1). Strings the output must spell whole are held to 4,096 characters;
    descriptions, defaults and examples are not spelled, and are not bounded."""
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "h", "schema": schema}})
    assert exc.value.pointer == pointer and exc.value.code == "schema_too_large", exc.value.pointer
    assert "longer than 4096 characters" in exc.value.message
    fits = json.loads(json.dumps(schema).replace(LONG, LONG[1:]))
    assert spec_from_request(response_format={"type": "json_object", "schema": fits}).kind == "json_schema"
    noted = {"type": "string", "description": LONG, "default": LONG, "examples": [LONG]}
    assert spec_from_request(response_format={"type": "json_object", "schema": noted}).kind == "json_schema"
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(choice=["yes", LONG])
    assert exc.value.param == "choice" and "the limit is 4096" in exc.value.message
    assert exc.value.code == "schema_too_large"  # (as every size limit answers: README)
    with pytest.raises(ConstraintError) as exc:  # (a regex that is one long literal costs as much: review R5)
        spec_from_request(regex="(x|" + LONG + ")[0-9]")
    assert exc.value.param == "regex" and "4097 characters in a row; the limit is 4096" in exc.value.message
    assert exc.value.code == "schema_too_large"
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(regex="[ab]" * 2_501)
    assert "longer than 10000 characters" in exc.value.message and exc.value.code == "schema_too_large"
    assert spec_from_request(regex="(x|" + LONG[1:] + ")[0-9]{3}" + LONG[1:]).kind == "regex"


def test_catastrophic_regex_is_refused_or_compiled_without_backtracking(gpt2_compiler):
    """(a+)+$ is catastrophic for backtracking engines; automata compile it in linear time."""
    spec = spec_from_request(regex=r"(a+)+b")
    g = gpt2_compiler.compile(spec)
    m = g.matcher()
    assert g.backend in ("llguidance", "outlines") and not m.can_end()


def test_invalid_regex_and_invalid_schema_are_client_errors():
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(regex="(unclosed")
    assert exc.value.param == "regex"
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(response_format={"type": "json_schema",
                                           "json_schema": {"name": "x", "schema": {"type": "strin"}}})
    assert "/type" in exc.value.message


def test_backreference_pattern_fails_only_that_request(gpt2_compiler):
    spec = ConstraintSpec(kind="json_schema", schema={"type": "string", "pattern": "^(a)\\1$"}, strict=True)
    with pytest.raises(ConstraintError):
        gpt2_compiler.compile(spec)
    assert gpt2_compiler.compile(spec_from_request(choice=["ok"])).matcher() is not None


def test_unknown_outlines_regex_size_is_bounded(tokenizers, vocabs):
    from constrain import GrammarCompiler

    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", max_outlines_regex_chars=100)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20)},
              "additionalProperties": False}
    with pytest.raises(ConstraintError) as exc:
        c.compile(ConstraintSpec(kind="json_schema", schema=schema))
    assert exc.value.code == "schema_too_large"
    c.close()


def test_a_schema_llguidance_finds_too_large_is_schema_too_large(gpt2_compiler):
    """500 subschemas under `allOf` are "schema too large" to llguidance: that was code `invalid_constraint`
    (QA hostile F8), where the size limits' refusals say `schema_too_large`."""
    schema = {"allOf": [{"type": "object", "properties": {f"p{i}": {"type": "string", "minLength": i % 5}}}
                        for i in range(500)]}
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "h", "schema": schema}}, backend="llguidance"))
    assert exc.value.code == "schema_too_large" and "schema too large" in exc.value.message
    assert "llguidance's limit on the grammar it builds" in exc.value.message  # (which limit: QA dos F5)
    with pytest.raises(ConstraintError) as exc:  # ("too large" in llguidance's words quoting the schema was taken)
        gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "h", "schema": {"$ref": "#/$defs/too large", "$defs": {"too large": {"type": "integer"}}}}},
            backend="llguidance"))
    assert exc.value.code == "invalid_constraint"


def test_a_schema_holding_every_private_use_character_is_refused_by_outlines_saying_why(gpt2_compiler):
    """outlines' translation marks placeholders with private-use characters the schema holds nowhere: with none
    left its refusal gave no reason (review of 40f66b8 F5). auto serves it with llguidance."""
    every = "".join(chr(c) for c in range(0xE000, 0xF900))
    schema = {"type": "object", "properties": {"a": {"enum": [every[:3200], every[3200:], "b"]}}, "required": ["a"],
              "additionalProperties": False}
    format_ = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}}
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec_from_request(response_format=format_, backend="outlines"))
    assert "private-use character" in exc.value.message
    assert gpt2_compiler.compile(spec_from_request(response_format=format_)).backend == "llguidance"


def test_an_object_of_hundreds_of_optional_properties_is_followed_past_its_first_key(gpt2_compiler, vocabs):
    """Each of 600 optional properties may come next: llguidance's rows held ~4 items a property, past its limit
    of 2,000, and every answer failed at its first key ("Current row has 2407 items"; QA loop)."""
    schema = {"type": "object", "properties": {f"field_{i}": {"type": "string", "maxLength": 5} for i in range(600)}}
    grammar = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "wide", "schema": schema}}, backend="llguidance"))
    assert ended_walks_valid(grammar, vocabs["gpt2"], schema, seed=0, walks=4, max_tokens=40) >= 1


def test_compile_time_limit_fails_only_that_request(tokenizers, vocabs):
    from constrain import GrammarCompiler

    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", compile_timeout_s=0.001)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(8)},
              "required": [f"p{i}" for i in range(8)], "additionalProperties": False}
    with pytest.raises(ConstraintError) as exc:
        c.compile(ConstraintSpec(kind="json_schema", schema=schema))
    assert exc.value.code == "compile_timeout"
    c.close()


def test_shipped_named_schemas_compile_exactly(tokenizers, vocabs):
    from pathlib import Path

    from constrain import GrammarCompiler

    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], schemas_dir=Path(__file__).parents[2] / "schemas")
    assert c.named_schemas and set(c.precompile_named().values()) == {"outlines"}
    c.close()


def test_outlines_core_regex_completeness_bug_is_kept_away_from_auto(gpt2_compiler, tokenizers):
    """0.2.14 refuses "1.5" for [0-9]+(\\.[0-9]+)?; auto serves regexes with llguidance, which accepts it."""
    spec = spec_from_request(regex=r"[0-9]+(\.[0-9]+)?")
    g = gpt2_compiler.compile(spec)
    m = g.matcher()
    assert g.backend == "llguidance"
    assert all(m.accept(t) for t in tokenizers["gpt2"].encode("1.5")) and m.can_end()


@pytest.mark.timeout(60)
def test_schema_rewrites_never_run_the_clients_regexes():
    """A catastrophic pattern next to an enum would backtrack for hours in Python's `re` (holding the GIL: the
    whole server stalls) if the exact rewrites validated values against it: they leave such nodes alone instead
    (the backends' regex engines are linear)."""
    from constrain.spec import normalise_schema

    schema = {"type": "string", "pattern": "^(a+)+$", "enum": ["a" * 40 + "!", "aa"]}
    assert normalise_schema(schema) == schema


@pytest.mark.timeout(60)
def test_declared_names_are_tested_against_property_names_by_automaton():
    """The same pattern in propertyNames: whether a declared name matches is decided on the pattern's automaton
    (linear in the name), so the name that would backtrack for hours is simply forbidden."""
    from constrain.spec import normalise_schema

    name = "a" * 40 + "!"
    schema = {"type": "object", "additionalProperties": False,
              "properties": {name: {"type": "integer"}, "aaa": {"type": "string"}},
              "propertyNames": {"pattern": "^(a+)+$"}}
    out = normalise_schema(schema)
    assert "propertyNames" not in out
    assert out["properties"] == {name: False, "aaa": {"type": "string"}}


@pytest.mark.timeout(60)
def test_a_one_of_against_a_catastrophic_pattern_is_rewritten_from_its_automaton():
    """The pattern is parsed, never run: its negation comes from its automaton (constrain/regex_sets.py), and that
    complement, a DFA written back, is itself safe to run."""
    import re

    from constrain.spec import normalise_schema

    const = "a" * 40 + "!"
    out = normalise_schema({"oneOf": [{"type": "string", "pattern": "^(a+)+$"}, {"const": const}]})
    assert "oneOf" not in json.dumps(out)
    const_branch = next(b for b in out["anyOf"] if const in json.dumps(b))
    (not_pattern,) = [p for p in _patterns(const_branch)]
    assert re.search(not_pattern, const) and not re.search(not_pattern, "aaa")


def _patterns(node):
    if isinstance(node, dict):
        yield from ([node["pattern"]] if isinstance(node.get("pattern"), str) else [])
        for v in node.values():
            yield from _patterns(v)
    elif isinstance(node, list):
        for v in node:
            yield from _patterns(v)


def test_a_schema_full_of_patterns_to_negate_gets_a_bounded_share_of_regex_work():
    """Each `not: {pattern}` costs an automaton; one schema's rewrites share one budget of states
    (rewrite._REGEX_DFA_STATES), after which the rest are left alone (refused by pointer in strict mode)."""
    from constrain.rewrite import rewrite_schema

    props = {f"p{i}": {"type": "string", "not": {"pattern": f"^x{i}[a-z]{{0,60}}$"}} for i in range(100)}
    out = rewrite_schema({"type": "object", "properties": props})
    negated = [name for name, sub in out["properties"].items() if "not" not in json.dumps(sub)]
    assert 0 < len(negated) < 100
    assert out["properties"]["p99"] == props["p99"]


def test_choices_sharing_subschemas_cost_the_checks_on_finished_values_bounded_work():
    """40 anyOfs in a chain, each of two branches that both lead to the next: 2^40 ways to the late keyword at
    the end. Placing the checks and listing each value's choices stop at their budgets (the placement visits
    each node once per context; the choices give up past 16 or 256 subschemas looked at)."""
    from constrain.late_keywords import plan_late_keywords

    n = 40
    defs = {f"d{k}": {"anyOf": [{"$ref": f"#/$defs/d{k + 1}"}, {"$ref": f"#/$defs/d{k + 1}", "type": "object"}]}
            for k in range(n)}
    defs[f"d{n}"] = {"type": "object", "properties": {"x": {"type": "integer", "not": {"multipleOf": 3}}}}
    schema = {"$defs": defs, "type": "object", "properties": {"v": {"$ref": "#/$defs/d0"}}}
    plan = plan_late_keywords(schema, one_of=False)
    assert plan is not None and plan.pointers == ("/$defs/d0",)
    assert plan.alternatives(plan.schema["properties"]["v"]) is None
    assert plan.child_alternatives([(plan.schema,)], "v") is None


# A number llguidance follows only by building its lexer's states as the digits come: past `-`, one mask builds
# more expressions than its lexer may hold ("too many expressions constructed").
LEXER_PUZZLE = {"type": "number", "exclusiveMinimum": -100000000, "exclusiveMaximum": -10000,
                "allOf": [{"multipleOf": 6.75}, {"multipleOf": 19}, {"multipleOf": 9.5}, {"multipleOf": 2.125}]}


@pytest.mark.parametrize("schema, raised", [
    ({"type": "integer", "multipleOf": 4096, "minimum": 4096, "maximum": 1073741824}, True),
    # (whether this one still needs more depends on the states its lexer has built: not asked)
    ({"type": "integer", "multipleOf": 8721, "exclusiveMinimum": -100000, "exclusiveMaximum": -10000}, None),
    ({"type": "string", "pattern": "^(?:\\S+\\s+){0,99}\\S+$", "maxLength": 1000}, True)])
def test_a_mask_past_llguidance_default_lexer_work_is_built_with_more(gpt2_compiler, vocabs, schema, raised):
    """llguidance's default lexer work per token (200,000) ran out on the first mask of such numbers, or after
    their `-`, and on this pattern of up to 100 words: the request compiled, then every answer failed as
    constraint_too_complex. An output that runs out of it on a lexer of its own now goes on with more (up to
    `_STEP_FUEL`'s last level), and the grammar keeps the level for the outputs after it."""
    from constrain.llg_backend import _STEP_FUEL

    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, backend="llguidance"))
    assert g.step_fuel == _STEP_FUEL[0]
    assert ended_walks_valid(g, vocabs["gpt2"], schema, seed=3, walks=6, max_tokens=16) == 6
    assert raised is None or (g.step_fuel > _STEP_FUEL[0]) == raised


# JSONSchemaBench Github_easy o35866 (a real-world form): an address whose state depends on its country.
_STATES = {"CAN": ["AB", "BC", "MB", "NB", "NF", "NT", "NV", "NU", "ON", "PE", "QC", "SK", "YT"],
           "MEX": ["aguascalientes", "baja-california-norte", "baja-california-sur", "campeche", "chiapas",
                   "chihuahua", "coahuila", "colima", "distrito-federal", "durango", "guanajuato", "guerrero",
                   "hidalgo", "jalisco", "mexico", "michoacan", "morelos", "nayarit", "nuevo-leon", "oaxaca", "puebla",
                   "queretaro", "quintana-roo", "san-luis-potosi", "sinaloa", "sonora", "tabasco", "tamaulipas",
                   "tlaxcala", "veracruz", "yucatan", "zacatecas"],
           "USA": ["AL", "AK", "AS", "AZ", "AR", "AA", "AE", "AP", "CA", "CO", "CT", "DE", "DC", "FM", "FL", "GA", "GU",
                   "HI", "ID", "IL", "IN", "IA", "KS", "KY", "LA", "ME", "MH", "MD", "MA", "MI", "MN", "MS", "MO", "MT",
                   "NE", "NV", "NH", "NJ", "NM", "NY", "NC", "ND", "MP", "OH", "OK", "OR", "PW", "PA", "PR", "RI", "SC",
                   "SD", "TN", "TX", "UT", "VT", "VI", "VA", "WA", "WV", "WI", "WY"]}
ADDRESS_FORM = {
    "$schema": "http://json-schema.org/draft-04/schema#", "type": "object", "additionalProperties": False,
    "definitions": {"address": {"type": "object", "oneOf": [
        *({"properties": {"country": {"type": "string", "enum": [country]}, "state": {"type": "string", "enum": states},
                          "postalCode": {"type": "string", "maxLength": 10}}} for country, states in _STATES.items()),
        {"properties": {"country": {"not": {"type": "string", "enum": list(_STATES)}},
                        "state": {"type": "string", "maxLength": 51},
                        "postalCode": {"type": "string", "maxLength": 51}}}],
        "properties": {"street": {"type": "string", "minLength": 1, "maxLength": 50},
                       "street2": {"type": "string", "minLength": 1, "maxLength": 50},
                       "city": {"type": "string", "minLength": 1, "maxLength": 51}}}},
    "properties": {"address": {"$ref": "#/definitions/address"}}, "required": ["address"]}


def test_a_grammar_past_llguidance_default_initial_lexer_work_compiles(gpt2_compiler, tokenizers, vocabs):
    """llguidance's default work on a grammar's initial lexer (1,000,000) refused this form, strict or not
    ("initial lexer configuration (grammar) too big"); with more (`_INITIAL_FUEL`) it compiles, takes a valid
    address, refuses a state of another country, and answers end valid."""
    from constrain.spec import normalise_schema
    from tests.constrain.conftest import accepts_document

    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(ADDRESS_FORM), strict=True,
                                             backend="llguidance"))
    valid = {"address": {"country": "CAN", "state": "ON", "street": "1 Main", "city": "Ottawa"}}  # (keys in the
    # order the grammar writes them: its `oneOf`'s first)
    assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], valid)
    assert not accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"],
                                {"address": {"country": "CAN", "state": "TX", "city": "Ottawa"}})
    assert ended_walks_valid(g, vocabs["gpt2"], ADDRESS_FORM, seed=2, walks=4, max_tokens=60) == 4


def test_lexer_limit_fails_only_the_output_that_ran_into_it(gpt2_compiler, vocabs):
    """The copies of a parsed llguidance grammar share one lexer, and so its limit. An output that spends it
    gives up (constraint_too_complex); an output already under way and the next request of the same (cached)
    grammar go on, on a fresh lexer (before, both failed at their next mask, and so did every later request)."""
    import torch

    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema={"anyOf": [{"type": "string"}, LEXER_PUZZLE]},
                                             backend="llguidance"))
    byte = vocabs["gpt2"].byte_tokens()
    bm = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    under_way = g.matcher()
    for b in b'"a':
        under_way.fill_bitmask(bm, 0)
        assert under_way.accept(byte[b])
    spender = g.matcher()
    spender.fill_bitmask(bm, 0)
    assert spender.accept(byte[ord("-")])
    with pytest.raises(ConstraintError) as exc:
        spender.fill_bitmask(bm, 0)
    assert exc.value.code == "constraint_too_complex" and "lexer" in exc.value.message
    for m, text in ((under_way, b'b"'), (g.matcher(), b'"ok"')):
        for b in text:
            m.fill_bitmask(bm, 0)
            assert bm.count_nonzero() > 0 and m.accept(byte[b])
        assert m.can_end()


def test_an_output_under_way_goes_on_when_the_lexer_is_spent_again_by_another_output(gpt2_compiler, vocabs):
    """After one output spends the lane's lexer, the others under way went on copies of the lane's new parse,
    sharing its lexer with a second spender, which spent it too: the outputs under way then met the limit a
    second time and gave up as if it were theirs (QA: 8 of 12 requests that succeed alone were 400s beside
    outputs that spend the lexer). An output that meets the limit goes on with a parse of its own."""
    import torch

    # (a string whose every letter asks the lexer for a state: the output under way needs the lexer after a spend)
    letters = {"type": "string", "pattern": "^[a-z]{0,40}$"}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema={"anyOf": [letters, LEXER_PUZZLE]},
                                             backend="llguidance"))
    byte = vocabs["gpt2"].byte_tokens()
    bm = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    under_way, first, second = g.matcher(), g.matcher(), g.matcher()
    for m, b in ((under_way, b'"'), (first, b"-"), (second, b"-")):
        m.fill_bitmask(bm, 0)
        assert m.accept(byte[b[0]])
    for spender in (first, second):
        with pytest.raises(ConstraintError):
            spender.fill_bitmask(bm, 0)
        for b in b"ab":  # (the output under way between the two)
            under_way.fill_bitmask(bm, 0)
            assert under_way.accept(byte[b])
    for b in b'cd"':
        under_way.fill_bitmask(bm, 0)
        assert bm.count_nonzero() > 0 and under_way.accept(byte[b])
    assert under_way.can_end()


def _parsed_lanes(g, lanes) -> None:
    """Wait until each of `lanes` of the llguidance grammar `g` has its own parse (made in the background)."""
    import time

    deadline = time.monotonic() + 60
    while any(g.fresh_copy(lane)[1] != lane for lane in lanes):
        assert time.monotonic() < deadline, "a lane's parse never came"
        time.sleep(0.01)


def test_a_lane_is_parsed_in_the_background_and_its_first_matchers_copy_lane_0(gpt2_compiler):
    """The engine thread never waits for a lane's parse (40-160 ms for a large grammar): a lane's first matcher
    copies lane 0's parse, and the lane's own parse is made in the background for the matchers after it."""
    from constrain.llg_backend import LlgGrammar

    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema={"type": "array", "items": {"maxLength": 7}},
                                             backend="llguidance"))
    g = getattr(g, "inner", g)  # (under the distinct-keys check any JSON output of llguidance has)
    assert isinstance(g, LlgGrammar)
    assert g.fresh_copy(5)[1] == 0
    _parsed_lanes(g, [5])
    assert g.fresh_copy(5)[1] == 5 and g.fresh_copy(4)[1] == 0


def test_a_matcher_made_before_its_lane_was_parsed_moves_to_the_lanes_parse_at_its_next_fill(gpt2_compiler, vocabs,
                                                                                            monkeypatch):
    """A new grammar's first rows (a burst of requests for a new schema) copy lane 0's parse and share its lexer,
    whose lock makes their masks one at a time: once their own lane's parse comes, each moves to it at its next
    fill, with its output so far replayed, and its masks and its end are those of a matcher that never moved."""
    import threading

    import torch

    from constrain.llg_backend import LlgGrammar

    parse_may_end = threading.Event()  # (the lane's parse, ~1 ms here, is held until the output is under way)
    parse_lane = LlgGrammar._parse_lane
    monkeypatch.setattr(LlgGrammar, "_parse_lane",
                        lambda self, lane, text: parse_may_end.wait(60) and parse_lane(self, lane, text))
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", backend="llguidance", schema={
        "type": "object", "properties": {"moved": {"type": "string", "maxLength": 11}}, "required": ["moved"]}))
    g = getattr(g, "inner", g)
    early, reference = g.matcher(6), g.matcher(0)
    assert early.parse_lane == 0
    byte = vocabs["gpt2"].byte_tokens()
    bm = torch.zeros((2, vocabs["gpt2"].words), dtype=torch.int32)
    text = b'{"moved": "yes"}'
    for i, b in enumerate(text):
        if i == 4:
            parse_may_end.set()
            _parsed_lanes(g, [6])
        early.fill_bitmask(bm, 0, tokens_left=64)
        reference.fill_bitmask(bm, 1, tokens_left=64)
        assert torch.equal(bm[0], bm[1])
        assert early.parse_lane == (6 if i >= 4 else 0)
        assert early.accept(byte[b]) and reference.accept(byte[b])
    assert early.can_end() and reference.can_end()


def test_a_lane_whose_lexer_is_spent_is_parsed_anew_and_the_other_lanes_keep_theirs(gpt2_compiler, vocabs):
    """Matchers of different lanes copy different parses (Grammar.matcher): an output that spends its lane's lexer
    has that lane parsed anew, and the next matcher of another lane still copies that lane's first parse."""
    import torch

    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema={"anyOf": [{"type": "string"}, LEXER_PUZZLE]},
                                             backend="llguidance"))
    _parsed_lanes(g, [1, 3])
    byte = vocabs["gpt2"].byte_tokens()
    bm = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    other_lane = g.matcher(3)
    spender = g.matcher(1)
    before = {lane: g.fresh_copy(lane)[2] for lane in (0, 1, 3)}  # (the compiler's cache may have served it before)
    spender.fill_bitmask(bm, 0)
    assert spender.accept(byte[ord("-")])
    with pytest.raises(ConstraintError):
        spender.fill_bitmask(bm, 0)
    after = {lane: g.fresh_copy(lane)[2] for lane in (0, 1, 3)}  # (how often each lane was parsed anew)
    assert after[1] > before[1] and after[0] == before[0] and after[3] == before[3]
    for m in (other_lane, g.matcher(1)):
        for b in b'"ok"':
            m.fill_bitmask(bm, 0)
            assert m.accept(byte[b])
        assert m.can_end()


def test_lookahead_steers_away_from_a_token_past_which_the_lexer_gives_up(gpt2_compiler, vocabs):
    """Under a check (here a `not`), a sampled `-` after which llguidance's lexer would give up is replaced by a
    token with a way on, as a dead end is; and the matcher, whose lexer the probe spent, goes on."""
    import torch

    schema = {"anyOf": [{"type": "string"}, LEXER_PUZZLE], "not": {"const": "x"}}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, backend="llguidance", strict=True))
    byte = vocabs["gpt2"].byte_tokens()
    bm = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    m = g.matcher()
    m.fill_bitmask(bm, 0, tokens_left=50)
    token = m.vet(byte[ord("-")], 50)
    assert token != byte[ord("-")] and m.accept(token)
    for b in b'ok"':
        m.fill_bitmask(bm, 0, tokens_left=40)
        assert m.accept(byte[b])
    assert m.can_end()


def test_property_counts_over_many_optional_properties_are_not_enumerated(gpt2_compiler, tokenizers, vocabs,
                                                                        monkeypatch):
    """30 optional properties under maxProperties 17 would be ~10^8 alternatives of which properties are present:
    the rewrite counts them before listing any (before, one such request ran the server out of memory), leaves
    the bounds to the backend, and documents are still held to them."""
    import itertools

    import constrain.rewrite
    from tests.constrain.conftest import accepts_document

    class Listing(BaseException):  # (not an Exception: no fallback may swallow it)
        pass

    listed, combinations = 0, itertools.combinations

    def counted(items, size):
        nonlocal listed
        for combo in combinations(items, size):
            listed += 1
            if listed > 10_000:
                raise Listing("the alternatives are being listed")
            yield combo

    monkeypatch.setattr(constrain.rewrite.itertools, "combinations", counted)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 2} for i in range(30)},
              "minProperties": 15, "maxProperties": 17}
    grammar = gpt2_compiler.compile(spec_from_request(
        response_format={"type": "json_schema", "json_schema": {"name": "wide", "schema": schema}}))
    for count in (14, 15, 17, 18):
        document = {f"p{i}": "x" for i in range(count)}
        assert accepts_document(grammar, tokenizers["gpt2"], vocabs["gpt2"], document) == (15 <= count <= 17)


def test_a_constraint_llguidance_cannot_start_is_refused_naming_its_field(gpt2_compiler, monkeypatch):
    """`multipleOf: 1000000007` compiled, but llguidance's lexer ran out of fuel starting its matcher: that was a
    400 with `param: null` and llguidance's words alone. Such a divisor is now one llguidance cannot read, never
    given to it (test_spec); no other schema found starts it so, so the matcher it cannot start is one in error
    that llguidance itself makes, of a grammar text it cannot read."""
    import llguidance

    from constrain import ConstraintError, llg_backend, spec_from_request

    monkeypatch.setattr(llg_backend, "_new_parse",
                        lambda lltok, text, fuel: llguidance.LLMatcher(lltok, "%%", log_level=0))
    with pytest.raises(ConstraintError) as refused:
        gpt2_compiler.compile(spec_from_request(response_format={"type": "json_object", "schema": {
            "type": "integer", "minimum": 271828}}))
    assert refused.value.param == "response_format" and refused.value.code == "constraint_too_complex"
    assert "cannot start" in refused.value.message


@pytest.mark.parametrize("name", ["x", "default", "enum"])
def test_the_clients_regex_is_never_run_by_python(name, monkeypatch, gpt2_compiler):
    """Python's backtracking `re` runs `^(a+)+$` on 30 `a`s and a `!` for a minute, holding the interpreter and so
    the whole server: the support check ran it on an enum's values (QA review5 F1), and the finite-values check
    where a property named `default` hid its `pattern` (F2). Every backend here compiles the pattern."""
    import jsonschema._keywords

    ran: list[str] = []

    class NoRegex:  # (recorded: the checks catch what a validator raises)
        @staticmethod
        def search(pattern, text):
            ran.append(pattern)
            raise AssertionError(f"Python ran the client's regex {pattern!r}")

    monkeypatch.setattr(jsonschema._keywords, "re", NoRegex)
    value = "a" * 30 + "!"
    string = {"type": "string", "enum": [value, "aa"], "pattern": "^(a+)+$"}
    schema = {"type": "object", "properties": {"u": {"type": "array", "uniqueItems": True, "items": {
        "type": "object", "properties": {name: string}, "required": [name], "additionalProperties": False}},
        "s": string}, "required": ["u", "s"], "additionalProperties": False}
    for backend in ("auto", "outlines", "llguidance"):
        try:
            gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
                "name": "h", "schema": schema}}, backend=backend))
        except ConstraintError as exc:
            assert backend == "outlines" and "pattern" in exc.message, exc.message
    assert ran == []


def test_listing_a_recursive_one_ofs_values_reads_a_bounded_number_of_subschemas(monkeypatch):
    """A oneOf whose branches may overlap is written as the enum of its values where they are few: over a recursive
    oneOf of closed objects, listing them read b^depth subschemas (b=16: 39 million, 37 s; QA review6 F3)."""
    import constrain.finite_values as fv
    from constrain.spec import normalise_schema

    reads = [0]
    listed = fv._candidates

    def counted(*args):
        reads[0] += 1
        return listed(*args)

    monkeypatch.setattr(fv, "_candidates", counted)
    branches = [{"type": "object", "properties": {f"a{i}": {"$ref": "#/$defs/t"}}, "additionalProperties": False}
                for i in range(16)]
    t = {"oneOf": branches + [{"enum": [[1]]}, {"enum": [[1], [2]]}]}
    normalise_schema({"$defs": {"t": t}, "type": "object", "properties": {"v": {"$ref": "#/$defs/t"}}})
    assert 0 < reads[0] <= 10 * fv._MAX_VISITS
