"""Tool calls: the constrained output is a JSON array of calls whose arguments validate, and parses back."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from constrain import ConstraintError, parse_tool_calls, spec_from_request, tools_system_prompt
from tests.constrain.conftest import decode, random_walk

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
        calls = parse_tool_calls(decode(vocabs["gpt2"], toks), spec)
        assert calls
        if not parallel or isinstance(tool_choice, dict):
            assert len(calls) == 1
        for call in calls:
            assert call.name in spec.tool_names
            jsonschema.validate(json.loads(call.arguments), PARAMS[call.name])
    assert ended


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


def test_tool_choice_none_and_errors():
    assert spec_from_request(tools=TOOLS, tool_choice="none") is None
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert exc.value.param == "tool_choice"
    with pytest.raises(ConstraintError) as exc:
        spec_from_request(tools=[{"type": "function", "function": {"parameters": {}}}])
    assert exc.value.param == "tools"


def test_system_prompt_names_functions_and_format():
    text = tools_system_prompt(TOOLS)
    assert "get_weather" in text and "add" in text and '"arguments"' in text
