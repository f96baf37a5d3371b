"""Tool calls in the hermes format (`<tool_call>\\n{...}\\n</tool_call>`, what Qwen2.5's template asks for), on the
Qwen2 tokenizer with its tag tokens: arguments validate on both backends, the checks applied while decoding follow
each call, free text under "auto" holds no call, and the parser reads calls and the text before them."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from constrain import parse_tool_calls, spec_from_request
from tests.conftest import QWEN_TOOL_TAGS, build_qwen_tools_tokenizer
from tests.constrain.conftest import (LONG_FIRST, a_further_call_is_begun_after_a_spelled_close_only_where_one_fits,
                                      a_long_function_s_name_is_vetted_where_a_short_one_s_call_was_kept,
                                      allowed_ids, assert_the_tag_is_kept_only_where_its_call_fits, compiling, decode,
                                      may_answer_nothing, offered_walk, random_walk, takes_text,
                                      the_shortest_function_s_call_is_measured)

OPEN_ID, CLOSE_ID = sorted(QWEN_TOOL_TAGS)
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "days": {"type": "array", "items": {"enum": [1, 2, 3]},
                                                     "uniqueItems": True}},
           "required": ["city"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"x": {"$ref": "#/$defs/n"}, "y": {"type": "integer", "not": {"const": 3}}},
       "required": ["x", "y"], "additionalProperties": False, "$defs": {"n": {"type": "integer"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
# What outlines can serve (it refuses `not`, which llguidance's grammar serves with a check while decoding).
ADD_PLAIN = {**ADD, "properties": {**ADD["properties"], "y": {"type": "integer"}}}
OUTLINES_TOOLS = [TOOLS[0], {"type": "function", "function": {"name": "add", "parameters": ADD_PLAIN}}]


@pytest.fixture(scope="module")
def qwen_tools(tmp_path_factory):
    """(tokenizer, vocabulary, compiler) of the Qwen2 tokenizer with `<tool_call>` tokens."""
    with compiling(build_qwen_tools_tokenizer(tmp_path_factory.mktemp("qwen-tools")), "qwen2") as found:
        yield found


def _hermes(tool_choice, parallel=True, backend=None, tools=TOOLS):
    return spec_from_request(tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel,
                             tool_format="hermes", backend=backend)


def _calls(*calls) -> str:
    return "\n".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls)


@pytest.mark.parametrize("backend, tool_choice, parallel", [
    ("llguidance", "required", True), ("llguidance", "required", False),
    ("llguidance", {"type": "function", "function": {"name": "add"}}, True),
    ("outlines", "required", False), ("outlines", {"type": "function", "function": {"name": "add"}}, True)])
def test_forced_calls_are_tagged_and_validate(tool_choice, parallel, backend, qwen_tools):
    tok, vocab, compiler = qwen_tools
    tools = OUTLINES_TOOLS if backend == "outlines" else TOOLS
    spec = _hermes(tool_choice, parallel, backend, tools=tools)
    g = compiler.compile(spec)
    assert g.backend == backend and g.call_tag == b"<tool_call>"
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    g.matcher().fill_bitmask(bitmask, 0)
    assert OPEN_ID in allowed_ids(bitmask).tolist()  # the model's own tag token opens a call
    rng = random.Random(5)
    ended = 0
    for _ in range(8):
        toks, done = random_walk(g, vocab, rng, 160, budget=True, prefer_end=0.5)
        if not done:
            continue
        ended += 1
        text = decode(vocab, toks)
        parsed = parse_tool_calls(text, spec)
        assert parsed is not None and parsed.content is None, text
        assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
        if not parallel or isinstance(tool_choice, dict):
            assert len(parsed.calls) == 1
        for call in parsed.calls:
            assert call.name in spec.tool_names
            params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
            jsonschema.validate(json.loads(call.arguments), params[call.name])
    assert ended


def test_single_call_refuses_a_second_and_a_named_call_refuses_other_functions(qwen_tools):
    tok, _, compiler = qwen_tools
    one = _calls(("add", {"x": 1, "y": 2}))
    two = _calls(("add", {"x": 1, "y": 2}), ("get_weather", {"city": "Oslo"}))
    assert takes_text(compiler.compile(_hermes("required")), tok, two)
    assert not takes_text(compiler.compile(_hermes("required", parallel=False)), tok, two)
    named = compiler.compile(_hermes({"type": "function", "function": {"name": "get_weather"}}))
    assert not takes_text(named, tok, one)
    assert takes_text(named, tok, _calls(("get_weather", {"city": "Oslo"})))


def test_auto_may_answer_nothing(qwen_tools):
    _, vocab, compiler = qwen_tools
    assert may_answer_nothing(compiler.compile(_hermes("auto")), vocab)


def test_auto_takes_text_calls_or_text_then_calls(qwen_tools):
    tok, _, compiler = qwen_tools
    spec = _hermes("auto")
    g = compiler.compile(spec)
    call = _calls(("add", {"x": 1, "y": 2}))
    cases = [
        ("It is sunny in Oslo.", True, None),
        (call, True, None),
        ("Let me add them.\n" + call, True, "Let me add them."),
        ("Let me add them.\n" + _calls(("launch", {})), False, None),  # unknown functions are masked
        (" leading whitespace", True, None),  # (a SentencePiece model's first word begins with a space)
        (" \n" + call, True, None),  # (whitespace alone is text too: a model that wrote newlines may answer)
    ]
    for text, ok, content in cases:
        assert takes_text(g, tok, text) == ok, text
        if ok:
            parsed = parse_tool_calls(text, spec)
            assert (parsed is not None) == (call in text)
            if parsed is not None:
                assert parsed.content == content and [c.name for c in parsed.calls] == ["add"]


def test_auto_text_never_spells_a_tag_out(qwen_tools):
    """Text that spells `<tool_call>` in pieces would read as a call with unchecked arguments: refused."""
    tok, _, compiler = qwen_tools
    g = compiler.compile(_hermes("auto"))
    spelled = tok.encode("Sure: <") + tok.encode("tool_call>")
    assert OPEN_ID not in spelled
    m = g.matcher()
    assert not all(m.accept(t) for t in spelled)


def test_checks_applied_while_decoding_follow_every_call(qwen_tools):
    """`uniqueItems` (constrain/unique_items.py) and `not` (constrain/late_keywords.py) are enforced in the
    second call too, past the tags between calls."""
    tok, _, compiler = qwen_tools
    g = compiler.compile(_hermes("required"))
    first = ("get_weather", {"city": "Oslo", "days": [1, 2]})
    assert takes_text(g, tok, _calls(first, ("get_weather", {"city": "Rome", "days": [2, 3]})))
    assert not takes_text(g, tok, _calls(first, ("get_weather", {"city": "Rome", "days": [2, 2]})))
    assert takes_text(g, tok, _calls(first, ("add", {"x": 3, "y": 4})))
    assert not takes_text(g, tok, _calls(first, ("add", {"x": 1, "y": 3})))
    single = compiler.compile(_hermes("required", parallel=False, backend="outlines", tools=OUTLINES_TOOLS))
    assert takes_text(single, tok, _calls(("get_weather", {"city": "Rome", "days": [2, 3]})))
    assert not takes_text(single, tok, _calls(("get_weather", {"city": "Rome", "days": [2, 2]})))


def test_outlines_refuses_parallel_tagged_calls_and_auto_serves_them(qwen_tools):
    """outlines-core would refuse every call after the first (`_many_tagged_calls`): a 400 when outlines is asked
    for, llguidance under `auto`."""
    from constrain import ConstraintError

    tok, _, compiler = qwen_tools
    with pytest.raises(ConstraintError) as exc:
        compiler.compile(_hermes("required", backend="outlines", tools=OUTLINES_TOOLS))
    assert exc.value.param == "tools" and "parallel_tool_calls: false" in exc.value.message
    g = compiler.compile(_hermes("required", tools=OUTLINES_TOOLS))
    assert g.backend == "llguidance"
    assert takes_text(g, tok, _calls(("add", {"x": 1, "y": 2}), ("add", {"x": 3, "y": 4})))


def test_escaped_keys_are_refused_in_every_call(qwen_tools):
    """Open parameters naming `city`: `\\u0063ity` would pass as another key (constrain/plain_keys.py)."""
    tok, _, compiler = qwen_tools
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    g = compiler.compile(_hermes("auto", tools=[{"type": "function", "function": {"name": "f",
                                                                                 "parameters": params}}]))
    first = '<tool_call>\n{"name": "f", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
    assert takes_text(g, tok, first + '<tool_call>\n{"name": "f", "arguments": {"city": "Rome", "n": 1}}\n</tool_call>')
    assert not takes_text(g, tok, first + '<tool_call>\n{"name": "f", "arguments": {"city": "Rome", '
                                      '"\\u0063ity": 1}}\n</tool_call>')
    assert takes_text(g, tok, 'Say "\\u0063ity": 1')  # free text is untouched


def test_strict_refusals_name_the_tools_entry(qwen_tools):
    _, _, compiler = qwen_tools
    from constrain import ConstraintError

    bad = {"type": "object", "properties": {"tags": {"type": "string", "not": {"pattern": "(a)\\1"}}}}
    tools = [{"type": "function", "function": {"name": "noop"}},
             {"type": "function", "function": {"name": "f", "strict": True, "parameters": bad}}]
    for tool_choice in ("required", "auto"):
        with pytest.raises(ConstraintError) as exc:
            compiler.compile(_hermes(tool_choice, tools=tools))
        assert exc.value.param == "tools" and exc.value.pointer == "/1/function/parameters/properties/tags/not"


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_calls_close_within_a_tight_budget(backend, qwen_tools):
    """The budget rule (issue #3, item 9) closes the tags too: every walk ends as complete, parseable calls."""
    _, vocab, compiler = qwen_tools
    spec = _hermes({"type": "function", "function": {"name": "add"}}, backend=backend,
                   tools=OUTLINES_TOOLS if backend == "outlines" else TOOLS)
    g = compiler.compile(spec)
    rng = random.Random(2)
    for _ in range(6):
        toks, done = random_walk(g, vocab, rng, 40, budget=True)
        assert done
        parsed = parse_tool_calls(decode(vocab, toks), spec)
        assert parsed is not None and len(parsed.calls) == 1
        jsonschema.validate(json.loads(parsed.calls[0].arguments), ADD_PLAIN if backend == "outlines" else ADD)


def test_parser_reads_only_whole_calls():
    spec = _hermes("auto")
    call = _calls(("add", {"x": 1, "y": 2}))
    assert parse_tool_calls("plain text", spec) is None
    assert parse_tool_calls(call[:-3], spec) is None  # cut short by max_tokens: the whole text is content
    assert parse_tool_calls(call + "\nand more text", spec) is None
    assert parse_tool_calls(_calls(("nope", {})), spec) is None
    parsed = parse_tool_calls("  Thinking done.\n\n" + call + "\n" + call + "\n", spec)
    assert parsed.content == "  Thinking done." and [c.arguments for c in parsed.calls] == ['{"x": 1, "y": 2}'] * 2
    # an argument may hold the closing tag (the grammar lets a string hold anything)
    tricky = parse_tool_calls(_calls(("get_weather", {"city": "</tool_call>"}), ("add", {"x": 1, "y": 2})), spec)
    assert [json.loads(c.arguments) for c in tricky.calls] == [{"city": "</tool_call>"}, {"x": 1, "y": 2}]
    # the other format's parser is not fooled by tags, nor this one by an array
    assert parse_tool_calls(call, spec_from_request(tools=TOOLS, tool_choice="auto")) is None
    assert parse_tool_calls('[{"name": "add", "arguments": {"x": 1, "y": 2}}]', spec) is None


def test_the_format_is_part_of_the_cache_key():
    assert _hermes("required").key != spec_from_request(tools=TOOLS, tool_choice="required").key
    with pytest.raises(ValueError):
        spec_from_request(tools=TOOLS, tool_choice="required", tool_format="xml")


def test_a_call_after_text_is_steered_to_a_function_that_fits(qwen_tools):
    """The completion after the tag goes through the function the walk comes to first, here the longest: where only
    the short one fits, the tag was replaced by EOS (helper-22's review). Now each function's shortest call is
    measured, and a call begun is steered to one that fits though the model leans to the long one."""
    tok, vocab, compiler = qwen_tools
    spec = _hermes("auto", tools=LONG_FIRST)
    g = compiler.compile(spec)
    text = tok.encode(" some words before the call")
    leaning = tok.encode('\n{"name": "alpha_long_function", "arguments": {')  # (the model leans to the long one)
    written = offered_walk(g, vocab, text, [min(QWEN_TOOL_TAGS)] + leaning, 24)
    assert written[0] == min(QWEN_TOOL_TAGS)
    calls = parse_tool_calls(decode(vocab, text + written), spec)
    assert calls is not None and calls.calls and all((c.name, c.arguments) == ("z", "{}") for c in calls.calls)


def test_a_call_is_begun_after_text_only_where_it_can_close(qwen_tools):
    """The `<tool_call>` token after free text (tool_choice "auto") is vetted at any distance from the limit: it
    takes the completion from nothing to a whole call (tests/constrain/test_tools_qwen3_coder.py, the same)."""
    tok, vocab, compiler = qwen_tools
    move = {"type": "object", "properties": {"source_path": {"type": "string", "maxLength": 8},
                                             "destination_path": {"type": "string", "maxLength": 8},
                                             "overwrite_mode": {"type": "boolean"}},
            "required": ["source_path", "destination_path", "overwrite_mode"], "additionalProperties": False}
    g = compiler.compile(_hermes("auto", tools=[{"type": "function", "function": {"name": "move_file",
                                                                                 "parameters": move}}]))
    assert_the_tag_is_kept_only_where_its_call_fits(g, tok, vocab, min(QWEN_TOOL_TAGS))


def test_a_further_call_is_begun_only_where_one_fits_however_far_the_limit(qwen_tools):
    """After a call, the newline that begins another was vetted only near the limit as measured there (nothing
    left to write): a second call begun 24 tokens out, whose shortest takes more, was cut (helper-22's review)."""
    tok, vocab, compiler = qwen_tools
    g = compiler.compile(_hermes("required", tools=LONG_FIRST[:1]))
    first = tok.encode(_calls(("alpha_long_function", {f"p{i}": "" for i in range(6)})))
    newline = tok.encode("\n")[0]
    probe = g.matcher()
    assert all(probe.accept(t) for t in first + [newline])
    needed = probe.min_tokens_to_end()
    assert needed is not None and needed > 20
    for left, kept in [(needed + 1, True), (needed, False), (24, False)]:
        m = g.matcher()
        assert all(m.accept(t) for t in first)
        vetted = m.vet(newline, left)
        assert vetted == newline if kept else vetted in vocab.eos_token_ids


def test_no_call_is_begun_that_cannot_close_in_the_budget(qwen_tools):
    """After a closing tag the calls may end or go on: near the budget, the newline that would begin another call
    is replaced by EOS when that call could not close in time (a sweep found parallel calls cut short)."""
    tok, vocab, compiler = qwen_tools
    g = compiler.compile(_hermes("required", tools=[{"type": "function", "function": {"name": "f"}}]))
    newline = tok.encode("\n")[0]
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    for tokens_left, room in [(40, True), (6, False)]:
        m = g.matcher()
        for t in tok.encode(_calls(("f", {}))):
            assert m.accept(t)
        m.fill_bitmask(bitmask, 0, tokens_left)  # (the engine fills the mask, then vets the sampled token)
        assert newline in allowed_ids(bitmask).tolist()
        assert (m.vet(newline, tokens_left) == newline) == room
        assert room or m.vet(newline, tokens_left) in vocab.eos_token_ids
    rng = random.Random(7)
    spec = _hermes("required", tools=[{"type": "function", "function": {"name": "f"}}])
    for _ in range(8):
        toks, done = random_walk(g, vocab, rng, 48, budget=True)
        assert done and parse_tool_calls(decode(vocab, toks), spec) is not None


def test_a_long_function_s_name_is_vetted_where_a_short_one_s_call_was_kept(qwen_tools):
    tok, vocab, compiler = qwen_tools
    a_long_function_s_name_is_vetted_where_a_short_one_s_call_was_kept(
        compiler, tok, vocab, "hermes", '<tool_call>\n{"name": "alpha_long_function", "arguments": {')


def test_the_budget_completion_is_the_shortest_function_s_call(qwen_tools):
    """Several functions: the completion measured before the tag is written goes through the shortest function's
    call (QA budgetfuzz F4: 34 tokens measured where 15 fit)."""
    tok, vocab, compiler = qwen_tools
    the_shortest_function_s_call_is_measured(compiler, tok, vocab, "hermes", special_ok=frozenset(
        tok.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>")))


def test_a_further_call_is_begun_after_a_spelled_close_only_where_one_fits(qwen_tools):
    tok, vocab, compiler = qwen_tools
    a_further_call_is_begun_after_a_spelled_close_only_where_one_fits(
        compiler, tok, vocab, "hermes", _calls(("alpha_long_function", {f"p{i}": "" for i in range(6)})))
