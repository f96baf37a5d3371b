"""Tool calls in GLM's formats (constrain/xml_calls.py): "glm45" (GLM-4.5 and 4.6: a newline after the name, after
each argument and between calls) and "glm47" (4.7 and later: none), on the Qwen2 tokenizer with GLM's tags as
special tokens. The tags are written as those tokens, string values raw and the rest JSON; every call a walk
through the mask finishes parses and validates, and the budget rule closes the tags."""

from __future__ import annotations

import json
import random

import pytest
import torch

from constrain import parse_tool_calls, spec_from_request
from tests.conftest import GLM_TAGS, build_glm45_tokenizer, build_qwen3_coder_tokenizer
from tests.constrain.conftest import (
    OPTIONAL_FIRST, a_further_call_is_begun_after_a_spelled_close_only_where_one_fits,
    a_long_function_s_name_is_vetted_where_a_short_one_s_call_was_kept, allowed_ids, compiling,
    random_walk, takes_text, valid_calls)

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"type": ["string", "null"], "enum": ["celsius", "fahrenheit", None]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "opts": {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"],
             "additionalProperties": False}},
    "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": WEATHER}},
         {"type": "function", "function": {"name": "ping"}}]
SCHEMAS = {"get_weather": WEATHER, "ping": {"type": "object", "properties": {}, "additionalProperties": False}}
TAG_IDS = frozenset(GLM_TAGS)


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    """(tokenizer, vocabulary, compiler) of the Qwen2 tokenizer with GLM's tags as special tokens, which grammars
    may write (as the server's chat template names them)."""
    tokenizer_dir = build_glm45_tokenizer(tmp_path_factory.mktemp("glm"))
    with compiling(tokenizer_dir, "qwen2", writable_special=tuple(GLM_TAGS.values())) as found:
        yield found


def _spec(tool_format, tool_choice, parallel=True):
    return spec_from_request(tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=parallel,
                             tool_format=tool_format)


def _call(tool_format: str, name: str, *params: tuple[str, str]) -> str:
    """One call as the format's template writes it, each value already in its written form."""
    nl = "\n" if tool_format == "glm45" else ""
    body = "".join(f"<arg_key>{k}</arg_key>{nl}<arg_value>{v}</arg_value>{nl}" for k, v in params)
    return f"<tool_call>{name}{nl}{body}</tool_call>"


@pytest.mark.parametrize("tool_format", ["glm45", "glm47"])
def test_forced_calls_write_the_tag_tokens_and_validate(tool_format, glm):
    tok, vocab, compiler = glm
    spec = _spec(tool_format, "required")
    g = compiler.compile(spec)
    rng = random.Random(4)
    ended, tagged = 0, 0
    for _ in range(8):
        toks, done = random_walk(g, vocab, rng, 120, budget=True, prefer_end=0.5, special_ok=TAG_IDS)
        if done:
            ended += 1
            assert TAG_IDS.issuperset(t for t in toks if vocab.token_bytes[t] is None)
            text = tok.decode(toks, skip_special_tokens=False)
            valid_calls(text, spec, SCHEMAS)
            if "<arg_key>" in text:
                tagged += 1
                assert min(GLM_TAGS) + 3 in toks  # (`<arg_key>` written as its token)
                assert ("\n<arg_key>" in text) == (tool_format == "glm45")
    assert ended and tagged


@pytest.mark.parametrize("tool_format", ["glm45", "glm47"])
def test_values_are_raw_strings_or_json(tool_format, glm):
    tok, _, compiler = glm
    g = compiler.compile(_spec(tool_format, {"type": "function", "function": {"name": "get_weather"}}))
    base = [("city", "Paris"), ("days", "3")]
    cases = [
        (base, True),
        ([("city", 'Oslo "N"\n')] + base[1:], True),
        ([("city", "Oslo, Norway, Europe")] + base[1:], False),  # (maxLength 12)
        (base[:1] + [("unit", "null")] + base[1:], True),
        (base[:1] + [("unit", "kelvin")] + base[1:], False),
        (base + [("opts", '{"note": "a"}')], True),
        (base + [("opts", '{}')], False),
        (base[:1] + [("days", '"3"')], False),
        (base[:1], False),
    ]
    for params, ok in cases:
        assert takes_text(g, tok, _call(tool_format, "get_weather", *params)) == ok, params
    other = "glm47" if tool_format == "glm45" else "glm45"
    assert not takes_text(g, tok, _call(other, "get_weather", *base))  # (each format its own newlines)
    spec = _spec(tool_format, "required")
    text = "Let me look.\n" + _call(tool_format, "get_weather", base[0], ("unit", "null"), base[1],
                                    ("opts", '{"note": "</arg_value>"}')) + ("\n" if tool_format == "glm45" else "") \
        + _call(tool_format, "ping")
    parsed = parse_tool_calls(text, spec)  # (a JSON string may hold a tag's text, spelled in pieces by the model)
    assert parsed.content == "Let me look." and [c.name for c in parsed.calls] == ["get_weather", "ping"]
    assert json.loads(parsed.calls[0].arguments) == {"city": "Paris", "unit": None, "days": 3,
                                                     "opts": {"note": "</arg_value>"}}


