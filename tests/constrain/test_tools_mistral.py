"""Tool calls in Mistral's format (constrain/tools.py "mistral", constrain/call_token.py): the special token
`[TOOL_CALLS]`, then a JSON array of calls valid against the functions; under tool_choice "auto", or free text
that holds no such token. On a SentencePiece tokenizer where `[TOOL_CALLS]` is a special token, as Mistral's."""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest
import torch

from constrain import ConstraintError, spec_from_request
from constrain.call_token import CallTokenGrammar
from constrain.tools import parse_tool_calls
from tests.conftest import build_mistral_tools_tokenizer
from tests.constrain.conftest import (allowed_ids, compiling, may_answer_nothing, random_walk,
                                      the_shortest_function_s_call_is_measured)

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"enum": [1, 3, 7]}},
           "required": ["city", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
ARGS = {"get_weather": WEATHER, "get_time": TIME}


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    with compiling(build_mistral_tools_tokenizer(tmp_path_factory.mktemp("mistral")), "phi3") as (tok, vocab, c):
        yield c, vocab, tok.convert_tokens_to_ids("[TOOL_CALLS]")


def _spec(tool_choice="required", backend=None, parallel=True):
    return spec_from_request(tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=parallel,
                             tool_format="mistral", backend=backend)


def _valid_calls(text: str, single: bool) -> list[dict]:
    calls = json.loads(text)
    assert isinstance(calls, list) and calls and (len(calls) == 1 or not single)
    for call in calls:
        assert set(call) == {"name", "arguments"}
        jsonschema.validate(call["arguments"], ARGS[call["name"]])
    return calls


@pytest.mark.parametrize("backend,parallel", [("outlines", False), ("llguidance", True)])
def test_required_calls_start_with_the_token_and_end_valid_within_max_tokens(backend, parallel, mistral):
    compiler, vocab, token = mistral
    grammar = compiler.compile(_spec(backend=backend, parallel=parallel))
    assert isinstance(grammar, CallTokenGrammar) and grammar.backend == backend
    shortest = grammar.matcher().min_tokens_to_end()
    assert shortest == 1 + grammar.calls.matcher().min_tokens_to_end()
    rng = random.Random(5)
    for max_tokens in (shortest, shortest + 1, shortest + 6, 60, 60, 60):
        toks, ended = random_walk(grammar, vocab, rng, max_tokens, budget=True, prefer_end=0.4,
                                  special_ok=frozenset([token]))
        assert ended and toks[0] == token and token not in toks[1:]
        _valid_calls(b"".join(vocab.token_bytes[t] for t in toks[1:]).decode("utf-8"), single=not parallel)


def test_the_first_token_is_the_call_token_alone_under_required(mistral):
    compiler, vocab, token = mistral
    m = compiler.compile(_spec()).matcher()
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    m.fill_bitmask(bitmask, 0, tokens_left=1)  # (even where the calls no longer fit: they are the only output)
    assert allowed_ids(bitmask).tolist() == [token]
    assert not m.can_end() and not m.accept(vocab.spell(b"[")[0])
    assert m.accept(token) and not m.can_end()


def test_auto_is_the_token_and_calls_or_free_text_never_starting_as_calls_would(mistral):
    compiler, vocab, token = mistral
    grammar = compiler.compile(_spec("auto"))
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    grammar.matcher().fill_bitmask(bitmask, 0)
    first = allowed_ids(bitmask)
    assert token in first and vocab.ids_by_bytes()[b" Sure"] in first  # (SentencePiece's "▁Sure")
    assert not any(vocab.token_bytes[t] is not None and vocab.token_bytes[t].lstrip()[:1] in (b"[", b"{")
                   for t in first)
    rng = random.Random(11)
    for _ in range(8):  # (the token is one of 32k: a walk picks text)
        toks, ended = random_walk(grammar, vocab, rng, 30, budget=True, prefer_end=0.3,
                                  special_ok=frozenset([token]))
        assert ended and token not in toks  # (an empty answer too: nothing to say)
    m = grammar.matcher()
    assert m.accept(token) and not m.can_end()
    after = torch.zeros((1, vocab.words), dtype=torch.int32)
    m.fill_bitmask(after, 0)
    grammar.calls.matcher().fill_bitmask(bitmask, 0)
    calls = {vocab.token_bytes[t] for t in allowed_ids(bitmask)}
    # the calls from their start (text is over), their first token with or without a space before it
    got = {vocab.token_bytes[t] for t in allowed_ids(after)}
    assert calls | {b" ["} <= got <= calls | {b" " + c for c in calls}
    assert not m.accept(vocab.spell(b"Sure")[0])


def test_auto_may_answer_nothing(mistral):
    compiler, vocab, _ = mistral
    assert may_answer_nothing(compiler.compile(_spec("auto")), vocab)


def test_auto_allows_the_token_only_while_the_shortest_calls_still_fit(mistral):
    compiler, vocab, token = mistral
    grammar = compiler.compile(_spec("auto"))
    m = grammar.matcher()
    calls = grammar.calls.matcher().min_tokens_to_end()
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    m.fill_bitmask(bitmask, 0, tokens_left=1 + calls)
    assert token in allowed_ids(bitmask)
    m.fill_bitmask(bitmask, 0, tokens_left=calls)
    ids = allowed_ids(bitmask)
    assert token not in ids and len(ids) > 1000  # free text still may start
    assert m.min_tokens_to_end() == 0  # (the answer may be empty)


def test_a_named_function_is_one_call_to_it(mistral):
    compiler, vocab, token = mistral
    spec = spec_from_request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
                             tool_format="mistral")
    toks, ended = random_walk(compiler.compile(spec), vocab, random.Random(2), 40, budget=True,
                              special_ok=frozenset([token]))
    [call] = _valid_calls(b"".join(vocab.token_bytes[t] for t in toks[1:]).decode("utf-8"), single=True)
    assert ended and toks[0] == token and call["name"] == "get_time"


