"""`uniqueItems`, enforced while decoding, for arrays whose items are scalars (strings, numbers, booleans, null).

No grammar can say "each item differs from the earlier ones", so neither backend enforces the keyword. Here it is
taken out of the schema the backend compiles (`plan_unique_items`), and a matcher wrapper follows the output byte
by byte: it knows which subschemas may apply to the container being written, remembers the finished items of an
array that must be unique, and clears the mask bits of every token that would finish an item equal to an earlier
one (JSON equality: 1 == 1.0, strings compared after unescaping, `"a"` == `"\\u0061"`). When the items can take
finitely many values (an enum, booleans, a small integer range), a separator is refused once every value is used,
so the output never reaches a point where no item may follow.

Which arrays are meant is decided from the schema: every subschema that may apply at a position (each anyOf/oneOf
branch, every patternProperties schema, ...) counts, so an array is held unique when any of them says so: never
weaker than asked, at worst stricter inside an anyOf whose other branch would allow repeats. Items of other kinds
(objects, arrays, strings with a `pattern` or `format`, bounded numbers) keep the keyword, and so does an array a
`not` or an `if` reaches: it stays unenforced (named, or refused when strict). Never imports HTTP or model code.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import numpy as np

from constrain.checked import CheckedGrammar, CheckedMatcher, allowed_among, allowed_ids, per_vocabulary
from constrain.grammar import Grammar, Matcher
from constrain.json_follower import BACKSLASH, COMMA_BYTE, NUMBER_CHARS, NUMBER_START, QUOTE, WS, Frame, JsonFollower
from constrain.support import ANNOTATIONS, references_followable, resolve_ref, walk
from constrain.vocabulary import Vocabulary

_SCALAR_TYPES = frozenset({"string", "number", "integer", "boolean", "null"})
# Keywords an items schema may hold for its values to be counted here (anything else: the keyword is left alone).
_SCALAR_KEYWORDS = frozenset({"type", "enum", "const", "minLength", "maxLength", "minimum", "maximum",
                              "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "format"}) | ANNOTATIONS
_MAX_ENUMERATED_INTEGERS = 1000  # a bounded integer range up to this size is counted value by value


@dataclass(frozen=True)
class UniqueRule:
    """An array whose items must differ. Its items take the finitely many `values` (canonical, with the text
    each is written as) and, when `free` names types, unboundedly many values of those types ("string": any
    string of at most `max_length` characters; "number", "integer": unbounded above)."""

    values: tuple[tuple[tuple, bytes], ...] = ()
    free: frozenset[str] = frozenset()
    max_length: int | None = None

    @property
    def domain(self) -> int | None:
        """How many distinct items exist (None: unboundedly many)."""
        return None if self.free else len(self.values)

    def viable(self, state: "ItemState", seen: set) -> bool:
        """An item written up to `state` can still finish as a value not in `seen`. (The grammar keeps it a
        prefix of some value the items schema accepts; this says whether an unused one is among them.)"""
        if state.mode == "string":
            written = None if state.escaped else unescape(state.buf)
            if written is None:
                return True  # (inside an escape: decided once it is written)
            if "string" in self.free:  # another character can follow, unless the string is at its longest
                return (self.max_length is None or _characters(written) < self.max_length
                        or ("s", written) not in seen)
            return any(v[0] == "s" and v not in seen and text.startswith(written) for v, text in self.values)
        if state.mode == "number":
            if _zero_whatever_follows(state.buf):
                return ("n", 0.0) not in seen
            if "number" in self.free or ("integer" in self.free and state.buf not in (b"0", b"-0")):
                return True
            if "integer" in self.free and ("n", 0.0) not in seen:
                return True
            if any(c in state.buf for c in b".eE"):
                return True  # (a finite number written with a fraction or exponent: not followed here)
            return any(v[0] == "n" and v not in seen and text.startswith(state.buf) for v, text in self.values)
        if state.mode == "literal":
            return any(v[0] == "l" and v not in seen and text.startswith(state.buf) for v, text in self.values)
        return True


_EXPONENT_AHEAD = re.compile(rb"[0-9.+-]*[eE]")


def _zero_whatever_follows(number: bytes) -> bool:
    """A number written up to here is 0 whatever follows: its exponent is begun after a mantissa of zeros (`0e`,
    `-0.00E+1`). Its exponent's digits are bounded (json_follower.MAX_EXPONENT_DIGITS), so such an item where a 0
    is used could only end as a repeat."""
    at = max(number.find(b"e"), number.find(b"E"))
    return at >= 0 and not any(c in b"123456789" for c in number[:at])


@dataclass
class UniquePlan:
    """`schema` (what the backend compiles: the enforced `uniqueItems` removed) and the arrays held unique."""

    schema: Any
    rules: dict[int, UniqueRule]  # id() of an array's schema object inside `schema` -> its rule
    pointers: tuple[str, ...]  # where those `uniqueItems` were, for messages and tests
    _expanded: dict[int, tuple[dict, ...]] = field(default_factory=dict, repr=False)
    _children: dict[tuple, tuple[dict, ...]] = field(default_factory=dict, repr=False)

    def expand(self, node: Any) -> tuple[dict, ...]:
        """`node` and every subschema that applies to the same value ($ref, allOf, anyOf/oneOf branches,
        then/else, dependent schemas)."""
        if not isinstance(node, dict):
            return ()
        hit = self._expanded.get(id(node))
        if hit is not None:
            return hit
        out: list[dict] = []
        seen: set[int] = set()
        stack = [node]
        while stack:
            n = stack.pop()
            if not isinstance(n, dict) or id(n) in seen:
                continue
            seen.add(id(n))
            out.append(n)
            if isinstance(n.get("$ref"), str):
                stack.append(resolve_ref(self.schema, n["$ref"]))
            for key in ("allOf", "anyOf", "oneOf"):
                if isinstance(n.get(key), list):
                    stack.extend(n[key])
            stack.extend(n.get(key) for key in ("then", "else"))
            for key in ("dependentSchemas", "dependencies"):
                if isinstance(n.get(key), dict):
                    stack.extend(n[key].values())
        result = self._expanded[id(node)] = tuple(out)
        return result

    def children(self, parents: tuple[dict, ...], step: str | int) -> tuple[dict, ...]:
        """The subschemas that may apply to the member `step` (an object key or an array index) of a value that
        `parents` apply to. Patterns are not run: every patternProperties schema counts (stricter, never weaker)."""
        key = (tuple(id(p) for p in parents), step)
        hit = self._children.get(key)
        if hit is not None:
            return hit
        direct: list[Any] = []
        for p in parents:
            if isinstance(step, str):
                props = p.get("properties")
                if isinstance(props, dict) and step in props:
                    direct.append(props[step])
                if isinstance(p.get("patternProperties"), dict):
                    direct.extend(p["patternProperties"].values())
                direct.extend(p.get(k) for k in ("additionalProperties", "unevaluatedProperties"))
            else:
                for k in ("prefixItems", "items"):
                    if isinstance(p.get(k), list) and step < len(p[k]):
                        direct.append(p[k][step])
                direct.extend(p.get(k) for k in ("items", "additionalItems", "unevaluatedItems", "contains"))
        out: dict[int, dict] = {}
        for d in direct:
            for n in self.expand(d):
                out.setdefault(id(n), n)
        result = tuple(out.values())
        if len(self._children) < 4096:
            self._children[key] = result
        return result

    def rule(self, candidates: tuple[dict, ...]) -> UniqueRule | None:
        """The rule of an array these subschemas apply to (when several do: the one with the fewest values)."""
        rules = [self.rules[id(c)] for c in candidates if id(c) in self.rules]
        return min(rules, key=lambda r: (r.domain is None, r.domain or 0)) if rules else None


def plan_unique_items(schema: Any) -> UniquePlan | None:
    """The plan for a schema holding `uniqueItems: true` on arrays of scalar items (None: nothing to enforce here).
    A finite domain smaller than `minItems` is left to the backend (no output could finish)."""
    if not isinstance(schema, dict) or '"uniqueItems"' not in json.dumps(schema):
        return None
    if not references_followable(schema):
        return None
    out = copy.deepcopy(schema)
    rules: dict[int, UniqueRule] = {}
    pointers: list[str] = []
    negated = _under_not_or_if(out)
    for ptr, key, node in list(walk(out)):
        if key != "uniqueItems" or node.get("uniqueItems") is not True or "prefixItems" in node \
                or id(node) in negated:
            continue
        items = node.get("items")
        for _ in range(32):  # (a chain of $refs; a cycle of them accepts nothing we count)
            if not (isinstance(items, dict) and isinstance(items.get("$ref"), str)
                    and set(items) - ANNOTATIONS == {"$ref"}):
                break
            items = resolve_ref(out, items["$ref"])
        rule = _items_rule(items)
        min_items = node.get("minItems", 0)
        if rule is None or (rule.domain is not None and isinstance(min_items, (int, float))
                            and min_items > rule.domain):
            continue
        del node["uniqueItems"]
        rules[id(node)] = rule
        pointers.append(ptr)
    if not rules:
        return None
    return UniquePlan(out, rules, tuple(sorted(pointers)))


def _under_not_or_if(root: dict) -> set[int]:
    """id() of every schema object a `not` or an `if` reaches (through $refs too): there the keyword only decides
    what is refused or which branch applies, so taking it out would change the meaning."""
    found: set[int] = set()
    stack = [node[key] for _, key, node in walk(root) if key in ("not", "if") and isinstance(node[key], dict)]
    while stack:
        top = stack.pop()
        if id(top) in found:
            continue
        for _, key, node in walk(top):
            found.add(id(node))
            if key == "$ref":
                target = resolve_ref(root, node["$ref"])
                if isinstance(target, dict) and id(target) not in found:
                    stack.append(target)
    return found


def _items_rule(items: Any) -> UniqueRule | None:
    """The rule for items of this schema, when every value it accepts is a scalar and the grammar cannot force an
    item written so far into a repeat (None: left to the backend). Strings with a `format` or `pattern` and
    bounded numbers are left alone: their grammar can force the last characters."""
    if not isinstance(items, dict) or set(items) - _SCALAR_KEYWORDS:
        return None
    validator = jsonschema.validators.validator_for(items, default=jsonschema.Draft202012Validator)(items)
    if "const" in items or "enum" in items:
        values = [items["const"]] if "const" in items else items["enum"]
        if not isinstance(values, list) or any(isinstance(v, (dict, list)) for v in values):
            return None
        return UniqueRule(values=_values([v for v in values if validator.is_valid(v)]))
    types = items.get("type")
    types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else None
    if not types or not types <= _SCALAR_TYPES:
        return None
    values: list = [v for t, vs in (("boolean", [True, False]), ("null", [None])) if t in types for v in vs]
    free: set[str] = set()
    max_length = items.get("maxLength")
    if "string" in types:
        if "format" in items or (max_length is not None and not _is_number(max_length)):
            return None
        if max_length == 0:
            values += [""] if validator.is_valid("") else []
        else:
            free.add("string")
    if "number" in types:
        if any(k in items for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
            return None
        free.add("number")
    elif "integer" in types:
        integers = _integers(items, validator)
        if integers is not None:
            values += integers
        elif any(k in items for k in ("maximum", "exclusiveMaximum", "multipleOf")):
            return None
        else:
            free.add("integer")
    return UniqueRule(values=_values(values), free=frozenset(free),
                      max_length=int(max_length) if "string" in free and max_length is not None else None)


def _values(values: list) -> tuple[tuple[tuple, bytes], ...]:
    """Distinct canonical values, each with the text the grammar writes it as (strings: their characters)."""
    out: dict[tuple, bytes] = {}
    for v in values:
        c = canonical_value(v)
        out.setdefault(c, c[1] if c[0] == "s" else json.dumps(v).encode())
    return tuple(out.items())


def _integers(items: dict, validator) -> list[int] | None:
    """The integers `items` accepts, when its bounds leave at most _MAX_ENUMERATED_INTEGERS candidates."""
    lo = [items[k] for k in ("minimum", "exclusiveMinimum") if _is_number(items.get(k))]
    hi = [items[k] for k in ("maximum", "exclusiveMaximum") if _is_number(items.get(k))]
    if not lo or not hi:
        return None
    first, last = math.ceil(max(lo)), math.floor(min(hi))
    if last - first + 1 > _MAX_ENUMERATED_INTEGERS:
        return None
    return [v for v in range(first, last + 1) if validator.is_valid(v)]


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# ---- values and the item scanner --------------------------------------------------------------------------------

_LITERALS = {b"true": ("l", True), b"false": ("l", False), b"null": ("l", None)}  # (canonical values)
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = {ord('"'): b'"', ord("\\"): b"\\", ord("/"): b"/", ord("b"): b"\b", ord("f"): b"\f", ord("n"): b"\n",
            ord("r"): b"\r", ord("t"): b"\t"}
COMMA, CLOSE = "comma", "close"


def canonical_value(value: Any) -> tuple:
    """A scalar as JSON Schema compares it: numbers by value (1 == 1.0), true != 1, strings by their characters.
    Numbers are compared as the doubles most clients read them as: two numbers equal as doubles (1e400 and 2e400
    are both infinite) count as equal too, which is stricter than JSON Schema's mathematical equality, never
    weaker."""
    if isinstance(value, bool) or value is None:
        return ("l", value)
    if isinstance(value, (int, float)):
        return ("n", float(str(value)))  # (str: an integer past the double range is infinite, not an error)
    return ("s", str(value).encode("utf-8", "surrogatepass"))


def unescape(raw: bytes) -> bytes | None:
    """The characters (UTF-8) a JSON string's raw inside stands for; None when it ends inside an escape (or
    between the two halves of a surrogate pair), or holds one JSON does not have (free text, not JSON)."""
    if b"\\" not in raw:
        return bytes(raw)
    out = bytearray()
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c != BACKSLASH:
            out.append(c)
            i += 1
            continue
        if i + 1 >= n:
            return None
        e = raw[i + 1]
        if e != ord("u"):
            out += _ESCAPES.get(e, bytes([e]))
            i += 2
            continue
        cp = _hex4(raw[i + 2:i + 6])
        if cp is None:
            return None
        i += 6
        if 0xD800 <= cp < 0xDC00:
            low = _hex4(raw[i + 2:i + 6]) if raw[i:i + 2] == b"\\u" else None
            if low is None:
                return None
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
            i += 6
        out += chr(cp).encode("utf-8", "surrogatepass")
    return bytes(out)


def _characters(text: bytes) -> int:
    """Characters in UTF-8 `text` (a character still being written is not counted)."""
    return len(text.decode("utf-8", "ignore"))


def _hex4(digits: bytes) -> int | None:
    if len(digits) != 4 or any(d not in _HEX for d in digits):
        return None
    return int(digits, 16)


def _number(text: bytes) -> tuple | None:
    try:
        return ("n", float(text.decode("ascii")))  # (any exponent: past the double range it is 0 or infinite)
    except (ValueError, UnicodeDecodeError):
        return None


@dataclass
class ItemState:
    """Where the output stands inside an array of scalars: before an item ("value"), inside one ("string",
    "number", "literal": `buf` holds what is written of it), or after one ("after")."""

    mode: str = "value"
    buf: bytes = b""
    escaped: bool = False


def item_events(state: ItemState, data: bytes) -> tuple[list, ItemState]:
    """What `data` does from `state`: in order, finished items (canonical values; None for one that cannot be
    read), COMMA and CLOSE (the array ends; nothing after it is looked at); and the state it ends in. Pure."""
    mode, buf, escaped = state.mode, bytearray(state.buf), state.escaped
    events: list = []
    for c in data:
        if mode == "number":
            if c in NUMBER_CHARS:
                buf.append(c)
                continue
            events.append(_number(bytes(buf)))
            mode = "after"
        if mode == "value":
            if c in WS:
                continue
            if c == QUOTE:
                mode, buf, escaped = "string", bytearray(), False
            elif c in NUMBER_START:
                mode, buf = "number", bytearray([c])
            elif c in b"tfn":
                mode, buf = "literal", bytearray([c])
            else:  # "]" right after "[" (or anything an array of scalars cannot hold)
                events.append(CLOSE)
                break
        elif mode == "string":
            if escaped:
                escaped = False
            elif c == BACKSLASH:
                escaped = True
            elif c == QUOTE:
                value = unescape(bytes(buf))
                events.append(("s", value) if value is not None else None)
                mode = "after"
                continue
            buf.append(c)
        elif mode == "literal":
            buf.append(c)
            if bytes(buf) in _LITERALS:
                events.append(_LITERALS[bytes(buf)])
                mode = "after"
        elif mode == "after":
            if c in WS:
                continue
            if c == COMMA_BYTE:
                events.append(COMMA)
                mode = "value"
            else:
                events.append(CLOSE)
                break
    return events, ItemState(mode, bytes(buf), escaped)


def repeats(state: ItemState, data: bytes, seen: set, rule: UniqueRule) -> bool:
    """Writing `data` from `state` finishes an item equal to an earlier one, adds a separator when every value
    is used, or leaves an unfinished item that can only finish as a repeat."""
    events, end = item_events(state, data)
    count, local = len(seen), seen
    for ev in events:
        if ev is CLOSE:
            return False
        if ev is COMMA:
            if rule.domain is not None and count >= rule.domain:
                return True
        elif ev is not None:
            if ev in local:
                return True
            local = local | {ev}
            count += 1
    return not rule.viable(end, local)


# ---- per-vocabulary token index ---------------------------------------------------------------------------------

class TokenIndex:
    """Tokens grouped for the common cases, so a step checks a few dictionary entries instead of the vocabulary:
    - `quote_pre`: tokens holding a '"' with no backslash before it, by the bytes before it (inside a string
      item they finish it with exactly those bytes);
    - `quote_other`: tokens holding a '"' after a backslash (checked one by one);
    - `start`: tokens that, from before an item, finish one, by its value;
    - `number_tails`: tokens that end a number (number characters, then a delimiter), by those characters;
    - `multi`: tokens that may finish or begin a second item after a comma (checked one by one: `","+` after
      `"4` leaves a string at its maxLength that may repeat an earlier one);
    - `partial`: tokens that leave an item unfinished where few values can follow (a literal begun, an integer
      at "0", which cannot grow, a number that is 0 whatever follows: checked one by one); `exponents`: tokens
      that may begin a number's exponent (number characters holding an `e`: after a mantissa of zeros the item
      is then 0 whatever follows);
    - `spelled`: tokens by their bytes (one that writes the rest of an earlier string at its maximum length
      leaves a string that can only finish as a repeat); `escaped_content`: those holding whole escapes and no
      quote (`\\\\`, `\\/`), by the characters they write inside a string; `after_backslash`: tokens by the
      characters they write inside a string after a backslash (they finish its escape); `opens`: tokens that, from
      before an item, open a string and write whole characters, by those characters."""

    def __init__(self, vocab: Vocabulary):
        self.token_bytes = vocab.token_bytes
        quote_pre: dict[bytes, list[int]] = {}
        quote_other: list[int] = []
        start: dict[tuple, list[int]] = {}
        number_tails: dict[bytes, list[int]] = {}
        multi: list[int] = []
        partial: list[int] = []
        exponents: list[int] = []
        escaped_content: dict[bytes, list[int]] = {}
        after_backslash: dict[bytes, list[int]] = {}
        opens: dict[bytes, list[int]] = {}
        in_string, after_escape = ItemState("string"), ItemState("string", b"\\", escaped=True)
        exact = vocab.ids_by_bytes()
        exact_more: dict[bytes, list[int]] = {}  # (the few tokens spelled like an earlier one)
        before_item = ItemState()
        for tid, data in enumerate(vocab.token_bytes):
            if not data:
                continue
            if exact[data] != tid:
                exact_more.setdefault(data, []).append(tid)
            q = data.find(b'"')
            if q >= 0:
                (quote_other.append(tid) if b"\\" in data[:q] else quote_pre.setdefault(data[:q], []).append(tid))
            k = 0
            while k < len(data) and data[k] in NUMBER_CHARS:
                k += 1
            if k < len(data) and (data[k] in WS or data[k] in b",]"):
                number_tails.setdefault(data[:k], []).append(tid)
            if b"\\" in data:
                _index_content(escaped_content, tid, *item_events(in_string, data))
            if data[0] in _ESCAPES or data[0] == ord("u"):
                _index_content(after_backslash, tid, *item_events(after_escape, data))
            first = data.lstrip(b" \t\n\r")[:1]
            if first and (first[0] == QUOTE or first[0] in NUMBER_START or first in (b"t", b"f", b"n")):
                events, end = item_events(before_item, data)
                if events and isinstance(events[0], tuple):
                    start.setdefault(events[0], []).append(tid)
                elif not events and (end.mode == "literal" or end.buf in (b"0", b"-0")
                                     or (end.mode == "number" and _zero_whatever_follows(bytes(end.buf)))):
                    partial.append(tid)
                elif first[0] == QUOTE:
                    _index_content(opens, tid, events, end)
            c = data.find(b",")
            if c >= 0:
                events, end = item_events(before_item, data[c + 1:])
                if any(isinstance(e, tuple) for e in events) or end.mode in ("string", "number", "literal"):
                    multi.append(tid)
            if data == b"0":
                partial.append(tid)
            if _EXPONENT_AHEAD.match(data):
                exponents.append(tid)
        self.quote_pre = {k: np.array(v, dtype=np.int64) for k, v in quote_pre.items()}
        self.quote_all = np.array(sorted(quote_other + [t for v in quote_pre.values() for t in v]), dtype=np.int64)
        self.quote_other = np.array(quote_other, dtype=np.int64)
        self.start = {k: np.array(v, dtype=np.int64) for k, v in start.items()}
        self.number_tails = {k: np.array(v, dtype=np.int64) for k, v in number_tails.items()}
        self.multi = np.array(multi, dtype=np.int64)
        self.partial = np.array(partial, dtype=np.int64)
        self.exponents = np.array(exponents, dtype=np.int64)
        self.escaped_content = {k: np.array(v, dtype=np.int64) for k, v in escaped_content.items()}
        self.after_backslash = {k: np.array(v, dtype=np.int64) for k, v in after_backslash.items()}
        self.opens = {k: np.array(v, dtype=np.int64) for k, v in opens.items()}
        self._exact, self._exact_more = exact, exact_more


    def spelled(self, data: bytes) -> np.ndarray:
        """The tokens whose bytes are exactly `data`."""
        first = self._exact.get(data)
        if first is None:
            return np.zeros(0, dtype=np.int64)
        return np.array([first, *self._exact_more.get(data, ())], dtype=np.int64)


def _index_content(index: dict[bytes, list[int]], tid: int, events: list, end: ItemState) -> None:
    """Index token `tid` by the characters it leaves written in a string (`end`, from `item_events`), where it
    leaves one open, its escapes finished."""
    text = unescape(end.buf) if not events and end.mode == "string" and not end.escaped else None
    if text is not None:
        index.setdefault(text, []).append(tid)


def token_index(vocab: Vocabulary) -> TokenIndex:
    """Built once per vocabulary (~0.3 s for 152k tokens)."""
    return per_vocabulary(TokenIndex, vocab)


# ---- following the output -----------------------------------------------------------------------------------------

@dataclass
class _Frame(Frame):
    candidates: tuple[dict, ...] = ()  # the subschemas that may apply to the container
    rule: UniqueRule | None = None  # arrays whose items must be unique
    seen: set = field(default_factory=set)  # their finished items (canonical values)


class OutputTracker(JsonFollower):
    """Follows the JSON output (constrain/json_follower.py) with the subschemas that may apply to each open
    container, and the finished items of every array that must be unique."""

    def __init__(self, plan: UniquePlan, call_tag: bytes | None = None):
        super().__init__(call_tag)
        self.plan = plan
        self.repeated = False  # an item was finished equal to an earlier one (a fork's text ahead, see `fork`)

    def fork(self) -> "OutputTracker":
        """A copy to feed text ahead on (`repeated` says whether it repeats an item); the plan and rules shared."""
        f = copy.copy(self)
        f.buf, f.repeated = bytearray(self.buf), False
        f.calls = self.calls.copy() if self.calls is not None else None
        f.stack = [copy.copy(frame) for frame in self.stack]
        for frame in f.stack:  # (what a frame gathers: its items, an item's members)
            for name, value in vars(frame).items():
                if isinstance(value, (set, dict, list)):
                    setattr(frame, name, copy.copy(value))
        return f

    def unique_frame(self) -> _Frame | None:
        """The array being written, when its items must be unique and the output stands at one of them."""
        if self.mode in ("off", "key", "member", "colon") or not self.stack or not self.in_json:
            return None
        top = self.stack[-1]
        return top if top.is_array and top.rule is not None else None

    def item_state(self) -> ItemState:
        return ItemState(self.mode, bytes(self.buf), self.escaped)

    def _frame(self, is_array: bool) -> _Frame:
        if not self.stack:
            candidates = self.plan.expand(self.plan.schema)
        else:
            top = self.stack[-1]
            candidates = self.plan.children(top.candidates, top.index if top.is_array else top.key)
        return _Frame(is_array, candidates=candidates, rule=self.plan.rule(candidates) if is_array else None)

    def _value_ends(self, kind: str) -> None:
        top = self.stack[-1] if self.stack else None
        if kind == "container" or top is None or not top.is_array or top.rule is None:
            return
        if kind == "number":
            value = _number(bytes(self.buf))
        elif kind == "literal":
            value = _LITERALS[bytes(self.buf)]
        else:
            text = unescape(bytes(self.buf))
            value = ("s", text) if text is not None else None
        if value is not None:
            self.repeated |= value in top.seen
            top.seen.add(value)


# ---- grammar and matcher ----------------------------------------------------------------------------------------

class UniqueItemsGrammar(CheckedGrammar):
    """A backend grammar (compiled without the enforced `uniqueItems`) whose matchers also keep items unique."""

    def __init__(self, inner: Grammar, plan: UniquePlan, vocab: Vocabulary):
        super().__init__(inner)
        self.plan = plan
        self.index = token_index(vocab)  # (built here, on a compile thread, not by the engine's first step)

    def matcher(self, lane: int = 0) -> "UniqueItemsMatcher":
        return UniqueItemsMatcher(self.inner.matcher(lane), OutputTracker(self.plan, self.call_tag), self.index)


class UniqueItemsMatcher(CheckedMatcher):
    """Refuses the tokens that would repeat an item (a budget completion can: an empty string, a 0)."""

    dead_end = "every token the output constraint allows here would repeat an item of an array whose schema says " \
               "uniqueItems"  # (kept out by construction: see _items_rule)

    def __init__(self, inner: Matcher, tracker: OutputTracker, index: TokenIndex):
        super().__init__(inner, index.token_bytes)
        self.tracker = tracker
        self.index = index

    def _active(self) -> bool:
        """In an array whose items must be unique: from its first item on, as one token may finish an item and
        begin its repeat (`","+` after `["+`, with maxLength 1)."""
        return self.tracker.unique_frame() is not None

    def _refused(self, words: np.ndarray) -> np.ndarray:
        """Allowed tokens after which the array would hold two equal items, a separator past its values, or an
        item that can only finish as a repeat. Tokens are looked up by what they finish with (`TokenIndex`) and
        only the rest are run through `repeats`."""
        t, ix = self.tracker, self.index
        frame = t.unique_frame()
        rule = frame.rule
        fast: list[np.ndarray] = []
        if rule.domain is not None or t.mode in ("literal", "after"):
            suspects = allowed_ids(words)  # (few: an enum's or a literal's continuations, separators)
        elif t.mode == "value":
            fast = [ix.start[v] for v in frame.seen if v in ix.start]
            fast += [ix.opens[v[1]] for v in frame.seen
                     if v[0] == "s" and self._longest(rule, v[1]) and v[1] in ix.opens]
            suspects = np.concatenate([ix.multi, ix.partial])
        elif t.mode == "string":
            buf = bytes(t.buf)
            written = None if t.escaped else unescape(buf)
            if written is None:  # inside an escape: tokens that finish it may also leave the string at its longest
                begun = buf.rfind(b"\\")
                while begun > 0 and unescape(buf[:begun]) is None:  # (the low half of a pair: from the high half)
                    begun = buf.rfind(b"\\", 0, begun)
                longest = self._longest_rests(frame, unescape(buf[:begun]))
                suspects = ix.quote_all
                if t.escaped and begun == len(buf) - 1:
                    fast = [ix.after_backslash[r] for r in longest if r in ix.after_backslash]
                elif longest:  # (a \u escape begun, or a pair's second half: the few tokens allowed, one by one)
                    suspects = allowed_ids(words)
            else:
                rests = [v[1][len(written):] for v in frame.seen if v[0] == "s" and v[1].startswith(written)]
                fast = [ix.quote_pre[r] for r in rests if r in ix.quote_pre]
                for r in self._longest_rests(frame, written):
                    fast += [ix.spelled(r)] + ([ix.escaped_content[r]] if r in ix.escaped_content else [])
                suspects = np.concatenate([ix.quote_other, ix.multi])
        else:  # number
            written = bytes(t.buf)
            fast = [ids for tail, ids in ix.number_tails.items() if _number(written + tail) in frame.seen]
            suspects = np.concatenate([ix.multi, ix.partial])
            if not any(c in b"123456789eE" for c in written):  # (an exponent now would leave it 0 for good)
                suspects = np.concatenate([suspects, ix.exponents])
        slow = [tid for tid in allowed_among(words, suspects).tolist() if self._refuses(ix.token_bytes[tid])]
        fast = [allowed_among(words, ids) for ids in fast]  # (a lookup can name many tokens, few allowed)
        return np.concatenate([*fast, np.array(slow, dtype=np.int64)])

    def _refuses(self, data: bytes) -> bool:
        frame = self.tracker.unique_frame()
        return repeats(self.tracker.item_state(), data, frame.seen, frame.rule)

    def _feed(self, data: bytes) -> None:
        self.tracker.feed(data)

    judges_walks = True

    def _fork(self) -> OutputTracker:
        return self.tracker.fork()

    def _refused_after(self, fork: OutputTracker, ends: bool) -> bool:
        return fork.repeated

    def _longest_rests(self, frame: _Frame, written: bytes | None) -> list[bytes]:
        """What would finish, after `written`, an earlier string item of the array's longest length: a string left
        holding `written` plus one of these can only finish as a repeat."""
        if written is None:
            return []
        return [v[1][len(written):] for v in frame.seen
                if v[0] == "s" and v[1].startswith(written) and self._longest(frame.rule, v[1])]

    @staticmethod
    def _longest(rule: UniqueRule, text: bytes) -> bool:
        """A string item holding `text` can take no more characters."""
        return rule.max_length is not None and _characters(text) >= rule.max_length
