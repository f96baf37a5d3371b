"""Tool calls in Mistral's later format (constrain/tools.py "mistral_args", constrain/args_calls.py): each call as
`[TOOL_CALLS]name[ARGS]{arguments}`, both tags special tokens, the arguments valid against the function named;
under tool_choice "auto", or free text, or text and then calls. On a SentencePiece tokenizer where the tags are
special tokens, as in Mistral's."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from constrain import ConstraintError, spec_from_request
from constrain.args_calls import ArgsCallsGrammar
from constrain.tools import parse_tool_calls
from tests.conftest import build_mistral_args_tokenizer
from tests.constrain.conftest import allowed_ids, compiling, may_answer_nothing, random_walk, takes_spelled

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "array", "items": {"enum": [1, 2, 3]},
                                                     "maxItems": 3, "uniqueItems": True}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
ARGS = {"get_weather": WEATHER, "get_time": TIME}


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    with compiling(build_mistral_args_tokenizer(tmp_path_factory.mktemp("mistral-args")), "phi3") as (tok, vocab, c):
        yield c, vocab, {tok.convert_tokens_to_ids(tag): tag for tag in ("[TOOL_CALLS]", "[ARGS]")}


def _spec(tool_choice="required", parallel=True, backend=None, tools=TOOLS):
    return spec_from_request(tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel,
                             tool_format="mistral_args", backend=backend)


def test_auto_may_answer_nothing(mistral):
    compiler, vocab, _ = mistral
    assert may_answer_nothing(compiler.compile(_spec("auto")), vocab)


def _text(vocab, tags, toks) -> str:
    """The output as the engine decodes it for this format: with its special tokens."""
    return b"".join(tags[t].encode() if t in tags else vocab.token_bytes[t] for t in toks).decode("utf-8")


def _tokens(vocab, tags, *pieces) -> list[int]:
    """Tags by their ids, text spelled token by token."""
    ids = {tag: tid for tid, tag in tags.items()}
    return [t for p in pieces for t in ([ids[p]] if p in ids else vocab.spell(p.encode()))]


def _check(calls, single: bool) -> None:
    assert calls and (len(calls) == 1 or not single)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), ARGS[call.name])


@pytest.mark.parametrize("backend,parallel", [("outlines", False), ("llguidance", True)])
def test_required_calls_end_valid_within_max_tokens(backend, parallel, mistral):
    compiler, vocab, tags = mistral
    spec = _spec(parallel=parallel, backend=backend, tools=TOOLS[1:] if backend == "outlines" else TOOLS)
    grammar = compiler.compile(spec)
    assert isinstance(grammar, ArgsCallsGrammar) and grammar.backend == backend
    shortest = grammar.matcher().min_tokens_to_end()
    rng = random.Random(7)
    for max_tokens in (shortest, shortest + 1, shortest + 5, 50, 50, 50, 50):
        toks, ended = random_walk(grammar, vocab, rng, max_tokens, budget=True, prefer_end=0.4,
                                  special_ok=frozenset(tags))
        assert ended and tags.get(toks[0]) == "[TOOL_CALLS]"
        _check(parse_tool_calls(_text(vocab, tags, toks), spec).calls, single=not parallel)


def test_the_tags_come_where_the_format_puts_them(mistral):
    compiler, vocab, tags = mistral
    call, args = sorted(tags, key=lambda t: tags[t] != "[TOOL_CALLS]")
    m = compiler.compile(_spec(parallel=False)).matcher()
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    m.fill_bitmask(bitmask, 0, tokens_left=2)  # (even where no call fits: calls are the only output)
    assert allowed_ids(bitmask).tolist() == [call] and not m.accept(args) and m.accept(call)
    assert all(m.accept(t) for t in vocab.spell(b"get"))
    m.fill_bitmask(bitmask, 0)
    assert args not in allowed_ids(bitmask) and not m.accept(args)  # the name is not complete
    assert all(m.accept(t) for t in vocab.spell(b"_time"))
    m.fill_bitmask(bitmask, 0)
    ids = allowed_ids(bitmask)
    assert args in ids and not set(ids.tolist()) & vocab.eos_token_ids and m.accept(args)
    assert all(m.accept(t) for t in vocab.spell(b'{"zone": "CET"}')) and m.can_end() and m.is_terminated()
    m.fill_bitmask(bitmask, 0)
    assert call not in allowed_ids(bitmask)  # parallel_tool_calls: false
    many = compiler.compile(_spec()).matcher()
    assert all(many.accept(t) for t in _tokens(vocab, tags, "[TOOL_CALLS]", "get_time", "[ARGS]", '{"zone": "UTC"}'))
    many.fill_bitmask(bitmask, 0)
    assert call in allowed_ids(bitmask) and many.can_end() and not many.is_terminated()


def test_auto_is_text_calls_or_text_then_calls(mistral):
    compiler, vocab, tags = mistral
    spec = _spec("auto")
    grammar = compiler.compile(spec)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    grammar.matcher().fill_bitmask(bitmask, 0)
    first = allowed_ids(bitmask)
    assert {t for t in tags if tags[t] == "[TOOL_CALLS]"} < set(first.tolist())
    assert vocab.ids_by_bytes()[b" Sure"] in first  # (SentencePiece's "▁Sure")
    for pieces, content, names in [
        (["Let me check.", "[TOOL_CALLS]", "get_time", "[ARGS]", '{"zone": "UTC"}'], "Let me check.", ["get_time"]),
        (["[TOOL_CALLS]", "get_time", "[ARGS]", '{"zone": "UTC"}', "[TOOL_CALLS]", "get_weather", "[ARGS]",
          '{"city": "Oslo", "days": [1, 3]}'], None, ["get_time", "get_weather"]),
        ([" It is noon."], None, None),
    ]:
        m = grammar.matcher()
        toks = _tokens(vocab, tags, *pieces)
        assert all(m.accept(t) for t in toks) and m.can_end(), pieces
        parsed = parse_tool_calls(_text(vocab, tags, toks), spec)
        assert (parsed is None) == (names is None)
        if parsed is not None:
            assert parsed.content == content and [c.name for c in parsed.calls] == names
    for pieces in (["[TOOL_CALLS]", "launch", "[ARGS]", "{}"],  # unknown functions are masked
                   ["[TOOL_CALLS]", "get_weather", "[ARGS]", '{"city": "Oslo", "days": [1, 1]}'],  # uniqueItems
                   ["Sure.", "[TOOL_CALLS]", "get_time", "[ARGS]", '{"zone": "UTC"}', "Done."]):  # text after
        m = grammar.matcher()
        assert not (all(m.accept(t) for t in _tokens(vocab, tags, *pieces)) and m.can_end()), pieces


def test_auto_allows_a_call_only_while_a_whole_shortest_call_fits(mistral):
    compiler, vocab, tags = mistral
    call = next(t for t in tags if tags[t] == "[TOOL_CALLS]")
    grammar = compiler.compile(_spec("auto"))
    m, needed = grammar.matcher(), grammar.shortest_call()
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    m.fill_bitmask(bitmask, 0, tokens_left=needed)
    assert call in allowed_ids(bitmask)
    m.fill_bitmask(bitmask, 0, tokens_left=needed - 1)
    assert call not in allowed_ids(bitmask) and len(allowed_ids(bitmask)) > 1000


def test_strict_refusals_and_unenforced_keywords_name_the_entry_of_tools(mistral):
    compiler, _, _ = mistral
    loose = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "format": "regex"}}, "required": ["a"],
        "additionalProperties": False}}}
    strict = {"type": "function", "function": {**loose["function"], "strict": True}}
    with pytest.raises(ConstraintError) as exc:
        compiler.compile(_spec("auto", tools=[TOOLS[0], strict]))
    assert exc.value.param == "tools" and exc.value.pointer == "/1/function/parameters/properties/a/format"
    from constrain.compiler import unenforced_in_client_terms

    spec = _spec("auto", tools=[TOOLS[0], loose])
    assert unenforced_in_client_terms(spec, compiler.compile(spec)) == ("/1/function/parameters/properties/a/format",)


def test_a_vocabulary_without_the_tags_refuses_the_format(gpt2_compiler):
    with pytest.raises(ConstraintError) as exc:
        gpt2_compiler.compile(_spec())
    assert exc.value.param == "tools" and "[ARGS]" in exc.value.message


def test_the_parser_reads_calls_only_with_their_tags():
    spec = _spec("auto")
    [call] = parse_tool_calls('[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}\n', spec).calls
    assert call.name == "get_time" and json.loads(call.arguments) == {"zone": "UTC"}
    for text in ('get_time{"zone": "UTC"}', '[TOOL_CALLS]get_time[ARGS]{"zone": "U',
                 '[TOOL_CALLS]launch[ARGS]{}', '[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"} and more'):
        assert parse_tool_calls(text, spec) is None, text


def test_below_the_shortest_call_the_output_still_goes_on_to_the_limit(mistral):
    """max_tokens too small for any call: the calls are the only output, so the shortest call is begun (it ends
    at the limit) rather than no token being allowed."""
    compiler, vocab, tags = mistral
    grammar = compiler.compile(_spec(parallel=False))
    shortest = grammar.shortest_call()
    for max_tokens in (1, 2, shortest - 1):
        toks, ended = random_walk(grammar, vocab, random.Random(max_tokens), max_tokens, budget=True,
                                  special_ok=frozenset(tags))
        assert len(toks) == max_tokens and not ended


def test_free_text_never_spells_the_call_tag(mistral):
    """The parser reads the decoded text, where `[TOOL_CALLS]` spelled in ordinary tokens is the tag: free text
    `hi [TOOL_CALLS]get_time[ARGS]{"zone": 5}` came back as a call whose arguments no grammar held (QA toolfmt
    F1, unsound)."""
    compiler, vocab, _ = mistral
    grammar = compiler.compile(_spec("auto"))
    for text in (b'hi [TOOL_CALLS]get_time[ARGS]{"zone": 5}', b'[TOOL_CALLS]get_time[ARGS]{"zone": 5}'):
        assert parse_tool_calls(text.decode(), _spec("auto")) is not None  # (what it would be read as)
        assert not takes_spelled(grammar, vocab, text), text
    assert takes_spelled(grammar, vocab, b"hi [TOOL_CALL] and [ARGS]")
