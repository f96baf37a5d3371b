"""`tools` and `response_format` in one request, as OpenAI takes them (constrain/either.py): under tool_choice
"auto" the output is tool calls or an answer valid against the response_format's schema, never free text; under
"required" or a named function, calls. Random walks through the union of the two masks, on the Qwen2 tokenizer in
our JSON-array format and with the hermes tags."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from constrain import ConstraintError, GrammarCompiler, parse_tool_calls, spec_from_request
from constrain.either import EitherGrammar
from tests.conftest import build_qwen_tools_tokenizer
from tests.constrain.conftest import compiling, random_walk

CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                         "population": {"type": "integer", "minimum": 0}},
        "required": ["name", "population"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}


@pytest.fixture(scope="module")
def json_array(tokenizers, vocabs):
    c = GrammarCompiler(vocabs["qwen2"], tokenizers["qwen2"], backend="auto", background_outlines=False,
                        compile_timeout_s=120)
    yield tokenizers["qwen2"], vocabs["qwen2"], c
    c.close()


@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    with compiling(build_qwen_tools_tokenizer(tmp_path_factory.mktemp("qwen-tools")), "qwen2") as found:
        yield found


def _spec(tool_format, tool_choice="auto", response_format=RESPONSE_FORMAT):
    return spec_from_request(tools=TOOLS, tool_choice=tool_choice, response_format=response_format,
                             tool_format=tool_format)


@pytest.mark.parametrize("fixture,tool_format", [("json_array", "json_array"), ("hermes", "hermes")])
def test_auto_ends_as_valid_calls_or_a_valid_answer(request, fixture, tool_format):
    tokenizer, vocab, compiler = request.getfixturevalue(fixture)
    spec = _spec(tool_format)
    assert spec.kind == "tools" and spec.answer.kind == "json_schema"
    grammar = compiler.compile(spec)
    assert isinstance(grammar, EitherGrammar)
    rng, seen = random.Random(2), set()
    special = frozenset(i for i, t in tokenizer.added_tokens_decoder.items() if t.content == "<tool_call>")
    for max_tokens in (12, 20, 40, 40, 40, 40, 40, 40, 60, 60, 60, 60):
        toks, ended = random_walk(grammar, vocab, rng, max_tokens, budget=True, prefer_end=0.3,
                                  special_ok=special)
        assert ended
        text = tokenizer.decode(toks)
        parsed = parse_tool_calls(text, spec)
        if parsed is None:
            jsonschema.validate(json.loads(text), CITY)
            seen.add("answer")
        else:
            assert parsed.content is None
            for call in parsed.calls:
                jsonschema.validate(json.loads(call.arguments), TIME)
            seen.add("calls")
    assert seen == {"answer", "calls"}


def test_forced_calls_leave_the_response_format_out(json_array):
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        spec = _spec("json_array", choice)
        assert spec.answer is None and spec == spec_from_request(tools=TOOLS, tool_choice=choice)


def test_pairs_that_cannot_be_told_apart_are_a_400_naming_the_field():
    with pytest.raises(ConstraintError) as exc:
        _spec("llama3_json")  # (a call is a bare object there, as the answer is)
    assert exc.value.param == "response_format"
    with pytest.raises(ConstraintError) as exc:
        _spec("json_array", response_format={"type": "json_schema", "json_schema": {
            "name": "xs", "schema": {"type": "array", "items": {"type": "integer"}}}})
    assert exc.value.param == "response_format"
    with pytest.raises(ConstraintError, match="only one output constraint"):
        spec_from_request(tools=TOOLS, regex="a+")
    json_mode = _spec("json_array", response_format={"type": "json_object"})
    assert json_mode.answer.kind == "json_object"


def test_the_backend_names_each_backend_its_parts_were_served_by(json_array):
    """The calls and the answer are grammars of their own, which the auto policy moves to outlines one by one: the
    union named the calls' backend alone, so the response header and the fingerprint hid a part's move."""
    _, _, c = json_array
    time_format = {"type": "json_schema", "json_schema": {"name": "time", "schema": TIME}}
    on = {name: c.compile(spec_from_request(response_format=time_format, backend=name))
          for name in ("outlines", "llguidance")}
    calls = c.compile(spec_from_request(tools=TOOLS, tool_choice="required", backend="llguidance"))
    assert EitherGrammar(calls, on["llguidance"]).backend == "llguidance"
    mixed = EitherGrammar(calls, on["outlines"])
    assert mixed.backend == "llguidance+outlines"
    assert EitherGrammar(mixed, on["outlines"]).backend == "llguidance+outlines"  # (a part made of parts)
