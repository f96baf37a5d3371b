"""Tool calls in the qwen3_coder format (Qwen3-Coder's and Qwen3.5's XML calls, constrain/xml_calls.py) on the Qwen2
tokenizer with its tag tokens: every call a walk through the mask finishes parses and validates, each value is
written in the form its schema gives it (strings raw, the rest JSON), keywords the format cannot enforce are refused
in strict functions and named otherwise, and the budget rule closes the tags."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import torch

from constrain import ConstraintError, parse_tool_calls, spec_from_request
from constrain.compiler import unenforced_in_client_terms
from constrain.formats import DURATION, URI
from constrain.xml_calls import JSON_FORM, SHAPES, parse_xml_calls, value_form
from tests.conftest import QWEN_TOOL_TAGS, build_qwen3_coder_tokenizer
from tests.constrain.conftest import (LONG_FIRST, OPTIONAL_FIRST,
                                      a_further_call_is_begun_after_a_spelled_close_only_where_one_fits, allowed_ids,
                                      assert_the_tag_is_kept_only_where_its_call_fits, compiling, decode,
                                      may_answer_nothing, offered_walk, random_walk, takes_text, valid_calls)

OPEN_ID = min(QWEN_TOOL_TAGS)
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "description": "A city", "maxLength": 12},
    "unit": {"type": ["string", "null"], "enum": ["celsius", "fahrenheit", None]},
    "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
    "day": {"type": "string", "format": "date"},
    "mail": {"type": "string", "format": "email"},
    "id": {"type": "string", "format": "uuid"},
    "host": {"type": "string", "format": "hostname"},
    "ip": {"type": "string", "format": "ipv4"},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 2},
    "opts": {"type": "object", "properties": {"hot": {"type": "boolean"}}, "required": ["hot"],
             "additionalProperties": False}},
    "required": ["city", "days"], "additionalProperties": False,
    "$defs": {"tag": {"type": "string", "enum": ["rain", "sun"]}}}
NOTE = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": WEATHER}},
         {"type": "function", "function": {"name": "note", "parameters": NOTE}},
         {"type": "function", "function": {"name": "ping"}}]
SCHEMAS = {"get_weather": WEATHER, "note": NOTE, "ping": {"type": "object", "properties": {},
                                                          "additionalProperties": False}}


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    """(tokenizer, vocabulary, compiler) of the Qwen2 tokenizer with `<tool_call>` tokens."""
    with compiling(build_qwen3_coder_tokenizer(tmp_path_factory.mktemp("qwen3-coder")), "qwen2") as found:
        yield found


def _spec(tool_choice, parallel=True, tools=TOOLS, backend=None):
    return spec_from_request(tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel,
                             tool_format="qwen3_coder", backend=backend)


def test_auto_may_answer_nothing(coder):
    _, vocab, compiler = coder
    assert may_answer_nothing(compiler.compile(_spec("auto")), vocab)


def _call(name: str, *params: tuple[str, str]) -> str:
    """One call as the template writes it, each parameter's value already in its written form."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


@pytest.mark.parametrize("tool_choice, parallel", [
    ("required", True), ("required", False), ({"type": "function", "function": {"name": "get_weather"}}, True)])
def test_forced_calls_parse_and_validate(tool_choice, parallel, coder):
    tok, vocab, compiler = coder
    spec = _spec(tool_choice, parallel)
    g = compiler.compile(spec)
    assert g.backend == "llguidance" and g.unenforced == ()
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    g.matcher().fill_bitmask(bitmask, 0)
    assert OPEN_ID in allowed_ids(bitmask).tolist()  # the model's own tag token opens a call
    rng = random.Random(3)
    ended = 0
    for _ in range(8):
        toks, done = random_walk(g, vocab, rng, 160, budget=True, prefer_end=0.5)
        if done:
            ended += 1
            text = decode(vocab, toks)
            assert text.startswith("<tool_call>\n<function=") and text.endswith("</function>\n</tool_call>")
            calls = valid_calls(text, spec, SCHEMAS)
            assert len(calls) == 1 or (parallel and not isinstance(tool_choice, dict))
    assert ended


def test_values_are_written_in_the_form_their_schema_gives_them(coder):
    """Strings raw, checked as raw text (length, enum, pattern, date, e-mail, UUID, IPv4, host name); null as `null`
    where the string may be null; everything else as JSON."""
    tok, _, compiler = coder
    g = compiler.compile(_spec({"type": "function", "function": {"name": "get_weather"}}))
    base = [("city", "Paris"), ("days", "3")]
    cases = [
        ([("city", "Oslo\nNor  ")] + base[1:], True),
        ([("city", "Oslo, Norway, Europe")] + base[1:], False),  # (maxLength 12)
        ([("city", '"Oslo"')] + base[1:], True),  # (a raw string may hold quotes)
        ([("city", "Oslo</parameter>")] + base[1:], False),  # (but never its closing tag)
        (base[:1] + [("unit", "celsius")] + base[1:], True),
        (base[:1] + [("unit", "null")] + base[1:], True),
        (base[:1] + [("unit", '"celsius"')] + base[1:], False),
        (base[:1] + [("unit", "kelvin")] + base[1:], False),
        (base[:1] + [("code", "OSL")] + base[1:], True),
        (base[:1] + [("code", "osl")] + base[1:], False),
        (base[:1] + [("day", "2024-02-29")] + base[1:], True),
        (base[:1] + [("day", "2023-02-29")] + base[1:], False),
        (base[:1] + [("mail", "ann.lee+x@mail.example.co")] + base[1:], True),
        (base[:1] + [("mail", '"a@b.co"')] + base[1:], False),
        (base[:1] + [("mail", "ann..lee@b.co")] + base[1:], False),
        (base[:1] + [("mail", "ann@b")] + base[1:], False),
        (base[:1] + [("id", "123e4567-e89b-12d3-a456-426614174000")] + base[1:], True),
        (base[:1] + [("id", "123e4567e89b12d3a456426614174000")] + base[1:], False),
        (base[:1] + [("ip", "192.168.0.255")] + base[1:], True),
        (base[:1] + [("ip", "192.168.00.1")] + base[1:], False),  # (leading zeros: refused by ipaddress)
        (base[:1] + [("ip", "192.168.0.256")] + base[1:], False),
        (base[:1] + [("ip", '"10.0.0.1"')] + base[1:], False),
        (base[:1] + [("host", "api.example-1.com")] + base[1:], True),
        (base[:1] + [("host", '"example.com"')] + base[1:], False),
        (base[:1] + [("host", "-example.com")] + base[1:], False),
        (base[:1] + [("host", "ex_ample.com")] + base[1:], False),
        (base[:1] + [("host", ".".join(["a" * 63] * 4)[:253])] + base[1:], True),
        (base[:1] + [("host", ".".join(["a" * 63] * 4))] + base[1:], False),  # (254: past RFC 1034's, QA F8)
        (base + [("tags", '["rain", "sun"]'), ("opts", '{"hot": true}')], True),
        (base + [("tags", '["snow"]')], False),
        (base[:1] + [("days", "8")], False),
        (base[:1], False),  # (days is required)
        ([base[1], base[0]], False),  # (declared order)
        (base + [("wind", "3")], False),  # (undeclared parameters are never written)
    ]
    for params, ok in cases:
        assert takes_text(g, tok, _call("get_weather", *params)) == ok, params
    spec = _spec("required")
    args = json.loads(parse_tool_calls(_call("get_weather", ("city", "Oslo\nNor  "), ("unit", "null"),
                                             ("mail", "a@b.co"), ("host", "x.org"), base[1]),
                                       spec).calls[0].arguments)
    assert args == {"city": "Oslo\nNor  ", "unit": None, "mail": "a@b.co", "host": "x.org", "days": 3}