def test_auto_takes_text_then_calls(glm):
    tok, _, compiler = glm
    spec = _spec("glm45", "auto")
    g = compiler.compile(spec)
    call = _call("glm45", "ping")
    for text, ok in [("It is sunny.", True), (call, True), ("Let me check.\n" + call, True),
                     ("Text then " + _call("glm45", "launch"), False)]:
        assert takes_text(g, tok, text) == ok, text


@pytest.mark.parametrize("tool_format", ["glm45", "glm47"])
def test_calls_close_within_a_tight_budget(tool_format, glm):
    """The budget rule writes the tag tokens too: the closing walk follows forced special tokens."""
    tok, vocab, compiler = glm
    spec = _spec(tool_format, {"type": "function", "function": {"name": "get_weather"}})
    g = compiler.compile(spec)
    m = g.matcher()
    assert m.min_tokens_to_end() == {"glm45": 20, "glm47": 15}[tool_format]  # (the shortest call, tags as tokens)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    left = m.min_tokens_to_end()
    m.fill_bitmask(bitmask, 0, tokens_left=left)  # (no slack: the tag spelled out would not fit, its token does)
    allowed = allowed_ids(bitmask).tolist()
    assert min(GLM_TAGS) in allowed and len(allowed) > 1
    assert all(m.vet(t, left) == min(GLM_TAGS) for t in allowed)
    rng = random.Random(2)
    for _ in range(6):
        toks, done = random_walk(g, vocab, rng, 24, budget=True, special_ok=TAG_IDS)
        assert done
        assert len(valid_calls(tok.decode(toks, skip_special_tokens=False), spec, SCHEMAS)) == 1


def test_a_budget_completion_writes_the_tags_as_their_tokens(glm):
    """The tags are special tokens whose text the vocabulary also spells: a completion spelled with the longest
    tokens once began `}</`, which the grammar refuses (a sweep's requests failed with it). With no slack left,
    the budget rule keeps the completion's tokens one by one: `}` (in the place of a space), then the
    `</arg_value>` token (the grammar's only one there)."""
    tok, vocab, compiler = glm
    m = compiler.compile(_spec("glm45", {"type": "function", "function": {"name": "get_weather"}})).matcher()
    for t in tok.encode('<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n'
                        '<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>opts</arg_key>\n'
                        '<arg_value>{"note": "x"'):
        assert m.accept(t)
    assert m.min_tokens_to_end() == 4  # }, </arg_value>, a newline, </tool_call>
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    space, brace, close = tok.encode(" ")[0], tok.encode("}")[0], tok.encode("</arg_value>")[0]
    m.fill_bitmask(bitmask, 0, tokens_left=4)
    assert {space, brace} <= set(allowed_ids(bitmask).tolist())
    assert m.vet(space, 4) == brace and m.vet(brace, 4) == brace and m.accept(brace)
    m.fill_bitmask(bitmask, 0, tokens_left=3)
    assert allowed_ids(bitmask).tolist() == [close] and m.vet(close, 3) == close and m.accept(close)


NOTE = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 16},
                                         "due": {"type": ["string", "null"], "format": "date"}},
        "required": ["title", "due"], "additionalProperties": False}


@pytest.mark.parametrize("tool_format", ["glm45", "glm47"])
def test_a_budget_completion_writes_null_where_a_value_cannot_be_empty(tool_format, glm):
    """A required date that may be null: the closing walk writes `null` (one token), not a date (ten digits), so
    a budget between the two still closes every call (none closed at 26 tokens before)."""
    tok, vocab, compiler = glm
    tools = [{"type": "function", "function": {"name": "add_note", "strict": True, "parameters": NOTE}}]
    spec = spec_from_request(tools=tools, tool_choice="required", parallel_tool_calls=True, tool_format=tool_format)
    g = compiler.compile(spec)
    shortest = {"glm45": 20, "glm47": 15}[tool_format]
    assert g.matcher().min_tokens_to_end() == shortest
    rng = random.Random(3)
    for _ in range(6):
        toks, done = random_walk(g, vocab, rng, shortest + 6, budget=True, special_ok=TAG_IDS)
        assert done
        assert len(valid_calls(tok.decode(toks, skip_special_tokens=False), spec, {"add_note": NOTE})) == 1


