"""The MaskBench method over JSONSchemaBench-style cases: compile each schema, walk each instance's tokens through
the mask, count valid instances rejected and invalid instances accepted.

A case is compiled with `strict` semantics: a schema is covered only when every keyword is enforced, so a keyword a
backend would skip can never be scored as a pass. Used by `structgen maskbench` and by the tests; no HTTP here.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from constrain.compiler import GrammarCompiler
from constrain.grammar import ConstraintError, ConstraintSpec
from constrain.limits import read_json


@dataclass
class CaseResult:
    case: str
    compiled: bool
    backend: str | None
    error: str | None
    compile_ms: float
    valid_n: int = 0
    valid_accepted: int = 0
    invalid_n: int = 0
    invalid_rejected: int = 0
    mask_us_mean: float = 0.0


def _allowed(bitmask: torch.Tensor, token: int) -> bool:
    return bool((int(bitmask[0, token >> 5]) >> (token & 31)) & 1)


def walk_instance(grammar, tokens: list[int], eos: int, bitmask: torch.Tensor, times: list[float]) -> bool:
    """True when every token is allowed by the mask in turn and the grammar may end after the last one."""
    m = grammar.matcher()
    for tok in tokens + [eos]:
        t0 = time.perf_counter()
        try:
            m.fill_bitmask(bitmask, 0)
        except ConstraintError:  # the matcher gave up (a backend work limit): the instance is not accepted
            return False
        times.append(time.perf_counter() - t0)
        if not _allowed(bitmask, tok):
            return False
        if tok == eos:
            return True
        if not m.accept(tok):
            return False
    return False


def run_case(path: Path, root: Path, compiler: GrammarCompiler, tokenizer) -> CaseResult:
    from constrain.spec import normalise_schema, validate_schema

    name = str(path.relative_to(root))
    t0 = time.perf_counter()
    try:
        case = read_json(path.read_text(encoding="utf-8-sig"))
        if not isinstance(case, dict) or "schema" not in case:
            raise ValueError("no \"schema\" field")
        tests = case.get("tests", [])
        if not isinstance(tests, list) or not all(
                isinstance(t, dict) and "data" in t and isinstance(t.get("valid"), bool) for t in tests):
            raise ValueError("\"tests\" is not a list of {\"data\", \"valid\"}")
    except (OSError, ValueError) as exc:  # (a stray file, or an earlier --json saved as *.json, ended the run;
        # so did a case nested deeper than Python's stack, now JSONTooDeep)
        return CaseResult(name, False, None, f"not a MaskBench case: {str(exc)[:200]}", 0.0)
    try:
        validate_schema(case["schema"], "response_format")
        grammar = compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(case["schema"]),
                                                  strict=True))
    except ConstraintError as exc:
        return CaseResult(name, False, None, exc.message[:300], 1000 * (time.perf_counter() - t0))
    except Exception as exc:  # a backend crash is a finding, not a reason to stop the run
        return CaseResult(name, False, None, f"{type(exc).__name__}: {str(exc)[:300]}",
                          1000 * (time.perf_counter() - t0))
    res = CaseResult(name, True, grammar.backend, None, 1000 * (time.perf_counter() - t0))
    bitmask = torch.zeros((1, compiler.vocab.words), dtype=torch.int32)
    eos = min(compiler.vocab.eos_token_ids)
    times: list[float] = []
    for test in tests:
        tokens = instance_tokens(json.dumps(test["data"]), tokenizer, compiler.vocab)
        ok = walk_instance(grammar, tokens, eos, bitmask, times)
        if test["valid"]:
            res.valid_n += 1
            res.valid_accepted += ok
        else:
            res.invalid_n += 1
            res.invalid_rejected += not ok
    res.mask_us_mean = 1e6 * statistics.fmean(times) if times else 0.0
    return res


def instance_tokens(text: str, tokenizer, vocab) -> list[int]:
    """`text` as the tokenizer encodes it, less SentencePiece's dummy prefix: Phi-3's `▁{"` for `{"`, which no
    grammar takes first, made every valid instance count as rejected (QA cli F1). The first token is taken without
    its space (`{"`, the vocabulary's own token for it), not the text spelled anew: longest matches spelled `.` and
    `a` with byte-fallback tokens, which a grammar that forces those bytes refuses (268 of 440 valid instances,
    QA review F5). Other text the tokenizer changes is spelled with the vocabulary's tokens."""
    tokens = tokenizer.encode(text, add_special_tokens=False)
    data = text.encode()
    spelled = b"".join(vocab.token_bytes[t] or b"" for t in tokens)
    if spelled == data:
        return tokens
    if tokens and spelled == b" " + data and (vocab.token_bytes[tokens[0]] or b"").startswith(b" "):
        rest = vocab.token_bytes[tokens[0]][1:]
        first = [] if not rest else [vocab.ids_by_bytes()[rest]] if rest in vocab.ids_by_bytes() else vocab.spell(rest)
        if first is not None:
            return first + tokens[1:]
    return vocab.spell(data) or tokens


def summary_line(results: list[CaseResult]) -> str:
    comp = [r for r in results if r.compiled]
    vn = sum(r.valid_n for r in comp)
    vr = vn - sum(r.valid_accepted for r in comp)
    inn = sum(r.invalid_n for r in comp)
    ia = inn - sum(r.invalid_rejected for r in comp)
    return (f"maskbench: cases={len(results)} compiled={len(comp)} valid_rejected={vr}/{vn} "
            f"invalid_accepted={ia}/{inn} compile_p50_ms={_compile_ms(comp, 0.5):.1f} "
            f"mask_mean_us={_mask_mean_us(comp):.1f}")


def _compile_ms(compiled: list[CaseResult], quantile: float) -> float:
    ms = sorted(r.compile_ms for r in compiled)
    return ms[min(int(len(ms) * quantile), len(ms) - 1)] if ms else 0.0


def _mask_mean_us(compiled: list[CaseResult]) -> float:
    masks = [r.mask_us_mean for r in compiled if r.valid_n + r.invalid_n]
    return statistics.fmean(masks) if masks else 0.0


_ERROR_CLASSES = (
    (re.compile(r"cannot be enforced at \S+ \(([^)]*)\)"), "keyword {0}"),
    (re.compile(r"the outlines backend serves only closed objects"), "outlines open object"),
    (re.compile(r"the outlines backend cannot enforce the keyword at (\S+)"), "outlines keyword {0}"),
    (re.compile(r"oneOf constraints are not supported"), "oneOf not provably disjoint"),
    (re.compile(r"invalid JSON Schema"), "invalid schema"),
    (re.compile(r"Unsatisfiable schema|anyOf is empty"), "unsatisfiable schema"),
    (re.compile(r"min/maxProperties only supported"), "min/maxProperties with optional properties"),
    (re.compile(r"circular references with sibling keys"), "recursive $ref with siblings"),
    (re.compile(r"intersection stack level exceeded"), "allOf intersection too deep"),
    (re.compile(r"patternProperty regexes .* are not disjoint"), "overlapping patternProperties"),
    (re.compile(r"look-?around|backreferences|regex parse error"), "unsupported regex"),
    (re.compile(r"not present in a registry"), "external $ref"),
    (re.compile(r"took longer than|time"), "time limit"),
    (re.compile(r"too large|limit is|more than|deeper than|longer than"), "size limit"),
)


def error_class(message: str | None) -> str:
    """A short cause for a compile error, for grouping (the keyword names for unenforceable keywords)."""
    message = message or ""
    for pattern, label in _ERROR_CLASSES:
        m = pattern.search(message)
        if m:
            if "{0}" in label:
                arg = m.group(1)
                if label.startswith("outlines"):
                    arg = arg.rsplit("/", 1)[-1]
                return label.format(arg)
            return label
    return "other: " + message.split("\n")[0][:80]


def stats_line(results: list[CaseResult]) -> str:
    """compiled, errors, compile p50/p90 and mask mean: what the issue asks the note to report per backend."""
    comp = [r for r in results if r.compiled]
    return (f"compiled={len(comp)} errors={len(results) - len(comp)} compile_p50_ms={_compile_ms(comp, 0.5):.1f} "
            f"compile_p90_ms={_compile_ms(comp, 0.9):.1f} mask_mean_us={_mask_mean_us(comp):.1f}")


def details(results: list[CaseResult]) -> list[str]:
    comp = [r for r in results if r.compiled]
    lines = [stats_line(results)]
    if comp:
        by = {}
        for r in comp:
            by[r.backend] = by.get(r.backend, 0) + 1
        lines.append("served by: " + ", ".join(f"{k}={v}" for k, v in sorted(by.items())))
    errors = [r for r in results if not r.compiled]
    lines.append(f"not compiled: {len(errors)}")
    causes: dict[str, int] = {}
    for r in errors:
        c = error_class(r.error)
        causes[c] = causes.get(c, 0) + 1
    for c, n in sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))[:25]:
        lines.append(f"  {n:5d} {c}")
    bad = [r for r in comp if r.valid_accepted < r.valid_n or r.invalid_rejected < r.invalid_n]
    for r in bad[:20]:
        lines.append(f"  FAIL {r.case}: valid {r.valid_accepted}/{r.valid_n} invalid rejected "
                     f"{r.invalid_rejected}/{r.invalid_n} ({r.backend})")
    return lines


def write_json(results: list[CaseResult], out: Path) -> None:
    with open(out, "w") as f:
        for r in results:
            f.write(json.dumps(asdict(r)) + "\n")
