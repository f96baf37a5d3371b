"""Throughput and latency of the real server (`structgen serve`) on 127.0.0.1, from one run.

Prints tokens/s at 1, 4 and 16 concurrent requests, unconstrained and with a JSON schema, the ratios
16-way/1-way and constrained/unconstrained (against unconstrained requests of the constrained answers' lengths,
and of max_tokens each), time-to-first-token for a new and a repeated schema (right after the
new one, and once its background compile is done), and the same unconstrained workload against `transformers
serve` on the same model (when it starts offline here).

    python bench/bench.py                       # saves the built-in Qwen2-vocabulary model to a temp dir
    python bench/bench.py --model DIR --max-tokens 64 --requests-per-client 2
    python bench/bench.py --random-qwen2-0.5b    # a model of a served size (random weights, Qwen2-0.5B shape)
    python bench/bench.py --rounds 5 --skip-transformers-serve   # each ratio's median and range over 5 rounds

Not a test: it measures, it asserts nothing. Every request asks for `max_tokens` with `ignore_eos`; the schema
(an array of at least 8 short strings) keeps constrained outputs close to that length (they may end earlier).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's engine/ (save_builtin), as the servers below run it
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["items"],
          "properties": {"items": {"type": "array", "minItems": 8, "items": {"type": "string", "maxLength": 8}}}}
MESSAGES = [{"role": "user", "content": "List some short words as JSON."}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def save_builtin(out: Path) -> Path:
    """The built-in model (random Qwen2 weights, real Qwen2 tokenizer) as a directory both servers can load."""
    from engine.model_loader import BUILTIN_DIR, BUILTIN_MODEL, load_model

    loaded = load_model(BUILTIN_MODEL, device="cpu")
    loaded.model.save_pretrained(out)
    tok = loaded.tokenizer
    tok.chat_template = (BUILTIN_DIR / "chat_template.jinja").read_text()
    tok.save_pretrained(out)
    return out


# Qwen2-0.5B's published configuration: a model of a size people serve, where the forward, not the 151,936-wide
# output layer of the built-in model, is most of a step.
QWEN2_05B_SHAPE = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, tie_word_embeddings=True)


def save_random_qwen2_05b(out: Path) -> Path:
    """Random weights in Qwen2-0.5B's shape (~494M parameters) with the built-in model's Qwen2 tokenizer."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from engine.model_loader import BUILTIN_DIR

    tok = AutoTokenizer.from_pretrained(str(BUILTIN_DIR))
    vocab = tok.get_vocab()
    config = Qwen2Config(vocab_size=151936, max_position_embeddings=4096, bos_token_id=vocab["<|endoftext|>"],
                         eos_token_id=[vocab["<|im_end|>"], vocab["<|endoftext|>"]],
                         pad_token_id=vocab["<|endoftext|>"], **QWEN2_05B_SHAPE)
    Qwen2ForCausalLM(config).save_pretrained(out)
    tok.chat_template = (BUILTIN_DIR / "chat_template.jinja").read_text()
    tok.save_pretrained(out)
    return out


class Server:
    """A server subprocess on a free port, ready once `health_path` answers 200."""

    def __init__(self, argv: list[str], port: int, health_path: str, log_path: Path, timeout: float = 300):
        self.argv, self.port, self.health_path, self.log_path, self.timeout = argv, port, health_path, log_path, timeout
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Server":
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": path}
        self.proc = subprocess.Popen(self.argv, env=env, stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT,
                                     cwd=str(ROOT))
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[:3]} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}{self.health_path}", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"{self.argv[:3]} did not become healthy; see {self.log_path}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def chat_body(model: str, max_tokens: int, schema: dict | None, extra: dict) -> dict:
    body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 1.0, **extra}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "bench", "schema": schema}}
    return body


async def throughput(base: str, model: str, clients: int, per_client: int, max_tokens: int, schema: dict | None,
                     extra: dict, lengths: list[list[int]] | None = None) -> tuple[float, int, int, dict, list]:
    """(tokens/s, completion tokens, errors, {constraint backend: requests}, each client's completion lengths) for
    `clients` concurrent loops of `per_client` requests; with `lengths`, client i's requests ask for
    `max_tokens=lengths[i][j]` instead (with ignore_eos: the same outputs' lengths, in the same order)."""
    async with httpx.AsyncClient(base_url=base, timeout=600) as http:
        errors = 0
        backends: dict[str, int] = {}

        async def loop(limits: list[int]) -> list[int]:
            nonlocal errors
            seen = []
            for limit in limits:
                r = await http.post("/v1/chat/completions", json=chat_body(model, limit, schema, extra))
                if r.status_code != 200:
                    errors += 1
                    if errors == 1:
                        print(f"    first error: {r.status_code} {r.text[:300]}", flush=True)
                    continue
                seen.append(r.json()["usage"]["completion_tokens"])
                backend = r.headers.get("x-structgen-constraint-backend")
                if backend:
                    backends[backend] = backends.get(backend, 0) + 1
            return seen

        start = time.perf_counter()
        seen = await asyncio.gather(*(loop(lengths[i] if lengths else [max_tokens] * per_client)
                                      for i in range(clients)))
        tokens = sum(map(sum, seen))
        return tokens / (time.perf_counter() - start), tokens, errors, backends, seen