def test_a_reference_into_the_parameters_names_the_same_place_in_a_values_schema(coder):
    """A JSON value is compiled as a schema of its own: `#` (a tree's children) named the parameter rather than
    the parameters (`[[]]` passed for a list of trees, `[{"name": "b"}]` was refused: QA toolfmt2 F1, unsound), and
    `#/properties/a` named nothing (a 400, F2). What such a reference names is copied beside the value."""
    tok, _, compiler = coder
    tree = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3},
                                             "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
                                             "size": {"type": "integer"}, "same": {"$ref": "#/properties/size"}},
            "required": ["name", "kids"], "additionalProperties": False}
    for strict in (True, False):
        tools = [{"type": "function", "function": {"name": "tree", "strict": strict, "parameters": tree}}]
        g = compiler.compile(_spec("required", tools=tools))
        assert g.unenforced == ()
        for kids, ok in (('[{"name": "b", "kids": []}]', True), ('[[]]', False), ('[{"name": "b"}]', False),
                         ('[{"name": "b", "kids": [{"name": "c", "kids": []}]}]', True)):
            assert takes_text(g, tok, _call("tree", ("name", "a"), ("kids", kids))) == ok, kids
        assert takes_text(g, tok, _call("tree", ("name", "a"), ("kids", "[]"), ("same", "4")))
        assert not takes_text(g, tok, _call("tree", ("name", "a"), ("kids", "[]"), ("same", '"x"')))
    # a `$ref` beside a nested `$id` names a place in that resource, which the parameter's document cannot hold:
    # refused where required (it was read at the parameters' root: "abc" passed `maxLength: 1`, QA review10 F2)
    nested = {"type": "object", "required": ["s"], "properties": {"s": {
        "$id": "http://example.com/sub", "$ref": "#/$defs/a", "$defs": {"a": {"type": "string", "maxLength": 1}}}},
        "$defs": {"a": {"type": "string", "maxLength": 5}}}
    for strict in (True, False):
        with pytest.raises(ConstraintError) as exc:
            compiler.compile(_spec("required", tools=[{"type": "function", "function": {
                "name": "f", "strict": strict, "parameters": nested}}]))
        assert exc.value.pointer == "/0/function/parameters/properties/s", exc.value.message
    # nor one whose target refers on inside such a resource (a string was taken for an integer: QA review12 F1)
    through = {"type": "object", "required": ["s"], "properties": {"s": {"$ref": "#/$defs/n/$defs/x"}},
               "$defs": {"n": {"$id": "http://example.com/n", "$defs": {"x": {"$ref": "#/$defs/y"},
                                                                         "y": {"type": "integer"}}},
                         "y": {"type": "string"}}}
    with pytest.raises(ConstraintError) as exc:
        compiler.compile(_spec("required", tools=[{"type": "function", "function": {"name": "f",
                                                                                    "parameters": through}}]))
    assert exc.value.pointer == "/0/function/parameters/properties/s", exc.value.message
    # a `$ref` into such a resource, from outside it, names what it names at the root (QA review11 F1: refused)
    into = {"type": "object", "required": ["b"], "properties": {"b": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
            "$defs": {"n": {"$id": "http://example.com/n", "type": "integer", "maximum": 3}}}
    g = compiler.compile(_spec("required", tools=[{"type": "function", "function": {"name": "f", "strict": True,
                                                                                    "parameters": into}}]))
    assert takes_text(g, tok, _call("f", ("b", "[1, 3]"))) and not takes_text(g, tok, _call("f", ("b", "[4]")))
    # an `$anchor` another parameter declares (a 400 "Anchor 'A' does not exist": QA review9 F5)
    anchored = {"type": "object", "properties": {"a": {"$anchor": "A", "type": "integer", "minimum": 2},
                                                 "b": {"type": "array", "items": {"$ref": "#A"}}},
                "required": ["b"], "additionalProperties": False}
    g = compiler.compile(_spec("required", tools=[{"type": "function", "function": {"name": "f",
                                                                                    "parameters": anchored}}]))
    assert g.unenforced == ()
    for items, ok in (("[2, 3]", True), ("[1]", False), ('["x"]', False)):
        assert takes_text(g, tok, _call("f", ("b", items))) == ok, items


def test_raw_values_match_their_pattern_in_every_regex_dialect(coder):
    """A raw value's pattern is read as JSON-schema patterns are (constrain/pattern_dialects.py): `\\d` takes ASCII
    digits only (as ECMA-262's), `.` no carriage return."""
    codes = {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^\\d{2}$"},
                                              "tag": {"type": "string", "pattern": "^a.c$"}},
             "required": ["zip", "tag"], "additionalProperties": False}
    tok, _, compiler = coder
    tools = [{"type": "function", "function": {"name": "f", "parameters": codes}}]
    g = compiler.compile(_spec("required", tools=tools))
    assert takes_text(g, tok, _call("f", ("zip", "42"), ("tag", "abc")))
    assert not takes_text(g, tok, _call("f", ("zip", "\u0664\u0662"), ("tag", "abc")))  # Arabic-Indic digits
    assert not takes_text(g, tok, _call("f", ("zip", "42"), ("tag", "a\rc")))


