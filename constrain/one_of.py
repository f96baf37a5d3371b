"""`oneOf` whose branches may overlap, enforced while decoding: the backend compiles the branches as an `anyOf`, and a
matcher wrapper refuses every token that would finish the value with other than exactly one branch valid.

llguidance compiles a `oneOf` only when it can prove the branches disjoint, and the exact rewrites
(constrain/rewrite.py) turn one into an `anyOf` only when the other branches' negations are expressible; the rest
used to be refused. Here each such `oneOf` that sits at a place the output's position names exactly (reached from
the root through `properties`, `items`, `additionalProperties` without `patternProperties`, `allOf` and `$ref`
only: never inside an anyOf/oneOf branch, a `not` or an `if`) becomes an `anyOf` for the backend; the wrapper
follows the output (which subschemas apply to each open container, where the governed value began) and, at each
step where an allowed token would finish that value, validates the finished value against each branch (jsonschema,
the client's schema as the root) and clears the token unless exactly one branch holds. Branches with a `pattern`
are validated on the pattern's automaton (constrain/regex_sets.py), never by running the client's regex; branches
with `patternProperties` or a pattern out of the automata's reach are left alone. Formats are checked where
jsonschema's FormatChecker can (date, time, email, ipv4, ipv6, uuid); a format it cannot check (uri, date-time)
counts as holding, which can only refuse more, never accept an invalid value. An output whose value matches
two branches cannot always be steered back: the closing stays refused, so such an output may run to max_tokens
(finish_reason "length"), never end invalid. Never imports HTTP or model code.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import jsonschema
import numpy as np

from constrain.checked import CheckedGrammar, CheckedMatcher, allowed_among, per_vocabulary
from constrain.grammar import Grammar, Matcher
from constrain.regex_sets import Work, pattern_search
from constrain.support import references_followable, resolve_ref, walk
from constrain.vocabulary import Vocabulary

ONE_OF_REFUSAL = "oneOf constraints are not supported"  # llguidance's words for a oneOf it cannot prove disjoint
_WS = frozenset(b" \t\n\r")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPEN, _CLOSE = frozenset(b"[{"), frozenset(b"]}")
_SCALAR_END = frozenset(b" \t\n\r,]}")


@dataclass
class OneOfPlan:
    """`schema`: what the backend compiles (the governed oneOfs as anyOfs); `governed`: id() of each such node
    in `schema` -> the same node in the client's (normalised) schema, whose branches decide."""

    schema: Any
    source: Any
    governed: dict[int, dict]
    pointers: tuple[str, ...]
    searches: dict[str, Callable[[str], bool]] = field(default_factory=dict)  # the branches' patterns, as automata
    _validator: Any = field(default=None, repr=False)

    def exactly_one(self, node: dict, value: Any) -> bool:
        """Exactly one branch of `node` (a oneOf of the client's schema) holds for `value`; False when a branch
        cannot be decided (never weaker than asked). `pattern` is decided on automata (`searches`): jsonschema
        would run the client's regex; formats as jsonschema's FormatChecker can."""
        if self._validator is None:
            from constrain.rewrite import validator_class  # (the draft, with `dependencies` as enforced)

            cls = validator_class(self.source)
            searches = self.searches

            def pattern(validator, regex, instance, schema):
                if validator.is_type(instance, "string") and not searches[regex](instance):
                    yield jsonschema.ValidationError(f"{instance!r} does not match {regex!r}")

            self._validator = jsonschema.validators.extend(cls, {"pattern": pattern})(
                self.source, format_checker=jsonschema.FormatChecker())
        try:
            return sum(self._validator.evolve(schema=b).is_valid(value) for b in node["oneOf"]) == 1
        except Exception:  # noqa: BLE001 - a branch jsonschema cannot decide counts as not holding
            return False

    def applicable(self, node: Any) -> tuple[dict, ...] | None:
        """`node` and the subschemas that apply with it ($ref, allOf): all of them hold for the value. None when
        the value is reached through a choice (anyOf/oneOf branches, patternProperties): not followed."""
        out: list[dict] = []
        stack = [node]
        while stack:
            n = stack.pop()
            if n is True or n == {}:
                continue
            if not isinstance(n, dict):
                return None
            if any(n is o for o in out):
                continue
            out.append(n)
            if isinstance(n.get("$ref"), str):
                stack.append(resolve_ref(self.schema, n["$ref"]))
            if isinstance(n.get("allOf"), list):
                stack.extend(n["allOf"])
        return tuple(out)

    def child(self, parents: tuple[dict, ...] | None, step: str | int) -> tuple[dict, ...] | None:
        """What applies for sure to member `step` of a value `parents` apply to (None: not known exactly). What
        may or may not apply is left out: the branches of an anyOf or oneOf beside, `patternProperties` (and the
        `additionalProperties` beside them), tuple forms of `items`. `_reached` counts a oneOf below those as
        not exactly placed, so no governed value is ever missed."""
        if parents is None:
            return None
        direct: list[Any] = []
        for p in parents:
            if isinstance(step, str):
                props = p.get("properties")
                if isinstance(props, dict) and step in props:
                    direct.append(props[step])
                elif isinstance(p.get("additionalProperties"), dict) and "patternProperties" not in p:
                    direct.append(p["additionalProperties"])
            elif isinstance(p.get("items"), dict) and "prefixItems" not in p:
                direct.append(p["items"])
        out: list[dict] = []
        for d in direct:
            a = self.applicable(d)
            if a is None:
                return None
            out.extend(a)
        return tuple(out)


