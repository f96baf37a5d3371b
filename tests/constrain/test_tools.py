"""Tool calls: the constrained output is a JSON array of calls whose arguments validate, and parses back."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from constrain import ConstraintError, parse_tool_calls, spec_from_request, tools_system_prompt
from constrain.maskbench import walk_instance
from tests.constrain.conftest import accepts_document, decode, may_answer_nothing, random_walk

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 10},
                                          "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"],
                                          "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/n"}, "y": {"$ref": "#/$defs/n"}},
        "required": ["x", "y"], "additionalProperties": False, "$defs": {"n": {"type": "integer"}}}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.mark.parametrize("tool_choice, parallel", [("required", True), ("required", False),
                                                   ({"type": "function", "function": {"name": "add"}}, True)])
@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_forced_tool_calls_validate_against_parameters(tool_choice, parallel, backend, gpt2_compiler, vocabs):
    spec = spec_from_request(tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=parallel, backend=backend)
    g = gpt2_compiler.compile(spec)
    rng = random.Random(3)
    ended = 0
    for _ in range(6):
        toks, done = random_walk(g, vocabs["gpt2"], rng, 120, budget=backend == "outlines", prefer_end=0.5)
        if not done:
            continue
        ended += 1
        calls = parse_tool_calls(decode(vocabs["gpt2"], toks), spec).calls
        assert calls
        if not parallel or isinstance(tool_choice, dict):
            assert len(calls) == 1
        for call in calls:
            assert call.name in spec.tool_names
            jsonschema.validate(json.loads(call.arguments), PARAMS[call.name])
    assert ended


def test_auto_may_answer_nothing(gpt2_compiler, vocabs):
    assert may_answer_nothing(gpt2_compiler.compile(spec_from_request(tools=TOOLS, tool_choice="auto")),
                              vocabs["gpt2"])


def test_auto_allows_free_text_or_calls(gpt2_compiler, tokenizers):
    spec = spec_from_request(tools=TOOLS, tool_choice="auto")
    g = gpt2_compiler.compile(spec)
    tok = tokenizers["gpt2"]
    for text, is_call in [('[{"name": "add", "arguments": {"x": 1, "y": 2}}]', True), ("It is sunny.", False)]:
        m = g.matcher()
        assert all(m.accept(t) for t in tok.encode(text)) and m.can_end()
        assert (parse_tool_calls(text, spec) is not None) == is_call
    m = g.matcher()
    ids = tok.encode('[{"name": "launch", ')
    assert not all(m.accept(t) for t in ids)  # unknown function names are masked
    # Text may not start with "{" either: a stream reads "{" as a call's beginning (service/tool_stream.py); nor
    # with whitespace before "[" or "{" (whitespace then "[" opens calls: below).
    for text in ('{"city": "Oslo"}', '\n {"city": "Oslo"}', ' [1', ' [{"name": "launch", '):
        m = g.matcher()
        assert not all(m.accept(t) for t in tok.encode(text)), text


@pytest.mark.parametrize("tool_format", ["json_array", "llama3_json"])
def test_auto_calls_may_begin_with_a_token_that_begins_with_a_space(tool_format, tokenizers, vocabs):
    """A SentencePiece model opens its calls as it opens a word, with a token that begins with a space ("▁[",
    "▁{"): under tool_choice "auto" such a token was masked (text may not start with whitespace then "[" or "{",
    and calls took no whitespace), so a model whose likeliest opening it was wrote text instead (helper-25). The
    calls may now begin after whitespace, and are read back as calls."""
    from constrain import GrammarCompiler

    compiler = GrammarCompiler(vocabs["phi3"], tokenizers["phi3"], background_outlines=False)
    try:
        spec = spec_from_request(tools=TOOLS, tool_choice="auto", tool_format=tool_format)
        call = {"name": "add", "arguments" if tool_format == "json_array" else "parameters": {"x": 1, "y": 2}}
        written = json.dumps([call] if tool_format == "json_array" else call)
        ids = tokenizers["phi3"].encode(written, add_special_tokens=False)  # (SentencePiece's prefix space)
        assert vocabs["phi3"].token_bytes[ids[0]] in (b" [", b" {", b' {"')
        text = " " + written
        m = compiler.compile(spec).matcher()
        assert all(m.accept(t) for t in ids) and m.can_end()
        [parsed] = parse_tool_calls(text, spec).calls
        assert parsed.name == "add" and json.loads(parsed.arguments) == {"x": 1, "y": 2}
    finally:
        compiler.close()


@pytest.mark.parametrize("tool_format", ["json_array", "llama3_json"])
def test_auto_text_may_begin_with_a_word_that_begins_with_a_space(tool_format, tokenizers, vocabs):
    """SentencePiece models (Mistral, Llama 2, Phi-3) write an answer's first word as a token beginning with a
    space ("▁Sure"): text under tool_choice "auto" may start with it, as an unconstrained answer would."""
    from constrain import GrammarCompiler

    compiler = GrammarCompiler(vocabs["phi3"], tokenizers["phi3"], background_outlines=False)
    spec = spec_from_request(tools=TOOLS, tool_choice="auto", tool_format=tool_format)
    [word] = tokenizers["phi3"].encode("Sure", add_special_tokens=False)
    assert vocabs["phi3"].token_bytes[word] == b" Sure"
    m = compiler.compile(spec).matcher()
    assert m.accept(word) and all(m.accept(t) for t in tokenizers["phi3"].encode(", it is.", add_special_tokens=False))
    assert m.can_end() and parse_tool_calls(" Sure, it is.", spec) is None
    compiler.close()


def test_tool_choice_none_and_errors():
    assert spec_from_request(tools=TOOLS, tool_choice="none") is None
    for broken in ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                 "properties": {"x": 5}}}}],
                   TOOLS + TOOLS[:1]):  # (an invalid schema; a name given twice: checked under `none` too)
        with pytest.raises(ConstraintError) as exc:
            spec_from_request(tools=broken, tool_choice="none")
        assert exc.value.param == "tools"
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(tools=TOOLS, tool_choice="none", parallel_tool_calls="no")
    assert exc.value.param == "parallel_tool_calls"
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert exc.value.param == "tool_choice"
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(tools=[{"type": "function", "function": {"parameters": {}}}])
    assert exc.value.param == "tools"
    with pytest.raises(ConstraintError) as exc:  # parameters no arguments satisfy
        spec_from_request(tools=[{"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}],
                          tool_choice="required")
    assert exc.value.param == "tools" and "tools[0].function.parameters: Unsatisfiable" in exc.value.message


def _allowed(mode, *names):
    return {"type": "allowed_tools", "allowed_tools": {
        "mode": mode, "tools": [{"type": "function", "function": {"name": n}} for n in names]}}


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_allowed_tools_narrow_the_calls_to_the_named_functions(mode, gpt2_compiler, tokenizers):
    spec = spec_from_request(tools=TOOLS, tool_choice=_allowed(mode, "add"))
    assert spec.tool_names == ("add",) and spec.tool_choice == mode
    g = gpt2_compiler.compile(spec)
    tok = tokenizers["gpt2"]
    for text, ok in [('[{"name": "add", "arguments": {"x": 1, "y": 2}}]', True),
                     ('[{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}]', False),
                     ("It is sunny.", mode == "auto")]:
        m = g.matcher()
        assert (all(m.accept(t) for t in tok.encode(text)) and m.can_end()) == ok, text
    # the client's index of the function still names its parameters in errors
    assert spec.extra["tool_sources"][0][0] == 1


@pytest.mark.parametrize("tool_choice, said", [
    ({"type": "allowed_tools", "allowed_tools": {"mode": "sometimes", "tools": []}}, "'mode': 'auto' | 'required'"),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, "non-empty list"),
    ({"type": "allowed_tools"}, "'mode': 'auto' | 'required'"),
    (_allowed("auto", "add", "nope"), "tool_choice.allowed_tools.tools[1] names an unknown function 'nope'"),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "mcp"}]}},
     "tool_choice.allowed_tools.tools[0] must be"),
    ({"type": "custom", "custom": {"name": "add"}}, "custom tools (free-form text input) are not supported"),
    ({"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name names an unknown function"),
])
def test_malformed_allowed_tools_are_refused_naming_tool_choice(tool_choice, said):
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(tools=TOOLS, tool_choice=tool_choice)
    assert exc.value.param == "tool_choice" and said in exc.value.message


@pytest.mark.parametrize("tool_choice, param", [
    ({"type": "function", "function": {"name": "add"}, "extra": 1}, "tool_choice.extra"),
    ({"type": "function", "function": {"name": "add", "strict": True}}, "tool_choice.function.strict"),
    ({**_allowed("auto", "add"), "tools": []}, "tool_choice.tools"),
    ({"type": "allowed_tools", "allowed_tools": {**_allowed("auto", "add")["allowed_tools"], "x": 1}},
     "tool_choice.allowed_tools.x"),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "function", "function": {"name": "add"}, "strict": True}]}},
     "tool_choice.allowed_tools.tools[0].strict"),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "function", "function": {"name": "add", "examples": []}}]}},
     "tool_choice.allowed_tools.tools[0].function.examples"),
])
def test_a_field_of_tool_choice_the_server_does_not_read_is_refused_naming_it(tool_choice, param):
    """As response_format's are (and the deprecated function_call's): they were dropped without a word."""
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(tools=TOOLS, tool_choice=tool_choice)
    assert exc.value.param == param and exc.value.code == "unknown_parameter", exc.value.message
    # (null counts as not sent)
    assert spec_from_request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"},
                                                       "extra": None}).tool_names == ("add",)


def test_allowed_tools_may_list_the_tools_whole_definitions():
    """OpenAI calls the entries "tool definitions": a client that passes its `tools` on sends them whole (review of
    62c4e95, which refused their `description` and `parameters`)."""
    spec = spec_from_request(tools=TOOLS, tool_choice={"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": TOOLS[1:]}})
    assert spec.tool_names == ("add",)


def test_system_prompt_names_functions_and_format():
    text = tools_system_prompt(TOOLS)
    assert "get_weather" in text and "add" in text and '"arguments"' in text


# Parameters that need the exact rewrites (oneOf of overlapping branches, `not`), and one keyword nothing enforces.
REWRITTEN = {"type": "object", "properties": {"unit": {"oneOf": [{"const": "c"}, {"const": "f"}]},
                                              "n": {"type": "integer", "not": {"const": 3}}},
             "required": ["unit", "n"], "additionalProperties": False}
UNENFORCEABLE = {"type": "object", "properties": {"tags": {"type": "string", "not": {"pattern": "(a)\\1"}}}}


def _tools(params: dict, strict: bool) -> list[dict]:
    return [{"type": "function", "function": {"name": "noop"}},
            {"type": "function", "function": {"name": "f", "strict": strict, "parameters": params}}]


@pytest.mark.parametrize("tool_choice", ["required", "auto", {"type": "function", "function": {"name": "f"}}])
def test_parameters_get_the_exact_rewrites_of_response_format_schemas(tool_choice, gpt2_compiler, tokenizers):
    spec = spec_from_request(tools=_tools(REWRITTEN, True), tool_choice=tool_choice)
    g = gpt2_compiler.compile(spec)
    assert g.unenforced == ()
    tok = tokenizers["gpt2"]
    for n, ok in [(2, True), (3, False)]:
        m = g.matcher()
        text = '[{"name": "f", "arguments": {"unit": "c", "n": %d}}]' % n
        assert (all(m.accept(t) for t in tok.encode(text)) and m.can_end()) == ok


def _with_id(value_type: str, **fields) -> dict:
    return {"type": "object", "$defs": {"a": {"type": value_type}}, "properties": {"a": {"$ref": "#/$defs/a"}},
            "required": ["a"], "additionalProperties": False, **fields}


@pytest.mark.parametrize("parameters,valid,invalid", [
    # an `$id` at the parameters' root: its `#/$defs/a` is its own wherever the call schema puts it
    (_with_id("integer", **{"$id": "http://x.example/p"}), {"a": 1}, {"a": "s"}),
    # draft 4's `id`; and in 2020-12 an `id` that is only an annotation (review R2, R3: 400s)
    (_with_id("integer", **{"$schema": "http://json-schema.org/draft-04/schema#", "id": "http://x.example/p"}),
     {"a": 1}, {"a": "s"}),
    (_with_id("integer", id="myparams"), {"a": 1}, {"a": "s"}),
    # the parameters' root named by its URI
    ({"$id": "http://x.example/p", "type": "object", "$defs": {"a": {"type": "integer"}},
      "properties": {"a": {"$ref": "http://x.example/p#/$defs/a"}, "b": {"$ref": "p#/$defs/a"}},
      "additionalProperties": False},
     {"a": 1, "b": 2}, {"a": "s"}),
])
@pytest.mark.parametrize("backend", ["llguidance", "outlines", "auto"])
def test_references_in_parameters_named_by_an_id_keep_their_meaning(parameters, valid, invalid, backend,
                                                                     gpt2_compiler, tokenizers, vocabs):
    """The call schema moves each function's parameters under its `$defs`, and their `#...` references with them;
    the parameters' own name (their root `$id`) is left out there, as several functions often share one."""
    spec = spec_from_request(tools=[{"type": "function", "function": {"name": "f", "parameters": parameters}}],
                             tool_choice="required", backend=backend)
    g = gpt2_compiler.compile(spec)
    for arguments, ok in ((valid, True), (invalid, False)):
        call = [{"name": "f", "arguments": arguments}]
        assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], call) == ok, arguments


