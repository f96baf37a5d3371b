"""A number's exponent has at most two significant digits (`json_follower.MAX_EXPONENT_DIGITS`), on both backends:
neither number lexeme bounds it, and a random model wrote `-5E81779` and `8e+7992`, valid JSON that JavaScript and
Python read as infinity (the Node SDK's zod parse of `z.number()` failed in 8 answers of 30)."""

from __future__ import annotations

import json
import random
import re

import pytest
from transformers import AutoTokenizer

from constrain import ConstraintSpec, GrammarCompiler
from constrain.spec import normalise_schema
from constrain.vocabulary import Vocabulary
from constrain.walkbench import decode, random_walk
from tests.constrain.conftest import allowed_ids

NUMBERS = {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "number"}}},
           "required": ["xs"], "additionalProperties": False}
EXPONENT = re.compile(r"[eE][+-]?0*([0-9]+)")


@pytest.fixture(scope="module", params=["llguidance", "outlines"])
def compilers(request, tokenizers, vocabs):
    made = {name: GrammarCompiler(vocabs[name], tokenizers[name], backend=request.param, background_outlines=False)
            for name in ("gpt2", "qwen2")}
    yield request.param, made
    for c in made.values():
        c.close()


def _grammar(compiler, schema):
    return compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True))


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_walks_write_no_exponent_past_two_digits(compilers, vocabs, name):
    """Before the bound, 18 of 21 exponents GPT-2's walks wrote had three digits or more (its tokens hold up to
    three digits), 6 of 17 Qwen2's (one digit a token)."""
    backend, made = compilers
    g, vocab = _grammar(made[name], NUMBERS), vocabs[name]
    rng = random.Random(1)
    exponents = []
    for _ in range(30):
        tokens, done = random_walk(g, vocab, rng, 80, budget=True, prefer_end=0.02)
        text = decode(vocab, tokens)
        exponents += [m[1] for m in EXPONENT.finditer(text)]
        if done:
            assert all(abs(x) < 1e300 for x in json.loads(text)["xs"]), text
    assert len(exponents) >= 8  # (the walks wrote exponents: the bound was put to the test)
    assert all(len(digits) <= 2 for digits in exponents), exponents


def _accepts(grammar, vocab, text: bytes) -> bool:
    """The matcher takes `text`, one byte-token at a time, and may end after it."""
    ids = vocab.ids_by_bytes()
    m = grammar.matcher()
    return all(m.accept(ids[bytes([c])]) for c in text) and m.can_end()


@pytest.mark.parametrize("text, taken", [
    (b'{"xs": [1e99, -2.5E-99, 3e+7, 4e0099, 5e-000]}', True),
    (b'{"xs": [1e100]}', False),
    (b'{"xs": [-2.5E-100]}', False),
    (b'{"xs": [4e00100]}', False),
])
def test_both_backends_take_the_same_exponents(compilers, vocabs, text, taken):
    """The same documents whichever backend serves the schema: leading zeros do not count."""
    _, made = compilers
    assert _accepts(_grammar(made["qwen2"], NUMBERS), vocabs["qwen2"], text) is taken


@pytest.mark.parametrize("schema, values", [
    ({"const": 2.5e-150}, {2.5e-150}),
    ({"enum": [1.5e-200, 7]}, {1.5e-200, 7}),
], ids=["const", "enum"])
def test_a_value_the_schema_names_is_still_written(compilers, vocabs, schema, values):
    """A `const` or `enum` number with a long exponent is still written: outlines spells it as JSON does
    (`2.5e-150`), llguidance in full (`0.000...25`)."""
    _, made = compilers
    g, vocab = _grammar(made["qwen2"], {"type": "object", "properties": {"x": schema}, "required": ["x"],
                                        "additionalProperties": False}), vocabs["qwen2"]
    rng = random.Random(2)
    for _ in range(6):
        tokens, done = random_walk(g, vocab, rng, 240, budget=True)
        assert done and json.loads(decode(vocab, tokens))["x"] in values


def test_a_token_that_writes_a_long_exponent_whole_is_refused(tmp_path):
    """Tokens holding an exponent and three digits (none in GPT-2's, Qwen2's or Phi-3's vocabulary, added here)
    are checked one by one wherever they may come; inside a string they are text."""
    from tests.constrain.conftest import TOKENIZERS

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS["qwen2"]))
    tok.add_tokens(["e100", "5e-123", "e12"])
    tok.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    vocab = Vocabulary.from_tokenizer(tok, len(tok), [tok.eos_token_id])
    compiler = GrammarCompiler(vocab, tok, backend="llguidance")
    try:
        schema = {"type": "object", "properties": {"x": {"type": "number"}, "s": {"type": "string"}}}
        ids = vocab.ids_by_bytes()

        def taken(text: bytes, last: bytes) -> bool:
            m = _grammar(compiler, schema).matcher()
            assert all(m.accept(ids[bytes([c])]) for c in text)
            return m.accept(ids[last])

        assert not taken(b'{"x": 5', b"e100") and not taken(b'{"x": ', b"5e-123")
        assert taken(b'{"x": 5', b"e12") and taken(b'{"s": "', b"e100")
    finally:
        compiler.close()


def test_a_check_left_with_nothing_but_a_long_exponent_has_it(tokenizers, vocabs):
    """`0e15` under `not: {multipleOf: 8}`: the number may not end (0 is a multiple of 8) and may only go on with
    an exponent's third digit. The exponent bound gives way, as the distinct-keys check's refusals do where
    nothing else is left, rather than the answer failing (it ran to max_tokens before the bound, and does again)."""
    import torch

    compiler = GrammarCompiler(vocabs["qwen2"], tokenizers["qwen2"], backend="llguidance")
    try:
        vocab = vocabs["qwen2"]
        g = _grammar(compiler, {"type": "object", "properties": {"x": {"type": "number", "not": {"multipleOf": 8}}},
                                "required": ["x"], "additionalProperties": False})
        m, ids = g.matcher(), vocab.ids_by_bytes()
        assert all(m.accept(ids[bytes([c])]) for c in b'{"x": 0e15')
        bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
        m.fill_bitmask(bitmask, 0)
        allowed = {vocab.token_bytes[i] for i in allowed_ids(bitmask).tolist()}
        assert b"7" in allowed and b"}" not in allowed
    finally:
        compiler.close()