def plan_one_of(schema: Any) -> OneOfPlan | None:
    """The plan for the oneOfs of `schema` at exactly known places (None: some other oneOf is not, or none is)."""
    if not isinstance(schema, dict) or '"oneOf"' not in json.dumps(schema) or not references_followable(schema):
        return None
    out = copy.deepcopy(schema)
    exact, inexact = _reached(out)
    nodes = {id(n): (ptr[: -len("/oneOf")], n) for ptr, key, n in walk(out) if key == "oneOf"}
    if not exact or inexact:
        return None  # (a oneOf no output position can reach is turned into an anyOf too: it never matters)
    patterns: set[str] = set()
    for _, n in nodes.values():
        found = _patterns(out, n)
        if found is None:
            return None
        patterns |= found
    work = Work()
    searches = {p: pattern_search(p, work) for p in patterns}
    if any(f is None for f in searches.values()):
        return None
    governed: dict[int, dict] = {}
    for ptr, node in nodes.values():
        if "anyOf" in node or not isinstance(node["oneOf"], list):
            return None
        original = resolve_ref(schema, "#" + ptr)
        node["anyOf"] = node.pop("oneOf")
        governed[id(node)] = original
    return OneOfPlan(out, schema, governed, tuple(sorted(p + "/oneOf" for p, _ in nodes.values())), searches)


def _reached(root: dict) -> tuple[set[int], set[int]]:
    """id() of the oneOf nodes reached through exactly known places only, and of those reached otherwise."""
    exact, other = set(), set()
    seen: set[tuple[int, bool]] = set()
    stack: list[tuple[Any, bool]] = [(root, True)]
    while stack:
        n, known = stack.pop()
        if not isinstance(n, dict) or (id(n), known) in seen:
            continue
        seen.add((id(n), known))
        if "oneOf" in n:
            (exact if known else other).add(id(n))
        if isinstance(n.get("$ref"), str):
            stack.append((resolve_ref(root, n["$ref"]), known))
        for key, value in n.items():
            if key == "properties" and isinstance(value, dict):
                stack += [(v, known) for v in value.values()]
            elif key == "additionalProperties" and isinstance(value, dict):
                stack.append((value, known and "patternProperties" not in n))
            elif key == "items" and isinstance(value, dict):
                stack.append((value, known and "prefixItems" not in n))
            elif key == "allOf" and isinstance(value, list):
                stack += [(v, known) for v in value]
            elif key in ("anyOf", "oneOf", "prefixItems") and isinstance(value, list):
                stack += [(v, False) for v in value]
            elif key == "items" and isinstance(value, list):
                stack += [(v, False) for v in value]
            elif key == "dependencies" and isinstance(value, dict):
                stack += [(v, False) for v in value.values() if isinstance(v, dict)]
            elif key in ("patternProperties", "dependentSchemas", "$defs", "definitions") and isinstance(value, dict):
                if key not in ("$defs", "definitions"):  # (definitions count where a $ref reaches them)
                    stack += [(v, False) for v in value.values()]
            elif key in ("not", "if", "then", "else", "contains", "additionalItems", "propertyNames",
                         "unevaluatedItems", "unevaluatedProperties") and isinstance(value, dict):
                stack.append((value, False))
    return exact - other, other


def _patterns(root: dict, node: dict) -> set[str] | None:
    """The `pattern`s the branches of `node` reach (through $refs too); None when they reach a
    `patternProperties` (jsonschema would match its names with the client's regex)."""
    found: set[int] = set()
    patterns: set[str] = set()
    stack = [node]
    while stack:
        top = stack.pop()
        if id(top) in found:
            continue
        found.add(id(top))
        for _, key, n in walk(top):
            if key == "patternProperties" or (key == "pattern" and not isinstance(n[key], str)):
                return None
            if key == "pattern":
                patterns.add(n[key])
            if key == "$ref":
                target = resolve_ref(root, n[key])
                if isinstance(target, dict):
                    stack.append(target)
    return patterns