def test_references_below_a_nested_id_in_parameters_keep_their_base(gpt2_compiler, tokenizers, vocabs):
    """Moved to the call schema's place, a `$ref` under a nested `$id` named nothing (llguidance: a 400 "Pointer
    '/$defs/tool0/$defs/a' does not exist") or the parameters' root definition of the same name (outlines took
    `{"z": {"a": "s"}}`); outlines, which reads every reference against the root, refuses those."""
    parameters = {"type": "object", "$defs": {"a": {"type": "string"}}, "properties": {
        "z": {"$id": "http://x.example/z", "$defs": {"a": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/a"}},
              "required": ["a"], "additionalProperties": False}}, "required": ["z"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    for backend in ("llguidance", "auto"):
        g = gpt2_compiler.compile(spec_from_request(tools=tools, tool_choice="required", backend=backend))
        for arguments, ok in (({"z": {"a": 1}}, True), ({"z": {"a": "s"}}, False)):
            assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], [{"name": "f", "arguments": arguments}]) == ok
    with pytest.raises(ConstraintError, match="cannot enforce the keyword at /0/function/parameters/.*\\$ref"):
        gpt2_compiler.compile(spec_from_request(tools=tools, tool_choice="required", backend="outlines"))


@pytest.mark.parametrize("named", [True, False])
def test_functions_keep_their_own_anchors(named, gpt2_compiler, tokenizers, vocabs):
    """The calls' schema holds every function's parameters: two `$anchor: s` were one (review2 F2, unsound; without
    `$id`s so before too)."""
    def parameters(value_type: str, name: str) -> dict:
        out = {"type": "object", "properties": {"a": {"$ref": "#s"}}, "required": ["a"],
               "$defs": {"s": {"$anchor": "s", "type": value_type}}}
        return {"$id": f"http://x/{name}", **out} if named else out
    tools = [{"type": "function", "function": {"name": n, "parameters": parameters(t, n)}}
             for n, t in (("f", "integer"), ("g", "string"))]
    g = gpt2_compiler.compile(spec_from_request(tools=tools, tool_choice="required", backend="llguidance"))
    for call, ok in (({"name": "f", "arguments": {"a": 1}}, True), ({"name": "f", "arguments": {"a": "s"}}, False),
                     ({"name": "g", "arguments": {"a": "s"}}, True), ({"name": "g", "arguments": {"a": 1}}, False)):
        assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], [call]) == ok, call


