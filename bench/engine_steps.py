"""The engine alone, in-process (no HTTP, no event loop of a server): tokens/s and milliseconds per step by phase,
unconstrained and under constraints, at several batch sizes, from one run.

Where bench.py measures what a client sees, this says where the engine thread's time goes (the phases of
`Engine.step`: schedule, forward, prefill, mask, sample, postprocess), with nothing else in the process.

    python bench/engine_steps.py                                 # built-in model, CPU
    python bench/engine_steps.py --device cuda --concurrency 1 16
    python bench/engine_steps.py --regex '[a-z ]{600}' --backend llguidance

Not a test: it measures, it asserts nothing. Every request asks for `max_tokens` with `ignore_eos` at
temperature 1; a constrained output may end earlier (its grammar ends), which the step counts show.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's engine/ and constrain/

from bench import SCHEMA  # noqa: E402  (bench/bench.py, beside this script)
from constrain import ConstraintSpec, GrammarCompiler, Vocabulary  # noqa: E402
from engine import Engine, GenerationRequest, SamplingParams  # noqa: E402
from engine.engine import STEP_PHASES  # noqa: E402
from engine.model_loader import BUILTIN_MODEL, load_model  # noqa: E402

PROMPT = "List some short words as JSON."


def run(engine: Engine, prompt: list[int], n: int, grammar, max_tokens: int) -> tuple[int, float]:
    """`n` concurrent requests; (tokens generated, seconds)."""
    async def one(i: int) -> int:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=1.0)
        request = GenerationRequest(request_id=f"r{time.monotonic_ns()}-{i}", prompt_ids=list(prompt),
                                    params=params, grammar=grammar)
        return sum([len(event.token_ids) async for event in engine.generate(request)])

    async def all_of_them() -> list[int]:
        return await asyncio.gather(*(one(i) for i in range(n)))

    start = time.perf_counter()
    tokens = sum(asyncio.run(all_of_them()))
    return tokens, time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=BUILTIN_MODEL, help="model directory or hub id (default: the built-in one)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto", help="auto: bfloat16/float16 on a GPU, float32 on a CPU")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--backend", default="outlines", choices=["outlines", "llguidance"],
                    help="the backend of the constrained workloads (outlines: bench.py's schema once compiled)")
    ap.add_argument("--regex", help="also a workload under this regex (the --backend serves it)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each workload and size")
    ap.add_argument("--overlap-fill", default="auto", choices=["auto", "on", "off"],
                    help="fill grammar rows on other threads during the forward (auto: when a core is free)")
    ap.add_argument("--mask-threads", type=int, help="threads that fill grammar rows (default: the engine's)")
    args = ap.parse_args()

    loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    vocab = Vocabulary.from_tokenizer(loaded.tokenizer, loaded.logits_width, loaded.eos_token_ids)
    compiler = GrammarCompiler(vocab, loaded.tokenizer, backend=args.backend, background_outlines=False)
    workloads = {"plain": None,
                 "schema": compiler.compile(ConstraintSpec(kind="json_schema", schema=SCHEMA, backend=args.backend))}
    if args.regex:
        workloads["regex"] = compiler.compile(ConstraintSpec(kind="regex", pattern=args.regex, backend=args.backend))
    prompt = loaded.tokenizer(PROMPT)["input_ids"]
    overlap = {"auto": None, "on": True, "off": False}[args.overlap_fill]
    engine = Engine(loaded, max_batch_size=max(args.concurrency), overlap_fill=overlap, mask_threads=args.mask_threads)
    engine.start()
    print(f"model: {args.model}  device: {loaded.device}  max_tokens: {args.max_tokens}  "
          f"backend: {args.backend}  overlap fill: {args.overlap_fill}  mask threads: {engine.mask_threads}",
          flush=True)
    try:
        for grammar in workloads.values():  # warm-up: first steps, first masks
            run(engine, prompt, 2, grammar, 4)
        for n in args.concurrency:
            for label, grammar in workloads.items():
                for _ in range(args.repeats):
                    before, steps_before = engine.stats()["step_seconds"], engine.stats()["steps"]
                    tokens, seconds = run(engine, prompt, n, grammar, args.max_tokens)
                    after, steps = engine.stats()["step_seconds"], engine.stats()["steps"] - steps_before
                    phases = " ".join(f"{p}={1000 * (after[p] - before[p]) / max(steps, 1):.2f}"
                                      for p in STEP_PHASES)
                    print(f"{label:7s} n={n:2d} {tokens / seconds:8.1f} tok/s {1000 * seconds / max(steps, 1):7.2f} "
                          f"ms/step steps={steps:3d} | ms/step: {phases}", flush=True)
    finally:
        engine.shutdown()
        compiler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