async def ttft(base: str, model: str, schema: dict | None) -> tuple[float, str | None]:
    """Seconds from sending a streamed request to its first content delta, and the backend that served it."""
    body = {**chat_body(model, 8, schema, {}), "stream": True}
    async with httpx.AsyncClient(base_url=base, timeout=600) as http:
        start = time.perf_counter()
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                        return time.perf_counter() - start, r.headers.get("x-structgen-constraint-backend")
    raise RuntimeError("no content in the stream")


def settled_ttft(base: str, model: str, schema: dict, wait: float, pairs: int = 5) -> tuple[list, list]:
    """TTFT of a repeated schema once its background outlines compile (auto policy) is done (on a CPU that
    compile shares the cores with the forward, so a repeat sent while it runs measures the competition), each
    sample paired with an unconstrained one sent just before it: (unconstrained, repeated schema) seconds."""
    deadline = time.perf_counter() + wait
    while asyncio.run(ttft(base, model, schema))[1] == "llguidance" and time.perf_counter() < deadline:
        time.sleep(0.5)
    plain, repeated = [], []
    for _ in range(pairs):
        plain.append(asyncio.run(ttft(base, model, None))[0])
        repeated.append(asyncio.run(ttft(base, model, schema))[0])
    return plain, repeated


def fresh_schema() -> dict:
    """Same shape as SCHEMA, but a property name no cache has seen."""
    name = "k" + uuid.uuid4().hex[:10]
    return {"type": "object", "additionalProperties": False, "required": [name],
            "properties": {name: {"type": "string", "maxLength": 8}}}


STEP_PHASE_METRIC = "structgen_engine_step_seconds_total"


def engine_counters(base: str) -> dict[str, float]:
    """structgen's /metrics: seconds per step phase (by phase name) and "steps"."""
    out = {}
    for line in httpx.get(base + "/metrics", timeout=30).text.splitlines():
        if line.startswith(STEP_PHASE_METRIC + '{phase="'):
            out[line.split('"')[1]] = float(line.split()[-1])
        elif line.startswith("structgen_engine_steps_total "):
            out["steps"] = float(line.split()[-1])
    return out


def step_phases_line(before: dict[str, float], after: dict[str, float]) -> str:
    """Milliseconds per engine step, by phase, between two readings of `engine_counters`."""
    steps = after.get("steps", 0) - before.get("steps", 0)
    if steps <= 0:
        return "no engine steps"
    parts = [f"{phase} {1000 * (after[phase] - before.get(phase, 0.0)) / steps:.2f}"
             for phase in after if phase != "steps"]
    return f"ms/step over {steps:.0f} steps: " + ", ".join(parts)