def _takes(compiler, tokenizers, vocabs, tools: list, calls: list, refused: list) -> None:
    """The calls' grammar (tool_choice required, llguidance) takes each of `calls` and none of `refused`."""
    g = compiler.compile(spec_from_request(tools=[{"type": "function", "function": f} for f in tools],
                                           tool_choice="required", backend="llguidance"))
    assert [c for c in calls if not accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], [c])] == []
    assert [c for c in refused if accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], [c])] == []


@pytest.mark.parametrize("s_schema", [
    {"$dynamicAnchor": "s", "type": "integer"},  # (also an anchor for `$ref`: review3 F2)
    {"$id": "#s", "type": "integer"},  # (draft 7's plain name: an `$anchor` in the calls' 2020-12 schema, F5)
])
def test_anchors_of_every_kind_reach_their_references(s_schema, gpt2_compiler, tokenizers, vocabs):
    draft = {"$schema": "http://json-schema.org/draft-07/schema#"} if "$id" in s_schema else {}
    parameters = {**draft, "type": "object", "properties": {"a": {"$ref": "#s"}}, "required": ["a"],
                  "definitions": {"s": s_schema}}
    _takes(gpt2_compiler, tokenizers, vocabs, [{"name": "f", "parameters": parameters}],
           [{"name": "f", "arguments": {"a": 1}}], [{"name": "f", "arguments": {"a": "x"}}])


