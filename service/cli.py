"""The `structgen` command: `serve`, plus the constraint tools that constrain/ registers (check-schema, maskbench,
walkbench).

Every `serve` option also reads STRUCTGEN_<OPTION> from the environment (e.g. STRUCTGEN_MODEL); the command
line wins over the environment.
"""

from __future__ import annotations

import os

# Before torch is imported: idle OpenMP threads must sleep, not spin. Spinning workers fight the engine thread
# and the event loop for the cores (bench/README.md measured 3x slower decoding on 2 cores). A user's own
# setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import logging  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from dataclasses import fields  # noqa: E402
from pathlib import Path  # noqa: E402

from constrain.cli import existing_directory  # noqa: E402
from constrain.tools import TOOL_FORMATS  # noqa: E402
from engine.model_loader import BUILTIN_MODEL  # noqa: E402
from service.config import ServerConfig  # noqa: E402


def _env(name: str, default=None, empty_is_a_value: bool = False):
    """An option's value from `STRUCTGEN_<NAME>`; an empty one is unset (env files and charts leave values empty,
    and an empty `STRUCTGEN_CACHE_DIR` made the working directory the cache), but for an option whose empty value
    means something (`--json-whitespace ''`: compact JSON)."""
    value = os.environ.get("STRUCTGEN_" + name.upper().replace("-", "_"))
    return value if value or (empty_is_a_value and value is not None) else default


