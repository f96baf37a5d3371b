"""What one llguidance row costs a step on the CPU, by part: `fill_bitmask` (on the mask threads), `vet` (the budget
rule's probe, on the engine thread) and `accept` (engine thread), in microseconds a token, over budgeted random
walks under bench.py's schema (or --schema FILE), with the built-in model's vocabulary (Qwen2's 152k tokens).

    python bench/vet_cost.py --walks 30 --max-tokens 64 40

The walks are seeded: two versions of the code take the same tokens, so their figures compare side by side (run
them interleaved: the machines here are shared and noisy)."""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's constrain/ and engine/

from bench import SCHEMA  # noqa: E402  (bench/bench.py, beside this script)
from constrain import GrammarCompiler, Vocabulary, llg_backend, spec_from_request  # noqa: E402
from constrain.walkbench import _one_byte, allowed_ids  # noqa: E402
from engine.model_loader import BUILTIN_DIR  # noqa: E402


@contextlib.contextmanager
def counting_closing_walks(phase: list[str], counts: dict[str, int]):
    """Count the closing walks (`llg_backend.closing_tokens`, what the probes cost) by the phase named in
    `phase[0]`: the same walks give the same counts, however noisy the machine."""
    real = llg_backend.closing_tokens

    def counted(*args, **kwargs):
        counts[phase[0]] += 1
        return real(*args, **kwargs)

    llg_backend.closing_tokens = counted
    try:
        yield
    finally:
        llg_backend.closing_tokens = real


def walk_costs(grammar, vocab: Vocabulary, walks: int, max_tokens: int, seed: int = 0) -> dict[str, float]:
    """Microseconds a token in each of fill_bitmask, vet and accept over `walks` random walks (half the time a
    one-byte token, as walkbench samples), and the closing walks made in each."""
    phase, counts = ["fill"], {"fill": 0, "vet": 0, "accept": 0}
    with counting_closing_walks(phase, counts):
        seconds, tokens = _walks(grammar, vocab, walks, max_tokens, random.Random(seed), phase)
    return ({part: 1e6 * s / max(tokens, 1) for part, s in seconds.items()} | {"tokens": tokens}
            | {f"walks_{part}": n for part, n in counts.items()})


def _walks(grammar, vocab: Vocabulary, walks: int, max_tokens: int, rng: random.Random,
           phase: list[str]) -> tuple[dict[str, float], int]:
    one = _one_byte(vocab)
    eos = np.array(sorted(vocab.eos_token_ids))
    seconds = {"fill": 0.0, "vet": 0.0, "accept": 0.0}
    tokens = 0
    for _ in range(walks):
        m = grammar.matcher()
        bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
        for step in range(max_tokens):
            phase[0] = "fill"
            t0 = time.perf_counter()
            m.fill_bitmask(bitmask, 0, tokens_left=max_tokens - step)
            t1 = time.perf_counter()
            ids = allowed_ids(bitmask)
            choices = ids[~np.isin(ids, eos)]
            if m.is_terminated() or not len(choices):
                break
            short = choices[one[choices]]
            pool = short if len(short) and rng.random() < 0.5 else choices
            phase[0] = "vet"
            t2 = time.perf_counter()
            token = m.vet(int(pool[rng.randrange(len(pool))]), max_tokens - step)
            t3 = time.perf_counter()
            if token in vocab.eos_token_ids:
                break
            phase[0] = "accept"
            m.accept(token)
            t4 = time.perf_counter()
            seconds["fill"] += t1 - t0
            seconds["vet"] += t3 - t2
            seconds["accept"] += t4 - t3
            tokens += 1
    return seconds, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schema", type=Path, help="a JSON schema file (default: bench.py's schema)")
    ap.add_argument("--walks", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, nargs="+", default=[64, 40])
    args = ap.parse_args()
    schema = json.loads(args.schema.read_text()) if args.schema else SCHEMA
    tokenizer = AutoTokenizer.from_pretrained(str(BUILTIN_DIR))
    vocab = Vocabulary.from_tokenizer(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    compiler = GrammarCompiler(vocab, tokenizer, backend="llguidance")
    try:
        grammar = compiler.compile(spec_from_request(
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}))
        for max_tokens in args.max_tokens:
            costs = walk_costs(grammar, vocab, args.walks, max_tokens)
            print(f"max_tokens={max_tokens} tokens={costs['tokens']} fill_us={costs['fill']:.0f} "
                  f"vet_us={costs['vet']:.0f} accept_us={costs['accept']:.0f} closing_walks: "
                  f"fill={costs['walks_fill']} vet={costs['walks_vet']} accept={costs['walks_accept']}")
    finally:
        compiler.close()


if __name__ == "__main__":
    main()