def test_a_reference_to_no_anchor_is_refused_in_the_client_s_words(gpt2_compiler):
    """The calls' schema prefixes each function's anchors: the 400 named `'tool0-nope'`, and no place (review3 F7)."""
    parameters = {"type": "object", "properties": {"a": {"$ref": "#nope"}}}
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec_from_request(tools=[{"type": "function", "function": {
            "name": "f", "parameters": parameters}}], tool_choice="required", backend="llguidance"))
    assert "Anchor 'nope' does not exist" in exc.value.message and "tool0" not in exc.value.message
    assert exc.value.pointer == "/0/function/parameters/properties/a/$ref"


def test_subschemas_are_named_by_the_uris_their_ids_resolve_to(gpt2_compiler, tokenizers, vocabs):
    """`item.json` under `http://x/a/root.json` is `http://x/a/item.json`: compared as written, the two functions'
    different subschemas of that name were both kept, and f took g's string (review3 F3, unsound)."""
    f = {"$id": "http://x/a/root.json", "type": "object", "properties": {"a": {"$ref": "item.json"}},
         "required": ["a"], "$defs": {"i": {"$id": "item.json", "type": "integer"}}}
    g = {"type": "object", "properties": {"a": {"$ref": "http://x/a/item.json"}}, "required": ["a"],
         "$defs": {"i": {"$id": "http://x/a/item.json", "type": "string"}}}
    with pytest.raises(ConstraintError, match="the subschema named 'http://x/a/item.json'"):
        gpt2_compiler.compile(spec_from_request(tools=[{"type": "function", "function": {"name": n, "parameters": p}}
                                                       for n, p in (("f", f), ("g", g))], tool_choice="required"))
    # (one relative name under two documents is two names)
    h = {**f, "$id": "http://y/root.json", "$defs": {"i": {"$id": "item.json", "type": "string"}}}
    _takes(gpt2_compiler, tokenizers, vocabs, [{"name": "f", "parameters": f}, {"name": "h", "parameters": h}],
           [{"name": "f", "arguments": {"a": 1}}, {"name": "h", "arguments": {"a": "x"}}],
           [{"name": "f", "arguments": {"a": "x"}}, {"name": "h", "arguments": {"a": 1}}])


