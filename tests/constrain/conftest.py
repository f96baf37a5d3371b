"""Fixtures for constrain/ tests: real tokenizers, their Vocabularies, compilers, and helpers around the random
mask walker of constrain/walkbench.py."""

from __future__ import annotations

import contextlib
import copy
import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from constrain import GrammarCompiler, Vocabulary, spec_from_request
from constrain.maskbench import walk_instance
from constrain.walkbench import allowed_ids, decode, random_walk  # noqa: F401 - re-exported to the tests
from tests.conftest import TOKENIZERS

# Padded logits widths, as models round their vocabularies up.
WIDTHS = {"gpt2": 50304, "phi3": 32064, "qwen2": 151936}
EOS = {"gpt2": [50256], "phi3": [32000, 32007], "qwen2": [151643, 151645]}


@pytest.fixture(scope="session")
def tokenizers():
    return {name: AutoTokenizer.from_pretrained(str(path)) for name, path in TOKENIZERS.items()}


@pytest.fixture(scope="session")
def vocabs(tokenizers):
    return {name: Vocabulary.from_tokenizer(tok, WIDTHS[name], EOS[name]) for name, tok in tokenizers.items()}


@contextlib.contextmanager
def compiling(tokenizer_dir: Path, base: str, writable_special: tuple[str, ...] = ()):
    """(tokenizer, vocabulary, compiler) of a tokenizer a test built from TOKENIZERS[base] (its logits width and EOS
    ids; `writable_special`: special tokens grammars may write, as the server's chat template names them): the auto
    policy, no background builds."""
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    vocab = Vocabulary.from_tokenizer(tok, WIDTHS[base], EOS[base], writable_special=writable_special)
    compiler = GrammarCompiler(vocab, tok, backend="auto", background_outlines=False, compile_timeout_s=120)
    try:
        yield tok, vocab, compiler
    finally:
        compiler.close()


def valid_calls(text: str, spec, schemas: dict[str, dict]) -> list:
    """The tool calls parsed from `text` (there are some), each one's arguments valid against its function's
    parameters (`schemas`: function name -> parameters)."""
    import jsonschema

    from constrain import parse_tool_calls

    parsed = parse_tool_calls(text, spec)
    assert parsed is not None, text
    for call in parsed.calls:
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])
    return parsed.calls


