"""Every value a schema accepts, when there are few of them. `uniqueItems` over such items is held to their number
(constrain/rewrite.py bounds the array's `maxItems`), where otherwise an array of `{"a": 0|1}` objects could open
an item that can only repeat one.

Candidates come from the keywords that make a set finite: `const`, `enum`, booleans, null, bounded integers,
closed objects of such properties, `anyOf`/`oneOf` branches, `allOf` members and `$ref` targets. jsonschema then
keeps those the whole schema accepts, so the list is exact. A schema that reaches a `format` or a regex is left
alone: jsonschema does not assert formats, and a client's regex is never run here. Never imports HTTP or model
code.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from constrain.support import NAMED_SUBSCHEMAS, VALUE_KEYWORDS, resolve_ref

MAX_CANDIDATES = 4096  # values listed before the schema's keywords are checked on them
_MAX_VISITS = 20_000  # subschemas read while listing them (a recursive oneOf of b branches took b^depth: QA review6 F3)
_UNDECIDABLE = ("format", "pattern", "patternProperties")


def finite_values(schema: Any, root: Any, limit: int, validator) -> list | None:
    """The values `schema` accepts (in `root`'s $ref context), when there are at most `limit` of them; None when
    they are more, or not known to be finite. `validator`: a jsonschema validator of `root` (its `evolve` checks
    `schema` with `root`'s references)."""
    if not _decidable(schema, root):
        return None
    candidates = _candidates(schema, root, 0, [_MAX_VISITS])
    if candidates is None:
        return None
    check = validator.evolve(schema=schema)
    out = [v for v in _distinct(candidates) if check.is_valid(v)]
    return out if len(out) <= limit else None


def _json_key(value: Any) -> tuple:
    """A hashable key under which JSON-equal values (1 and 1.0; objects whatever their key order) are equal."""
    if isinstance(value, bool) or value is None:
        return ("l", value)
    if isinstance(value, (int, float)):
        return ("n", value)  # (Python: 1 == 1.0, same hash)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("a", tuple(_json_key(v) for v in value))
    return ("o", frozenset((k, _json_key(v)) for k, v in value.items()))


def _distinct(values: list) -> list:
    seen: dict[tuple, Any] = {}
    for v in values:
        seen.setdefault(_json_key(v), v)
    return list(seen.values())


_NO_SUBSCHEMA = VALUE_KEYWORDS | {"$ref"}  # keywords whose values hold no subschema (`$ref` is followed)


def _decidable(schema: Any, root: Any) -> bool:
    """No `format` or regex in `schema`, nor in what its $refs reach (Python's backtracking `re` must never run
    a client's regex: hours on a crafted one, holding the interpreter)."""
    stack, visited = [(schema, False)], set()
    while stack:
        node, names = stack.pop()
        if isinstance(node, list):
            stack.extend((v, False) for v in node)
            continue
        if not isinstance(node, dict) or id(node) in visited:
            continue
        visited.add(id(node))
        if names:
            stack.extend((v, False) for v in node.values())
            continue
        if any(k in node for k in _UNDECIDABLE):
            return False
        if isinstance(node.get("$ref"), str):
            stack.append((resolve_ref(root, node["$ref"]), False))
        stack.extend((v, k in NAMED_SUBSCHEMAS) for k, v in node.items() if k not in _NO_SUBSCHEMA)
    return True


def _candidates(s: Any, root: Any, depth: int, visits: list[int]) -> list | None:
    """A list holding every value `s` accepts (and maybe more), or None. Each keyword that bounds the values
    gives such a list; the shortest is taken. `visits`: how many more subschemas may be read (past that, None)."""
    if s is False:
        return []
    visits[0] -= 1
    if not isinstance(s, dict) or depth > 16 or visits[0] < 0:
        return None
    options: list[list | None] = []
    if "const" in s:
        options.append([s["const"]])
    elif isinstance(s.get("enum"), list):
        options.append(list(s["enum"]))
    types = [s["type"]] if isinstance(s.get("type"), str) else s.get("type")
    if isinstance(types, list):
        typed = [_typed(s, t, root, depth, visits) for t in types]
        options.append(None if None in typed else [v for vs in typed for v in vs])
    if isinstance(s.get("$ref"), str):
        options.append(_candidates(resolve_ref(root, s["$ref"]), root, depth + 1, visits))
    for member in s.get("allOf", []) if isinstance(s.get("allOf"), list) else []:
        options.append(_candidates(member, root, depth + 1, visits))
    for key in ("anyOf", "oneOf"):
        if isinstance(s.get(key), list):
            branches = [_candidates(b, root, depth + 1, visits) for b in s[key]]
            options.append(None if None in branches else [v for vs in branches for v in vs])
    known = [o for o in options if o is not None and len(o) <= MAX_CANDIDATES]
    return min(known, key=len) if known else None


def _typed(s: dict, t: Any, root: Any, depth: int, visits: list[int]) -> list | None:
    """Candidates of type `t` from `s`'s own keywords."""
    if t == "null":
        return [None]
    if t == "boolean":
        return [True, False]
    if t == "integer":
        ends = integer_range(s)
        return list(range(ends[0], ends[1] + 1)) if ends is not None and ends[1] - ends[0] < MAX_CANDIDATES else None
    if t == "object":
        props = s.get("properties", {})
        if s.get("additionalProperties") is not False or not isinstance(props, dict):
            return None
        required = s.get("required", [])
        required = set(required) if isinstance(required, list) else set()
        if required - set(props):
            return []
        choices: list[list] = []  # per property: its values, and absence (a marker) where it is optional
        total = 1
        for name, sub in props.items():
            values = _candidates(sub, root, depth + 1, visits)
            if values is None:
                return None
            choices.append([(name, v) for v in values] + ([] if name in required else [None]))
            total *= len(choices[-1])
            if total > MAX_CANDIDATES:
                return None
        return [dict(pair for pair in combo if pair is not None) for combo in itertools.product(*choices)]
    return None


def integer_range(s: dict) -> tuple[int, int] | None:
    """(first, last): the integers between `s`'s own bounds, an exclusive end read as inclusive (so a range that
    holds every integer `s` takes, and maybe its ends); None without a finite bound on each side."""
    low = [x for x in (s.get("minimum"), s.get("exclusiveMinimum")) if _finite_number(x)]
    high = [x for x in (s.get("maximum"), s.get("exclusiveMaximum")) if _finite_number(x)]
    return (math.ceil(max(low)), math.floor(min(high))) if low and high else None


def _finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