def test_functions_sharing_a_boilerplate_id_keep_their_own_inner_names(gpt2_compiler, tokenizers, vocabs):
    """With subschemas that name themselves inside, the shared root `$id` was kept and named two documents (a
    400 "differs", review3 F4): it is left out, and the inner names resolve against it as before."""
    shared = "https://example.com/schemas/tool.json"
    f = {"$id": shared, "type": "object", "properties": {"a": {"$ref": "fi.json"}}, "required": ["a"],
         "$defs": {"i": {"$id": "fi.json", "type": "integer"}}}
    g = {"$id": shared, "type": "object", "properties": {"a": {"$ref": "gi.json"}}, "required": ["a"],
         "$defs": {"i": {"$id": "gi.json", "type": "string"}}}
    _takes(gpt2_compiler, tokenizers, vocabs, [{"name": "f", "parameters": f}, {"name": "g", "parameters": g}],
           [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"a": "x"}}],
           [{"name": "f", "arguments": {"a": "x"}}, {"name": "g", "arguments": {"a": 1}}])


def test_values_in_parameters_keep_keys_that_look_like_references(gpt2_compiler, tokenizers, vocabs):
    """Moving the parameters into the calls' schema rewrote every "$ref" (and "$anchor") key, a `const` object's
    too: `{"$ref": "#/x"}` was held to `{"$ref": "#/$defs/tool0/x"}`."""
    value = {"$ref": "#/x", "$anchor": "a"}
    parameters = {"type": "object", "properties": {"v": {"const": value}, "w": {"enum": [value, 1]}},
                  "required": ["v"], "additionalProperties": False}
    g = gpt2_compiler.compile(spec_from_request(tools=[{"type": "function", "function": {
        "name": "f", "parameters": parameters}}], tool_choice="required", backend="llguidance"))
    assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], [{"name": "f", "arguments": {"v": value, "w": value}}])
    moved = {"$ref": "#/$defs/tool0/x", "$anchor": "tool0-a"}
    assert not accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], [{"name": "f", "arguments": {"v": moved}}])


@pytest.mark.parametrize("name", ["default", "examples", "enum", "const"])
def test_properties_and_definitions_named_as_value_keywords_are_subschemas(name, gpt2_compiler, tokenizers, vocabs):
    """A property (or a definition) named `default`, `enum`... was taken for that keyword and copied as a value: its
    `#` kept meaning the calls' array (`{"default": [{"name": "f", ...}]}` was written: review4 F1, unsound), its
    `#/$defs/...` named nothing and its anchors none (400s)."""
    parameters = {"type": "object", "properties": {
        name: {"$ref": "#"}, "i": {"$ref": f"#/$defs/{name}"}, "s": {"$ref": "#s"}, "n": {"type": "integer"}},
        "$defs": {name: {"type": "integer"}, "s": {"$anchor": "s", "type": "string"}},
        "minProperties": 1, "additionalProperties": False}
    _takes(gpt2_compiler, tokenizers, vocabs, [{"name": "f", "parameters": parameters}],
           [{"name": "f", "arguments": {name: {"n": 1}, "i": 2, "s": "x"}}],
           [{"name": "f", "arguments": {name: [{"name": "f", "arguments": {"n": 1}}]}},
            {"name": "f", "arguments": {"i": "x"}}, {"name": "f", "arguments": {"s": 1}}])
    nested = {"type": "object", "properties": {name: {"$id": "http://x/v", "type": "integer"}}}  # (a resource)
    with pytest.raises(ConstraintError, match="the subschema named 'http://x/v'"):
        gpt2_compiler.compile(spec_from_request(tools=[{"type": "function", "function": {"name": n, "parameters": p}}
                                                       for n, p in (("f", nested), ("g", {**nested, "properties": {
                                                           name: {"$id": "http://x/v", "type": "string"}}}))],
                                                tool_choice="required"))


