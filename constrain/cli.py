"""`structgen check-schema`, `structgen maskbench` and `structgen walkbench`: registered on the top-level parser
by service/cli.py."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

_DEFAULT_TOKENIZER = Path(__file__).resolve().parent.parent / "engine" / "builtin_model"
_STOP_NAMES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "</s>")


def existing_directory(text: str) -> Path:
    """A directory that exists, as an argparse `type`: a typo ran a benchmark over no case (`cases=0`, exit status
    0), and `serve --schemas-dir` took it as holding no schema."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a directory: {text}")
    return path


def _readable_file(text: str) -> Path:
    """A file that can be read, as an argparse `type`: `check-schema` said "not supported" (exit status 1, as for a
    schema it refuses) of a file that does not exist."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; name a file")
    if not path.exists():  # (a pipe is taken: `check-schema /dev/stdin`, `<(...)`)
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text} cannot be read")
    return path


def _writable_file(text: str) -> Path:
    """A file that can be written where it is named: `--json` is written at the end of a run (35-85 minutes for the
    whole walkbench), which a wrong folder lost."""
    path = Path(text)
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"no such directory for {text}: {path.parent}")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; name a file")
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text} cannot be written")
    return path


def at_least(least: int):
    """An argparse `type`: an integer of at least `least` (`--limit 0` ran every case, a negative one silently
    left cases out, `--walks 0` walked nothing)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}: {text}")
        return value
    return parse


def _seconds(text: str) -> float:
    """An argparse `type`: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text}")
    return value


_TIMEOUT_HELP = "time limit of an outlines build, seconds (llguidance compiles are held by its own limits; " \
                "default: %(default)g)"
_TOKENIZER_HELP = "tokenizer directory (default: the built-in model's Qwen2 tokenizer)"


def _tokenizer_dir(text: str) -> Path:
    """A local tokenizer directory (a path that is none was read as a hub id, and failed with a traceback)."""
    path = Path(text)
    if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
        raise argparse.ArgumentTypeError(f"not a tokenizer directory (no tokenizer.json): {text}")
    return path


def add_commands(subparsers) -> None:
    """Add this package's subcommands to the `structgen` parser."""
    p = subparsers.add_parser("check-schema", help="say whether a JSON schema is supported, and by which backend")
    p.add_argument("file", type=_readable_file, help="a JSON Schema file")
    p.add_argument("--tokenizer", type=_tokenizer_dir, default=_DEFAULT_TOKENIZER, help=_TOKENIZER_HELP)
    p.add_argument("--backend", default="auto", choices=["auto", "outlines", "llguidance"])
    p.add_argument("--strict", action="store_true", help="check as a strict schema (every keyword enforced)")
    p.add_argument("--timeout", type=_seconds, default=120.0, help=_TIMEOUT_HELP)
    p.set_defaults(func=_check_schema)

    p = subparsers.add_parser("maskbench", help="run the MaskBench method over JSONSchemaBench cases")
    p.add_argument("cases_dir", type=existing_directory, help="directory searched recursively for *.json cases")
    p.add_argument("--tokenizer", type=_tokenizer_dir, default=_DEFAULT_TOKENIZER, help=_TOKENIZER_HELP)
    p.add_argument("--backend", default="auto", choices=["auto", "outlines", "llguidance"])
    p.add_argument("--timeout", type=_seconds, default=60.0, help=_TIMEOUT_HELP)
    p.add_argument("--json", type=_writable_file, default=None,
                   help="write one JSON object per case (JSON lines) here")
    p.add_argument("--limit", type=at_least(0), default=None, help="only the first N cases (sorted by path)")
    p.set_defaults(func=_maskbench)

    p = subparsers.add_parser("walkbench", help="random walks through each compiled case's mask, every finished "
                                                "document validated against its schema")
    p.add_argument("cases_dir", type=existing_directory, help="directory searched recursively for *.json cases")
    p.add_argument("--tokenizer", type=_tokenizer_dir, default=_DEFAULT_TOKENIZER, help=_TOKENIZER_HELP)
    p.add_argument("--backend", default="auto", choices=["auto", "outlines", "llguidance"])
    p.add_argument("--timeout", type=_seconds, default=60.0, help=_TIMEOUT_HELP)
    p.add_argument("--walks", type=at_least(1), default=3, help="walks per case (default: %(default)s)")
    p.add_argument("--max-tokens", type=at_least(1), default=160, help="the budget of each walk (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--not-strict", action="store_true",
                   help="compile as the server compiles a schema sent without `strict` (OpenAI's default)")
    p.add_argument("--json", type=_writable_file, default=None,
                   help="write one JSON object per case (JSON lines) here")
    p.add_argument("--limit", type=at_least(0), default=None, help="only the first N cases (sorted by path)")
    p.set_defaults(func=_walkbench)


