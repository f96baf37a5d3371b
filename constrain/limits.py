"""Size limits a constraint must meet before anything compiles it: a schema's bytes, nesting depth, enum sizes,
node count, pattern and literal lengths; a `regex`'s length; a `choice`'s entries and characters. And how deep JSON
text may nest for the server to read it at all (`read_json`).

Checked in microseconds-to-milliseconds so hostile schemas are refused before they can cost compile time.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from constrain.grammar import ConstraintError
from constrain.support import escape_pointer_part, walk_with_refs


@dataclass(frozen=True)
class Limits:
    max_schema_bytes: int = 256 * 1024
    max_depth: int = 64
    max_enum: int = 2_000
    max_nodes: int = 20_000
    max_pattern_chars: int = 2_000
    # A string the output must spell whole (a `const`/`enum` string, a property name, a `choice` entry): its masks
    # cost time with its length, on the engine thread, where every row of the batch waits: a 200 KB `const` took 2 s
    # at its first mask and ~100 ms at each later one under llguidance (QA dos F1); 4,096 characters take ~20 ms,
    # then 1-4 ms a step.
    max_literal_chars: int = 4_096
    max_regex_chars: int = 10_000  # a client's `regex`
    max_choices: int = 10_000  # entries of a `choice`
    # Characters of a `choice`, all entries together: 262,144 took ~50 MB as answers went through it, 65,536 ~3 MB
    # (the cache counts ~32 bytes a character); 7 MB of them took 1 GB of the server's memory to compile.
    max_choice_chars: int = 64 * 1024


DEFAULT_LIMITS = Limits()

# How deep JSON text may nest for the server to read it (a request body, a schema sent as JSON text, an earlier
# call's arguments, a file the CLIs read). Python's own reader gives up where its recursion limit falls (near 1,000
# levels on 3.11; 3.12, the Docker image's, read 5,000): the limit is the server's own, below every version's, so
# one text gets one answer on any Python. (A schema is then held to `Limits.max_depth`, with the pointer of where.)
MAX_JSON_NESTING = 500


class JSONTooDeep(ValueError):
    """JSON text nesting arrays and objects deeper than MAX_JSON_NESTING. Its message completes a sentence whose
    subject is what was read: "the request body " + str(exc)."""

    def __init__(self) -> None:
        super().__init__(f"nests arrays and objects deeper than {MAX_JSON_NESTING} levels")


def nesting_depth(value: Any) -> int:
    """How deep arrays and objects nest in `value` (0 for a scalar), without recursion: level by level, each
    level's arrays and objects only (0.08 s for a body of 200,000 messages, where a walk of every value took 0.5)."""
    depth, level = 0, [value] if isinstance(value, (dict, list)) else []
    while level:
        depth += 1
        below: list = []
        for v in level:
            below += [x for x in (v.values() if isinstance(v, dict) else v) if isinstance(x, (dict, list))]
        level = below
    return depth


def read_json(text: str | bytes) -> Any:
    """`json.loads(text)`, but text nesting deeper than MAX_JSON_NESTING raises JSONTooDeep on every Python."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONTooDeep() from None
    # (text with fewer opening brackets than the limit cannot nest past it: most texts are not walked)
    opens = text.count(b"[") + text.count(b"{") if isinstance(text, bytes) else text.count("[") + text.count("{")
    if opens > MAX_JSON_NESTING and nesting_depth(value) > MAX_JSON_NESTING:
        raise JSONTooDeep()
    return value


def _ptr(parts: list, base: str = "") -> str:
    """The JSON Pointer of `parts` below `base` (RFC 6901: "" is the root, `/` a key named "")."""
    return base + "".join("/" + escape_pointer_part(p) for p in parts)


def check_schema_limits(schema: Any, param: str, limits: Limits = DEFAULT_LIMITS, base: str = "") -> None:
    """Raise ConstraintError naming the limit (and the pointer, below `base`) a schema breaks, or a number JSON
    cannot write."""
    try:
        size = len(json.dumps(schema, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        raise ConstraintError("schema is not serialisable JSON", param=param) from None
    if size > limits.max_schema_bytes:
        raise ConstraintError(f"schema is {size} bytes; the limit is {limits.max_schema_bytes}", param=param,
                              code="schema_too_large")
    nodes = 0
    stack: list[tuple[Any, list, int]] = [(schema, [], 0)]
    while stack:
        node, path, depth = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise ConstraintError(f"schema has more than {limits.max_nodes} nodes", param=param,
                                  code="schema_too_large")
        if depth > limits.max_depth:
            p = _ptr(path, base)
            raise ConstraintError(f"schema nesting deeper than {limits.max_depth} at {p}", param=param, pointer=p,
                                  code="schema_too_large")
        if isinstance(node, dict):
            enum = node.get("enum")
            if isinstance(enum, list) and len(enum) > limits.max_enum:
                p = _ptr(path + ["enum"], base)
                raise ConstraintError(f"enum at {p} has {len(enum)} values; the limit is {limits.max_enum}",
                                      param=param, pointer=p, code="schema_too_large")
            pat = node.get("pattern")
            if isinstance(pat, str) and len(pat) > limits.max_pattern_chars:
                p = _ptr(path + ["pattern"], base)
                raise ConstraintError(f"pattern at {p} is longer than {limits.max_pattern_chars} characters",
                                      param=param, pointer=p, code="schema_too_large")
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            if isinstance(v, (dict, list)):
                stack.append((v, path + [k], depth + 1))
            elif isinstance(v, float) and not math.isfinite(v):
                # (no JSON value equals one: llguidance wrote `null` for `{"const": 1e999}`)
                p = _ptr(path + [k], base)
                raise ConstraintError(f"the schema holds a number JSON cannot write at {p} (a number past float "
                                      "range, such as 1e999, reads as infinity; NaN and Infinity are not JSON)",
                                      param=param, pointer=p)
    _check_literals(schema, param, limits, base)


def _check_literals(schema: Any, param: str, limits: Limits, base: str) -> None:
    """Refuse a string the output would have to spell whole past `max_literal_chars`: in a `const` or `enum`
    value (keys of its objects too), a declared or required property name."""
    def strings(value: Any):
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)
        elif isinstance(value, dict):
            for k, v in value.items():
                yield k
                yield from strings(v)

    most = limits.max_literal_chars
    for ptr, key, node in walk_with_refs(schema, base):
        value = node[key]
        if key in ("const", "enum"):
            found = strings(value)
        elif key in ("properties", "required") and isinstance(value, (dict, list)):
            found = (name for name in value if isinstance(name, str))
        else:
            continue
        if any(len(text) > most for text in found):
            raise ConstraintError(f"{key} at {ptr} holds a string longer than {most} characters", param=param,
                                  pointer=ptr, code="schema_too_large")