def test_values_that_look_like_named_subschemas_are_no_subschemas(gpt2_compiler):
    """A `const` object with an "$id" key is a value: two functions' different ones are no clash of names."""
    tools = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {"v": {"const": {"$id": "http://x/v", "n": n}}}}}} for n in ("f", "g")]
    assert gpt2_compiler.compile(spec_from_request(tools=tools, tool_choice="required", backend="llguidance"))


@pytest.mark.parametrize("parameters,valid,invalid", [
    ({"$id": "http://x/root.json", "type": "object", "properties": {"a": {"$ref": "http://x/item.json"}},
      "required": ["a"], "$defs": {"i": {"$id": "item.json", "type": "integer"}}}, {"a": 1}, {"a": "x"}),
    ({"$id": "http://x/root.json", "type": "object", "properties": {"a": {"$ref": "http://x/item.json"}},
      "required": ["a"], "$defs": {"s": {"type": "integer"}, "i": {
          "$id": "http://x/item.json", "type": "object", "properties": {"v": {"$ref": "root.json#/$defs/s"}},
          "required": ["v"]}}}, {"a": {"v": 1}}, {"a": {"v": "x"}}),
])
def test_parameters_whose_subschemas_name_themselves_stay_a_document_of_their_own(parameters, valid, invalid,
                                                                                  gpt2_compiler, tokenizers, vocabs):
    """Their references may reach the parameters by their `$id` (`root.json#/$defs/s` from inside `item.json`):
    the `$id` stays there (left out, they were a 400 "Resource ... is not present in a registry": review2 F3)."""
    g = gpt2_compiler.compile(spec_from_request(tools=[{"type": "function", "function": {
        "name": "f", "parameters": parameters}}], tool_choice="required", backend="llguidance"))
    assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], [{"name": "f", "arguments": valid}])
    assert not accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], [{"name": "f", "arguments": invalid}])


def test_functions_whose_parameters_share_an_id_keep_their_own_definitions(gpt2_compiler, tokenizers, vocabs):
    """Two functions' parameters with one boilerplate `$id` were two resources of one name in the call schema:
    llguidance read both against one, and `f` took `g`'s string (review R1, unsound). Nested subschemas of one
    name that differ are refused; the same subschema twice is served."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": _with_id("integer", **{"$id": "http://x/p"})}},
             {"type": "function", "function": {"name": "g", "parameters": _with_id("string", **{"$id": "http://x/p"})}}]
    for backend in ("llguidance", "auto"):
        g = gpt2_compiler.compile(spec_from_request(tools=tools, tool_choice="required", backend=backend))
        for call, ok in (({"name": "f", "arguments": {"a": 1}}, True), ({"name": "f", "arguments": {"a": "s"}}, False),
                         ({"name": "g", "arguments": {"a": "s"}}, True), ({"name": "g", "arguments": {"a": 1}}, False)):
            assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], [call]) == ok, call

    def nested(value_type: str) -> dict:
        return {"type": "object", "properties": {"z": {"$id": "http://x/z", "$defs": {"a": {"type": value_type}},
                                                       "properties": {"a": {"$ref": "#/$defs/a"}}}}}
    same = [{"type": "function", "function": {"name": n, "parameters": nested("integer")}} for n in ("f", "g")]
    assert gpt2_compiler.compile(spec_from_request(tools=same, tool_choice="required"))
    differing = [same[0], {"type": "function", "function": {"name": "g", "parameters": nested("string")}}]
    with pytest.raises(ConstraintError, match="tools\\[1\\].function.parameters: the subschema named 'http://x/z'"):
        gpt2_compiler.compile(spec_from_request(tools=differing, tool_choice="required"))


@pytest.mark.parametrize("tool_choice", ["required", "auto", {"type": "function", "function": {"name": "f"}}])
def test_pointers_name_the_entry_of_the_tools_array(tool_choice, gpt2_compiler):
    """Errors (param "tools") and unenforced pointers name /<index in tools>/function/parameters/..., not the
    call schema the parameters are compiled inside."""
    from constrain.compiler import unenforced_in_client_terms

    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec_from_request(tools=_tools(UNENFORCEABLE, True), tool_choice=tool_choice))
    assert exc.value.param == "tools"
    assert exc.value.pointer == "/1/function/parameters/properties/tags/not"
    assert "at /1/function/parameters/properties/tags/not" in exc.value.message
    spec = spec_from_request(tools=_tools(UNENFORCEABLE, False), tool_choice=tool_choice)
    g = gpt2_compiler.compile(spec)
    assert unenforced_in_client_terms(spec, g) == ("/1/function/parameters/properties/tags/not",)


@pytest.mark.parametrize("tool_format", ["json_array", "hermes", "qwen3_coder"])
def test_a_length_no_pattern_it_meets_can_be_decided_beside_is_named_in_the_functions_terms(tool_format,
                                                                                              gpt2_compiler):
    """An RFC 1123 name as a definition, referenced beside `maxLength: 253` in a function's parameters: the length
    is named where the function wrote it (unenforced, or a strict 400 pointing at it, whose message names no place
    in the call schema the parameters are compiled inside)."""
    from constrain.compiler import unenforced_in_client_terms

    name = r"^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9][a-z0-9-]{0,61}[a-z0-9]$"
    params = {"type": "object", "properties": {"host": {"$ref": "#/$defs/name", "maxLength": 253}},
              "required": ["host"], "$defs": {"name": {"type": "string", "pattern": name}}}
    spec = spec_from_request(tools=_tools(params, False), tool_choice="required", tool_format=tool_format)
    g = gpt2_compiler.compile(spec)
    assert unenforced_in_client_terms(spec, g) == ("/1/function/parameters/properties/host/maxLength",)
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec_from_request(tools=_tools(params, True), tool_choice="required",
                                                tool_format=tool_format))
    assert exc.value.pointer == "/1/function/parameters/properties/host/maxLength"
    assert "$defs/tool" not in exc.value.message and "at /1/function/parameters/properties/host/maxLength" \
        in exc.value.message


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_strict_is_per_function(tool_choice, gpt2_compiler):
    """A strict function next to a non-strict one: only a keyword in the strict function's parameters is refused;
    the other function's unenforced keywords are named, as for a non-strict request."""
    from constrain.compiler import unenforced_in_client_terms

    clean = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
             "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "s", "strict": True, "parameters": clean}},
             {"type": "function", "function": {"name": "f", "parameters": UNENFORCEABLE}}]
    spec = spec_from_request(tools=tools, tool_choice=tool_choice)
    g = gpt2_compiler.compile(spec)
    assert unenforced_in_client_terms(spec, g) == ("/1/function/parameters/properties/tags/not",)
    tools[0]["function"]["strict"], tools[1]["function"]["strict"] = False, True
    for backend in (None, "llguidance"):  # a per-request backend keeps which functions are strict
        with pytest.raises(ConstraintError) as exc:
            gpt2_compiler.compile(spec_from_request(tools=tools, tool_choice=tool_choice, backend=backend))
        assert exc.value.pointer == "/1/function/parameters/properties/tags/not"