def test_ip_uri_and_duration_values_are_raw_text_of_their_rfc_grammars(coder):
    """IPv6 addresses, URIs and durations are written raw, as the template renders them, and only what their RFC's
    grammar (constrain/formats.py) takes; random walks give values that jsonschema's format checks pass."""
    link = {"type": "object", "properties": {"url": {"type": "string", "format": "uri"},
                                             "ip": {"type": "string", "format": "ipv6"},
                                             "every": {"type": "string", "format": "duration"}},
            "required": ["url", "ip", "every"], "additionalProperties": False}
    tok, vocab, compiler = coder
    tools = [{"type": "function", "function": {"name": "fetch", "strict": True, "parameters": link}}]
    spec = _spec("required", tools=tools)
    g = compiler.compile(spec)
    good = [("url", "https://example.com/a?b=c#d"), ("ip", "2001:db8::8a2e:370:7334"), ("every", "P1DT12H")]
    assert takes_text(g, tok, _call("fetch", *good))
    for i, bad in [(0, '"https://example.com"'), (0, "not a uri"), (0, "a:"), (1, "2001:db8:::1"), (1, "10.0.0.1"),
                   (2, "P"), (2, "1D"), (2, "P1.5D")]:
        params = list(good)
        params[i] = (params[i][0], bad)
        assert not takes_text(g, tok, _call("fetch", *params)), bad
    assert json.loads(parse_tool_calls(_call("fetch", *good), spec).calls[0].arguments) == dict(good)
    rng = random.Random(5)
    checker = jsonschema.Draft202012Validator(link, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    ended = 0
    for _ in range(6):
        toks, done = random_walk(g, vocab, rng, 200, budget=True, prefer_end=0.5)
        if done:
            ended += 1
            for call in parse_tool_calls(decode(vocab, toks), spec).calls:
                args = json.loads(call.arguments)
                checker.validate(args)  # (ipv6 by Python's ipaddress; uri and duration where their checkers are)
                assert re.fullmatch(URI, args["url"]) and re.fullmatch(DURATION, args["every"])
    assert ended


def test_value_forms():
    root = {"$defs": {"s": {"type": "string"}}}
    assert value_form({"type": "string"}, root).raw
    assert value_form({"$ref": "#/$defs/s", "description": "x"}, root).raw
    assert value_form({"enum": ["a", "b"]}, root).raw
    assert value_form({"type": ["string", "null"]}, root).nullable
    assert not value_form({"type": ["string", "null"], "enum": ["a", "b"]}, root).nullable  # (null not in enum)
    # keywords JSON Schema does not define assert nothing: such a string is raw as the template writes it (QA
    # toolfmt2 F6: OpenAPI's `nullable` and `example` put it in quotes)
    for schema in ({"type": "string", "nullable": True}, {"type": "string", "example": "x", "x-order": 1},
                   {"$ref": "#/$defs/s", "examples": ["a"], "x-kind": "id"}, {"type": "string", "format": "password"}):
        assert value_form(schema, root).raw, schema
        assert not value_form(schema, root).nullable
    for schema in ({"type": "integer"}, {"type": ["string", "integer"]}, {"enum": ["a", 1]}, {},
                   {"type": "string", "format": "regex"}, {"type": "string", "pattern": "(a)\\1"},
                   {"anyOf": [{"type": "string"}]}, True):
        assert value_form(schema, root) == JSON_FORM, schema


def test_a_string_that_is_not_nullable_may_be_the_text_null(coder):
    tok, _, compiler = coder
    spec = _spec({"type": "function", "function": {"name": "note"}})
    assert takes_text(compiler.compile(spec), tok, _call("note", ("text", "null")))
    assert json.loads(parse_tool_calls(_call("note", ("text", "null")), spec).calls[0].arguments) == {"text": "null"}


def test_auto_takes_text_calls_or_text_then_calls(coder):
    tok, _, compiler = coder
    spec = _spec("auto")
    g = compiler.compile(spec)
    call = _call("note", ("text", "hi"))
    for text, ok, content in [("It is sunny.", True, None), (call, True, None),
                              ("Let me note it.\n\n" + call, True, "Let me note it."),
                              ("Text then " + _call("launch"), False, None),
                              (" \n" + call, True, None)]:  # (whitespace alone is text too)
        assert takes_text(g, tok, text) == ok, text
        parsed = parse_tool_calls(text, spec) if ok else None
        assert (parsed is not None) == (ok and call in text)
        if parsed is not None:
            assert parsed.content == content and [c.name for c in parsed.calls] == ["note"]
    spelled = tok.encode("Sure: <") + tok.encode("tool_call>")
    assert OPEN_ID not in spelled
    m = g.matcher()
    assert not all(m.accept(t) for t in spelled)  # text never spells a tag out


def test_a_call_after_text_is_steered_to_a_function_that_fits(coder):
    """The completion after the tag goes through the function the walk comes to first, here the longest: where only
    the short one fits, the tag was replaced by EOS (helper-22's review). Now each function's shortest call is
    measured, and a call begun is steered to one that fits though the model leans to the long one."""
    tok, vocab, compiler = coder
    spec = _spec("auto", tools=LONG_FIRST)
    g = compiler.compile(spec)
    text = tok.encode(" some words before the call")
    written = offered_walk(g, vocab, text, [OPEN_ID] + tok.encode('\n<function=alpha_long_function>\n'), 24)
    assert written[0] == OPEN_ID
    calls = parse_tool_calls(decode(vocab, text + written), spec)
    assert calls is not None and calls.calls and all((c.name, c.arguments) == ("z", "{}") for c in calls.calls)


def test_a_call_is_begun_after_text_only_where_it_can_close(coder):
    """Under tool_choice "auto" the call tag takes the completion from nothing (the text may end) to a whole call:
    it is vetted at any distance from the limit, not only near it. Seen on a GPU: a call begun 19 tokens before
    `max_tokens` was cut, its arguments `{"path": "...` and finish_reason length."""
    tok, vocab, compiler = coder
    move = {"type": "object", "properties": {"src": {"type": "string", "maxLength": 8},
                                             "dst": {"type": "string", "maxLength": 8}},
            "required": ["src", "dst"], "additionalProperties": False}
    spec = _spec("auto", tools=[{"type": "function", "function": {"name": "move_file", "parameters": move}}])
    g = compiler.compile(spec)  # (a grammar of its own: no growth learned from other tests' outputs)
    assert_the_tag_is_kept_only_where_its_call_fits(g, tok, vocab, OPEN_ID)


def test_calls_close_within_a_tight_budget(coder):
    """The budget rule (issue #3, item 9) ends raw values and closes the tags: every walk ends as a complete
    call, though the random walk writes long raw strings."""
    _, vocab, compiler = coder
    spec = _spec({"type": "function", "function": {"name": "get_weather"}})
    g = compiler.compile(spec)
    shortest = g.matcher().min_tokens_to_end()
    assert shortest is not None and shortest < 40
    rng = random.Random(2)
    for _ in range(6):
        toks, done = random_walk(g, vocab, rng, 48, budget=True)
        assert done
        assert len(valid_calls(decode(vocab, toks), spec, SCHEMAS)) == 1


def test_raw_values_with_a_format_or_pattern_close_within_a_tight_budget(coder):
    """A raw `email` or pattern value that a walk keeps writing is finished by an example of its pattern before
    the value's closing tag (as a JSON string is before its quote): such calls ran to `max_tokens`, cut."""
    contact = {"type": "object", "properties": {"email": {"type": "string", "format": "email"},
                                                "handle": {"type": "string", "pattern": "^[a-z]+@[a-z]+$"}},
               "required": ["email", "handle"], "additionalProperties": False}
    _, vocab, compiler = coder
    tools = [{"type": "function", "function": {"name": "contact", "parameters": contact}}]
    spec = _spec({"type": "function", "function": {"name": "contact"}}, tools=tools)
    g = compiler.compile(spec)
    rng = random.Random(3)
    for _ in range(6):
        toks, done = random_walk(g, vocab, rng, 60, budget=True)
        assert done
        assert len(valid_calls(decode(vocab, toks), spec, {"contact": contact})) == 1


def _refused_when_strict_and_named_otherwise(compiler, parameters: dict, pointer: str, before: tuple = ()) -> str:
    """A strict function of `parameters` (after the tools `before` it) is a 400 naming `pointer`, in terms of
    `tools`; not strict, the function is served with `pointer` named unenforced. The 400's message."""
    for strict in (True, False):
        tools = [*before, {"type": "function", "function": {"name": "f", "strict": strict, "parameters": parameters}}]
        spec = _spec("required", tools=tools)
        if strict:
            with pytest.raises(ConstraintError) as exc:
                compiler.compile(spec)
            assert exc.value.param == "tools" and exc.value.pointer == pointer, exc.value.message
            message = exc.value.message
        else:
            assert unenforced_in_client_terms(spec, compiler.compile(spec)) == (pointer,)
    return message


def test_keywords_the_format_cannot_enforce_are_refused_when_strict_and_named_otherwise(coder):
    """`uniqueItems` is enforced by a check that follows JSON outputs, not this format: a strict function gets a
    400 with the keyword's pointer in terms of `tools`; a function that is not strict gets it named. So do
    keywords about the parameters object beyond its properties."""
    _, _, compiler = coder
    params = {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "integer"},
                                                       "uniqueItems": True}},
              "required": ["ids"], "additionalProperties": False}
    _refused_when_strict_and_named_otherwise(compiler, params, "/1/function/parameters/properties/ids/uniqueItems",
                                             before=(TOOLS[2],))
    # (a pattern's schema that asserts something: one that asserts nothing beside open other names says nothing)
    loose = {"type": "object", "properties": {"a": {"type": "string"}},
             "patternProperties": {"^x": {"type": "integer"}}}
    spec = _spec("required", tools=[{"type": "function", "function": {"name": "f", "parameters": loose}}])
    assert unenforced_in_client_terms(spec, compiler.compile(spec)) == ("/0/function/parameters/patternProperties",)
    # one in the parameters' `$defs` is named there, not at the `$ref` to it (QA toolfmt2 F5)
    listed = {"type": "object", "properties": {"v": {"$ref": "#/$defs/L"}}, "required": ["v"],
              "additionalProperties": False, "$defs": {"L": {"type": "array", "uniqueItems": True}}}
    _refused_when_strict_and_named_otherwise(compiler, listed, "/0/function/parameters/$defs/L/uniqueItems")
    # keywords JSON Schema does not define assert nothing: OpenAPI's beside the parameters are no refusal
    openapi = {**params, "discriminator": {"propertyName": "ids"}, "x-order": 1, "nullable": False}
    tools = [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        **openapi, "properties": {"ids": {"type": "array", "items": {"type": "integer"}}}}}}]
    assert compiler.compile(_spec("required", tools=tools)).unenforced == ()
    # A oneOf whose branches overlap, in a JSON value: llguidance enforces it as anyOf only (before, a 400 that
    # passed on llguidance's words about an option of its own, even where the function was not strict).
    overlapping = {"type": "object", "properties": {"v": {"oneOf": [{"type": "integer"}, {"type": "number"}]}},
                   "required": ["v"], "additionalProperties": False}
    assert "oneOf" in _refused_when_strict_and_named_otherwise(compiler, overlapping,
                                                               "/0/function/parameters/properties/v/oneOf")


