"""Tool calls in Llama 3's format (one `{"name": ..., "parameters": {...}}` object, what Llama 3.1-3.3's templates
ask for): arguments validate on both backends, there is never a second call, free text under "auto" never starts
with "{", and the parser reads the call back."""

from __future__ import annotations

import copy
import json
import random

import jsonschema
import pytest

from constrain import ConstraintError, llg_backend, parse_tool_calls, spec_from_request
from tests.constrain.conftest import (SHORT_NAME_LONG_CALL, decode, offered_walk, random_walk,
                                      the_shortest_function_s_call_is_measured)

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "days": {"type": "array", "items": {"enum": [1, 2, 3]},
                                                     "uniqueItems": True}},
           "required": ["city"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"x": {"$ref": "#/$defs/n"}, "y": {"$ref": "#/$defs/n"}},
       "required": ["x", "y"], "additionalProperties": False, "$defs": {"n": {"type": "integer"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
PARAMS = {"get_weather": WEATHER, "add": ADD}


def _llama(tool_choice, parallel=None, backend=None, tools=TOOLS):
    return spec_from_request(tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel,
                             tool_format="llama3_json", backend=backend)


def _call(name, parameters) -> str:
    return json.dumps({"name": name, "parameters": parameters})


def _takes(g, tok, text: str) -> bool:
    m = g.matcher()
    return all(m.accept(t) for t in tok.encode(text, add_special_tokens=False)) and m.can_end()


@pytest.mark.parametrize("backend, tool_choice", [
    ("llguidance", "required"), ("llguidance", {"type": "function", "function": {"name": "add"}}),
    ("outlines", {"type": "function", "function": {"name": "get_weather"}})])
def test_forced_calls_are_one_object_with_parameters(backend, tool_choice, gpt2_compiler, vocabs):
    tools = TOOLS
    if backend == "outlines":  # (outlines refuses uniqueItems, which llguidance's side checks while decoding)
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            **WEATHER, "properties": {"city": WEATHER["properties"]["city"]}}}}, TOOLS[1]]
    spec = _llama(tool_choice, backend=backend, tools=tools)
    g = gpt2_compiler.compile(spec)
    assert g.backend == backend
    rng = random.Random(7)
    ended = 0
    for _ in range(8):
        toks, done = random_walk(g, vocabs["gpt2"], rng, 120, budget=True, prefer_end=0.5)
        if not done:
            continue
        ended += 1
        text = decode(vocabs["gpt2"], toks)
        value = json.loads(text)
        assert isinstance(value, dict) and set(value) == {"name", "parameters"}, text
        parsed = parse_tool_calls(text, spec)
        assert parsed is not None and parsed.content is None and len(parsed.calls) == 1
        call = parsed.calls[0]
        if isinstance(tool_choice, dict):
            assert call.name == tool_choice["function"]["name"]
        jsonschema.validate(json.loads(call.arguments), PARAMS[call.name])
    assert ended


def test_always_one_call_whatever_parallel_tool_calls_says(gpt2_compiler, tokenizers):
    """Llama 3's templates refuse to render an assistant message with two calls: the format holds one."""
    tok = tokenizers["gpt2"]
    parallel, single = _llama("required", parallel=True), _llama("required", parallel=False)
    assert parallel.key == single.key
    g = gpt2_compiler.compile(parallel)
    one = _call("add", {"x": 1, "y": 2})
    assert _takes(g, tok, one)
    for two in (one + "; " + _call("add", {"x": 3, "y": 4}), f"[{one}]"):
        assert not _takes(g, tok, two)
    assert not _takes(g, tok, json.dumps({"name": "add", "arguments": {"x": 1, "y": 2}}))  # ours, not Llama's


def test_auto_takes_the_call_or_text_that_does_not_start_with_a_brace(gpt2_compiler, tokenizers):
    tok = tokenizers["gpt2"]
    spec = _llama("auto")
    g = gpt2_compiler.compile(spec)
    call = _call("get_weather", {"city": "Oslo", "days": [1, 3]})
    for text, ok, is_call in [
        ("It is sunny in Oslo.", True, False),
        ("[1, 2] are the days.", True, False),  # ("[" opens nothing here)
        (call, True, True),
        ('{"city": "Oslo"}', False, False),  # "{" opens a call: text never starts with it
        (" It is sunny.", True, False),  # (a SentencePiece model's first word begins with a space)
        (' \n{"city": "Oslo"}', False, False),  # nor with whitespace and "{"
        (_call("get_weather", {"city": "Oslo", "days": [1, 1]}), False, False),  # uniqueItems, checked while decoding
        (_call("launch", {}), False, False),  # unknown functions are masked
    ]:
        assert _takes(g, tok, text) == ok, text
        if ok:
            assert (parse_tool_calls(text, spec) is not None) == is_call