def test_strict_refusals_name_the_keyword_in_the_tools_array(mistral):
    compiler, _, _ = mistral
    strict = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "format": "regex"}}, "required": ["a"],
        "additionalProperties": False}}}
    with pytest.raises(ConstraintError) as exc:
        compiler.compile(spec_from_request(tools=[TOOLS[0], strict], tool_choice="auto", tool_format="mistral"))
    assert exc.value.param == "tools" and exc.value.pointer == "/1/function/parameters/properties/a/format"


def test_a_vocabulary_without_the_token_refuses_the_format(gpt2_compiler):
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(_spec())
    assert exc.value.param == "tools" and "[TOOL_CALLS]" in exc.value.message


@pytest.mark.parametrize("prefix", ["", "[TOOL_CALLS]", " [TOOL_CALLS] "])
def test_the_parser_reads_calls_with_or_without_the_token_in_the_text(prefix):
    spec = _spec("auto")
    text = prefix + '[{"name": "get_time", "arguments": {"zone": "UTC"}}]'
    [call] = parse_tool_calls(text, spec).calls
    assert call.name == "get_time" and json.loads(call.arguments) == {"zone": "UTC"}
    assert parse_tool_calls("It is noon [TOOL_CALLS].", spec) is None


def test_the_calls_grammar_is_cached_as_the_json_array_formats(mistral):
    compiler, _, _ = mistral
    compiler.compile(_spec(parallel=False, backend="llguidance"))
    hits = compiler.stats.cache_hits
    again = compiler.compile(_spec(parallel=False, backend="llguidance"))
    plain = compiler.compile(spec_from_request(tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                               tool_format="json_array", backend="llguidance"))
    assert compiler.stats.cache_hits == hits + 2 and again.calls is plain
    assert np.array_equal(again.token_row, compiler.compile(_spec()).token_row)


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_the_calls_may_begin_with_a_space_as_mistral_v0_3_writes_them(backend, mistral):
    """`[TOOL_CALLS] [` in Mistral 7B v0.3's template is `▁[` in its SentencePiece vocabulary: allowed as the
    calls' first token, taken as `[`, and the calls end valid after it."""
    compiler, vocab, token = mistral
    grammar = compiler.compile(_spec(backend=backend, parallel=False))
    spaced = vocab.ids_by_bytes()[b" ["]
    m = grammar.matcher()
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    assert m.accept(token)
    m.fill_bitmask(bitmask, 0)
    first = allowed_ids(bitmask)
    assert spaced in first and vocab.ids_by_bytes()[b"["] in first
    assert not m.accept(vocab.ids_by_bytes()[b" {"]) and m.vet(spaced, 40) == spaced and m.accept(spaced)
    m.fill_bitmask(bitmask, 0)
    assert spaced not in allowed_ids(bitmask)  # (only the first token: the JSON's own whitespace is bounded)
    rest = vocab.spell(b'{"name": "get_time", "arguments": {"zone": "CET"}}]')
    assert all(m.accept(t) for t in rest) and m.can_end()
    text = b"".join(vocab.token_bytes[t] for t in [spaced, *rest]).decode()
    [call] = parse_tool_calls(text, _spec()).calls
    assert call.name == "get_time"


def test_the_budget_completion_is_the_shortest_function_s_call(mistral):
    """Several functions: the completion measured before the name is written goes through the shortest function's
    call, not the first name the closing walk comes to (QA budgetfuzz F4: 41 tokens measured where 18 fit, and 4
    of 6 walks at 21 tokens were cut)."""
    compiler, vocab, token = mistral
    the_shortest_function_s_call_is_measured(compiler, compiler.tokenizer, vocab, "mistral",
                                             special_ok=frozenset([token]))