def test_a_parameter_every_value_of_which_holds_the_closing_tag_is_refused_or_left_out(coder):
    """A raw value ends at `</parameter>`: a parameter whose only values hold it could not be written, and the
    answer failed midway with a 400 `constraint_too_complex`, after the call had begun (QA toolformats). A required
    one is refused before any token, with its pointer; an optional one is left out of the calls."""
    tok, vocab, compiler = coder
    closing = {"type": "string", "enum": ["a</parameter>b"]}
    params = {"type": "object", "properties": {"text": closing}, "required": ["text"], "additionalProperties": False}
    with pytest.raises(ConstraintError) as exc:
        compiler.compile(_spec("required", tools=[{"type": "function", "function": {"name": "f",
                                                                                     "parameters": params}}]))
    assert exc.value.pointer == "/0/function/parameters/properties/text" and exc.value.code == "unsupported_schema"
    optional = {"type": "object", "properties": {"text": closing, "n": {"type": "integer"}}, "required": ["n"],
                "additionalProperties": False}
    spec = _spec("required", tools=[{"type": "function", "function": {"name": "f", "parameters": optional}}])
    g = compiler.compile(spec)
    for seed in range(4):
        toks, ended = random_walk(g, vocab, random.Random(seed), 60, budget=True)
        assert ended and "<parameter=text>" not in decode(vocab, toks)
    assert value_form({"type": ["string", "null"], "enum": ["</parameter>", None]}, {}).writable("</parameter>")


def test_the_outlines_backend_is_refused(coder):
    _, _, compiler = coder
    with pytest.raises(ConstraintError) as exc:
        compiler.compile(_spec("required", backend="outlines"))
    assert exc.value.param == "tools" and "llguidance" in exc.value.message


QWEN = SHAPES["qwen3_coder"]


def test_parser_reads_only_whole_calls():
    forms = {"f": {"a": value_form({"type": "string"}, {})}}
    call = _call("f", ("a", "x\n"))
    assert parse_xml_calls(call, forms, QWEN) == \
        ([{"name": "f", "arguments": {"a": "x\n"}, "arguments_text": '{"a": "x\\n"}'}], None)
    assert parse_xml_calls("plain text", forms, QWEN) is None
    assert parse_xml_calls(call[:-3], forms, QWEN) is None  # (cut short by max_tokens: the whole text is content)
    assert parse_xml_calls(call + "\nmore text", forms, QWEN) is None
    assert parse_xml_calls(_call("g"), forms, QWEN) is None  # (an unknown function)
    assert parse_xml_calls(_call("f", ("b", "1")), forms, QWEN) is None  # (an unknown parameter)
    two = parse_xml_calls("  Text.\n\n" + call + "\n" + _call("f") + "\n", forms, QWEN)
    assert two == ([{"name": "f", "arguments": {"a": "x\n"}, "arguments_text": '{"a": "x\\n"}'},
                    {"name": "f", "arguments": {}, "arguments_text": "{}"}], "  Text.")


def test_a_repeated_spec_is_served_from_the_cache(coder):
    _, _, compiler = coder
    spec = _spec({"type": "function", "function": {"name": "note"}})
    first = compiler.compile(spec)
    hits = compiler.stats.cache_hits
    assert compiler.compile(spec) is first and compiler.stats.cache_hits == hits + 1


_LONG_B = {"properties": {"b": {"maxLength": 2}}}  # (a second schema for `b`: no argument list holds both)