def test_the_parser_reads_one_call_and_nothing_else():
    spec = _llama("auto")
    parsed = parse_tool_calls(" " + _call("add", {"x": 1, "y": 2}) + "\n", spec)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("add", {"x": 1, "y": 2})]
    assert parsed.content is None and parsed.calls[0].id.startswith("call_")
    for text in ['{"name": "add", "parameters": {"x": 1', "It is sunny.",  # cut short; text
                 json.dumps({"name": "add", "arguments": {"x": 1, "y": 2}}),  # another format's key
                 json.dumps([{"name": "add", "parameters": {"x": 1, "y": 2}}])]:
        assert parse_tool_calls(text, spec) is None, text


def test_outlines_serves_a_call_to_one_function(gpt2_compiler):
    """Calls to one of several functions are an anyOf at the root, which outlines cannot serve exactly."""
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(_llama("required", backend="outlines", tools=[TOOLS[1], {**TOOLS[1], "function": {
            **TOOLS[1]["function"], "name": "add2"}}]))
    assert exc.value.param == "tools" and "name the function in tool_choice" in exc.value.message
    assert gpt2_compiler.compile(_llama("required", backend="outlines", tools=[TOOLS[1]])).backend == "outlines"


def test_refusals_name_the_tools_entry(gpt2_compiler):
    strict = [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "format": "regex"}}, "required": ["a"],
        "additionalProperties": False}}}]
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(_llama("required", tools=[TOOLS[0], *strict]))
    assert exc.value.param == "tools" and exc.value.pointer == "/1/function/parameters/properties/a/format"


def test_a_bad_tool_format_is_a_programming_error():
    with pytest.raises(ValueError):
        spec_from_request(tools=TOOLS, tool_choice="required", tool_format="xml")



@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
    """A compiler on a vocabulary with Llama 3's `<|python_tag|>` special token."""
    from tests.conftest import LLAMA3_PYTHON_TAG, build_llama3_tagged_tokenizer
    from tests.constrain.conftest import compiling

    with compiling(build_llama3_tagged_tokenizer(tmp_path_factory.mktemp("llama3-tag")), "qwen2") as (tok, vocab, c):
        yield c, vocab, tok, min(LLAMA3_PYTHON_TAG)


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_the_call_may_begin_with_the_python_tag_token(tool_choice, tagged):
    """Llama 3.1 and 3.2 sometimes write `<|python_tag|>` before a call: where the vocabulary has that token, it
    may open the call (then only the call follows), or the answer goes on without it."""
    import torch

    from tests.constrain.conftest import allowed_ids

    compiler, vocab, tok, tag = tagged
    spec = _llama(tool_choice)
    grammar = compiler.compile(spec)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    grammar.matcher().fill_bitmask(bitmask, 0)
    first = set(allowed_ids(bitmask).tolist())
    assert tag in first and vocab.ids_by_bytes()[b"{"] in first
    assert (vocab.ids_by_bytes()[b"It"] in first) == (tool_choice == "auto")
    call = _call("add", {"x": 1, "y": 2})
    for with_tag in (True, False):
        m = grammar.matcher()
        assert (m.accept(tag) if with_tag else True) and all(m.accept(t) for t in tok.encode(call))
        assert m.can_end()
    m = grammar.matcher()
    assert m.accept(tag) and not m.accept(vocab.ids_by_bytes()[b"It"])  # after the tag, only the call
    rng = random.Random(4)
    for _ in range(4):
        toks, ended = random_walk(grammar, vocab, rng, 60, budget=True, prefer_end=0.5, special_ok=frozenset([tag]))
        assert ended and tag not in toks[1:]
        text = decode(vocab, [t for t in toks if t != tag])
        if toks and toks[0] == tag or tool_choice == "required":
            [parsed] = parse_tool_calls(text, spec).calls
            jsonschema.validate(json.loads(parsed.arguments), PARAMS[parsed.name])
    [parsed] = parse_tool_calls("<|python_tag|>" + call, spec).calls  # (kept in the text: special tokens kept)
    assert parsed.name == "add"


def test_free_text_never_begins_with_the_python_tag_spelled_out(tagged):
    """`<|python_tag|>` spelled in ordinary tokens decodes as the token does, and the parser reads a call after it:
    free text `<|python_tag|>{"name": ...}` came back as a call no grammar held (QA toolfmt F1, unsound)."""
    from tests.constrain.conftest import takes_spelled

    compiler, vocab, tok, tag = tagged
    grammar = compiler.compile(_llama("auto"))
    text = b'<|python_tag|>{"name": "get_weather", "parameters": {"city": 5}}'
    assert parse_tool_calls(text.decode(), _llama("auto")) is not None  # (what it would be read as)
    assert not takes_spelled(grammar, vocab, text) and not takes_spelled(grammar, vocab, b" <|python_tag|> hi")
    assert takes_spelled(grammar, vocab, b"It is <|python_tag|> time.")


