"""A burst of rows for a new llguidance grammar: the time the mask threads take to fill them, step after step.

The engine makes each new row's matcher on the next lane, round robin (`Grammar.matcher(lane)`), and a lane's rows
are filled by one mask thread. A new grammar has only lane 0 parsed; the other lanes are parsed in the background,
and a row made before its lane's parse came copies lane 0's (sharing its lexer, whose lock fills such rows one at a
time). This makes such a burst as the engine does (`--rows` rows of a grammar compiled just before, on `--threads`
lanes), fills them on as many threads for `--steps` steps, each row taking a random allowed token after each fill,
and prints the fill's milliseconds a step and the lane whose parse each lane's first row copies at the end.

    python bench/new_grammar_burst.py                      # 16 rows, 2 threads (this machine's cores)
    python bench/new_grammar_burst.py --threads 8          # as on a GPU host with 16 cores

Not a test: it measures, it asserts nothing. Each trial compiles a schema not seen before (bench.py's, retitled).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's engine/ and constrain/

from bench import SCHEMA  # noqa: E402  (bench/bench.py, beside this script)
from constrain import ConstraintSpec, GrammarCompiler, Vocabulary  # noqa: E402
from engine.model_loader import BUILTIN_MODEL, load_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=BUILTIN_MODEL, help="its tokenizer and logits width (default: built-in)")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--trials", type=int, default=4)
    args = ap.parse_args()

    loaded = load_model(args.model, device="cpu")
    vocab = Vocabulary.from_tokenizer(loaded.tokenizer, loaded.logits_width, loaded.eos_token_ids)
    compiler = GrammarCompiler(vocab, loaded.tokenizer, backend="llguidance", background_outlines=False)
    pool = ThreadPoolExecutor(args.threads)
    bitmask = torch.zeros((args.rows, vocab.words), dtype=torch.int32)
    print(f"rows: {args.rows}  threads: {args.threads}  steps: {args.steps}  vocabulary: {loaded.logits_width}")
    try:
        for trial in range(args.trials):
            schema = dict(SCHEMA, title=f"burst {trial} at {time.time_ns()}")
            grammar = compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, backend="llguidance"))
            lanes: dict[int, list] = {}
            for row in range(args.rows):
                lanes.setdefault(row % args.threads, []).append((row, grammar.matcher(row % args.threads)))
            rng = random.Random(trial)

            def fill(rows: list) -> None:
                for row, matcher in rows:
                    if not matcher.is_terminated():
                        matcher.fill_bitmask(bitmask, row)

            seconds = 0.0
            for _ in range(args.steps):
                start = time.perf_counter()
                list(pool.map(fill, lanes.values()))
                seconds += time.perf_counter() - start
                for rows in lanes.values():
                    for row, matcher in rows:
                        if not matcher.is_terminated():
                            words = bitmask[row].numpy().view(np.uint32)
                            allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
                            matcher.accept(int(rng.choice(allowed)))
            parses = [getattr(getattr(rows[0][1], "inner", rows[0][1]), "parse_lane", "?") for rows in lanes.values()]
            print(f"trial {trial}: fill {1000 * seconds / args.steps:6.2f} ms a step; lanes' first rows copy the "
                  f"parses of lanes {parses}", flush=True)
    finally:
        pool.shutdown()
        compiler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
