"""A reasoning block before a constrained answer (constrain/reasoning.py): free text inside `<think>...</think>`,
the answer after it valid, and the budget rule kept: the close tag comes in time for the shortest answer."""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest
import torch

from constrain import ConstraintSpec
from constrain.reasoning import GAP_TOKENS, ReasoningGrammar, ReasoningTokens
from tests.conftest import QWEN3_THINK_TAGS, build_qwen3_thinking_tokenizer
from tests.constrain.conftest import allowed_ids, compiling, random_walk

OPEN, CLOSE = QWEN3_THINK_TAGS
EOS = [151643, 151645]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "yz"]}},
          "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture(scope="module")
def thinking(tmp_path_factory):
    with compiling(build_qwen3_thinking_tokenizer(tmp_path_factory.mktemp("qwen3")), "qwen2") as (_, vocab, c):
        yield c, vocab, ReasoningTokens.for_vocab(vocab, OPEN, CLOSE)


def _split(vocab, toks: list[int]) -> tuple[list[int], list[int], str]:
    """(the block's tokens without its tags, the whitespace tokens after it, the answer's text)."""
    close = toks.index(CLOSE)
    inside = toks[1 if toks[0] == OPEN else 0:close]
    after = toks[close + 1:]
    gap = 0
    while gap < len(after) and vocab.token_bytes[after[gap]].strip() == b"":
        gap += 1
    answer = b"".join(vocab.token_bytes[t] for t in after[gap:]).decode("utf-8")
    return inside, after[:gap], answer


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
@pytest.mark.parametrize("opened", [True, False], ids=["opened", "model-opens"])
def test_walks_think_then_answer_validly_and_always_end(backend, opened, thinking):
    compiler, vocab, tokens = thinking
    inner = compiler.compile(ConstraintSpec(kind="json_schema", schema=SCHEMA, backend=backend))
    grammar = ReasoningGrammar(inner, tokens, opened=opened)
    shortest = grammar.matcher().min_tokens_to_end()
    assert shortest == inner.matcher().min_tokens_to_end() + (1 if opened else 0)  # (+ the close tag)
    rng = random.Random(3)
    blocks = 0
    for max_tokens in (shortest, shortest + 2, shortest + 8, 40, 40, 40):
        toks, ended = random_walk(grammar, vocab, rng, max_tokens, budget=True, prefer_end=0.5)
        assert ended, "the answer did not close within max_tokens"
        if not opened and toks[0] != OPEN:  # the model answered at once
            assert CLOSE not in toks[:1]
            jsonschema.validate(json.loads(b"".join(vocab.token_bytes[t] for t in toks)), SCHEMA)
            continue
        blocks += 1
        inside, gap, answer = _split(vocab, toks)
        assert all(t not in EOS for t in inside) and len(gap) <= GAP_TOKENS
        jsonschema.validate(json.loads(answer), SCHEMA)
    assert blocks == 6 or not opened


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_inside_the_block_any_token_but_eos_until_only_the_close_tag_fits(backend, thinking):
    compiler, vocab, tokens = thinking
    inner = compiler.compile(ConstraintSpec(kind="json_schema", schema=SCHEMA, backend=backend))
    answer = inner.matcher().min_tokens_to_end()
    m = ReasoningGrammar(inner, tokens, opened=True).matcher()
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    m.fill_bitmask(bitmask, 0, tokens_left=answer + 2)
    ids = allowed_ids(bitmask)
    assert CLOSE in ids and not np.isin(ids, EOS).any() and not m.can_end()
    # every ordinary token (Qwen3's tags are ordinary tokens too)
    assert len(ids) == int(np.unpackbits(vocab.allowed_words().view(np.uint8)).sum())
    assert m.accept(int(tokenizer_id(vocab, b" hmm")))
    m.fill_bitmask(bitmask, 0, tokens_left=answer + 1)
    assert allowed_ids(bitmask).tolist() == [CLOSE]
    assert not m.accept(EOS[0]) and m.accept(CLOSE)
    # after the tag: the answer's first tokens, whitespace while the answer still fits after it
    m.fill_bitmask(bitmask, 0, tokens_left=answer + 1)
    ids = set(allowed_ids(bitmask).tolist())
    assert tokenizer_id(vocab, b"{") in ids and tokenizer_id(vocab, b"\n\n") in ids
    m.fill_bitmask(bitmask, 0, tokens_left=answer)
    assert tokenizer_id(vocab, b"\n\n") not in set(allowed_ids(bitmask).tolist())


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_the_mask_offers_no_more_whitespace_after_the_block_than_the_matcher_takes(backend, thinking):
    """After GAP_TOKENS whitespace tokens the mask still offered more, which `accept` passed to the answer's
    grammar, which refused them: a 500 ("sampled but the grammar rejected it") for any constrained request on a
    reasoning model that wrote a third blank token after `</think>` (greedy, every time)."""
    compiler, vocab, tokens = thinking
    inner = compiler.compile(ConstraintSpec(kind="json_schema", schema=SCHEMA, backend=backend))
    m = ReasoningGrammar(inner, tokens, opened=True).matcher()
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    blank = tokenizer_id(vocab, b"\n\n")
    assert m.accept(CLOSE)
    for _ in range(GAP_TOKENS):
        m.fill_bitmask(bitmask, 0, tokens_left=40)
        assert blank in allowed_ids(bitmask) and m.accept(blank)
    m.fill_bitmask(bitmask, 0, tokens_left=40)
    ids = allowed_ids(bitmask)
    assert blank not in ids and tokenizer_id(vocab, b"{") in ids
    assert not m.accept(blank) and m.accept(tokenizer_id(vocab, b"{"))


def test_the_open_tag_is_offered_only_as_the_first_token_and_only_with_room(thinking):
    compiler, vocab, tokens = thinking
    inner = compiler.compile(ConstraintSpec(kind="json_schema", schema=SCHEMA, backend="outlines"))
    answer = inner.matcher().min_tokens_to_end()
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    m = ReasoningGrammar(inner, tokens, opened=False).matcher()
    m.fill_bitmask(bitmask, 0, tokens_left=answer + 2)
    assert OPEN in allowed_ids(bitmask)
    m.fill_bitmask(bitmask, 0, tokens_left=answer + 1)  # no room for both tags: the answer at once
    assert OPEN not in allowed_ids(bitmask)
    assert m.accept(tokenizer_id(vocab, b"{"))  # answering at once: no block any more
    m.fill_bitmask(bitmask, 0, tokens_left=40)
    ids = allowed_ids(bitmask)
    assert OPEN not in ids and CLOSE not in ids


def test_max_tokens_of_exactly_the_tags_and_the_shortest_answer_gives_that_answer(thinking):
    compiler, vocab, tokens = thinking
    inner = compiler.compile(ConstraintSpec(kind="json_schema", schema=SCHEMA, backend="outlines"))
    grammar = ReasoningGrammar(inner, tokens, opened=True)
    shortest = grammar.matcher().min_tokens_to_end()
    toks, ended = random_walk(grammar, vocab, random.Random(0), shortest, budget=True)
    assert ended and toks[0] == CLOSE and len(toks) == shortest
    jsonschema.validate(json.loads(_split(vocab, toks)[2]), SCHEMA)


def tokenizer_id(vocab, data: bytes) -> int:
    return vocab.ids_by_bytes()[data]