# ---- following the output -------------------------------------------------------------------------------------

@dataclass
class _Open:
    """An open container: what applies to it exactly (None: not known), and the member being written."""

    is_array: bool
    applies: tuple[dict, ...] | None
    key: str = ""
    index: int = 0


@dataclass
class Pending:
    """The value a governed oneOf holds, being written: where it began in the output and at what depth."""

    node: dict
    start: int
    depth: int


class OneOfTracker:
    """Follows the output's JSON: open containers, the lexical state, and the governed value being written.
    `fork` gives a copy to try a token on: `finished` collects (oneOf node, value text) of the governed values a
    token finishes."""

    def __init__(self, plan: OneOfPlan):
        self.plan = plan
        self.out = bytearray()  # (from `origin` on: a fork holds only the text its pending value needs)
        self.origin = 0
        self.stack: list[_Open] = []
        self.mode = "value"  # value | string | key | scalar | after | member | colon | off
        self.escaped = False
        self.key = bytearray()
        self.pending: list[Pending] = []  # (outermost first: a governed value may hold another)
        self.finished: list[tuple[dict, bytes]] = []

    def fork(self) -> "OneOfTracker":
        f = OneOfTracker.__new__(OneOfTracker)
        f.plan, f.mode, f.escaped, f.key = self.plan, self.mode, self.escaped, bytearray(self.key)
        f.pending = list(self.pending)
        f.origin = self.pending[0].start if self.pending else self.origin + len(self.out)
        f.out = bytearray(self.out[f.origin - self.origin:])
        f.stack = [_Open(o.is_array, o.applies, o.key, o.index) for o in self.stack]
        f.finished = []
        return f

    def feed(self, data: bytes) -> None:
        for c in data:
            if self.mode == "off":
                return
            self.out.append(c)
            self._byte(c)

    def _applies_here(self) -> tuple[dict, ...] | None:
        if not self.stack:
            return self.plan.applicable(self.plan.schema)
        top = self.stack[-1]
        return self.plan.child(top.applies, top.index if top.is_array else top.key)

    def _begin_value(self, c: int) -> None:
        applies = self._applies_here()
        if applies is not None:
            start = self.origin + len(self.out) - 1  # (this byte is the value's first)
            self.pending += [Pending(self.plan.governed[id(a)], start, len(self.stack)) for a in applies
                             if id(a) in self.plan.governed]
        if c in _OPEN:
            self.stack.append(_Open(c == ord("["), applies))
            self.mode = "value" if c == ord("[") else "member"
        elif c == _QUOTE:
            self.mode, self.escaped = "string", False
        else:
            self.mode = "scalar"

    def _end_value(self, end: int) -> None:
        """The value just written ends before output position `end` (relative to `out`)."""
        self.mode = "after"
        while self.pending and self.pending[-1].depth == len(self.stack):
            p = self.pending.pop()
            self.finished.append((p.node, bytes(self.out[p.start - self.origin:end])))

    def _byte(self, c: int) -> None:
        mode = self.mode
        if mode == "scalar":
            if c not in _SCALAR_END:
                return
            self._end_value(len(self.out) - 1)  # (the delimiter is not part of the number or literal)
            mode = "after"
        if mode in ("string", "key"):
            if self.escaped:
                self.escaped = False
            elif c == _BACKSLASH:
                self.escaped = True
            elif c == _QUOTE:
                if mode == "key":
                    self.stack[-1].key = _decode_key(bytes(self.key))
                    self.mode = "colon"
                else:
                    self._end_value(len(self.out))
                return
            if mode == "key":
                self.key.append(c)
        elif c in _WS:
            return
        elif mode == "value":
            if c == ord("]") and self.stack and self.stack[-1].is_array:
                self._close()
            else:
                self._begin_value(c)
        elif mode == "after":
            if not self.stack:
                self.mode = "off"
            elif c == ord(","):
                top = self.stack[-1]
                top.index += 1
                self.mode = "value" if top.is_array else "member"
            elif c in _CLOSE:
                self._close()
            else:
                self.mode = "off"
        elif mode == "member":
            if c == _QUOTE:
                self.mode, self.escaped, self.key = "key", False, bytearray()
            elif c == ord("}"):
                self._close()
            else:
                self.mode = "off"
        elif mode == "colon":
            self.mode = "value" if c == ord(":") else "off"

    def _close(self) -> None:
        self.stack.pop()
        self._end_value(len(self.out))


