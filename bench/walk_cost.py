"""What the llguidance budget rule's closing walk costs and measures: the mean time of `min_tokens_to_end` at the
start of each of a sample of JSONSchemaBench schemas (compiled as MaskBench compiles them, strict, on the built-in
model's Qwen2 vocabulary), and the sum of the completions' lengths in tokens (smaller is better: a completion too
long makes the rule cut answers that fitted max_tokens).

    python bench/walk_cost.py CASES_DIR --sample 140 --seed 1     # CASES_DIR: JSONSchemaBench's cases

The sample is seeded: two versions of the code measure the same schemas, so their figures compare side by side
(run them interleaved, from each checkout: the machines here are shared and noisy)."""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's constrain/ and engine/

from constrain import ConstraintSpec, GrammarCompiler, Vocabulary  # noqa: E402
from constrain.grammar import ConstraintError  # noqa: E402
from constrain.spec import normalise_schema  # noqa: E402
from engine.model_loader import BUILTIN_DIR  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases_dir", type=Path, help="JSONSchemaBench cases (each a JSON object with a \"schema\")")
    parser.add_argument("--sample", type=int, default=140, help="schemas measured (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="of the sample (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="walks timed per schema (default: %(default)s)")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(str(BUILTIN_DIR))
    vocab = Vocabulary.from_tokenizer(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    compiler = GrammarCompiler(vocab, tokenizer, backend="llguidance", background_outlines=False)
    files = sorted(args.cases_dir.rglob("*.json"))
    random.Random(args.seed).shuffle(files)
    seconds, lengths, measured, none = 0.0, 0, 0, 0
    try:
        for path in files[:args.sample]:
            try:
                case = json.loads(path.read_text())
                grammar = compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(case["schema"]),
                                                          strict=True))
            except (ConstraintError, ValueError, KeyError, TypeError):
                continue  # (not compiled: MaskBench counts why)
            matcher = grammar.matcher()
            started = time.perf_counter()
            for _ in range(args.repeats):
                _forget_completion(matcher)
                length = matcher.min_tokens_to_end()
            seconds += (time.perf_counter() - started) / args.repeats
            measured += 1
            none += length is None
            lengths += length or 0
    finally:
        compiler.close()
    print(f"walk_cost: schemas={measured} walk_mean_ms={1000 * seconds / max(measured, 1):.3f} "
          f"completion_tokens_sum={lengths} no_completion={none}")


def _forget_completion(matcher) -> None:
    """The llguidance matcher under `matcher`'s checks forgets its measured completion: the next call walks."""
    while not hasattr(matcher, "_closing") and hasattr(matcher, "inner"):
        matcher = matcher.inner
    matcher._closing, matcher._closing_kept = None, False


if __name__ == "__main__":
    main()
