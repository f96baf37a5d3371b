"""Can llguidance rows be filled in parallel? One step's masks for N rows inside a JSON string (bench.py's
schema, `{"items": ["ab`: ~100k tokens allowed, the costly kind of row), computed one after another, by
llguidance's `LLExecutor` and by Python threads, for matchers that are deep copies of one parse (as
constrain/llg_backend.py makes them: they share one lexer) and for matchers built independently.

    python bench/llg_parallel_masks.py                     # 16 rows, 2 threads
    python bench/llg_parallel_masks.py --rows 16 --threads 8

Not a test: it measures, it asserts nothing. Each figure is a fresh set of matchers (a matcher keeps the mask of
its current state, so a second fill of the same state costs ~7 us and says nothing).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import llguidance
import llguidance.hf
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's engine/

from bench import SCHEMA  # noqa: E402  (bench/bench.py, beside this script)
from engine.model_loader import BUILTIN_MODEL, load_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=BUILTIN_MODEL, help="its tokenizer and logits width (default: built-in)")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prefix", default='{"items": ["ab', help="the output so far in every row")
    args = ap.parse_args()

    loaded = load_model(args.model, device="cpu")
    lltok = llguidance.hf.from_tokenizer(loaded.tokenizer, n_vocab=loaded.logits_width)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    prefix = loaded.tokenizer.encode(args.prefix)
    words = (loaded.logits_width + 31) // 32
    mask = torch.zeros((args.rows, words), dtype=torch.int32)
    executor = llguidance.LLExecutor(num_threads=args.threads)

    def independent() -> list:
        out = []
        for _ in range(args.rows):
            m = llguidance.LLMatcher(lltok, grammar, log_level=0)
            m.consume_tokens(prefix)
            out.append(m)
        return out

    def copies() -> list:
        proto = llguidance.LLMatcher(lltok, grammar, log_level=0)
        proto.consume_tokens(prefix)
        return [proto.deep_copy() for _ in range(args.rows)]

    def one_by_one(ms: list) -> None:
        for i, m in enumerate(ms):
            m.unsafe_compute_mask_ptr(mask[i].data_ptr(), words * 4)

    def by_executor(ms: list) -> None:
        executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(ms)], mask.data_ptr(), words * 4, args.rows)

    def by_threads(ms: list) -> None:
        def fill(rows: range) -> None:
            for i in rows:
                ms[i].unsafe_compute_mask_ptr(mask[i].data_ptr(), words * 4)
        threads = [threading.Thread(target=fill, args=(range(k, args.rows, args.threads),))
                   for k in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def timed(make, fill) -> float:
        ms = make()
        t0 = time.perf_counter()
        fill(ms)
        return time.perf_counter() - t0

    print(f"rows: {args.rows}  threads: {args.threads}  prefix: {args.prefix!r}  vocabulary: {loaded.logits_width}")
    t0 = time.perf_counter()
    independent()
    built = (time.perf_counter() - t0) / args.rows
    t0 = time.perf_counter()
    copies()
    copied = (time.perf_counter() - t0) / args.rows
    print(f"a matcher at the prefix: built independently {1000 * built:.2f} ms, as a deep copy (proto included) "
          f"{1000 * copied:.2f} ms")
    for name, make in (("deep copies (shared lexer)", copies), ("independent matchers", independent)):
        for _ in range(args.repeats):
            alone = timed(make, one_by_one)
            pooled = timed(make, by_executor)
            threaded = timed(make, by_threads)
            print(f"{name:27s} one by one {1000 * alone:6.1f} ms | LLExecutor {1000 * pooled:6.1f} ms "
                  f"({alone / pooled:.2f}x) | threads {1000 * threaded:6.1f} ms ({alone / threaded:.2f}x)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
