"""How long other clients wait while the server takes one heavy request: GET /health is polled every 20 ms while
the request runs, and the longest and the 99th-percentile waits are printed beside the request's own time.

Runs against a server already started (`python -m service.cli serve`), so two servers (two commits, two settings)
can be compared one after the other on one machine. Measures; asserts nothing.

    python bench/loop_stalls.py --base-url http://127.0.0.1:8000
    python bench/loop_stalls.py --base-url http://127.0.0.1:8000 --only answer --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import httpx

MODEL = "structgen-builtin"
HI = {"role": "user", "content": "hi"}


def workloads(model: str) -> dict[str, tuple[str, dict]]:
    """Each: (path, body). The bodies are near the 8 MiB limit, or make a large answer."""
    return {
        # refused by its last field, after all of it is validated
        "messages": ("/v1/chat/completions", {"model": model, "messages": [HI] * 200_000, "temperature": 5}),
        "token_ids": ("/v1/completions", {"model": model, "prompt": list(range(1_000_000)), "max_tokens": 1}),
        "unknown_fields": ("/v1/chat/completions", {"model": model, "messages": [HI], "max_tokens": 1,
                                                    **{f"f{i}": 1 for i in range(550_000)}}),
        # ~17 MB of JSON answer: 16 choices x 600 tokens x 20 alternatives
        "answer": ("/v1/chat/completions", {"model": model, "messages": [HI], "n": 16, "max_tokens": 600,
                                            "logprobs": True, "top_logprobs": 20, "seed": 1, "ignore_eos": True}),
    }


def one_round(base_url: str, path: str, raw: bytes) -> tuple[float, float, float, int]:
    """(request seconds, longest /health wait, p99 /health wait, response bytes)."""
    done: dict = {}

    def heavy():
        t0 = time.perf_counter()
        r = httpx.post(base_url + path, content=raw, headers={"content-type": "application/json"}, timeout=900)
        done["seconds"], done["size"] = time.perf_counter() - t0, len(r.content)

    worker = threading.Thread(target=heavy)
    worker.start()
    waits = []
    with httpx.Client(base_url=base_url, timeout=120) as client:
        while worker.is_alive():
            t0 = time.perf_counter()
            client.get("/health")
            waits.append(time.perf_counter() - t0)
            time.sleep(0.02)
    worker.join()
    waits.sort()
    return done["seconds"], waits[-1], waits[min(len(waits) - 1, int(len(waits) * 0.99))], done["size"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--only", nargs="*", help="workloads to run (default: all)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for name, (path, body) in workloads(args.model).items():
        if args.only and name not in args.only:
            continue
        raw = json.dumps(body).encode()
        rounds = [one_round(args.base_url, path, raw) for _ in range(args.rounds)]
        seconds, worst, p99, size = (statistics.median(r[i] for r in rounds) for i in range(4))
        print(f"{name:15s} body {len(raw) / 1e6:4.1f} MB  answer {size / 1e6:5.1f} MB  request {seconds:6.2f} s  "
              f"/health longest {worst:5.3f} s  p99 {p99:5.3f} s  (median of {args.rounds})")


if __name__ == "__main__":
    main()
