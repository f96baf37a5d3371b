"""`uniqueItems` over objects that take finitely many values (at most 64, constrain/finite_values.py), steered
while decoding.

The exact check stays with constrain/late_keywords.py: a finished item equal to an earlier one is refused there.
But that check can only refuse the token that finishes an item, and by then the item may be unable to become
anything else: in `[{"k": "x"}, {"k": "x` (k one of x, y) the string can only close as "x", and the object as
the repeat. Here, inside an item, each token after which the item could no longer become a value the array has
not used yet is refused, judged on the members written so far and the one being written (a string's characters
so far, a number's digits, a literal's letters). Items must be objects of scalars; anything else is left to the
late check. Never imports HTTP or model code.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import numpy as np

from constrain.checked import NO_IDS, CheckedGrammar, CheckedMatcher, allowed_ids
from constrain.finite_values import finite_values
from constrain.grammar import Grammar, Matcher
from constrain.json_follower import Frame, JsonFollower
from constrain.support import references_followable, walk
from constrain.unique_items import OutputTracker, UniquePlan, _Frame, _under_not_or_if, canonical_value, unescape

MAX_VALUES = 64  # (as constrain/rewrite.py bounds such arrays' maxItems)

# A member's value: canonical (as unique_items compares scalars) and the text the grammar writes it as.
Member = tuple[tuple, bytes]


@dataclass(frozen=True)
class ObjectsRule:
    """The values the items of a unique array may take: each an object of scalars, as {key: Member}."""

    objects: tuple[dict[str, Member], ...]

    @property
    def domain(self) -> int:
        return len(self.objects)

    @functools.cached_property
    def identities(self) -> tuple[frozenset, ...]:
        """Each value as the set of its (key, canonical value) pairs, as `ObjectTracker` records finished items."""
        return tuple(frozenset((k, m[0]) for k, m in v.items()) for v in self.objects)


def plan_unique_objects(schema: Any) -> UniquePlan | None:
    """The arrays of `schema` under `uniqueItems: true` whose items are objects of scalars with at most
    MAX_VALUES values (None: none). `schema` is kept as it is: the late check still enforces the keyword."""
    if not isinstance(schema, dict) or '"uniqueItems"' not in json.dumps(schema) \
            or not references_followable(schema):
        return None
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
    negated = _under_not_or_if(schema)
    rules: dict[int, ObjectsRule] = {}
    pointers: list[str] = []
    for ptr, key, node in list(walk(schema)):
        if key != "uniqueItems" or node.get(key) is not True or "prefixItems" in node or id(node) in negated \
                or not isinstance(node.get("items"), dict):
            continue
        values = finite_values(node["items"], schema, MAX_VALUES, validator)
        if not values or not all(isinstance(v, dict) and not any(isinstance(x, (dict, list)) for x in v.values())
                                 for v in values):
            continue
        rules[id(node)] = ObjectsRule(tuple({k: _member(x) for k, x in v.items()} for v in values))
        pointers.append(ptr)
    return UniquePlan(schema, rules, tuple(sorted(pointers))) if rules else None


def _member(value: Any) -> Member:
    canon = canonical_value(value)
    return canon, canon[1] if canon[0] == "s" else json.dumps(value).encode()


@dataclass
class _ItemFrame(_Frame):
    members: dict[str, tuple] = field(default_factory=dict)  # finished members: key -> canonical value
    flat: bool = True  # no member value was a container


class ObjectTracker(OutputTracker):
    """Follows the output with the members of each item of a steered array, and the items it finished."""

    def item(self) -> tuple[_ItemFrame, _Frame] | None:
        """The item being written and its array, when the output stands inside a flat item of a steered array."""
        if len(self.stack) < 2 or not self.in_json or self.mode == "off":
            return None
        top, below = self.stack[-1], self.stack[-2]
        if isinstance(top, _ItemFrame) and top.flat and below.is_array and isinstance(below.rule, ObjectsRule):
            return top, below
        return None

    def _frame(self, is_array: bool) -> _Frame:
        frame = super()._frame(is_array)
        parent = self.stack[-1] if self.stack else None
        if not is_array and parent is not None and parent.is_array and isinstance(parent.rule, ObjectsRule):
            return _ItemFrame(False, candidates=frame.candidates)
        if parent is not None and isinstance(parent, _ItemFrame):
            parent.flat = False
        return frame

    def _value_ends(self, kind: str) -> None:
        top = self.stack[-1] if self.stack else None
        if isinstance(top, _ItemFrame) and kind != "container":
            top.members[top.key] = _scalar(kind, bytes(self.buf))

    def _close(self) -> None:
        closed = self.stack[-1]
        super()._close()
        if isinstance(closed, _ItemFrame) and closed.flat and self.stack:
            item = frozenset(closed.members.items())
            self.repeated |= item in self.stack[-1].seen
            self.stack[-1].seen.add(item)


def _scalar(kind: str, text: bytes) -> tuple | None:
    if kind == "string":
        chars = unescape(text)
        return ("s", chars) if chars is not None else None
    return canonical_value(json.loads(text)) if kind in ("number", "literal") else None


class _ItemFollower(JsonFollower):
    """One item from where the output stands in it, to learn what a token would make of it: the members it
    would finish, whether it would close (`closed`: its members) or open a container."""

    def __init__(self, item: _ItemFrame, mode: str, buf: bytes, escaped: bool):
        super().__init__()
        self.stack = [Frame(False, item.key)]
        self.mode, self.buf, self.escaped = mode, bytearray(buf), escaped
        self.members = dict(item.members)
        self.closed: dict | None = None
        self.nested = False

    def _begin(self, c: int) -> None:
        if c in b"[{":
            self.nested = True
            self.mode = "off"
            return
        super()._begin(c)

    def _value_ends(self, kind: str) -> None:
        if kind == "container":
            self.closed = self.members
            self.mode = "off"  # (what follows the item is not looked at)
        elif self.stack:
            self.members[self.stack[-1].key] = _scalar(kind, bytes(self.buf))


def item_viable(f: _ItemFollower, rule: ObjectsRule, seen: set) -> bool:
    """After the bytes `f` was fed, the item can still become (or, closed, is) a value the array has not used."""
    if f.nested:
        return True
    if f.closed is not None:
        closed = frozenset(f.closed.items())
        return closed in rule.identities and closed not in seen
    unused = [v for v, identity in zip(rule.objects, rule.identities) if identity not in seen
              and all(k in v and v[k][0] == c for k, c in f.members.items())]
    key = f.stack[-1].key if f.stack else ""
    if f.mode == "member":  # (after a comma: a member must follow)
        return any(set(v) - set(f.members) for v in unused)
    if f.mode == "key":
        written = None if f.escaped else unescape(bytes(f.buf))
        return written is None or any(k not in f.members and k.encode("utf-8", "surrogatepass").startswith(written)
                                      for v in unused for k in v)
    if f.mode in ("colon", "value"):
        return any(key in v and key not in f.members for v in unused)
    if f.mode in ("after", "off"):
        return bool(unused)
    if f.mode == "string":
        written = None if f.escaped else unescape(bytes(f.buf))
        return written is None or any(key in v and v[key][0][0] == "s" and v[key][1].startswith(written)
                                      for v in unused)
    if f.mode == "number" and any(c in f.buf for c in b".eE"):
        return True  # (a number written with a fraction or exponent: not followed here)
    kind = "n" if f.mode == "number" else "l"
    return any(key in v and v[key][0][0] == kind and v[key][1].startswith(bytes(f.buf)) for v in unused)


class UniqueObjectsGrammar(CheckedGrammar):
    """A grammar whose matchers steer each item of the planned arrays to a value not used yet."""

    def __init__(self, inner: Grammar, plan: UniquePlan, token_bytes: list[bytes | None]):
        super().__init__(inner)
        self.plan = plan
        self.token_bytes = token_bytes

    def matcher(self, lane: int = 0) -> "UniqueObjectsMatcher":
        return UniqueObjectsMatcher(self.inner.matcher(lane), ObjectTracker(self.plan, self.call_tag), self.token_bytes)


class UniqueObjectsMatcher(CheckedMatcher):
    dead_end = "every token the output constraint allows here would make an item of an array whose schema says " \
               "uniqueItems equal to an earlier one"

    def __init__(self, inner: Matcher, tracker: ObjectTracker, token_bytes: list[bytes | None]):
        super().__init__(inner, token_bytes)
        self.tracker = tracker

    def _active(self) -> bool:
        at = self.tracker.item()
        return at is not None and bool(at[1].seen)

    def _refused(self, words: np.ndarray) -> np.ndarray:
        refused = [tid for tid in allowed_ids(words).tolist()
                   if self.token_bytes[tid] and self._refuses(self.token_bytes[tid])]
        return np.array(refused, dtype=np.int64) if refused else NO_IDS

    def _refuses(self, data: bytes) -> bool:
        item, array = self.tracker.item()
        t = self.tracker
        f = _ItemFollower(item, t.mode, bytes(t.buf), t.escaped)
        f.feed(data)
        return not item_viable(f, array.rule, array.seen)

    def _feed(self, data: bytes) -> None:
        self.tracker.feed(data)

    judges_walks = True

    def _fork(self) -> ObjectTracker:
        return self.tracker.fork()

    def _refused_after(self, fork: ObjectTracker, ends: bool) -> bool:
        return fork.repeated