def test_a_long_call_begun_under_auto_is_vetted_at_any_distance(gpt2_compiler, vocabs):
    """Under "auto" a `{` at the answer's start opens a whole call where the answer could end before it (the
    completion grows from nothing to the call at once, as after a tag): it was vetted only from 2 x (0 + 8) + 32
    tokens before the limit, so a call of 50 tokens begun with 55 left was cut at the limit, and one begun with
    just enough left had its completion measured again only 8 tokens later, after a wasted token (QA budgetfuzz:
    Glaiveai2K's create_event, cut at its `location` value)."""
    params = {"type": "object", "properties": {f"parameter_number_{i}": {"type": "string", "format": "date"}
                                               for i in range(4)},
              "required": [f"parameter_number_{i}" for i in range(4)], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "schedule_the_long_event", "parameters": params}}]
    vocab = vocabs["gpt2"]
    shortest = gpt2_compiler.compile(_llama("required", tools=tools)).matcher().min_tokens_to_end()
    assert shortest > 2 * 8 + 32
    g = gpt2_compiler.compile(_llama("auto", tools=tools))
    brace = vocab.ids_by_bytes()[b'{"']  # (the shortest call's first token)
    assert g.matcher().vet(brace, shortest - 1) in vocab.eos_token_ids  # (the call cannot fit: the answer ends)
    assert g.matcher().vet(brace, shortest) == brace
    # begun with just enough left, a spelling longer than the shortest is steered back
    offered = vocab.spell(b'{"name" : "schedule_the_long_event" , "parameters" : {')
    toks = offered_walk(g, vocab, [], offered, shortest)
    [call] = parse_tool_calls(decode(vocab, toks), _llama("auto", tools=tools)).calls
    jsonschema.validate(json.loads(call.arguments), params)


def test_the_budget_completion_is_the_shortest_function_s_call(gpt2_compiler, tokenizers, vocabs):
    """Several functions: the completion measured before the name is written goes through the shortest function's
    call, not the first name the closing walk comes to (QA budgetfuzz F4: 31 tokens measured where 12 fit, and 4
    of 6 walks at 15 tokens were cut). Under "auto", a `{` is kept where the shortest call fits (it was replaced by
    EOS where the first function's did not)."""
    vocab = vocabs["gpt2"]
    short = the_shortest_function_s_call_is_measured(gpt2_compiler, tokenizers["gpt2"], vocab, "llama3_json")
    tools = copy.deepcopy(SHORT_NAME_LONG_CALL)
    tools[1]["function"]["name"] = "zs_without_arguments"  # (a grammar no output has walked yet)
    g = gpt2_compiler.compile(_llama("auto", tools=tools))
    brace = vocab.ids_by_bytes()[b'{"']  # (the shortest call's first token)
    assert g.matcher().vet(brace, short) == brace
    assert g.matcher().vet(brace, short - 1) in vocab.eos_token_ids


def test_after_a_first_walk_through_every_function_a_measure_walks_the_shortest_few(gpt2_compiler, monkeypatch):
    """The completion before a name is written walks the call through each function's name: 50 functions cost ~50
    ms a measure on the engine thread, several times a request. The first walk on a grammar ranks the names; later
    ones walk the `_NAMES_WALKED` shortest (and the walk that found the first name), with the same result."""
    params = [{"type": "object", "properties": {f"p{j}": {"type": "string"} for j in range(i)},
               "required": [f"p{j}" for j in range(i)], "additionalProperties": False} for i in range(10)]
    tools = [{"type": "function", "function": {"name": f"fn_{i}_args", "parameters": params[9 - i]}}
             for i in range(10)]  # (the shortest call, fn_9_args, is the last function, and the last by name)
    g = gpt2_compiler.compile(_llama("required", tools=tools))
    walks = []
    real = llg_backend.closing_tokens
    monkeypatch.setattr(llg_backend, "closing_tokens", lambda *a, **k: walks.append(1) or real(*a, **k))
    first = g.matcher().min_tokens_to_end()
    assert len(walks) == 1 + len(tools)
    walks.clear()
    assert g.matcher().min_tokens_to_end() == first
    assert len(walks) == 1 + llg_backend._NAMES_WALKED
    short = {"type": "function", "function": {"name": "fn_9_args"}}
    assert first == gpt2_compiler.compile(_llama(short, tools=tools)).matcher().min_tokens_to_end()
