"""gpt-oss's harmony format (constrain/harmony.py): reasoning messages, then a final message under the request's
constraint or one tool call under its function's, every header written as the format spells it, and the budget rule
through all of it. On the Qwen2 tokenizer with the harmony tags as special tokens (tests/conftest.py)."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from constrain import GrammarCompiler, spec_from_request
from constrain.harmony import CALL, END, RETURN, HarmonyGrammar
from constrain.tools import parse_tool_calls
from constrain.vocabulary import Vocabulary
from tests.conftest import HARMONY_TAGS, HARMONY_TEMPLATE, _build_tagged_tokenizer
from tests.constrain.conftest import WIDTHS, allowed_ids, random_walk

CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                         "population": {"type": "integer", "minimum": 0}},
        "required": ["name", "population"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_city", "parameters": CITY}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
ARGS = {"get_city": CITY, "get_time": TIME}
TAG_IDS = {tag: tid for tid, tag in HARMONY_TAGS.items()}


@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    tok = AutoTokenizer.from_pretrained(str(_build_tagged_tokenizer(tmp_path_factory.mktemp("harmony"), "qwen2",
                                                                    HARMONY_TAGS, HARMONY_TEMPLATE, special=True)))
    eos = [TAG_IDS[RETURN], TAG_IDS[CALL], 151643]
    vocab = Vocabulary.from_tokenizer(tok, WIDTHS["qwen2"], eos)
    compiler = GrammarCompiler(vocab, tok, backend="auto", background_outlines=False, compile_timeout_s=120)
    try:
        yield vocab, compiler
    finally:
        compiler.close()


def _answer_grammar(compiler, schema=CITY) -> HarmonyGrammar:
    spec = spec_from_request(response_format={"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": schema, "strict": True}})
    return HarmonyGrammar(compiler.compile(spec), {}, final=True, tokens=compiler.harmony_tokens(),
                          vocab=compiler.vocab)


def _split(grammar, vocab, toks) -> tuple[str, str]:
    """(reasoning, answer) text of an output, each token where its role puts it, as the engine does."""
    m, reasoning, answer = grammar.matcher(), b"", b""
    for t in toks:
        assert m.accept(t)
        if m.token_role == "reasoning":
            reasoning += vocab.token_bytes[t]
        elif m.token_role == "answer":
            answer += vocab.token_bytes[t]
        elif m.token_role == "call_header":
            answer += m.call_text.encode()
    return reasoning.decode(errors="replace"), answer.decode()  # (free text may hold any bytes)


def _tokens(vocab, *pieces) -> list[int]:
    """Tags by their ids, text spelled token by token."""
    parts = [part for p in pieces for part in re.split(r"(<\|[a-z]+\|>)", p) if part]
    return [t for p in parts for t in ([TAG_IDS[p]] if p in TAG_IDS else vocab.spell(p.encode()))]


def test_walks_end_with_a_valid_final_message_after_any_reasoning(harmony):
    vocab, compiler = harmony
    grammar = _answer_grammar(compiler)
    shortest = grammar.matcher().min_tokens_to_end()
    rng, reasoned = random.Random(3), 0
    for max_tokens in (shortest, shortest + 1, shortest + 4, 30, 60, 60, 60, 60, 90, 90):
        toks, ended = random_walk(grammar, vocab, rng, max_tokens, budget=True, prefer_end=0.3,
                                  special_ok=frozenset(HARMONY_TAGS))
        assert ended and len(toks) <= max_tokens
        reasoning, answer = _split(grammar, vocab, toks)
        jsonschema.validate(json.loads(answer), CITY)
        assert "<|" not in reasoning + answer
        reasoned += bool(reasoning)
    assert reasoned  # (some walks wrote reasoning first)


def test_required_calls_are_one_valid_call_read_back_from_the_answer(harmony):
    vocab, compiler = harmony
    spec = spec_from_request(tools=TOOLS, tool_choice="required", tool_format="harmony")
    grammar = compiler.compile(spec)
    assert isinstance(grammar, HarmonyGrammar)
    shortest = grammar.matcher().min_tokens_to_end()
    rng, names = random.Random(5), set()
    for max_tokens in (shortest, shortest + 2, 40, 40, 40, 40, 40, 40, 80, 80, 80, 80):
        toks, ended = random_walk(grammar, vocab, rng, max_tokens, budget=True, prefer_end=0.3,
                                  special_ok=frozenset(HARMONY_TAGS))
        assert ended
        _, answer = _split(grammar, vocab, toks)
        [call] = parse_tool_calls(answer, spec).calls
        jsonschema.validate(json.loads(call.arguments), ARGS[call.name])
        names.add(call.name)
    assert names == set(ARGS)


def test_headers_come_as_the_format_spells_them(harmony):
    vocab, compiler = harmony
    auto_spec = spec_from_request(tools=TOOLS, tool_choice="auto", tool_format="harmony")
    auto = compiler.compile(auto_spec)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    m = auto.matcher()
    m.fill_bitmask(bitmask, 0)
    assert allowed_ids(bitmask).tolist() == [TAG_IDS["<|channel|>"]] and m.accept(TAG_IDS["<|channel|>"])
    m.fill_bitmask(bitmask, 0)
    ids = set(allowed_ids(bitmask).tolist())
    ids_of = vocab.ids_by_bytes()
    assert {ids_of[b"analysis"], ids_of[b"final"], ids_of[b"comment"]} <= ids and ids_of[b"hello"] not in ids
    assert len(ids) < 50
    # in a reasoning message: any text, its end, never EOS nor another tag
    assert all(m.accept(t) for t in _tokens(vocab, "analysis", "<|message|>", "Let me think."))
    m.fill_bitmask(bitmask, 0)
    ids = set(allowed_ids(bitmask).tolist())
    assert TAG_IDS[END] in ids and ids_of[b" hello"] in ids and len(ids) > 100_000
    assert not ids & (vocab.eos_token_ids | {TAG_IDS["<|channel|>"], TAG_IDS["<|start|>"]})
    # near the budget the reasoning ends: only the end still fits
    m.fill_bitmask(bitmask, 0, tokens_left=m.min_tokens_to_end())
    assert allowed_ids(bitmask).tolist() == [TAG_IDS[END]]
    assert all(m.accept(t) for t in _tokens(vocab, "<|end|>", "<|start|>", "assistant", "<|channel|>",
                                             "commentary to=functions.get_time <|constrain|>json<|message|>"))
    [call] = parse_tool_calls(m.call_text + '{"zone": "UTC"}', auto_spec).calls
    assert m.token_role == "call_header" and (call.name, call.arguments) == ("get_time", '{"zone": "UTC"}')
    assert all(m.accept(t) for t in vocab.spell(b'{"zone": "CET"}')) and m.can_end() and m.is_terminated()
    # required: no final message
    required = compiler.compile(spec_from_request(tools=TOOLS, tool_choice="required", tool_format="harmony"))
    m = required.matcher()
    assert m.accept(TAG_IDS["<|channel|>"]) and not m.accept(ids_of[b"final"])


def test_auto_answers_in_text_or_a_call(harmony):
    vocab, compiler = harmony
    spec = spec_from_request(tools=TOOLS, tool_choice="auto", tool_format="harmony")
    grammar = compiler.compile(spec)
    for pieces, names, reasoning in [
        (["<|channel|>", "final", "<|message|>", "It is noon."], None, ""),
        (["<|channel|>", "analysis", "<|message|>", "Time?", "<|end|>", "<|start|>", "assistant", "<|channel|>",
          "commentary to=functions.get_time <|constrain|>json<|message|>", '{"zone": "UTC"}'], ["get_time"], "Time?"),
        # a preamble (a commentary message to no one) before the call: reasoning, as the analysis is
        (["<|channel|>commentary<|message|>I will check.<|end|><|start|>assistant<|channel|>",
          "commentary to=functions.get_time <|constrain|>json<|message|>", '{"zone": "CET"}'], ["get_time"],
         "I will check."),
    ]:
        m = grammar.matcher()
        toks = _tokens(vocab, *pieces)
        assert all(m.accept(t) for t in toks) and m.can_end(), pieces
        written, answer = _split(grammar, vocab, toks)
        parsed = parse_tool_calls(answer, spec)
        assert (parsed is None) == (names is None) and (names is None or [c.name for c in parsed.calls] == names)
        assert written == reasoning
    for pieces in (["<|channel|>", "commentary to=functions.launch <|constrain|>json<|message|>", "{}"],
                   ["<|channel|>", "commentary to=functions.get_time <|constrain|>json<|message|>",
                    '{"zone": "PST"}'],
                   ["<|channel|>", "final", "<|message|>", "Hi", "<|end|>"],
                   ["<|channel|>", "analysis", "<|message|>", "Hmm", "<|channel|>"],
                   ["<|channel|>commentary<|message|>Done."]):  # (a preamble is no answer)
        m = grammar.matcher()
        assert not (all(m.accept(t) for t in _tokens(vocab, *pieces)) and m.can_end()), pieces


def test_a_free_final_message_never_spells_a_calls_header(harmony):
    """The answer's text is read back as a call where it holds one's header, which a final message could spell in
    ordinary tokens: its arguments were held to nothing (QA toolfmt F1, unsound)."""
    vocab, compiler = harmony
    spec = spec_from_request(tools=TOOLS, tool_choice="auto", tool_format="harmony")
    grammar = compiler.compile(spec)
    header = _tokens(vocab, "<|channel|>", "final", "<|message|>")
    spelled = b'So: <|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"zone": "PST"}'
    assert parse_tool_calls(spelled.decode(), spec) is not None  # (what it would be read as)
    for text, taken in ((spelled, False), (b"The channel is <|channel|>final.", True)):
        m = grammar.matcher()
        assert all(m.accept(t) for t in header)
        assert all(m.accept(t) for t in vocab.spell(text, ordinary=True)) == taken, text
