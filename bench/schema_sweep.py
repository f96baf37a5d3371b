"""Real-world schemas through the real server: every Nth JSONSchemaBench case sent as a chat request, the way a
client sends it, and each answer judged. Where walkbench walks the grammar alone, this goes through everything a
request meets: validation, the rewrites, strict and not strict, tools, the engine's budget rule, the HTTP answer.

    python bench/schema_sweep.py CASES --every 11                 # response_format
    python bench/schema_sweep.py CASES/Glaiveai2K --every 6 --tools
    python bench/schema_sweep.py CASES --every 11 --offset 5 --concurrency 8   # mixed batches
    python bench/schema_sweep.py CASES/Glaiveai2K --every 6 --tools --model DIR  # another model
    python bench/schema_sweep.py CASES/Glaiveai2K --every 6 --tools --stream      # answers streamed

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
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's service/ and constrain/

from constrain.cli import at_least, existing_directory  # noqa: E402
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


@dataclass
class Answer:
    """What the client got: the status, the headers, the body as text and, for a stream, the chunks assembled into
    the body a whole answer would have had (or why they could not be)."""

    status_code: int
    headers: httpx.Headers
    text: str
    assembled: dict | None = None
    stream_fault: str | None = None

    def json(self):
        return self.assembled if self.assembled is not None else json.loads(self.text)


def ask(http: httpx.Client, body: dict, stream: bool) -> Answer:
    if not stream:
        r = http.post("/v1/chat/completions", json=body)
        return Answer(r.status_code, r.headers, r.text)
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = [line for line in r.iter_lines()]
    text = "\n".join(lines)
    if r.status_code != 200:
        return Answer(r.status_code, r.headers, text)
    assembled, fault = assemble([line[6:] for line in lines if line.startswith("data: ")])
    return Answer(r.status_code, r.headers, text, assembled, fault)


def assemble(datas: list[str]) -> tuple[dict | None, str | None]:
    """A chat stream's `data:` payloads as the whole answer's body ({"choices": [...]} with one message, its tool
    calls joined), or None and what broke the OpenAI stream's rules: a last `[DONE]`, each call's id and name
    sent once in its first delta, one finish_reason, usage only in a last chunk with no choices. An error chunk
    becomes the body, as a whole answer's error would be."""
    if not datas or datas[-1] != "[DONE]":
        return None, "the stream does not end with [DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    if chunks and "error" in chunks[-1]:
        return chunks[-1], None
    content, calls, finish = "", {}, None
    for n, chunk in enumerate(chunks):
        if not chunk["choices"]:
            if n != len(chunks) - 1 or "usage" not in chunk:
                return None, "a chunk with no choices that is not the last, with the usage"
            continue
        choice = chunk["choices"][0]
        if finish is not None:
            return None, "a choice's chunk after its finish_reason"
        finish = choice.get("finish_reason")
        delta = choice.get("delta") or {}
        content += delta.get("content") or ""
        for call in delta.get("tool_calls") or []:
            known = calls.get(call["index"])
            if known is None:
                if not call.get("id") or not call.get("function", {}).get("name"):
                    return None, f"a tool call's first delta without its id and name: {call}"
                calls[call["index"]] = {"id": call["id"], "type": "function",
                                        "function": {"name": call["function"]["name"],
                                                     "arguments": call["function"].get("arguments") or ""}}
            elif call.get("id") or call.get("function", {}).get("name"):
                return None, f"a tool call's id or name sent again: {call}"
            else:
                known["function"]["arguments"] += call.get("function", {}).get("arguments") or ""
    if finish is None:
        return None, "no finish_reason"
    if not chunks or "usage" not in chunks[-1] or chunks[-1]["choices"]:
        return None, "no last chunk with the usage"
    message = {"role": "assistant", "content": content or None,
               "tool_calls": [calls[i] for i in sorted(calls)] or None}
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}, None


def judge(schema, response: Answer, label: str) -> tuple[str, str | None]:
    """(outcome, why when invalid): stop | length | tool_calls | refused | invalid | server_error."""
    if response.status_code >= 500:
        return "server_error", response.text[:300]
    if response.stream_fault is not None:
        return "invalid", f"stream: {response.stream_fault}"
    try:
        body = response.json()
    except ValueError:
        return "invalid", f"a {response.status_code} whose body is not JSON: {response.text[:200]}"
    if response.status_code != 200 or "error" in body:
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
            return "invalid", f"error not in the OpenAI shape: {response.text[:200]}"
        if response.status_code == 200:  # (an error chunk: after the stream began, the engine's)
            return ("server_error" if error["type"] == "server_error" else "refused"), None
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases_dir", type=existing_directory,
                    help="searched recursively for *.json cases ({\"schema\": ...})")
    ap.add_argument("--every", type=at_least(1), default=11, help="every Nth case, sorted by path")
    ap.add_argument("--offset", type=at_least(0), default=0,
                    help="start at the Kth case (another sample of the same size)")
    ap.add_argument("--concurrency", type=at_least(1), default=1,
                    help="requests in flight at once: cases then share the running batch, each with its own mask")
    ap.add_argument("--tools", action="store_true", help="send each schema as a function's parameters")
    ap.add_argument("--max-tokens", type=at_least(1), default=48)
    ap.add_argument("--model", help="model directory (default: the built-in one)")
    ap.add_argument("--stream", action="store_true",
                    help="stream each answer (with usage) and judge the chunks assembled, and the stream's shape")
    args = ap.parse_args()

    cases = sorted(args.cases_dir.rglob("*.json"))[args.offset:: args.every]
    counts: Counter[str] = Counter()
    server_args = ["--log-level", "warning"]
    if args.model:  # (served under the built-in model's name, which the requests send)
        server_args += ["--model", args.model, "--served-model-name", "structgen-builtin"]
    with ServerProcess(*server_args) as server, httpx.Client(base_url=server.base_url, timeout=600) as http:

        def sweep_case(i: int, path: Path) -> list[tuple[str, str | None]]:
            schema = json.loads(path.read_text())["schema"]
            return [judge(schema, ask(http, body, args.stream), label) + (label,)
                    for label, body in bodies(schema, args.tools, i, args.max_tokens)]

        with ThreadPoolExecutor(args.concurrency) as pool:
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