def load_tokenizer(path: Path):
    """A tokenizer and the Vocabulary built from it (EOS: its eos token plus the usual chat stop tokens it has as
    special tokens)."""
    from transformers import AutoTokenizer

    from constrain.vocabulary import Vocabulary

    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - a folder with a tokenizer's files that do not load: a one-line reason
        raise SystemExit(f"structgen: cannot load the tokenizer in {path}: {type(exc).__name__}: {str(exc)[:300]}") \
            from None
    eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    vocab_ids = tok.get_vocab()
    # (only where special: Qwen2's `</s>` and Phi-3's are text, and ended MaskBench's instances as EOS)
    special = set(tok.all_special_tokens) | {t.content for t in tok.added_tokens_decoder.values() if t.special}
    eos |= {vocab_ids[n] for n in _STOP_NAMES if n in vocab_ids and n in special}
    return tok, Vocabulary.from_tokenizer(tok, len(tok), eos)


def _check_schema(args: argparse.Namespace) -> int:
    from constrain.checked import wrapped
    from constrain.compiler import GrammarCompiler
    from constrain.grammar import ConstraintError, ConstraintSpec
    from constrain.late_keywords import LateGrammar
    from constrain.limits import JSONTooDeep, read_json
    from constrain.plain_keys import PlainKeysGrammar
    from constrain.spec import normalise_schema, validate_schema
    from constrain.support import outlines_unsupported
    from constrain.unique_items import plan_unique_items

    try:  # (a Windows editor's byte-order mark is read past)
        schema = read_json(args.file.read_text(encoding="utf-8-sig"))
    except JSONTooDeep as exc:
        print(f"{args.file}: not read: it {exc}")
        return 1
    except (OSError, ValueError) as exc:
        print(f"{args.file}: not JSON: {str(exc)[:300]}")
        return 1
    try:
        validate_schema(schema, "schema")
    except ValueError as exc:
        print(f"{args.file}: not supported: {getattr(exc, 'message', exc)}")
        return 1
    tok, vocab = load_tokenizer(args.tokenizer)
    compiler = GrammarCompiler(vocab, tok, backend=args.backend, compile_timeout_s=args.timeout,
                               background_outlines=False)
    source, schema = schema, normalise_schema(schema)  # as the server compiles it (exact rewrites included)
    plan = plan_unique_items(schema)
    if plan is not None:
        print(f"enforced while decoding: {', '.join(dict.fromkeys(_in_file(source, p) for p in plan.pointers))}")
    bad = outlines_unsupported(plan.schema if plan is not None else schema)
    bad = list(dict.fromkeys(_in_file(source, p) for p in bad))
    print(f"outlines: {'exact' if not bad else 'cannot enforce ' + ', '.join(map(_shown, bad[:20]))}")
    spec = ConstraintSpec(kind="json_schema", schema=schema, strict=args.strict, extra={"source": source})
    if args.backend != "outlines":  # (what a server pays once, at start-up: llguidance's tokenizer and tables)
        t0 = time.perf_counter()
        compiler.compile(ConstraintSpec(kind="json_schema", schema={"type": "string"}, backend="llguidance"))
        print(f"set-up {1000 * (time.perf_counter() - t0):.1f} ms (once per server start, not per schema)")
    t0 = time.perf_counter()
    try:
        grammar = compiler.compile(spec)
    except ConstraintError as exc:
        print(f"{args.file}: not supported ({args.backend}): {exc.message}")
        return 1
    ms = 1000 * (time.perf_counter() - t0)
    late = wrapped(grammar, LateGrammar)
    if late is not None:
        print(f"checked as each value is finished: "
              f"{', '.join(dict.fromkeys(_shown(_in_file(source, p)) for p in late.plan.pointers))}")
    if wrapped(grammar, PlainKeysGrammar) is not None:
        print("keys are written without \\u escapes (an open object names keys: constrain/plain_keys.py)")
    unenforced = ", ".join(grammar.unenforced) or "none"
    print(f"{args.file}: supported by {grammar.backend}; unenforced: {unenforced}; compile {ms:.1f} ms")
    if args.backend == "auto" and not bad and grammar.backend != "outlines":
        t0 = time.perf_counter()
        try:
            compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, strict=args.strict,
                                            backend="outlines"))
            print(f"outlines compile (serves repeats): {1000 * (time.perf_counter() - t0):.1f} ms")
        except ConstraintError as exc:
            print(f"outlines compile failed: {exc.message}")
    compiler.close()
    return 0


