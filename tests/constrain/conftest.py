"""Fixtures for constrain/ tests: real tokenizers, their Vocabularies, compilers, and a random mask walker."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from constrain import GrammarCompiler, Vocabulary
from constrain.maskbench import walk_instance
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


@pytest.fixture(scope="session")
def gpt2_compiler(tokenizers, vocabs):
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="auto", background_outlines=False,
                        compile_timeout_s=120)
    yield c
    c.close()


def allowed_ids(bitmask: torch.Tensor, row: int = 0) -> np.ndarray:
    bits = np.unpackbits(bitmask[row].numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits)


_ONE_BYTE: dict[int, np.ndarray] = {}


def _one_byte(vocab) -> np.ndarray:
    arr = _ONE_BYTE.get(id(vocab))
    if arr is None:
        arr = np.array([b is not None and len(b) == 1 for b in vocab.token_bytes], dtype=bool)
        _ONE_BYTE[id(vocab)] = arr
    return arr


def random_walk(grammar, vocab, rng: random.Random, max_tokens: int, budget: bool = False,
                prefer_end: float = 0.0) -> tuple[list[int], bool]:
    """Sample among allowed tokens (half the time a 1-byte one, which closes strings and numbers); returns
    (tokens, ended). Checks on every step that the mask and the matcher agree."""
    m = grammar.matcher()
    bm = torch.zeros((1, vocab.words), dtype=torch.int32)
    eos = np.array(sorted(vocab.eos_token_ids))
    one = _one_byte(vocab)
    toks: list[int] = []
    for step in range(max_tokens):
        m.fill_bitmask(bm, 0, tokens_left=(max_tokens - step) if budget else None)
        ids = allowed_ids(bm)
        assert len(ids), "empty mask"
        assert ids[-1] < len(vocab.token_bytes)
        is_eos = np.isin(ids, eos)
        assert all(vocab.token_bytes[i] is not None for i in ids[~is_eos][:: max(1, len(ids) // 500)])
        assert bool(is_eos.any()) == m.can_end()
        assert int(is_eos.sum()) in (0, len(eos))
        if is_eos.any() and (rng.random() < prefer_end or m.is_terminated()):
            return toks, True
        choices = ids[~is_eos]
        if not len(choices):
            return toks, True
        short = choices[one[choices]]
        pool = short if len(short) and rng.random() < 0.5 else choices
        tok = int(pool[rng.randrange(len(pool))])
        if budget:
            tok = m.vet(tok, max_tokens - step)  # as the engine does
        assert m.accept(tok)
        toks.append(tok)
    return toks, m.can_end()


def ended_walks_valid(grammar, vocab, schema: dict, seed: int, walks: int = 25, max_tokens: int = 60) -> int:
    """Budgeted random walks through the mask (see `random_walk`): every walk that ends is a document valid
    against `schema` (jsonschema); returns how many ended."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(seed)
    ended = 0
    for _ in range(walks):
        toks, done = random_walk(grammar, vocab, rng, max_tokens, budget=True, prefer_end=0.3)
        if done:
            ended += 1
            doc = json.loads(decode(vocab, toks))
            assert validator.is_valid(doc), doc
    return ended


def decode(vocab, toks: list[int]) -> str:
    return b"".join(vocab.token_bytes[t] for t in toks).decode("utf-8")


def accepts_value(grammar, tokenizer, vocab, value) -> bool:
    """The grammar (over `{"v": ...}` documents) takes `{"v": value}`, spelled as the tokenizer spells it,
    token by token through the mask, and may end after it. Non-ASCII is written raw, as a model writes it."""
    tokens = tokenizer.encode(json.dumps({"v": value}, ensure_ascii=False), add_special_tokens=False)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    return walk_instance(grammar, tokens, min(vocab.eos_token_ids), bitmask, [])