@pytest.mark.parametrize("tool_format", ["glm45", "glm47"])
def test_a_raw_email_value_closes_within_a_tight_budget(tool_format, glm):
    """A raw `email` value a walk keeps writing is finished by an example before its closing tag token (it ran to
    `max_tokens`, cut)."""
    tok, vocab, compiler = glm
    contact = {"type": "object", "properties": {"email": {"type": "string", "format": "email"}},
               "required": ["email"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "contact", "parameters": contact}}]
    spec = spec_from_request(tools=tools, tool_choice={"type": "function", "function": {"name": "contact"}},
                             tool_format=tool_format)
    g = compiler.compile(spec)
    rng = random.Random(3)
    for _ in range(6):
        toks, done = random_walk(g, vocab, rng, 60, budget=True, special_ok=TAG_IDS)
        assert done
        assert len(valid_calls(tok.decode(toks, skip_special_tokens=False), spec, {"contact": contact})) == 1


@pytest.mark.parametrize("tool_format", ["glm45", "glm47"])
def test_calls_close_where_the_tags_are_text(tool_format, tmp_path):
    """Where the tokenizer has no tokens for the argument tags (Qwen2's, `<tool_call>` added but not special), a
    tag's text is also text inside a JSON string or a raw value: the closing walk took `</arg_value>` there for the
    value's end again and again and found no completion, and glm47's walks ran out of tokens inside a string (6 in
    15; glm45's ending holds a newline, which a JSON string does not)."""
    params = {"type": "object", "properties": {"a": {}, "s": {"type": "string"}}, "required": ["a", "s"]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    spec = spec_from_request(tools=tools, tool_choice="required", parallel_tool_calls=False, tool_format=tool_format)
    with compiling(build_qwen3_coder_tokenizer(tmp_path), "qwen2") as (tok, vocab, compiler):
        g = compiler.compile(spec)
        m = g.matcher()
        nl = "\n" if tool_format == "glm45" else ""
        for t in vocab.spell(f'<tool_call>f{nl}<arg_key>a</arg_key>{nl}<arg_value>"x'.encode(), ordinary=True):
            assert m.accept(t)
        assert m.min_tokens_to_end() is not None
        rng = random.Random(0)
        for _ in range(12):
            toks, done = random_walk(g, vocab, rng, 60, budget=True, prefer_end=0.3)
            assert done
            valid_calls(tok.decode(toks), spec, {"f": params})



@pytest.mark.parametrize("tool_format", ["glm45", "glm47"])
def test_the_budget_completion_skips_optional_parameters_declared_before_a_required_one(tool_format, glm):
    tok, vocab, compiler = glm
    tools = [{"type": "function", "function": {"name": "search", "parameters": OPTIONAL_FIRST}}]
    spec = spec_from_request(tools=tools, tool_choice="required", tool_format=tool_format)
    g = compiler.compile(spec)
    shortest = tok.encode(_call(tool_format, "search", ("keywords", "[]")))
    assert g.matcher().min_tokens_to_end() == len(shortest)
    rng = random.Random(5)
    for _ in range(6):  # (each walk that fits the shortest call ends with it, or one as short)
        toks, done = random_walk(g, vocab, rng, len(shortest), budget=True, special_ok=TAG_IDS)
        assert done
        valid_calls(tok.decode(toks, skip_special_tokens=False), spec, {"search": OPTIONAL_FIRST})


def test_a_call_tag_spelled_as_text_is_vetted_near_the_budget(glm):
    """glm47 writes no newline between calls, and its grammar takes `<tool_call>` spelled as text too: a `<` after
    a call began another one that did not fit the tokens left (only the tag's token, and a newline, were vetted),
    and the call was cut at the limit."""
    tok, vocab, compiler = glm
    params = {"type": "object", "properties": {"a": {"type": "string", "format": "date"}}, "required": ["a"],
              "additionalProperties": False}
    spec = spec_from_request(tools=[{"type": "function", "function": {"name": "f", "parameters": params}}],
                             tool_choice="required", tool_format="glm47")
    g = compiler.compile(spec)
    m = g.matcher()
    for t in tok.encode(_call("glm47", "f", ("a", "1086-08-14"))):
        assert m.accept(t)
    lt = tok.convert_tokens_to_ids("<")
    assert m.vet(lt, 10) != lt


@pytest.mark.parametrize("tool_format", ["glm45", "glm47"])
def test_a_long_function_s_name_is_vetted_where_a_short_one_s_call_was_kept(tool_format, glm):
    tok, vocab, compiler = glm
    a_long_function_s_name_is_vetted_where_a_short_one_s_call_was_kept(
        compiler, tok, vocab, tool_format, _call(tool_format, "alpha_long_function", ("p0", "x")))


def test_a_further_call_is_begun_after_a_spelled_close_only_where_one_fits(glm):
    """(glm45: a newline between calls; glm47 writes none, its `<` after a call is vetted as the tag's beginning)"""
    tok, vocab, compiler = glm
    a_further_call_is_begun_after_a_spelled_close_only_where_one_fits(
        compiler, tok, vocab, "glm45", _call("glm45", "alpha_long_function", *((f"p{i}", "x") for i in range(6))))