@pytest.mark.parametrize("extra, named", [
    ({"dependentSchemas": {"a": _LONG_B}, "minProperties": 1}, ["dependentSchemas", "minProperties"]),
    ({"dependencies": {"a": _LONG_B}}, ["dependencies"]),  # (draft 7's spelling: QA toolreal F1)
    ({"allOf": [_LONG_B]}, ["allOf"]),
    ({"minProperties": 1, "required": ["a"]}, []),  # (implied by `required`: enforced, not named)
    # written as one argument list per variant of the rewrite's `anyOf` (QA xmlanyof): enforced, not named
    ({"dependentRequired": {"a": ["b"]}, "minProperties": 1}, []),
    ({"maxProperties": 1}, []),
    ({"dependencies": {"a": ["b"]}}, []),
    ({"dependencies": {"a": {"required": ["b"]}}}, []),
    ({"dependentSchemas": {"a": {"required": ["b"]}}}, []),
    ({"if": {"required": ["a"]}, "then": {"required": ["b"]}}, []),
    # (`a` is held to the root's schema and to the rewrite's pattern for "not x" both: QA xmlreal F2)
    ({"if": {"properties": {"a": {"const": "x"}}, "required": ["a"]}, "then": {"required": ["b"]}}, []),
    ({"not": {"properties": {"a": {"const": "x"}}, "required": ["a"]}}, []),
    ({"not": {"required": ["a"]}}, []),
    ({"allOf": [{"required": ["a"]}]}, []),
])
def test_root_keywords_the_rewrite_folds_into_allof_are_named_as_the_client_wrote_them(extra, named, coder):
    """The rewrite folds such root keywords into one `allOf`, which named only `/0/function/parameters`, in the
    strict 400 and in the unenforced list (QA toolfmt2 F4): each is named as the keyword itself; one the rewrite
    drops as implied is enforced, and named nowhere; so is one whose rewrite argument lists write exactly."""
    _, vocab, compiler = coder
    params = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
              "additionalProperties": False, **extra}
    pointers = tuple(f"/0/function/parameters/{k}" for k in named)
    for strict in (True, False):
        spec = _spec("required", tools=[{"type": "function", "function": {"name": "f", "strict": strict,
                                                                          "parameters": params}}])
        if strict and named:
            with pytest.raises(ConstraintError) as exc:
                compiler.compile(spec)
            assert exc.value.pointer == pointers[0] and exc.value.code == "unsupported_schema"
            assert "equivalent form" not in exc.value.message
        else:
            g = compiler.compile(spec)
            assert sorted(unenforced_in_client_terms(spec, g)) == sorted(pointers)
            if not named:
                rng = random.Random(4)
                for _ in range(6):
                    toks, done = random_walk(g, vocab, rng, 40, budget=True, prefer_end=0.4)
                    assert done
                    valid_calls(decode(vocab, toks), spec, {"f": params})


# (beyond argument lists: `properties: {d: {maximum: 3}}` is now written, `d` held to both its schemas)
_SMALL_D = {"patternProperties": {"^d": {"maximum": 3}}}


@pytest.mark.parametrize("first, second", [
    ({"dependencies": {"c": _SMALL_D}}, {"dependentSchemas": {"c": _SMALL_D}}),
    ({"dependentSchemas": {"c": _SMALL_D}}, {"dependencies": {"c": _SMALL_D}}),
])
def test_a_root_keyword_is_named_as_each_request_wrote_it_where_the_grammar_is_shared(first, second, coder):
    """Two spellings that rewrite alike share one grammar, which kept the first request's keyword: the second
    was told `/1/function/parameters`, and the keyword it wrote nowhere (QA fixptr F2, after QA toolreal F1).
    Each request's own keyword is named, and the grammar is still compiled once."""
    _, _, compiler = coder
    pointers, grammars = [], []
    for extra in (first, second):
        params = {"type": "object", "properties": {"c": {"type": "string"}, "d": {"type": "number"}}, **extra}
        spec = _spec("required", tools=[TOOLS[2], {"type": "function", "function": {"name": "f",
                                                                                    "parameters": params}}])
        grammars.append(compiler.compile(spec))
        pointers.append(unenforced_in_client_terms(spec, grammars[-1]))
    assert grammars[0] is grammars[1]
    assert pointers == [(f"/1/function/parameters/{next(iter(first))}",),
                        (f"/1/function/parameters/{next(iter(second))}",)]


@pytest.mark.parametrize("keyword", [{"dependentRequired": {"a": ["b"]}}, {"minProperties": 1},
                                     {"not": {"required": ["a"]}}])
def test_a_closed_nested_object_whose_keywords_the_rewrite_writes_as_members_is_served(keyword, coder):
    """The rewrite writes these as `allOf`/`anyOf` members such as `{"properties": {"a": false}}`, which took the
    object for one open to other keys: a 400 advising the `additionalProperties: false` it declared (QA toolfmt2
    F3). llguidance merges the members into the closed object: served, nothing unenforced. Open, the advice names
    the object."""
    _, _, compiler = coder
    inner = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, **keyword}
    for closed in (True, False):
        o = {**inner, "additionalProperties": False} if closed else inner
        params = {"type": "object", "properties": {"o": o}, "required": ["o"], "additionalProperties": False}
        spec = _spec("required", tools=[{"type": "function", "function": {"name": "f", "strict": True,
                                                                          "parameters": params}}])
        if closed:
            assert unenforced_in_client_terms(spec, compiler.compile(spec)) == ()
        else:
            with pytest.raises(ConstraintError) as exc:
                compiler.compile(spec)
            assert exc.value.pointer == "/0/function/parameters/properties/o"
            assert "additionalProperties: false there" in exc.value.message


_A = {"properties": {"a": {"type": "string", "maxLength": 5}}, "required": ["a"]}
_B = {"properties": {"b": {"type": "integer", "minimum": 1}}, "required": ["b"]}
_CAT = {"type": "object", "properties": {"kind": {"const": "cat", "type": "string"}, "lives": {"type": "integer"}},
        "required": ["kind", "lives"], "additionalProperties": False}
_DOG = {"type": "object", "properties": {"kind": {"const": "dog", "type": "string"}, "name": {"type": "string"}},
        "required": ["kind"], "additionalProperties": False}