def _decode_key(raw: bytes) -> str:
    try:
        return json.loads(b'"' + raw + b'"')
    except ValueError:
        return ""


# ---- grammar and matcher ----------------------------------------------------------------------------------------

class _TokenSets:
    """Per vocabulary, the tokens that can finish a value in each lexical state (so a step tries few tokens):
    `quote`: hold a '"'; `close`: hold '}' or ']'; `delimiter`: hold what ends a number or literal;
    `quote_close`: a '"' and after it '}' or ']' (leave a string, then a container); `whole`: may hold a whole
    value ('{...}', '[...]', two quotes, a digit or literal letter before a delimiter)."""

    def __init__(self, vocab: Vocabulary):
        self.token_bytes = vocab.token_bytes
        sets: dict[str, list[int]] = {"quote": [], "close": [], "delimiter": [], "quote_close": [], "whole": []}
        for tid, b in enumerate(vocab.token_bytes):
            if not b:
                continue
            q = b.find(b'"')
            closes = any(c in _CLOSE for c in b)
            if q >= 0:
                sets["quote"].append(tid)
                if any(c in _CLOSE for c in b[q:]):
                    sets["quote_close"].append(tid)
            if closes:
                sets["close"].append(tid)
            if any(c in _SCALAR_END for c in b):
                sets["delimiter"].append(tid)
            if closes or b.count(b'"') >= 2 or _scalar_then_delimiter(b):
                sets["whole"].append(tid)
        for name, ids in sets.items():
            setattr(self, name, np.array(ids, dtype=np.int64))


def _scalar_then_delimiter(b: bytes) -> bool:
    scalar = False
    for c in b:
        if c in b"-0123456789tfnrueals":
            scalar = True
        elif scalar and c in _SCALAR_END:
            return True
        else:
            scalar = False
    return False


class OneOfGrammar(CheckedGrammar):
    """A backend grammar compiled with the governed oneOfs as anyOfs, whose matchers keep exactly one branch."""

    def __init__(self, inner: Grammar, plan: OneOfPlan, vocab: Vocabulary):
        super().__init__(inner)
        self.plan = plan
        self.tokens = per_vocabulary(_TokenSets, vocab)  # (built here, on a compile thread)

    def matcher(self) -> "OneOfMatcher":
        return OneOfMatcher(self.inner.matcher(), OneOfTracker(self.plan), self.tokens)


class OneOfMatcher(CheckedMatcher):
    """Refuses the tokens that would finish a governed value with other than exactly one branch valid."""

    dead_end = "every token the output constraint allows here would finish a value that is valid in none or in " \
               "several of the branches of its oneOf"

    def __init__(self, inner: Matcher, tracker: OneOfTracker, tokens: _TokenSets):
        super().__init__(inner, tokens.token_bytes)
        self.tracker = tracker
        self.tokens = tokens
        self._verdicts: dict[bytes, bool] = {}  # this step's, by the finished value's text

    def _active(self) -> bool:
        return self.tracker.mode != "off"

    def _suspects(self) -> np.ndarray:
        """Tokens that may finish a governed value from here (see `_TokenSets`)."""
        t, sets = self.tracker, self.tokens
        in_string = t.mode in ("string", "key")
        if not t.pending:
            return sets.quote_close if in_string else sets.whole
        if len(t.stack) > t.pending[-1].depth:  # inside the innermost governed container
            return sets.quote_close if in_string else sets.close
        return sets.quote if in_string else sets.delimiter

    def _refused(self, words: np.ndarray) -> np.ndarray:
        self._verdicts = {}
        ids = allowed_among(words, self._suspects()).tolist()
        return np.array([t for t in ids if self._refuses(self.tokens.token_bytes[t])], dtype=np.int64)

    def _refuses(self, data: bytes) -> bool:
        """`data` finishes a governed value that has other than exactly one branch valid."""
        fork = self.tracker.fork()
        fork.feed(data)
        for node, text in fork.finished:
            if text not in self._verdicts:
                try:
                    value = json.loads(text)
                except ValueError:
                    self._verdicts[text] = True  # (not JSON: the backend's grammar refuses it anyway)
                else:
                    self._verdicts[text] = self.tracker.plan.exactly_one(node, value)
            if not self._verdicts[text]:
                return True
        return False

    def _feed(self, data: bytes) -> None:
        self.tracker.feed(data)
        self.tracker.finished.clear()