def _default(name: str, empty_is_a_value: bool = False):
    """A `serve` option's default: STRUCTGEN_<NAME>, else ServerConfig's (as text, which argparse's `type` reads
    as it reads the command line's), so the defaults are written once."""
    value = getattr(ServerConfig, name)
    return _env(name, None if value is None else str(value), empty_is_a_value)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _api_key(text: str) -> str:
    """An empty `--api-key` (`--api-key "$KEY"` with KEY unset) is refused: it served every request, unasked. So is
    one with whitespace around it (an env file's trailing space), which no request's header could match."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty key; leave --api-key out to serve without one")
    if text != text.strip():
        raise argparse.ArgumentTypeError("the key begins or ends with whitespace, which no Authorization header "
                                         "carries: every request would be refused")
    return text


def _origins(text: str) -> str:
    """`--allowed-origins`: `*`, or origins as a browser sends them (`https://app.example`, `http://localhost:3000`),
    comma-separated; written back as one comma-separated list."""
    origins = [o.strip() for o in text.split(",")]
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise argparse.ArgumentTypeError(f"not an origin: {origin!r} (write scheme://host[:port], no path, "
                                             "or '*')")
    return ",".join(origins)


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"port out of range: {value}")
    return value


def _one_of(*values: str):
    """An option's check that its value is one of `values`. argparse checks `choices` only against what the
    command line gives; a `type` is also applied to a default given as text, the STRUCTGEN_<OPTION> value, which
    a typo there so reaches as a one-line error too (`STRUCTGEN_LOG_LEVEL=bogus` ended in a traceback)."""
    def check(text: str) -> str:
        if text not in values:
            raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(values)})")
        return text
    return check


def _whitespace(text: str) -> str:
    from constrain.whitespace import check_whitespace_pattern

    try:
        return check_whitespace_pattern(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_serve(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve the OpenAI-compatible API",
                              description="Serve the OpenAI-compatible API. Each option can also be set with "
                                          "the environment variable STRUCTGEN_<OPTION>.")
    p.add_argument("--model", default=_default("model"),
                   help=f"local model directory or hub id (default: the offline {BUILTIN_MODEL})")
    # (defaults shown as `%(default)s`: STRUCTGEN_<OPTION>'s where it is set, as the server will use it)
    p.add_argument("--host", default=_default("host"), help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=_port, default=_default("port"), help="(default: %(default)s)")
    key_set = _env("api_key", None) is not None  # (never shown)
    p.add_argument("--api-key", type=_api_key, default=_default("api_key"),
                   help="require 'Authorization: Bearer KEY' (default: "
                        + ("the key in STRUCTGEN_API_KEY)" if key_set else "none, every request is served)"))
    p.add_argument("--allowed-origins", type=_origins, default=_default("allowed_origins"),
                   help="answer browsers' CORS requests from these origins (comma-separated, or '*' for any), so a "
                        "web page's script may call the API as it calls OpenAI's (default: none, browsers refused)")
    p.add_argument("--device", default=_default("device"),
                   help="auto, cpu, cuda, cuda:N, mps (where torch has it); auto takes cuda where there is "
                        "one (default: %(default)s)")
    dtypes = ["auto", "float32", "fp32", "float16", "fp16", "bfloat16", "bf16"]
    p.add_argument("--dtype", default=_default("dtype"), type=_one_of(*dtypes), choices=dtypes,
                   help="auto: bfloat16 or float16 on CUDA, float32 on a CPU (default: %(default)s)")
    p.add_argument("--max-batch-size", type=_positive_int, default=_default("max_batch_size"),
                   help="requests decoded together (default: %(default)s)")
    p.add_argument("--max-prefill-tokens", type=_positive_int, default=_default("max_prefill_tokens"),
                   help="prompt positions prefilled in one engine step for the waiting prompts that join together "
                        "(padded), and the chunk size of a longer prompt, which joins after several steps while the "
                        "running requests go on (a step may do both: up to twice this); lower it on a CPU so a long "
                        "prompt holds the streams up for less (default: %(default)s)")
    p.add_argument("--mask-threads", type=_positive_int, default=_default("mask_threads"),
                   help="threads that fill the output constraints' token masks, each step (default: 1 on a CPU; on "
                        "a GPU one per two cores, at most 8)")
    p.add_argument("--max-model-len", type=_positive_int, default=_default("max_model_len"),
                   help="context length (default: the model's)")
    p.add_argument("--served-model-name", default=_default("served_model_name"),
                   help="the name clients send as `model` (default: --model)")
    backends = ["auto", "outlines", "llguidance"]
    p.add_argument("--constraint-backend", default=_default("constraint_backend"), type=_one_of(*backends),
                   choices=backends, help="auto: llguidance serves a new schema, outlines its repeats, README "
                                          "(default: %(default)s)")
    p.add_argument("--schemas-dir", type=existing_directory, default=_default("schemas_dir"),
                   help="directory of named JSON schemas to precompile at start-up")
    p.add_argument("--cache-dir", type=Path, default=_default("cache_dir"),
                   help="on-disk grammar cache (default: $XDG_CACHE_HOME/structgen, else ~/.cache/structgen)")
    p.add_argument("--cache-max-mb", type=_positive_int, default=_default("cache_max_mb"),
                   help="the on-disk grammar cache's size bound, in MiB: the automata least recently used go first "
                        "(one takes ~6 MB on a 152k-token vocabulary; default: %(default)s)")
    p.add_argument("--grammar-cache-mb", type=_positive_int, default=_default("grammar_cache_mb"),
                   help="the in-memory grammar cache's size bound, in MiB: the grammars least recently used go "
                        "first (an llguidance one takes ~0.2 MB, an outlines automaton ~6 MB on a 152k-token "
                        "vocabulary; default: %(default)s)")
    p.add_argument("--json-whitespace", type=_whitespace,
                   default=_default("json_whitespace", empty_is_a_value=True),
                   help="regex of the whitespace JSON output may hold between tokens: only space, \\t, \\n, "
                        f"\\r, at most 64 characters (default {ServerConfig.json_whitespace!r}: one optional space; "
                        "'' for compact JSON)")
    p.add_argument("--tool-call-format", default=_default("tool_call_format"),
                   type=_one_of("auto", *TOOL_FORMATS), choices=["auto", *TOOL_FORMATS],
                   help="how the model writes tool calls: 'hermes' between <tool_call> tags, 'llama3_json' as "
                        "Llama 3's one {\"name\", \"parameters\"} object, 'mistral' as a JSON array after the "
                        "[TOOL_CALLS] token, 'granite' after <|tool_call|>, 'mistral_args' as "
                        "[TOOL_CALLS]name[ARGS]{...} per call, 'qwen3_coder', 'glm45' and 'glm47' as tags around "
                        "each argument, 'harmony' as gpt-oss's commentary-channel call, 'json_array' as a JSON array "
                        "(default 'auto': the format the chat template describes)")
    p.add_argument("--reasoning", default=_default("reasoning"), type=_one_of("auto", "none"),
                   choices=["auto", "none"],
                   help="'auto': a model whose chat template writes <think> (or Magistral's [THINK]) blocks, and "
                        "whose tokenizer has both tags as single tokens, may think before answering; the block "
                        "comes back as `reasoning_content` and constraints apply after it. 'none': the output is all "
                        "answer")
    p.add_argument("--max-body-bytes", type=_positive_int, default=_default("max_body_bytes"),
                   help="largest accepted request body; larger ones get a 413 "
                        f"(default: {ServerConfig.max_body_bytes >> 20} MiB)")
    p.add_argument("--max-body-seconds", type=_positive_int, default=_default("max_body_seconds"),
                   help="seconds a request's body may take to arrive (a slower one gets a 408), and its request "
                        "line and headers (else the connection is closed) (default: %(default)s)")
    levels = ["critical", "error", "warning", "info", "debug"]
    p.add_argument("--log-level", default=_default("log_level"), type=_one_of(*levels), choices=levels,
                   help="(default: %(default)s)")
    p.add_argument("--shutdown-timeout", type=_positive_int, default=_default("shutdown_timeout"),
                   help="seconds to finish the requests in flight after SIGTERM, after which those left are cut "
                        f"(default: %(default)s; {ServerConfig.shutdown_timeout} is within Kubernetes' 30-second grace "
                        "period)")
    for action in p._actions:  # (a default a help text words as the built-in one: the variable's value, where set)
        if action.help and "%(default)" not in action.help and action.dest != "api_key" \
                and _env(action.dest, None, empty_is_a_value=action.dest == "json_whitespace") is not None:
            action.help += f" (STRUCTGEN_{action.dest.upper()} sets %(default)r)"
    p.set_defaults(func=_serve)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """The settings `serve`'s options (each read by its `type`) name: one option per ServerConfig field."""
    settings = {f.name: getattr(args, f.name) for f in fields(ServerConfig)}
    return ServerConfig(**settings)


def _serve(args: argparse.Namespace) -> int:
    from engine.model_loader import ModelLoadError
    from service.server import AddressUnusable, EngineStopped, run_server

    try:
        run_server(server_config(args))
    except (AddressUnusable, ModelLoadError, EngineStopped) as exc:
        print(f"structgen: error: {exc}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="structgen", description="OpenAI-compatible structured generation")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_serve(subparsers)
    from constrain import cli as constrain_cli

    constrain_cli.add_commands(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "info").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