@pytest.mark.parametrize("tool_format", ["qwen3_coder", "glm47"])
@pytest.mark.parametrize("parameters, keys", [
    ({"type": "object", "anyOf": [_A, _B]}, [("a",), ("b",)]),
    ({"type": "object", "oneOf": [_A, _B]}, [("a",), ("b",)]),  # (no object both write: a oneOf)
    ({"anyOf": [{"type": "object", **_A, "additionalProperties": False},
                {"type": "object", **_B, "additionalProperties": False}]}, [("a",), ("b",)]),
    # pydantic's discriminated union: a oneOf of `$ref`s whose `kind` consts differ
    ({"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "$defs": {"Cat": _CAT, "Dog": _DOG}},
     [("kind",), ("kind", "lives"), ("kind", "name")]),
    ({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
      "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, [("a",), ("a", "b"), ("b",)]),
    # a closed root: a branch that requires a key it closes out takes no object
    ({"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}}, "additionalProperties": False,
      "anyOf": [_A, _B]}, [("a",)]),
    # the rewrite's exact `anyOf` for a `oneOf` of required keys: the branches' `properties: {"b": false}`
    ({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
      "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}, [("a",), ("b",)]),
])
def test_a_union_of_objects_at_the_root_is_written_as_one_argument_list_per_branch(parameters, keys, tool_format,
                                                                                     coder):
    """A root `anyOf`/`oneOf` of objects (pydantic's and zod's unions) was refused in strict functions and, in the
    others, served as the root's own properties alone: none in these, so every call was `{}`, which no branch
    takes (QA xmlanyof F1). Each branch is now one argument list: strict or not, nothing is unenforced and every
    call validates."""
    _, vocab, compiler = coder
    for strict in (True, False):
        tools = [{"type": "function", "function": {"name": "f", "strict": strict, "parameters": parameters}}]
        for choice in ("required", {"type": "function", "function": {"name": "f"}}):
            spec = spec_from_request(tools=tools, tool_choice=choice, tool_format=tool_format)
            g = compiler.compile(spec)
            assert unenforced_in_client_terms(spec, g) == ()
            rng, seen = random.Random(5), set()
            for _ in range(10):
                toks, done = random_walk(g, vocab, rng, 60, budget=True, prefer_end=0.4)
                assert done
                seen |= {tuple(sorted(json.loads(c.arguments)))
                         for c in valid_calls(decode(vocab, toks), spec, {"f": parameters})}
            assert seen <= set(keys) and len(seen) >= min(2, len(keys))


def test_a_union_argument_lists_cannot_write_exactly_is_refused_when_strict_and_named_otherwise(coder):
    """A `oneOf` whose branches may both take one object is written as `anyOf`: refused when strict, else named.
    A union whose branches hold one key in two forms (raw text and JSON: the parser could not tell which was
    written) or keywords beyond `properties` and `required` is refused as before."""
    _, vocab, compiler = coder
    overlapping = {"type": "object", "oneOf": [_A, {"properties": {**_A["properties"], **_B["properties"]},
                                                    "required": ["a"]}]}
    _refused_when_strict_and_named_otherwise(compiler, overlapping, "/0/function/parameters/oneOf")
    spec = _spec("required", tools=[{"type": "function", "function": {"name": "f", "parameters": overlapping}}])
    g, rng = compiler.compile(spec), random.Random(2)
    for _ in range(8):  # (held to the anyOf it was written as)
        toks, done = random_walk(g, vocab, rng, 40, budget=True, prefer_end=0.4)
        assert done
        valid_calls(decode(vocab, toks), spec, {"f": {"type": "object", "anyOf": overlapping["oneOf"]}})
    two_forms = {"type": "object", "anyOf": [_A, {"properties": {"a": {"type": "integer"}}, "required": ["a"]}]}
    _refused_when_strict_and_named_otherwise(compiler, two_forms, "/0/function/parameters/anyOf")
    counted = {"type": "object", "anyOf": [_A, {**_B, "maxProperties": 1}]}
    _refused_when_strict_and_named_otherwise(compiler, counted, "/0/function/parameters/anyOf")


# A discriminated union as real schemas write one (jsonschemabench Github_easy o10013, o75096): the root declares
# each property, and each `oneOf` branch narrows some of them (a `const` for `action`, a `minimum` for `count`)
_ACTIONS = {"type": "object", "properties": {"action": {"type": "string"},
                                             "name": {"type": "string", "maxLength": 6},
                                             "count": {"type": "integer", "maximum": 9}},
            "required": ["action"], "additionalProperties": False,
            "oneOf": [{"properties": {"action": {"const": "create"}, "name": {"type": "string", "minLength": 2}},
                       "required": ["name"]},
                      {"properties": {"action": {"enum": ["delete", "drop"]}, "count": {"minimum": 1}},
                       "required": ["count"]}]}


@pytest.mark.parametrize("tool_format", ["qwen3_coder", "glm47"])
def test_a_union_whose_branches_narrow_the_root_properties_is_written_exactly(tool_format, coder):
    """A key the root and a branch both declare, under two schemas, made the union inexpressible: a strict function
    was a 400 and the others were served with the `oneOf` unenforced (QA xmlreal F2). Its value is now held to
    both schemas: strict or not, nothing is unenforced, every call validates, both branches are written, and a
    value one of the two schemas refuses is not."""
    tok, vocab, compiler = coder
    for strict in (True, False):
        tools = [{"type": "function", "function": {"name": "f", "strict": strict, "parameters": _ACTIONS}}]
        spec = spec_from_request(tools=tools, tool_choice="required", tool_format=tool_format)
        g = compiler.compile(spec)
        assert unenforced_in_client_terms(spec, g) == ()
        rng, seen = random.Random(7), set()
        for _ in range(16):
            toks, done = random_walk(g, vocab, rng, 60, budget=True, prefer_end=0.4)
            assert done
            seen |= {json.loads(c.arguments)["action"] for c in valid_calls(decode(vocab, toks), spec, {"f": _ACTIONS})}
        assert "create" in seen and seen & {"delete", "drop"}
    if tool_format == "qwen3_coder":
        assert takes_text(g, tok, _call("f", ("action", "create"), ("name", "abc")))
        assert takes_text(g, tok, _call("f", ("action", "drop"), ("count", "9")))
        assert not takes_text(g, tok, _call("f", ("action", "update"), ("name", "abc")))  # (no branch's const)
        assert not takes_text(g, tok, _call("f", ("action", "create"), ("name", "a")))  # (the branch's minLength)
        assert not takes_text(g, tok, _call("f", ("action", "create"), ("name", "abcdefg")))  # (the root's maxLength)
        assert not takes_text(g, tok, _call("f", ("action", "drop"), ("count", "0")))  # (the branch's minimum)
        assert not takes_text(g, tok, _call("f", ("action", "drop"), ("count", "10")))  # (the root's maximum)
        assert not takes_text(g, tok, _call("f", ("action", "create"), ("count", "1")))  # (a oneOf: one branch)


def test_a_key_no_value_takes_in_both_schemas_rules_out_its_branch(coder):
    """A key whose two schemas no value takes (a string and an integer) made the whole union inexpressible: the
    branch that requires it takes no object, and the others are written exactly; where no branch is left, the
    union is refused as before (a 400 when strict, else named)."""
    _, vocab, compiler = coder
    parameters = {"type": "object", "properties": {"a": {"type": "string"}},
                  "anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}, _B]}
    for strict in (True, False):
        tools = [{"type": "function", "function": {"name": "f", "strict": strict, "parameters": parameters}}]
        spec = _spec("required", tools=tools)
        g = compiler.compile(spec)
        assert unenforced_in_client_terms(spec, g) == ()
        rng = random.Random(1)
        for _ in range(8):
            toks, done = random_walk(g, vocab, rng, 40, budget=True, prefer_end=0.4)
            assert done
            assert all("b" in json.loads(c.arguments)
                       for c in valid_calls(decode(vocab, toks), spec, {"f": parameters}))
    none_left = {"type": "object", "properties": {"a": {"type": "string"}},
                 "allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}]}
    _refused_when_strict_and_named_otherwise(compiler, none_left, "/0/function/parameters/allOf")


def test_a_closed_object_a_branch_narrows_is_no_open_object(coder):
    """A root's closed object (`additionalProperties: false`) that a branch narrows with `required` is checked as
    the `allOf` of both: the branch's member, which names keys, was taken for an object open to other keys, a 400
    in a strict function, though llguidance merges it into the closed one. Served, with nothing unenforced."""
    tok, vocab, compiler = coder
    opts = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
            "additionalProperties": False}
    parameters = {"type": "object", "properties": {"k": {"type": "string"}, "opts": opts}, "required": ["k", "opts"],
                  "oneOf": [{"properties": {"k": {"const": "a"}, "opts": {"required": ["x"]}}},
                            {"properties": {"k": {"const": "b"}, "opts": {"required": ["y"]}}}]}
    tools = [{"type": "function", "function": {"name": "f", "strict": True, "parameters": parameters}}]
    spec = _spec("required", parallel=False, tools=tools)
    g = compiler.compile(spec)
    assert unenforced_in_client_terms(spec, g) == ()
    rng = random.Random(2)
    for _ in range(8):
        toks, done = random_walk(g, vocab, rng, 60, budget=True, prefer_end=0.4)
        assert done
        valid_calls(decode(vocab, toks), spec, {"f": parameters})
    assert takes_text(g, tok, _call("f", ("k", "a"), ("opts", '{"x": 1}')))
    assert not takes_text(g, tok, _call("f", ("k", "a"), ("opts", '{"y": 1}')))
    assert not takes_text(g, tok, _call("f", ("k", "a"), ("opts", '{"\\u0078": 1}')))


@pytest.mark.parametrize("parameters, pointer", [
    # (in the branch's schema of a key the root declares too)
    ({"type": "object", "properties": {"k": {"type": "string"}, "ids": {"type": "array", "items": {"type": "integer"}}},
      "required": ["k"], "oneOf": [
          {"properties": {"k": {"const": "x"}, "ids": {"uniqueItems": True}}, "required": ["ids"]},
          {"properties": {"k": {"const": "y"}}}]},
     "/0/function/parameters/oneOf/0/properties/ids/uniqueItems"),
    # (in the root's)
    ({"type": "object", "properties": {"k": {"type": "string"}, "ids": {"type": "array", "uniqueItems": True}},
      "required": ["k"], "oneOf": [
          {"properties": {"k": {"const": "x"}, "ids": {"maxItems": 2}}, "required": ["ids"]},
          {"properties": {"k": {"const": "y"}}}]},
     "/0/function/parameters/properties/ids/uniqueItems"),
    # (in a definition the branch's schema refers to)
    ({"type": "object", "properties": {"k": {"type": "string"}, "ids": {"type": "array", "maxItems": 3}},
      "required": ["k"], "$defs": {"L": {"uniqueItems": True}}, "oneOf": [
          {"properties": {"k": {"const": "x"}, "ids": {"$ref": "#/$defs/L"}}, "required": ["ids"]},
          {"properties": {"k": {"const": "y"}}}]},
     "/0/function/parameters/$defs/L/uniqueItems"),
])
def test_a_keyword_of_one_of_a_keys_schemas_is_named_where_the_client_wrote_it(parameters, pointer, coder):
    """Where a key's value is held to the root's schema and a branch's, a keyword of either that this format cannot
    enforce is refused in a strict function, and named in the others, at its place in the client's schema."""
    _, _, compiler = coder
    _refused_when_strict_and_named_otherwise(compiler, parameters, pointer)


_OPEN = {"type": "object", "properties": {"x": {"type": "string"}}}  # (keys this format cannot keep unescaped)
_M = {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"], "additionalProperties": False}
_TREE = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3},
                                          "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
         "required": ["name", "kids"], "additionalProperties": False}


@pytest.mark.parametrize("tool_format", ["qwen3_coder", "glm47"])
@pytest.mark.parametrize("parameters", [
    # pydantic's discriminated union of its (open) models: `lives`, an integer, is JSON; `Dog` was checked with it
    {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
     "$defs": {"Cat": {k: v for k, v in _CAT.items() if k != "additionalProperties"},
               "Dog": {**{k: v for k, v in _DOG.items() if k != "additionalProperties"}, "required": ["kind", "name"]}}},
    # definitions no parameter reaches (shared across tools), beside ones one does, through another
    {"type": "object", "properties": {"n": {"type": "integer"}, "m": {"$ref": "#/$defs/W"}}, "required": ["n", "m"],
     "additionalProperties": False, "$defs": {"W": {"$ref": "#/$defs/M"}, "M": _M, "U": _OPEN,
                                              "L": {"type": "array", "uniqueItems": True}}},
    {"type": "object", "properties": {"m": {"$ref": "#/definitions/M"}}, "required": ["m"],
     "additionalProperties": False, "definitions": {"M": _M, "U": _OPEN}},
    # `#` (a tree's children): the parameters copied beside the value held every definition too
    {**_TREE, "$defs": {"U": _OPEN}},
    # a nested `$id` whose references the document could not follow, in a definition the parameter never reaches
    {"type": "object", "properties": {"m": {"$ref": "#/$defs/M"}}, "required": ["m"], "additionalProperties": False,
     "$defs": {"M": _M, "N": {"$id": "http://example.com/n", "$ref": "#/$defs/y", "$defs": {"y": {"type": "string"}}}}},
])
def test_a_parameter_is_checked_against_only_the_definitions_it_reaches(parameters, tool_format, coder):
    """A JSON value's schema is compiled as a document of its own, with the parameters' `$defs` beside it: every one
    of them, so a definition the parameter never reaches, that this format cannot enforce (an open object), refused
    a strict function and was named in the others (QA xmlanyof F2), though no call writes it. The JSON formats
    (hermes, the reference) serve these with nothing unenforced; so do these formats now, and every call validates."""
    _, vocab, compiler = coder
    for strict in (True, False):
        tools = [{"type": "function", "function": {"name": "f", "strict": strict, "parameters": parameters}}]
        for fmt in ("hermes", tool_format):
            spec = spec_from_request(tools=tools, tool_choice="required", tool_format=fmt)
            g = compiler.compile(spec)
            assert unenforced_in_client_terms(spec, g) == (), fmt
        assert spec.tool_format == tool_format
        rng = random.Random(3)
        for _ in range(6):
            toks, done = random_walk(g, vocab, rng, 60, budget=True, prefer_end=0.4)
            assert done
            valid_calls(decode(vocab, toks), spec, {"f": parameters})


def test_a_definition_a_parameter_reaches_is_still_refused_when_strict_and_named_otherwise(coder):
    """Reached through another definition, or from the copy of the parameters a `#` brings along, what this format
    cannot enforce is refused in strict functions and named in the others, where it is in the client's schema."""
    _, _, compiler = coder
    through = {"type": "object", "properties": {"n": {"type": "integer"}, "m": {"$ref": "#/$defs/M"}},
               "required": ["n", "m"], "additionalProperties": False,
               "$defs": {"M": {**_M, "properties": {"k": {"$ref": "#/$defs/U"}}}, "U": _OPEN}}
    _refused_when_strict_and_named_otherwise(compiler, through, "/0/function/parameters/$defs/U")
    listed = {**through, "$defs": {**through["$defs"], "U": {"type": "array", "uniqueItems": True}}}
    _refused_when_strict_and_named_otherwise(compiler, listed, "/0/function/parameters/$defs/U/uniqueItems")
    tree = {**_TREE, "properties": {**_TREE["properties"], "u": {"$ref": "#/$defs/U"}}, "$defs": {"U": _OPEN}}
    _refused_when_strict_and_named_otherwise(compiler, tree, "/0/function/parameters/$defs/U")


@pytest.mark.parametrize("parameters, pointer", [
    ({"type": "object", "properties": {"k": {"type": "integer"}, "z": {"type": "integer"}},
      "allOf": [{"oneOf": [{"properties": {"z": {"type": "integer"}}, "required": ["z"]},
                           {"properties": {"k": {"type": "integer"}}, "required": ["k"]}]}]},
     "/0/function/parameters/allOf/0/oneOf"),
    ({"type": "object", "properties": {"k": {"type": "integer"}, "z": {"type": "integer"}}, "$ref": "#/$defs/U",
      "$defs": {"U": {"oneOf": [{"properties": {"z": {"type": "integer"}}, "required": ["z"]},
                                {"properties": {"k": {"type": "integer"}}, "required": ["k"]}]}}},
     "/0/function/parameters/$defs/U/oneOf"),
])
def test_a_oneof_is_told_apart_with_the_keys_declared_beside_it(parameters, pointer, coder):
    """A `oneOf` whose branches each lack a key the other requires was kept exact from its branches alone, but a
    key declared beside it (a sibling `allOf` member, the object that refers to it) may stand in either branch's
    calls: `{"k": 1, "z": 1}` was written, which both branches take, in a strict function with nothing unenforced
    (QA review16 F1). Such a `oneOf` is now enforced as `anyOf`: refused when strict, else named."""
    tok, vocab, compiler = coder
    with pytest.raises(ConstraintError) as exc:
        compiler.compile(_spec("required", tools=[{"type": "function", "function": {
            "name": "f", "strict": True, "parameters": parameters}}]))
    assert exc.value.param == "tools" and exc.value.pointer == pointer, exc.value.message
    spec = _spec("required", tools=[{"type": "function", "function": {"name": "f", "parameters": parameters}}])
    g = compiler.compile(spec)
    assert pointer in unenforced_in_client_terms(spec, g)
    assert takes_text(g, tok, _call("f", ("k", "1"), ("z", "1")))


@pytest.mark.parametrize("tool_format", ["qwen3_coder", "glm47"])
def test_a_json_value_the_grammar_opens_with_a_space_is_read(tool_format, coder):
    """Where a union's argument lists write one key under two JSON rules, llguidance's `%json`s take a space before
    the value; the parser read JSON from the value's first character and refused it, so an answer the grammar took
    did not parse (QA review16 F2). JSON's whitespace before the value is now read past."""
    tok, vocab, compiler = coder
    parameters = {"anyOf": [{"properties": {"z": {"type": "integer"}}, "required": ["z"]},
                            {"properties": {"z": {"type": "integer"}, "q": {"type": "integer"}},
                             "required": ["z", "q"]}]}
    spec = spec_from_request(tools=[{"type": "function", "function": {"name": "f", "strict": True,
                                                                     "parameters": parameters}}],
                             tool_choice="required", tool_format=tool_format)
    g = compiler.compile(spec)
    text = _call("f", ("z", " 1")) if tool_format == "qwen3_coder" else \
        "<tool_call>f<arg_key>z</arg_key><arg_value> 1</arg_value></tool_call>"
    if takes_text(g, tok, text):  # (as llguidance does now; the parser reads what it takes either way)
        parsed = parse_tool_calls(text, spec)
        assert parsed is not None and [json.loads(c.arguments) for c in parsed.calls] == [{"z": 1}]
    rng = random.Random(3)
    for _ in range(20):
        toks, done = random_walk(g, vocab, rng, 30, budget=True, prefer_end=0.3)
        assert done
        valid_calls(decode(vocab, toks), spec, {"f": parameters})


def test_a_string_parameter_keeping_object_keywords_a_ref_points_into_is_no_open_object(coder):
    """The rewrite drops `properties` beside `type: string`, but keeps it where a `$ref` points into it: the string
    parameter was refused under strict as an object whose keys could be written with escapes."""
    params = {"type": "object", "properties": {"t": {"type": "string", "properties": {"a": {"type": "integer"}}},
                                               "r": {"$ref": "#/properties/t/properties/a"}},
              "required": ["t", "r"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "f", "strict": True, "parameters": params}}]
    _, _, compiler = coder
    g = compiler.compile(_spec("required", tools=tools))
    assert g.unenforced == ()


def test_the_budget_completion_skips_optional_parameters_declared_before_a_required_one(coder):
    """The closing walk wrote the `<parameter=` forced before a name, then the first name that fits: an optional
    `date_range` declared before the required `keywords` (Glaiveai2K's search_news), 56 tokens where the shortest
    call is 19, so calls that fitted the budget were refused or cut (QA xmlreal F1)."""
    tok, vocab, compiler = coder
    tools = [{"type": "function", "function": {"name": "search", "parameters": OPTIONAL_FIRST}}]
    spec = _spec("required", tools=tools)
    g = compiler.compile(spec)
    shortest = tok.encode(_call("search", ("keywords", "[]")))
    assert g.matcher().min_tokens_to_end() == len(shortest)
    rng = random.Random(5)
    for _ in range(6):
        toks, done = random_walk(g, vocab, rng, len(shortest), budget=True)
        assert done
        valid_calls(decode(vocab, toks), spec, {"search": OPTIONAL_FIRST})
    auto = compiler.compile(_spec("auto", tools=tools))  # (the tag is kept where the shortest call fits)
    m = auto.matcher()
    assert m.vet(OPEN_ID, len(shortest)) == OPEN_ID


def test_the_budget_completion_skips_optional_parameters_before_a_required_string(coder):
    """A required string's opening is taken twice in a row by the grammar (a raw value may begin as it does): the
    closing walk took that for text inside a value, wrote the `<parameter=` forced there, then the optional
    `date_range` declared first, 53 tokens where the shortest call is 18."""
    tok, vocab, compiler = coder
    params = {**OPTIONAL_FIRST, "properties": {**OPTIONAL_FIRST["properties"], "keywords": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": "search", "parameters": params}}]
    g = compiler.compile(_spec("required", tools=tools))
    assert g.matcher().min_tokens_to_end() == len(tok.encode(_call("search", ("keywords", ""))))


def test_the_budget_completion_writes_a_json_value_s_required_keys_not_the_optional_ones_first(coder):
    """A parameter whose value is a JSON object with optional members declared before its required one: the closing
    walk wrote the first key that fits, `{"base":0,"height":0,"radius":0,"side":0}` where `{"side":0}` fits, 11
    tokens more, so calls that fitted the budget were cut at it (QA budgetfuzz, Glaiveai2K's calculate_area)."""
    tok, vocab, compiler = coder
    dims = {"type": "object", "properties": {k: {"type": "number"} for k in ("base", "height", "radius", "side")},
            "required": ["side"], "additionalProperties": False}
    params = {"type": "object", "properties": {"dims": dims}, "required": ["dims"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "area", "parameters": params}}]
    spec = _spec("required", tools=tools)
    g = compiler.compile(spec)
    shortest = tok.encode(_call("area", ("dims", '{"side":0}')))
    assert g.matcher().min_tokens_to_end() <= len(shortest)
    rng = random.Random(3)
    for _ in range(4):
        toks, done = random_walk(g, vocab, rng, len(shortest), budget=True)
        assert done
        valid_calls(decode(vocab, toks), spec, {"area": params})


def test_a_further_call_is_begun_after_a_spelled_close_only_where_one_fits(coder):
    tok, vocab, compiler = coder
    a_further_call_is_begun_after_a_spelled_close_only_where_one_fits(
        compiler, tok, vocab, "qwen3_coder", _call("alpha_long_function", *((f"p{i}", "x") for i in range(6))))
