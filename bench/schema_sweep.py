"""Real-world schemas through the real server: every Nth JSONSchemaBench case sent as a chat request, the way a
client sends it, and each answer judged. Where walkbench walks the grammar alone, this goes through everything a
request meets: validation, the rewrites, strict and not strict, tools, the engine's budget rule, the HTTP answer.

    python bench/schema_sweep.py CASES --every 11                 # response_format
    python bench/schema_sweep.py CASES/Glaiveai2K --every 6 --tools
    python bench/schema_sweep.py CASES --every 11 --offset 5 --concurrency 8   # mixed batches
    python bench/schema_sweep.py CASES/Glaiveai2K --every 6 --tools --model DIR  # another model

CASES is a folder of JSONSchemaBench cases (`*.json` below it, as MaskBench reads them). Each case goes out
twice: `response_format` json_schema with `strict` true and false, or (`--tools`) as one function's `parameters` with
`tool_choice` "required" and "auto". The last line counts the outcomes:
`sweep: requests=R ok=O stop=S tool_calls=T length=L refused=F invalid=I server_errors=E` (refused: a 4xx in the
OpenAI error shape, such as a strict schema with a keyword nothing enforces; invalid: an answer or a call that
ended (one `max_tokens` cut comes back as written so far) and does not validate while no keyword was named in
`x-structgen-unenforced`, no call under
tool_choice "required", or an error in another shape). Every invalid answer and 5xx is printed. Not a test: it
asserts nothing, and it reads the cases from the path it is given.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's service/ and constrain/

from constrain.walkbench import validator_for  # noqa: E402
from tests.serverproc import ServerProcess  # noqa: E402

MESSAGES = [{"role": "user", "content": "Answer with the JSON the format asks for."}]


def bodies(schema, tools: bool, seed: int, max_tokens: int) -> list[tuple[str, dict]]:
    common = {"model": "structgen-builtin", "messages": MESSAGES, "max_tokens": max_tokens, "seed": seed,
              "temperature": 1.0}
    if tools:
        tool = {"type": "function", "function": {"name": "f", "description": "a tool", "parameters": schema}}
        return [(choice, {**common, "tools": [tool], "tool_choice": choice}) for choice in ("required", "auto")]
    return [(f"strict={strict}", {**common, "response_format": {"type": "json_schema", "json_schema": {
        "name": "case", "schema": schema, "strict": strict}}}) for strict in (True, False)]


def judge(schema, response: httpx.Response, label: str) -> tuple[str, str | None]:
    """(outcome, why when invalid): stop | length | tool_calls | refused | invalid | server_error."""
    if response.status_code >= 500:
        return "server_error", response.text[:300]
    try:
        body = response.json()
    except ValueError:
        return "invalid", f"a {response.status_code} whose body is not JSON: {response.text[:200]}"
    if response.status_code != 200:
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
            return "invalid", f"error not in the OpenAI shape: {response.text[:200]}"
        return "refused", None
    choice = body["choices"][0]
    named = "x-structgen-unenforced" in response.headers
    texts = [call["function"]["arguments"] for call in choice["message"].get("tool_calls") or []]
    if choice["finish_reason"] == "length":
        texts = []  # (a call max_tokens cut comes back as written so far, as its stream sent it: README)
    if label == "required" and choice["finish_reason"] == "stop":
        return "invalid", f"tool_choice required, answered without a call: {str(choice['message'])[:200]}"
    if label.startswith("strict") and choice["finish_reason"] == "stop":
        texts = [choice["message"]["content"]]
    for text in texts:
        try:
            error = next(validator_for(schema).iter_errors(json.loads(text)), None)
        except ValueError:
            return "invalid", f"not JSON: {text[:200]}"
        if error is not None and not named:
            return "invalid", f"{error.message[:150]}: {text[:200]}"
    return choice["finish_reason"], None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cases_dir", type=Path, help="searched recursively for *.json cases ({\"schema\": ...})")
    ap.add_argument("--every", type=int, default=11, help="every Nth case, sorted by path")
    ap.add_argument("--offset", type=int, default=0, help="start at the Kth case (another sample of the same size)")
    ap.add_argument("--concurrency", type=int, default=1,
                    help="requests in flight at once: cases then share the running batch, each with its own mask")
    ap.add_argument("--tools", action="store_true", help="send each schema as a function's parameters")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--model", help="model directory (default: the built-in one)")
    args = ap.parse_args()

    cases = sorted(args.cases_dir.rglob("*.json"))[args.offset:: args.every]
    counts: Counter[str] = Counter()
    server_args = ["--log-level", "warning"]
    if args.model:  # (served under the built-in model's name, which the requests send)
        server_args += ["--model", args.model, "--served-model-name", "structgen-builtin"]
    with ServerProcess(*server_args) as server, httpx.Client(base_url=server.base_url, timeout=600) as http:

        def sweep_case(i: int, path: Path) -> list[tuple[str, str | None]]:
            schema = json.loads(path.read_text())["schema"]
            return [judge(schema, http.post("/v1/chat/completions", json=body), label) + (label,)
                    for label, body in bodies(schema, args.tools, i, args.max_tokens)]

        with ThreadPoolExecutor(max(1, args.concurrency)) as pool:
            for i, (path, results) in enumerate(zip(cases, pool.map(sweep_case, range(len(cases)), cases))):
                for outcome, why, label in results:
                    counts["requests"] += 1
                    counts[outcome] += 1
                    if why is not None:
                        print(f"{outcome.upper()} {path.relative_to(args.cases_dir)} {label}: {why}", flush=True)
                if (i + 1) % 100 == 0:
                    print(f"[{i + 1}/{len(cases)}] {dict(counts)}", file=sys.stderr, flush=True)
    ok = counts["stop"] + counts["length"] + counts["tool_calls"]
    print(f"sweep: requests={counts['requests']} ok={ok} stop={counts['stop']} tool_calls={counts['tool_calls']} "
          f"length={counts['length']} refused={counts['refused']} invalid={counts['invalid']} "
          f"server_errors={counts['server_error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