def run_workloads(base: str, model: str, args, schema: dict | None, extra: dict, step_phases: bool = False,
                  lengths: dict[int, list[list[int]]] | None = None) -> tuple[dict[int, float], dict[int, list]]:
    """tokens/s by concurrency, and each run's completion lengths by client; with `step_phases` (structgen), also
    where its engine's steps spent the time; with `lengths` (by concurrency), requests of those lengths."""
    out, seen = {}, {}
    for clients in args.concurrency:
        before = engine_counters(base) if step_phases else {}
        tps, tokens, errors, backends, seen[clients] = asyncio.run(throughput(
            base, model, clients, args.requests_per_client, args.max_tokens, schema, extra,
            lengths[clients] if lengths else None))
        out[clients] = tps
        label = "schema" if schema else "same" if lengths else "plain"
        served = "".join(f", {n} served by {b}" for b, n in sorted(backends.items()))
        print(f"  {label:6s} c={clients:2d}: {tps:8.1f} tok/s  ({tokens} tokens, {errors} errors{served})", flush=True)
        if step_phases:
            print(f"      {step_phases_line(before, engine_counters(base))}", flush=True)
    return out, seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="model directory (default: the built-in model saved to a temp dir)")
    ap.add_argument("--random-qwen2-0.5b", action="store_true",
                    dest="random_qwen2_05b",
                    help="instead of --model: random weights in Qwen2-0.5B's shape, saved to a temp dir")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--ttft-samples", type=int, default=5)
    ap.add_argument("--constraint-backend", default="auto", choices=["auto", "outlines", "llguidance"])
    ap.add_argument("--settle", type=float, default=15.0,
                    help="seconds to wait after the warm-up (auto: the background outlines compile finishes)")
    ap.add_argument("--skip-transformers-serve", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the three structgen workloads (unconstrained, schema, the same requests unconstrained) "
                         "this many times in turn; the summary gives each ratio's median and range over the rounds "
                         "(on a shared machine whose speed drifts, a 5%% difference needs several)")
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="structgen-bench-"))
    if args.random_qwen2_05b:
        model_dir = save_random_qwen2_05b(workdir / "model")
    else:
        model_dir = Path(args.model) if args.model else save_builtin(workdir / "model")
    model = str(model_dir)
    print(f"model: {model}  device: {args.device}  max_tokens: {args.max_tokens}  "
          f"requests/client: {args.requests_per_client}  constraint backend: {args.constraint_backend}", flush=True)

    port = free_port()
    argv = [sys.executable, "-m", "service.cli", "serve", "--model", model, "--host", "127.0.0.1", "--port", str(port),
            "--device", args.device, "--max-batch-size", str(max(args.concurrency)),
            "--constraint-backend", args.constraint_backend]
    with Server(argv, port, "/health", workdir / "structgen.log"):
        base = f"http://127.0.0.1:{port}"
        asyncio.run(throughput(base, model, 2, 1, 4, SCHEMA, {"ignore_eos": True}))  # warm-up, schema compiled
        time.sleep(args.settle)
        print("structgen:", flush=True)
        rounds = []  # (plain, constrained, same) tok/s by concurrency, one triple per round
        for r in range(args.rounds):
            if args.rounds > 1:
                print(f" round {r + 1} of {args.rounds}", flush=True)
            plain, _ = run_workloads(base, model, args, None, {"ignore_eos": True}, step_phases=True)
            constrained, lengths = run_workloads(base, model, args, SCHEMA, {"ignore_eos": True}, step_phases=True)
            # The same requests unconstrained: each as long as its constrained answer was (a schema's answers end
            # sooner and at different lengths than max_tokens, so fewer rows share a step: not the mask's cost).
            same, _ = run_workloads(base, model, args, None, {"ignore_eos": True}, step_phases=True, lengths=lengths)
            rounds.append((plain, constrained, same))
        plain = {c: statistics.median(p[c] for p, _, _ in rounds) for c in args.concurrency}
        base_ttft = statistics.median(asyncio.run(ttft(base, model, None))[0] for _ in range(args.ttft_samples))
        new, repeated, paired_plain, settled = [], [], [], []
        for _ in range(args.ttft_samples):
            schema = fresh_schema()
            new.append(asyncio.run(ttft(base, model, schema))[0])
            repeated.append(asyncio.run(ttft(base, model, schema))[0])
            plain_pairs, settled_pairs = settled_ttft(base, model, schema, args.settle)
            paired_plain += plain_pairs
            settled += settled_pairs

    ours_label = "structgen"
    theirs: dict[int, float] = {}
    if not args.skip_transformers_serve:
        port = free_port()
        tf = shutil.which("transformers") or str(Path(sys.executable).parent / "transformers")
        argv = [tf, "serve", model, "--port", str(port), "--host", "127.0.0.1", "--device",
                "cpu" if args.device == "auto" and not _cuda() else args.device]
        try:
            with Server(argv, port, "/health", workdir / "transformers-serve.log"):
                print("transformers serve:", flush=True)
                theirs, _ = run_workloads(f"http://127.0.0.1:{port}", model, args, None, {})
        except Exception as exc:  # report, do not hide: the figures below say it did not run
            print(f"transformers serve did not run: {exc}", flush=True)

    print("\nsummary")
    c_lo, c_hi = min(args.concurrency), max(args.concurrency)
    def over_rounds(ratio, unit: str = "") -> str:
        """A ratio's median over the rounds, with its range when there are several."""
        values = [ratio(*triple) for triple in rounds]
        spread = f" (range {min(values):.3f}-{max(values):.3f} over {len(values)} rounds)" if len(values) > 1 else ""
        return f"{statistics.median(values):.3f}{unit}{spread}"

    print(f"  {ours_label} {c_hi}-way / {c_lo}-way: {over_rounds(lambda p, k, s: p[c_hi] / p[c_lo], 'x')}  "
          f"(goal >= 8x)")
    for c in args.concurrency:
        print(f"  constrained / unconstrained at c={c}: {over_rounds(lambda p, k, s: k[c] / s[c])} against the same "
              f"lengths (goal >= 0.95), {over_rounds(lambda p, k, s: k[c] / p[c])} against max_tokens each")
    print(f"  TTFT p50: unconstrained {base_ttft * 1000:.1f} ms, new schema {statistics.median(new) * 1000:.1f} ms, "
          f"repeated schema {statistics.median(repeated) * 1000:.1f} ms, repeated once its background compile "
          f"is done {statistics.median(settled) * 1000:.1f} ms")
    print(f"  added TTFT p50: new schema {(statistics.median(new) - base_ttft) * 1000:+.1f} ms (goal <= 50), "
          f"repeated {(statistics.median(repeated) - base_ttft) * 1000:+.1f} ms (goal <= 1), "
          f"repeated once compiled {(statistics.median(settled) - statistics.median(paired_plain)) * 1000:+.1f} ms "
          f"(against {len(paired_plain)} unconstrained requests interleaved with its {len(settled)})")
    for c in args.concurrency:
        if c in theirs:
            print(f"  structgen / transformers serve at c={c}: {plain[c] / theirs[c]:.2f}x  "
                  f"({plain[c]:.1f} vs {theirs[c]:.1f} tok/s)")
    if not theirs and not args.skip_transformers_serve:
        print("  transformers serve: no figures (see above)")
    print(f"  logs: {workdir}")
    return 0


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