@pytest.mark.parametrize("tool_format", ["json_array", "hermes"])
def test_a_keyword_a_rewrite_moved_is_named_where_the_function_wrote_it(tool_format, gpt2_compiler):
    """`if`/`then` is rewritten into branches: a pattern llguidance cannot read in the `then` was named at the
    subschema the rewrite replaced, `/1/function/parameters` ("in the equivalent form..."), in the 400 and in the
    unenforced list, where a response_format names `/then/properties/b/pattern` (QA fixptr F1 follow-up)."""
    from constrain.compiler import unenforced_in_client_terms

    moved = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
             "if": {"required": ["a"]}, "then": {"properties": {"b": {"type": "string", "pattern": "(?<=a)b"}}}}
    for params, at in ((moved, ""), ({"type": "object", "properties": {"v": moved}}, "/properties/v")):
        pointer = f"/1/function/parameters{at}/then/properties/b/pattern"
        for strict in (True, False):
            spec = spec_from_request(tools=_tools(params, strict), tool_choice="required", tool_format=tool_format)
            if strict:
                with pytest.raises(ConstraintError) as exc:
                    gpt2_compiler.compile(spec)
                assert exc.value.pointer == pointer and "equivalent form" not in exc.value.message
            else:
                assert unenforced_in_client_terms(spec, gpt2_compiler.compile(spec)) == (pointer,)


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_escaped_argument_keys_cannot_pass_as_other_keys(tool_choice, gpt2_compiler, tokenizers, vocabs):
    """Open parameters (no additionalProperties: false) name `city`: `\\u0063ity` would be another key to
    llguidance, so `\\u` escapes in keys are refused in calls (constrain/plain_keys.py); free text is untouched."""
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    spec = spec_from_request(tools=[{"type": "function", "function": {"name": "f", "parameters": params}}],
                             tool_choice=tool_choice)
    g = gpt2_compiler.compile(spec)
    tok = tokenizers["gpt2"]
    texts = [('[{"name": "f", "arguments": {"city": "Oslo", "n": 1}}]', True),
             ('[{"name": "f", "arguments": {"city": "Oslo", "\\u0063ity": 1}}]', False)]
    if tool_choice == "auto":
        texts.append(('Say "\\u0063ity": 1', True))
    bitmask = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    for text, accepted in texts:  # (token by token under the mask, as the engine samples)
        assert walk_instance(g, tok.encode(text), tok.eos_token_id, bitmask, []) == accepted, text