def takes_text(grammar, tokenizer, text: str, base: str = "qwen2") -> bool:
    """The grammar takes `text`, tokenised as `tokenizer` (built from TOKENIZERS[base]) does, its tags as their
    tokens, token by token under the mask, then ends."""
    bitmask = torch.zeros((1, (WIDTHS[base] + 31) // 32), dtype=torch.int32)
    return walk_instance(grammar, tokenizer.encode(text), EOS[base][0], bitmask, [])


def takes_spelled(grammar, vocab, text: bytes) -> bool:
    """The grammar takes `text` spelled in ordinary tokens (a special token's text too, which decodes as the token
    does), token by token under the mask, from the output's start."""
    m = grammar.matcher()
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    for t in vocab.spell(text, ordinary=True):
        m.fill_bitmask(bitmask, 0)
        if t not in set(allowed_ids(bitmask).tolist()) or not m.accept(t):
            return False
    return True


def may_answer_nothing(grammar, vocab) -> bool:
    """Under tool_choice "auto" the answer may be empty or whitespace alone: at its start, and after newlines, the
    matcher can end, and with one token left the mask holds EOS and text, not the budget rule's one closing token
    (a reasoning model's block, closed with one token left, was followed by the closing walk's `}` as its whole
    answer; a model that wrote newlines only was cut with `\n\n}`)."""
    for written in (b"", b"\n\n"):
        m = grammar.matcher()
        if not all(m.accept(token) for token in vocab.spell(written)):
            return False
        bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
        m.fill_bitmask(bitmask, 0, tokens_left=1)
        allowed = set(allowed_ids(bitmask).tolist())
        if not (m.can_end() and set(vocab.eos_token_ids) <= allowed and len(allowed - set(vocab.eos_token_ids)) > 100):
            return False
    return True


@pytest.fixture(scope="session")
def gpt2_compiler(tokenizers, vocabs):
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="auto", background_outlines=False,
                        compile_timeout_s=120)
    yield c
    c.close()


def ended_walks_valid(grammar, vocab, schema: dict, seed: int, walks: int = 25, max_tokens: int = 60,
                      prefer_end: float = 0.3) -> int:
    """Budgeted random walks through the mask (see `random_walk`): every walk that ends is a document valid
    against `schema` (jsonschema, as the product reads it: constrain.rewrite.validator_class); returns how many
    ended."""
    from constrain.rewrite import validator_class

    validator = validator_class(schema)(schema)
    rng = random.Random(seed)
    ended = 0
    for _ in range(walks):
        toks, done = random_walk(grammar, vocab, rng, max_tokens, budget=True, prefer_end=prefer_end)
        if done:
            ended += 1
            doc = json.loads(decode(vocab, toks))
            assert validator.is_valid(doc), doc
    return ended


def accepts_value(grammar, tokenizer, vocab, value) -> bool:
    """The grammar (over `{"v": ...}` documents) takes `{"v": value}`, spelled as the tokenizer spells it,
    token by token through the mask, and may end after it. Non-ASCII is written raw, as a model writes it."""
    return accepts_document(grammar, tokenizer, vocab, {"v": value})


def accepts_document(grammar, tokenizer, vocab, document) -> bool:
    """The grammar takes the JSON text of `document` (non-ASCII raw) token by token and may end after it."""
    tokens = tokenizer.encode(json.dumps(document, ensure_ascii=False), add_special_tokens=False)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    return walk_instance(grammar, tokens, min(vocab.eos_token_ids), bitmask, [])


def offered_walk(grammar, vocab, prefix: list[int], offered: list[int], tokens_left: int,
                 must_end: bool = True) -> list[int]:
    """Accept `prefix`; then, `tokens_left` tokens at most, offer the budget rule (`vet`) the next of `offered`
    where the mask allows it, else the first token allowed, as a model set on those tokens would be sampled; the
    tokens written after `prefix` until the output ends (which `must_end` asserts it may)."""
    m = grammar.matcher()
    assert all(m.accept(t) for t in prefix)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    out: list[int] = []
    while tokens_left > 0 and not m.is_terminated():
        m.fill_bitmask(bitmask, 0, tokens_left)
        allowed = allowed_ids(bitmask).tolist()
        want = offered[len(out)] if len(out) < len(offered) and offered[len(out)] in allowed else allowed[0]
        token = m.vet(want, tokens_left)
        assert token == want or token in allowed, "the budget rule's token is not in the mask (the engine keeps want)"
        if token in vocab.eos_token_ids:
            break
        assert m.accept(token)
        out.append(token)
        tokens_left -= 1
    assert m.can_end() or not must_end
    return out


# A required parameter declared after an optional one (Glaiveai2K's search_news). The closing walk wrote the
# `<arg_key>` forced before the name, then the first name that fits: the optional `date_range`, a completion 37
# tokens longer than the shortest call (QA xmlreal F1; XML tool formats' budget rule tests).
OPTIONAL_FIRST = {"type": "object", "properties": {
    "date_range": {"type": "object", "properties": {"start": {"type": "string", "format": "date"},
                                                    "end": {"type": "string", "format": "date"}},
                   "required": ["start", "end"], "additionalProperties": False},
    "keywords": {"type": "array", "items": {"type": "string"}}},
    "required": ["keywords"], "additionalProperties": False}


# Tools whose first function's shortest call is long and whose second's is short (budget rule tests of tagged calls)
LONG_FIRST = [{"type": "function", "function": {"name": "alpha_long_function", "parameters": {
    "type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(6)},
    "required": [f"p{i}" for i in range(6)], "additionalProperties": False}}},
              {"type": "function", "function": {"name": "z"}}]


def assert_the_tag_is_kept_only_where_its_call_fits(grammar, tokenizer, vocab, tag: int) -> None:
    """After free text, the call `tag` is kept by the budget rule with exactly the tokens its shortest call needs
    after it left, and replaced by EOS with one fewer."""
    text = tokenizer.encode(" some words before the call")
    probe = grammar.matcher()
    assert all(probe.accept(t) for t in text + [tag])
    needed = probe.min_tokens_to_end()
    assert needed is not None and needed > 20  # (past the zone vetted for a grammar that learned no growth)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    for room in (needed, needed - 1):  # tokens left once the tag is written
        m = grammar.matcher()
        assert all(m.accept(t) for t in text)
        m.fill_bitmask(bitmask, 0, room + 1)
        assert tag in allowed_ids(bitmask).tolist()
        vetted = m.vet(tag, room + 1)
        assert vetted == tag if room == needed else vetted in vocab.eos_token_ids


def a_long_function_s_name_is_vetted_where_a_short_one_s_call_was_kept(compiler, tokenizer, vocab, tool_format: str,
                                                                      head: str, left: int = 30) -> None:
    """LONG_FIRST on a grammar no output has walked yet: a call tag, then the long function's name, offered with
    `left` tokens where only the short function's call fits. The tag is kept for the short call; the name was not
    vetted from so far (no growth seen yet), and the long call was cut at the limit (QA budgetfuzz)."""
    tools = copy.deepcopy(LONG_FIRST)
    tools[1]["function"]["name"] = "zq"  # (a grammar of its own: none learned from other tests)
    spec = spec_from_request(tools=tools, tool_choice="required", tool_format=tool_format)
    g = compiler.compile(spec)
    assert g.matcher().min_tokens_to_end() is not None
    toks = offered_walk(g, vocab, [], tokenizer.encode(head, add_special_tokens=False), left)
    schemas = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in tools}
    assert [c.name for c in valid_calls(tokenizer.decode(toks, skip_special_tokens=False), spec, schemas)][0] == "zq"