def _shown(pointer: str) -> str:
    """A JSON Pointer as these lines show it: the root's, "" (RFC 6901's), in words."""
    return pointer or "the root"


def _in_file(source, pointer: str) -> str:
    """A pointer into the schema as compiled, as a place in the file, as the server names them: the subschema an
    exact rewrite replaced (`client_pointer`), but for an object of the file left open, whose absent
    `additionalProperties` is named at its place."""
    from constrain.support import client_pointer

    mapped, holder = client_pointer(source, pointer), pointer.rpartition("/")[0]
    return pointer if pointer.endswith("/additionalProperties") and mapped == holder else mapped


def _maskbench(args: argparse.Namespace) -> int:
    from constrain.compiler import GrammarCompiler
    from constrain.grammar import ConstraintSpec
    from constrain.maskbench import details, run_case, summary_line, write_json

    cases = sorted(args.cases_dir.rglob("*.json"))[: args.limit]
    tok, vocab = load_tokenizer(args.tokenizer)
    compiler = GrammarCompiler(vocab, tok, backend=args.backend, compile_timeout_s=args.timeout,
                               background_outlines=False, lru_max_bytes=256 << 20)
    if args.backend != "outlines":  # (llguidance's tokenizer and tables, once: not the first case's compile time)
        compiler.compile(ConstraintSpec(kind="json_schema", schema={"type": "string"}, backend="llguidance"))
    results = []
    for i, path in enumerate(cases, 1):
        results.append(run_case(path, args.cases_dir, compiler, tok))
        if i % 200 == 0:
            print(f"[{i}/{len(cases)}] {summary_line(results)}", file=sys.stderr, flush=True)
    if args.json:
        write_json(results, args.json)
    for line in details(results):
        print(line)
    print(summary_line(results))
    compiler.close()
    return 0


def _walkbench(args: argparse.Namespace) -> int:
    from constrain.compiler import GrammarCompiler
    from constrain.walkbench import summary_line, walk_case, write_json

    cases = sorted(args.cases_dir.rglob("*.json"))[: args.limit]
    tok, vocab = load_tokenizer(args.tokenizer)
    compiler = GrammarCompiler(vocab, tok, backend=args.backend, compile_timeout_s=args.timeout,
                               background_outlines=False, lru_max_bytes=256 << 20)
    results = []
    for i, path in enumerate(cases, 1):
        results.append(walk_case(path, args.cases_dir, compiler, args.walks, args.max_tokens, args.seed,
                                 strict=not args.not_strict))
        if i % 200 == 0:
            print(f"[{i}/{len(cases)}] {summary_line(results)}", file=sys.stderr, flush=True)
    if args.json:
        write_json(results, args.json)
    for r in results:
        for why in r.invalid:
            print(f"  INVALID {r.case}: {why}")
    print(summary_line(results))
    compiler.close()
    return 0
