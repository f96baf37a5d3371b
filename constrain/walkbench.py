"""Random walks through each compiled case's mask, every finished document validated: MaskBench's counterpart on
the generation side. MaskBench tries the instances a dataset lists; a walk writes whatever the mask allows, so it
finds outputs no listed instance covers (a February 31, a late keyword left unchecked, a repeated key counted
twice). Used by `structgen walkbench` and the tests; no HTTP here.

A walk samples among the allowed tokens (half the time a one-byte token, which closes strings and numbers), ends
with some probability wherever the grammar may end, and keeps the budget rule on (`tokens_left`, `vet`), as the
engine does, so budget completions are walked too. Validation is jsonschema's for the schema's draft, with
`dependencies` as enforced, formats with the draft's checker (`time` and `date-time` as Python's datetime reads
them), and `multipleOf` exactly in decimal, as JSON Schema defines it (jsonschema divides in floating point:
550.44 / 0.01 is not an integer there).
"""

from __future__ import annotations

import datetime
import json
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jsonschema
import numpy as np
import torch

from constrain.checked import allowed_ids as ids_in_row
from constrain.compiler import GrammarCompiler
from constrain.grammar import ConstraintError, ConstraintSpec


class WalkError(AssertionError):
    """The mask and the matcher disagree (a bug in the backend or its wrapper, not in the walked schema)."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise WalkError(message)


_ONE_BYTE: dict[int, np.ndarray] = {}


def _one_byte(vocab) -> np.ndarray:
    arr = _ONE_BYTE.get(id(vocab))
    if arr is None:
        arr = np.array([b is not None and len(b) == 1 for b in vocab.token_bytes], dtype=bool)
        _ONE_BYTE[id(vocab)] = arr
    return arr


def allowed_ids(bitmask: torch.Tensor, row: int = 0) -> np.ndarray:
    """Every id allowed in row `row` of a packed CPU bitmask."""
    return ids_in_row(bitmask[row].numpy())


def random_walk(grammar, vocab, rng: random.Random, max_tokens: int, budget: bool = False,
                prefer_end: float = 0.0, special_ok: frozenset[int] = frozenset()) -> tuple[list[int], bool]:
    """Sample among allowed tokens (half the time a 1-byte one); returns (tokens, ended). Checks on every step that
    the mask and the matcher agree (`WalkError` otherwise); the mask allows no special token but those of
    `special_ok` (a grammar's own tags). A matcher that gives up raises its ConstraintError."""
    m = grammar.matcher()
    bm = torch.zeros((1, vocab.words), dtype=torch.int32)
    eos = np.array(sorted(vocab.eos_token_ids))
    one = _one_byte(vocab)
    toks: list[int] = []
    for step in range(max_tokens):
        m.fill_bitmask(bm, 0, tokens_left=(max_tokens - step) if budget else None)
        ids = allowed_ids(bm)
        _check(len(ids) > 0, "empty mask")
        _check(ids[-1] < len(vocab.token_bytes), "a padded id is allowed")
        is_eos = np.isin(ids, eos)
        _check(all(vocab.token_bytes[i] is not None or i in special_ok
                   for i in ids[~is_eos][:: max(1, len(ids) // 500)]), "a special token is allowed")
        _check(bool(is_eos.any()) == m.can_end(), "the mask allows EOS exactly when the matcher can end")
        _check(int(is_eos.sum()) in (0, len(eos)), "all EOS ids or none")
        if is_eos.any() and (rng.random() < prefer_end or m.is_terminated()):
            return toks, True
        choices = ids[~is_eos]
        if not len(choices):
            return toks, True
        short = choices[one[choices]]
        pool = short if len(short) and rng.random() < 0.5 else choices
        tok = int(pool[rng.randrange(len(pool))])
        if budget:
            vetted = m.vet(tok, max_tokens - step)  # as the engine does (an EOS id ends the output)
            # (the engine keeps the sampled token where the rule's is not in the mask)
            _check(vetted == tok or vetted in ids, "the budget rule's token is not in the mask")
            tok = vetted
            if tok in vocab.eos_token_ids:
                _check(m.can_end(), "the budget rule ended an output that cannot end")
                return toks, True
        _check(m.accept(tok), "the matcher refuses a token its mask allowed")
        toks.append(tok)
    return toks, m.can_end()


def decode(vocab, toks: list[int]) -> str:
    return b"".join(vocab.token_bytes[t] for t in toks).decode("utf-8")


# RFC 3339's full-time and date-time (section 5.6): an offset is required, which Python's `fromisoformat` does not ask
# (QA realschemas: the oracle took `2020-01-01T00:00:00`, which the grammars rightly refuse).
_RFC3339_TIME = r"\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})"
_RFC3339 = {"time": re.compile(_RFC3339_TIME), "date-time": re.compile(r"\d{4}-\d{2}-\d{2}T" + _RFC3339_TIME)}


def _python_reads(parse, rfc3339: re.Pattern):
    def check(instance: object) -> bool:
        if isinstance(instance, str):
            if not rfc3339.fullmatch(instance):
                raise ValueError(f"{instance!r} is not RFC 3339")
            parse(instance)
        return True
    return check


def validator_for(schema):
    """jsonschema's validator for `schema` as the product means it (constrain.rewrite.validator_class: its draft,
    `dependencies` in every draft), with the draft's format checker, `time` and `date-time` RFC 3339 that Python's
    datetime reads (what constrain/formats.py promises; jsonschema checks them only with rfc3339-validator),
    and `multipleOf` in decimal."""
    from constrain.rewrite import validator_class

    cls = validator_class(schema)
    formats = jsonschema.FormatChecker()
    formats.checkers = dict(cls.FORMAT_CHECKER.checkers)
    for name, parse in (("time", datetime.time.fromisoformat), ("date-time", datetime.datetime.fromisoformat)):
        formats.checks(name, raises=ValueError)(_python_reads(parse, _RFC3339[name]))
    return cls(schema, format_checker=formats)


# A key holding a \uXXXX escape. llguidance 1.9.1 takes an escaped spelling of a declared name as another key;
# constrain/plain_keys.py refuses such keys where that matters, and invalid documents with one are counted apart.
ESCAPED_KEY = re.compile(r'"(?:[^"\\]|\\.)*\\u[0-9a-fA-F]{4}(?:[^"\\]|\\.)*"\s*:')


@dataclass
class WalkResult:
    case: str
    compiled: bool
    walks: int = 0
    ended: int = 0  # walks that finished a document
    gave_up: int = 0  # walks the matcher ended with a ConstraintError (constraint_too_complex: a dead end)
    invalid: list[str] = field(default_factory=list)  # "why: document" for each finished invalid document
    escaped_keys: int = 0  # of `invalid`, those with a \u escape in a key (see ESCAPED_KEY)
    named: int = 0  # finished documents invalid where the compile named keywords unenforced (not strict only)


def walk_case(path: Path, root: Path, compiler: GrammarCompiler, walks: int = 3, max_tokens: int = 160,
              seed: int = 0, strict: bool = True) -> WalkResult:
    """`walks` budgeted random walks through the case's schema compiled as MaskBench compiles it (strict), or as
    the server compiles a schema sent without `strict`: then a document that breaks a keyword the compile named
    unenforced is counted apart (`named`), and every other invalid one is a bug."""
    from constrain.spec import normalise_schema, validate_schema

    name = str(path.relative_to(root))
    try:
        schema = json.loads(path.read_text())["schema"]
        validate_schema(schema, "response_format")
        grammar = compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=strict))
        validator = validator_for(schema)
    except Exception:  # noqa: BLE001 - not compiled (MaskBench counts why)
        return WalkResult(name, False)
    res = WalkResult(name, True)
    rng = random.Random(f"{seed}:{name}")
    for _ in range(walks):
        res.walks += 1
        try:
            toks, ended = random_walk(grammar, compiler.vocab, rng, max_tokens, budget=True, prefer_end=0.3)
        except ConstraintError:
            res.gave_up += 1
            continue
        except WalkError as exc:  # the mask and the matcher disagree: a bug, counted with the case's name
            res.invalid.append(f"walk error: {exc}")
            continue
        if not ended:
            continue
        res.ended += 1
        text = b"".join(compiler.vocab.token_bytes[t] for t in toks).decode("utf-8", "replace")
        try:
            error = next(validator.iter_errors(json.loads(decode(compiler.vocab, toks))), None)
        except ValueError:  # (UnicodeDecodeError included)
            res.invalid.append(f"not JSON: {text[:300]}")
            continue
        if error is not None and grammar.unenforced:
            res.named += 1
        elif error is not None:
            res.invalid.append(f"{error.message[:200]}: {text[:300]}")
            res.escaped_keys += bool(ESCAPED_KEY.search(text))
    return res


def summary_line(results: list[WalkResult]) -> str:
    comp = [r for r in results if r.compiled]
    return (f"walkbench: cases={len(results)} compiled={len(comp)} walks={sum(r.walks for r in comp)} "
            f"ended={sum(r.ended for r in comp)} invalid={sum(len(r.invalid) for r in comp)} "
            f"escaped_keys={sum(r.escaped_keys for r in comp)} gave_up={sum(r.gave_up for r in comp)} "
            f"named={sum(r.named for r in comp)}")


def write_json(results: list[WalkResult], out: Path) -> None:
    with open(out, "w") as f:
        for r in results:
            f.write(json.dumps(asdict(r)) + "\n")