def a_further_call_is_begun_after_a_spelled_close_only_where_one_fits(compiler, tokenizer, vocab, tool_format: str,
                                                                      first: str) -> None:
    """LONG_FIRST's long function alone, calls required: after the call `first` (the format's text of one call, its
    `</tool_call>` last), written with that tag spelled in ordinary tokens up to its `>`, the token `>\n` (the tag's
    end, then the newline that begins another call) is kept only where a further call fits after it, else the
    call is closed with `>`. Only a newline where the output may end was vetted as beginning a call: `>\n`, which
    passes the end within the token, was kept where the completion before it was too short to be near the limit
    (1 token), and the second call it began was cut at the limit (QA xmlbudget)."""
    spec = spec_from_request(tools=LONG_FIRST[:1], tool_choice="required", tool_format=tool_format)
    g = compiler.compile(spec)
    assert first.endswith("</tool_call>")
    written = tokenizer.encode(first[:-len("</tool_call>")], add_special_tokens=False) + \
        vocab.spell(b"</tool_call", ordinary=True)
    [gt] = vocab.spell(b">", ordinary=True)
    [gt_newline] = vocab.spell(b">\n", ordinary=True)
    probe = g.matcher()
    assert all(probe.accept(t) for t in written + [gt_newline])
    needed = probe.min_tokens_to_end()
    assert needed is not None and needed > 24  # (past the zone vetted by the completion's length before `>\n`)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    for left, kept in [(needed + 1, True), (needed, False), (needed // 2, False)]:
        m = g.matcher()
        assert all(m.accept(t) for t in written)
        m.fill_bitmask(bitmask, 0, left)  # (the engine fills the mask, then vets the sampled token)
        assert gt_newline in allowed_ids(bitmask).tolist()
        assert m.vet(gt_newline, left) == (gt_newline if kept else gt)


# Tools whose shortest name (the one a closing walk writes) has the longer call (budget rule tests, QA budgetfuzz F4)
SHORT_NAME_LONG_CALL = [{"type": "function", "function": {"name": "sum", "parameters": {
    "type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(8)},
    "required": [f"p{i}" for i in range(8)], "additionalProperties": False}}},
                        {"type": "function", "function": {"name": "zr_without_arguments"}}]


def the_shortest_function_s_call_is_measured(compiler, tokenizer, vocab, tool_format: str,
                                             special_ok: frozenset[int] = frozenset(), seeds: int = 6) -> int:
    """SHORT_NAME_LONG_CALL: the budget completion measured before any name is written is the short call, not the
    long one the closing walk comes to first (it writes the shortest name), and budgeted random walks with
    max_tokens the short call's length (and 1 or 3 more) end with valid calls. The walk wrote the first name that
    fits: 41 tokens measured where 18 fit, and untagged JSON calls (llama3_json, mistral) begun with that budget were
    cut at the limit (QA budgetfuzz F4). Returns the short call's length."""
    tools = copy.deepcopy(SHORT_NAME_LONG_CALL)
    schemas = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in tools}

    def alone(name: str) -> int:
        named = {"type": "function", "function": {"name": name}}
        return compiler.compile(spec_from_request(tools=tools, tool_choice=named, tool_format=tool_format)) \
            .matcher().min_tokens_to_end()

    short, long = alone("zr_without_arguments"), alone("sum")
    assert long > short + 10
    spec = spec_from_request(tools=tools, tool_choice="required", tool_format=tool_format, parallel_tool_calls=False)
    g = compiler.compile(spec)
    assert g.matcher().min_tokens_to_end() == short
    for max_tokens in (short, short + 1, short + 3):
        for seed in range(seeds):
            toks, ended = random_walk(g, vocab, random.Random(seed), max_tokens, budget=True, prefer_end=0.0,
                                      special_ok=special_ok)
            text = tokenizer.decode(toks, skip_special_tokens=False)
            assert ended, (max_tokens, text)
            valid_calls(text, spec, schemas)
    return short