def test_a_refusal_names_the_entry_of_the_tools_array_not_the_call_schema(gpt2_compiler):
    """llguidance names where it failed as a URI into the schema it compiled: for tools, the call schema holding
    each function's parameters under `$defs/tool<i>`. The message names the client's `tools` entry instead."""
    ok = {"type": "object", "properties": {"a": {"type": "integer"}}}
    unsatisfiable = {"type": "object", "properties": {"d": {"type": "string", "minLength": 5, "maxLength": 2}},
                     "required": ["d"]}  # (found by llguidance: constrain/rewrite.py leaves lengths alone)
    tools = [{"type": "function", "function": {"name": "g", "parameters": ok}},
             {"type": "function", "function": {"name": "f", "parameters": unsatisfiable}}]
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(spec_from_request(tools=tools, tool_choice="required"))
    assert exc.value.param == "tools" and "Unsatisfiable" in exc.value.message
    assert "/1/function/parameters" in exc.value.message and "$defs" not in exc.value.message


ADD_ARGS = '{"y":-1,  "x": 1.50E1}'  # (spacing, key order and a number's spelling as a model may write them)


@pytest.mark.parametrize("tool_format, text", [
    ("json_array", f'[{{"name": "add", "arguments": {ADD_ARGS}}}, {{"arguments":{ADD_ARGS},"name":"add"}}]'),
    ("hermes", f'Sure.\n<tool_call>\n{{"name": "add", "arguments": {ADD_ARGS}}}\n</tool_call>\n'
               f'<tool_call>\n{{"name": "add", "arguments": {ADD_ARGS}}}\n</tool_call>'),
    ("llama3_json", f'{{"name": "add", "parameters": {ADD_ARGS}}}'),
    ("mistral", f'[TOOL_CALLS] [{{"name": "add", "arguments": {ADD_ARGS}}}, {{"name": "add", "arguments": {ADD_ARGS}}}]'),
    ("mistral_args", f"[TOOL_CALLS]add[ARGS]{ADD_ARGS}[TOOL_CALLS]add[ARGS]{ADD_ARGS}"),
])
def test_whole_answers_give_the_arguments_as_written(tool_format, text):
    """What a stream of the answer sends (service/tool_stream.py passes the arguments through): the same string,
    not a re-serialisation that only parses the same."""
    spec = spec_from_request(tools=TOOLS, tool_choice="required", tool_format=tool_format)
    calls = parse_tool_calls(text, spec).calls
    assert [c.arguments for c in calls] == [ADD_ARGS] * (1 if tool_format == "llama3_json" else 2)


def test_xml_answers_give_the_arguments_as_a_stream_sends_them():
    """JSON values as written, raw ones as JSON strings, `", "` and `": "` between (service/tool_stream.py)."""
    spec = spec_from_request(tools=TOOLS, tool_choice="required", tool_format="qwen3_coder")
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nSão \"P\"\n</parameter>\n<parameter=unit>\n"
            "C\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n<parameter=x>\n1.50E1\n"
            "</parameter>\n<parameter=y>\n-1\n</parameter>\n</function>\n</tool_call>")
    calls = parse_tool_calls(text, spec).calls
    assert [c.arguments for c in calls] == ['{"city": "São \\"P\\"", "unit": "C"}', '{"x": 1.50E1, "y": -1}']


def test_parameters_of_another_type_than_object_are_named_where_and_what():
    """A pydantic `RootModel[list[...]]` as a function: the 400 said "must describe an object", neither where nor
    what it found (QA pydantic F1)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "array", "items": {}}}}
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(tools=[tool])
    assert exc.value.param == "tools" and exc.value.pointer == "/0/function/parameters/type"
    assert "its type at /0/function/parameters/type names type 'array'" in exc.value.message


@pytest.mark.parametrize("tool_format, text", [
    ("json_array", '\u2028[{"name": "f", "arguments": {}}]'),
    ("granite", '\x0c<|tool_call|>[{"name": "f", "arguments": {}}]'),
    ("mistral", '\xa0[TOOL_CALLS][{"name": "f", "arguments": {}}]'),
    ("llama3_json", '\x0c{"name": "f", "parameters": {}}'),
])
def test_calls_are_read_after_the_whitespace_the_grammars_allow_before_them_only(tool_format, text):
    """Free text may begin with `\\x0c` or U+2028, which the grammars do not take as the whitespace before calls;
    the parser's `strip()` did, and read such text as calls its arguments' grammar never held (QA review7 F1,
    unsound)."""
    from constrain import parse_tool_calls

    spec = spec_from_request(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="auto",
                             tool_format=tool_format)
    assert parse_tool_calls(text, spec) is None
    assert parse_tool_calls(" \t\r\n" + text[1:], spec) is not None
