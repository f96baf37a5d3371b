"""Keywords the backend cannot compile, checked on each finished value that holds them: `not`, `if`/`then`/
`else`, `contains`, `propertyNames`, `dependentSchemas`/`dependentRequired`/`dependencies`, `unevaluated*`, the
`uniqueItems` constrain/unique_items.py leaves, `idn-email`/`idn-hostname` formats, min/maxProperties beside
optional properties, minProperties where keys may repeat, and `oneOf` whose branches the backend cannot prove
disjoint.

The exact rewrites (constrain/rewrite.py) turn most of these into keywords a grammar expresses; what is left used to
be refused. Here the backend compiles a weaker schema (the keywords dropped, `oneOf` as `anyOf`), and a matcher
wrapper refuses every token that would finish a *governed* value that is invalid against the client's subschema
there (jsonschema, the client's schema as the root, numbers as the decimals they spell). A governed value sits at a
place the output's position names exactly: reached from the root through `properties`, `items`,
`additionalProperties` without `patternProperties`, `allOf` and `$ref` only. A late keyword at such a place governs
its own value; one below a choice (an anyOf or oneOf branch, `patternProperties`, a tuple item) makes the nearest
exactly placed value around it governed, so the check comes later but is just as exact. The root is always exactly
placed, so every such schema is covered. What no continuation repairs (`uniqueItems`, `propertyNames`) is also
checked on a checked container so far as each member is finished, and a name as its closing quote is written;
property counts at each key and comma (`maxProperties`, and `minProperties` where the keys come in the declared
order: a key too late to reach it).

`pattern` and `patternProperties` are decided on the patterns' automata (constrain/regex_sets.py), never by
running the client's regex. Formats are checked where the draft's FormatChecker can (email, ipv4, ipv6, uuid;
date, time and date-time are patterns by then, constrain/formats.py); a format it cannot check (uri) counts as
holding, which can only refuse more, never accept an invalid value. A value already invalid in a way no
continuation repairs (a `not` pattern matched, a repeated item) cannot be steered back: its end stays refused,
so such an output may run to max_tokens (finish_reason "length") or end with a constraint_too_complex error, never
end invalid. Never imports HTTP or model code.
"""

from __future__ import annotations

import copy
import decimal
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import jsonschema
import numpy as np
import torch

from constrain.checked import (CheckedGrammar, CheckedMatcher, allowed_among, allowed_ids, backend_matcher,
                               clear_ids, per_vocabulary)
from constrain.formats import DURATION, HOSTNAME
from constrain.grammar import ConstraintError, Grammar, Matcher
from constrain.json_follower import WS, Frame, JsonFollower, exponent_digits
from constrain.llg_backend import (CONTAINER_VALUES, LlgMatcher, end_as_inclusive, inward_end,
                                   keywords_ignored_in_draft, moved_end)
from constrain.regex_sets import Work, pattern_examples, pattern_search
from constrain.support import (ANNOTATIONS, node_dialects, references_followable, resolve_ref, schema_objects, walk,
                               walk_with_refs)
from constrain.vocabulary import Vocabulary

ONE_OF_REFUSAL = "oneOf constraints are not supported"  # llguidance's words for a oneOf it cannot prove disjoint
# llguidance's refusals that a plan may answer (besides a strict refusal of a keyword, code unsupported_schema).
COUNT_REFUSAL = "min/maxProperties only supported"  # (when all keys listed in "properties" are required)
REFUSALS = (ONE_OF_REFUSAL, COUNT_REFUSAL)
# Dropped for the backend, checked on finished values (dropping an assertion only ever accepts more).
DROPPED = frozenset({"not", "if", "then", "else", "contains", "minContains", "maxContains", "propertyNames",
                     "dependentSchemas", "dependentRequired", "dependencies", "unevaluatedProperties",
                     "unevaluatedItems", "uniqueItems"})
# Formats llguidance does not enforce and jsonschema's FormatChecker checks here (`idn-hostname` needs the idna
# package), where the rewrite left them (it writes them as patterns, constrain/formats.py, unless it cannot read the
# schema at all). Not `regex`: FormatChecker compiles it as a Python regex, whose dialect is not ECMA-262's.
LATE_FORMATS = frozenset({"idn-email", "idn-hostname"}) & set(jsonschema.FormatChecker.checkers)
_MAX_VISITS = 200_000  # (node, context) pairs the placement walk may visit before it gives up
_LOOKAHEAD_TRIES = 32  # tokens `LateMatcher.vet` tries in place of one that leads to a dead end
_LOOKAHEAD_BLANKS = 2  # whitespace tokens the lookahead looks past (a schema's whitespace is bounded)
_CLOSE = frozenset(b"]}")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_NUMBER_END = frozenset(b" \t\n\r,]}")


@dataclass
class LatePlan:
    """`schema`: what the backend compiles (the late keywords dropped, oneOfs as anyOfs when `one_of`);
    `governed`: id() of each governed node in `schema` -> the same node in the client's (normalised) schema,
    which decides; `pointers`: where the governed values are; `members`: by id() of such a client's node, what
    is checked as each member of its value is finished."""

    schema: Any
    governed: dict[int, dict]
    pointers: tuple[str, ...]
    validator: Any = field(repr=False)  # (`_validator`: built on the compile thread, not on the first step)
    originals: dict[int, Any] = field(default_factory=dict, repr=False)  # id() in `schema` -> the client's node
    holders: frozenset[int] = frozenset()  # id() of the nodes of `schema` whose late keywords were taken out
    members: dict[int, "MemberChecks | None"] = field(default_factory=dict, repr=False)
    bounded: bool = False  # `schema` holds some `unevaluated*: false` to what may be evaluated
    # id() of each client's node below a `$schema` other than the root's (a function's draft-04 parameters in the
    # calls' schema) -> that `$schema`, the draft the node is read in
    dialects: dict[int, str] = field(default_factory=dict, repr=False)
    _memo: dict = field(default_factory=dict, repr=False)  # child_alternatives, by its arguments

    def holds(self, node: dict, value: Any) -> bool:
        """`value` is valid against `node` (a subschema of the client's schema); False when jsonschema cannot
        decide (never weaker than asked). Patterns are decided on automata: jsonschema would run the client's
        regex; formats as jsonschema's FormatChecker can."""
        try:
            validator = self.validator
            if id(node) in self.dialects:  # (read in its own draft: QA review10 F1)
                validator = validator.evolve(schema={"$schema": self.dialects[id(node)]})
            return validator.evolve(schema=node).is_valid(_exact(value))
        except Exception:  # noqa: BLE001 - what jsonschema cannot decide counts as invalid
            return False

    def walk_values(self) -> tuple[bytes, ...]:
        """The JSON texts of the governed nodes' const and enum values, for budget completions, which the checks
        may refuse (`CheckedMatcher.refuses_ahead`): `contains: {"const": 7}` asks for a 7; and of a short item
        each `contains` there takes (`_contains_examples`)."""
        if "walk_values" not in self._memo:
            found = [(key, holder) for node in self.governed.values() for _, key, holder in walk(node)]
            values = [v for key, holder in found
                      for v in ([holder["const"]] if key == "const" else holder["enum"] if key == "enum" and
                                isinstance(holder["enum"], list) else [])]
            values += [v for key, holder in found if key == "contains" for v in self._contains_examples(holder)]
            texts = (json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode() for v in values)
            # (last: a `oneOf` of open objects whose keys so far both branches take needs a member one refuses,
            # and under `patternProperties` of scalars that is a container: the greedy walk wrote scalars only,
            # and the answer ran to max_tokens)
            containers = CONTAINER_VALUES if any(key == "oneOf" for key, _ in found) else ()
            self._memo["walk_values"] = tuple(dict.fromkeys([*tuple(dict.fromkeys(texts))[:32 - len(containers)],
                                                             *containers]))
        return self._memo["walk_values"]

    def _contains_examples(self, holder: dict) -> list:
        """Up to two short values valid against `holder`'s `contains` and its items' schema: the greedy walk wrote
        `[0,0,0...` under `contains: {minimum: 5}` and never an item it takes (QA latechecks F6). Tried among small
        values and those the subschema's bounds, lengths and patterns name."""
        contains, items = holder["contains"], holder.get("items", True)
        candidates: list = [0, 1, -1, 10, 100, "", "a", True, False, None, [], {}]
        for sub in (contains, items):
            if isinstance(sub, dict):
                candidates += [v + d for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
                               if isinstance(v := sub.get(k), (int, float)) and not isinstance(v, bool)
                               and math.isfinite(v) for d in (0, 1, -1)]
                low = sub.get("minLength")
                if isinstance(low, int) and not isinstance(low, bool) and 0 < low <= 64:
                    candidates.append("a" * low)
                if isinstance(sub.get("pattern"), str):
                    candidates += pattern_examples(sub["pattern"])[:4]
        checks = [contains] + ([items] if isinstance(items, (dict, bool)) else [])
        return [v for v in candidates if all(self.holds(c, v) for c in checks)][:2]

    def _trivial(self, node: Any) -> bool:
        """`node` asserts nothing here: true, or {} that is not a governed node (a holder whose only keyword was
        late, `{"not": ...}`, is {} in `schema` and must still be checked)."""
        return node is True or (node == {} and id(node) not in self.governed)

    def applicable(self, node: Any) -> tuple[dict, ...] | None:
        """`node` and the subschemas that apply with it ($ref, allOf): all of them hold for the value. None when
        the value is reached through a choice (anyOf/oneOf branches, patternProperties): not followed."""
        out: list[dict] = []
        stack = [node]
        while stack:
            n = stack.pop()
            if self._trivial(n):
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
        `additionalProperties` beside them), tuple forms of `items`. `_placements` governs the value around a
        late keyword below those, so no governed value is ever missed."""
        if parents is None:
            return None
        out: list[dict] = []
        for d in _members(parents, step):
            a = self.applicable(d)
            if a is None:
                return None
            out.extend(a)
        return tuple(out)

    def alternatives(self, node: Any, inside: tuple[int, ...] = (),
                     budget: list[int] | None = None) -> list[tuple[dict, ...]] | None:
        """What applies to a value `node` applies to, one tuple per choice of anyOf/oneOf branches: the value is
        valid only if it holds every subschema of some tuple. Each tuple may leave out what applies (a recursive
        $ref met again), never holds what may not. None: more than `_MAX_ALTERNATIVES`, or more than
        `_MAX_ALTERNATIVE_STEPS` subschemas to look at (branches that share subschemas can be exponentially many
        ways through a schema)."""
        budget = [_MAX_ALTERNATIVE_STEPS] if budget is None else budget
        budget[0] -= 1
        if budget[0] < 0:
            return None
        if self._trivial(node):
            return [()]
        if not isinstance(node, dict):
            return []  # (`false`: no choice lets a value through)
        if id(node) in inside:
            return [()]
        inside = (*inside, id(node))
        out: list[tuple[dict, ...]] | None = [(node,)]
        parts = [node["allOf"]] if isinstance(node.get("allOf"), list) else []
        if isinstance(node.get("$ref"), str):
            parts.append([resolve_ref(self.schema, node["$ref"])])
        for part in parts:
            for sub in part:
                out = _product(out, self.alternatives(sub, inside, budget))
                if out is None:
                    return None
        if isinstance(node.get("anyOf"), list):
            union: list[tuple[dict, ...]] = []
            for branch in node["anyOf"]:
                more = self.alternatives(branch, inside, budget)
                if more is None or len(union) + len(more) > _MAX_ALTERNATIVES:
                    return None
                union += more
            out = _product(out, union)
        return out

    def child_alternatives(self, parents: list[tuple[dict, ...]] | None,
                           step: str | int) -> list[tuple[dict, ...]] | None:
        """`alternatives` for member `step` of a value whose alternatives are `parents` (remembered: the same
        places recur in every array item and every document)."""
        if parents is None:
            return None
        key = (tuple(tuple(map(id, alt)) for alt in parents), step)
        found = self._memo.get(key, self)  # (`self`: not there; None is an answer)
        if found is self:
            found = self._child_alternatives(parents, step)
            if len(self._memo) > 4096:  # (keys hold the output's property names: bounded)
                self._memo.clear()
            self._memo[key] = found
        return found

    def _child_alternatives(self, parents: list[tuple[dict, ...]], step: str | int) -> list[tuple[dict, ...]] | None:
        out: list[tuple[dict, ...]] = []
        budget = [_MAX_ALTERNATIVE_STEPS]
        for alt in parents:
            if isinstance(step, str) and not all(_may_hold_key(n, step) for n in alt):
                continue  # (this choice refuses the key: the object cannot be valid under it)
            mine: list[tuple[dict, ...]] | None = [()]
            for direct in _members(alt, step):
                mine = _product(mine, self.alternatives(direct, budget=budget))
            if mine is None or len(out) + len(mine) > _MAX_ALTERNATIVES:
                return None
            out += [m for m in mine if m not in out]
        return out


_MAX_ALTERNATIVES = 16
_MAX_ALTERNATIVE_STEPS = 256


def _members(parents: tuple[dict, ...], step: str | int) -> list[Any]:
    """The subschemas of `parents` that apply for sure to their member `step` (a key, or an array index)."""
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
    return direct


def _may_hold_key(node: dict, key: str) -> bool:
    """An object valid against `node` may have `key` (False only where `node` says it may not, plainly)."""
    props = node.get("properties")
    props = props if isinstance(props, dict) else {}
    if key in props:
        return props[key] is not False
    return not (node.get("additionalProperties") is False and not node.get("patternProperties"))


def _may_be(node: dict, kind: str) -> bool:
    """A value of JSON type `kind` ("object", "array") may be valid against `node` (its `type` allows it)."""
    types = node.get("type")
    return types is None or types == kind or (isinstance(types, list) and kind in types)


def _product(a: list[tuple] | None, b: list[tuple] | None) -> list[tuple] | None:
    """Every alternative of `a` together with every one of `b` (None: unknown, or too many)."""
    if a is None or b is None or len(a) * len(b) > _MAX_ALTERNATIVES:
        return None
    return [x + y for x in a for y in b]


@dataclass(frozen=True)
class TakeOut:
    """What a plan takes out of the backend's schema besides the keywords it never enforces (`late_keys`): every
    `oneOf` (read as `anyOf`), and every min/maxProperties. llguidance counts an object's keys only when every
    property it declares is required, judged on the object its `allOf` members and references make up: a count in
    one member beside optional properties in another is refused though neither node has both. And, by id() of a
    node of the backend's schema, the keywords llguidance would ignore there (`keywords_ignored_in_draft`: draft
    7's `prefixItems`), which the checks read as the later draft does."""

    one_of: bool = False
    every_count: bool = False
    ignored: dict[int, frozenset[str]] = field(default_factory=dict, compare=False)


def plan_late_keywords(schema: Any, one_of: bool, bound_unevaluated: bool = True,
                       every_count: bool = False) -> LatePlan | None:
    """The plan for `schema`'s late keywords (`late_keys`, `TakeOut(one_of, every_count)`); None when it has none,
    or when a value could not be checked exactly (references the checks cannot follow, a pattern out of the
    automata's reach, `unevaluatedProperties` beside `patternProperties`). With `bound_unevaluated`, the backend's
    schema holds `unevaluated*: false` to what may be evaluated (`_bound_unevaluated`)."""
    from constrain.rewrite import validator_class

    if not isinstance(schema, dict) or not references_followable(schema):
        return None
    out = copy.deepcopy(schema)
    originals = _originals(out, schema)
    take = TakeOut(one_of, every_count, keywords_ignored_in_draft(out))
    placed, holders = _placements(out, take)
    if not placed:
        return None
    patterns: set[str] = set()
    for node in placed.values():
        more = _patterns(out, node)
        if more is None:
            return None
        patterns |= more
    work = Work.for_search()
    searches = {p: pattern_search(p, work) for p in sorted(patterns)}
    if any(f is None for f in searches.values()):
        return None
    # A value below a choice is checked against every subschema in its place, not only the governed ones whose
    # patterns are above (the root's `patternProperties` beside the `allOf` member a count's rewrite made: the
    # missing search was read as invalid, and every object refused, QA fuzz4 F2). The schema's other patterns are
    # searched here, each within the limits of one search, never in a decode step (40 of them took 17 s there: QA
    # review9 F4; one budget for them all left ten of them out, and every object refused, QA review10 F3); one out
    # of its reach is missing, and a value it would decide counts as invalid (`LatePlan.holds`).
    # None where `unevaluatedProperties` meets `patternProperties`: jsonschema would match names with the regex.
    others = _patterns(schema, schema) or set()
    searches.update({p: found for p in sorted(others - patterns) if (found := pattern_search(p)) is not None})
    governed = {id(n): originals[id(n)] for n in placed.values()}
    pointers = tuple(sorted(ptr for ptr, n in _node_pointers(out).items() if id(n) in governed))
    unevaluated = [(node, key) for node in holders for key in ("unevaluatedProperties", "unevaluatedItems")
                   if bound_unevaluated and node.get(key) is False]
    refs = [(n, n["$ref"], resolve_ref(out, n["$ref"])) for _, key, n in walk_with_refs(out)
            if key == "$ref" and isinstance(n["$ref"], str)]
    _take_out_all(holders, take, schema, originals)
    _keep_targets(out, refs)
    bounded = {id(originals[id(node)]): key for node, key in unevaluated
               if _bound_unevaluated(node, key, schema, originals[id(node)], take, originals)}
    # (names are judged as keys are written only where the backend offers the declared ones alone: every byte of
    # a free key would be put to the check)
    named = {i for i, key in bounded.items() if key == "unevaluatedProperties"}
    dialects = _dialects(schema)

    def keywords(node: dict):
        """The keywords of the draft `node` is read in (a function's own, in the calls' schema: QA review11 F3)."""
        return validator_class({"$schema": dialects[id(node)]} if id(node) in dialects else schema,
                               later_keywords=True).VALIDATORS

    return LatePlan(out, governed, pointers, _validator(schema, searches), originals,
                    frozenset(id(n) for n in holders),
                    {id(n): _member_checks(n, schema if id(n) in named else None, keywords(n))
                     for n in governed.values()},
                    bounded=bool(bounded), dialects=dialects)


def _dialects(schema: dict) -> dict[int, str]:
    """id() of each subschema below a `$schema` other than the root's -> that `$schema` (`LatePlan.dialects`)."""
    return {node: dialect for node, dialect in node_dialects(schema).items()
            if isinstance(dialect, str) and dialect != schema.get("$schema")}


def _keep_targets(root: dict, refs: list[tuple[dict, str, Any]]) -> None:
    """Each `$ref` of `refs` (holder, reference, its target before the late keywords were taken out of `root`)
    whose target is no longer there (under a `then`, a `oneOf` read as `anyOf`) points at it where it now is:
    under `$defs` of `root`, which the late keywords' removal left without it (`Pointer '/then/properties/n'
    does not exist`, a 400 for a schema valid in every draft: QA testsuite2 F1)."""
    moved: dict[int, str] = {}
    for holder, ref, target in refs:
        if target is None or resolve_ref(root, ref) is target:
            continue
        defs = root.setdefault("$defs", {})
        if not isinstance(defs, dict):
            return
        if id(target) not in moved:
            moved[id(target)] = name = next(f"structgen-moved-{i}" for i in itertools.count() if
                                            f"structgen-moved-{i}" not in defs)
            defs[name] = target
        holder["$ref"] = f"#/$defs/{moved[id(target)]}"


def _take_out_all(nodes: list[dict], take: TakeOut, root: Any, originals: dict[int, Any]) -> None:
    """`nodes` (of the backend's schema) without their late keywords, in place (`_take_out_late_keys`); first, where
    `take.one_of`, each `oneOf`'s types narrowed (`_narrow_to_one_of_types`), judged on its branches as the client
    wrote them (`root`: the client's schema, for their references): a branch whose `not` was taken out takes more.
    A node made here joins `originals` as its holder's client node (the checks look up the client's node of each
    node they meet: the `allOf` member a `oneOf` beside an `anyOf` became was a `KeyError`, a 500)."""
    if take.one_of:
        for node in nodes:
            if "oneOf" in late_keys(node, take):
                _narrow_to_one_of_types(node, root)
    for node in nodes:
        made = _take_out_late_keys(node, take)
        if made is not None:
            originals[id(made)] = originals[id(node)]


def _take_out_late_keys(node: dict, take: TakeOut) -> dict | None:
    """`node` (of the backend's schema) without its late keywords, in place: dropped, exclusive ends widened,
    `oneOf` as `anyOf` when `take.one_of` (beside an `anyOf`, as a new `allOf` member: returned)."""
    made = None
    for key in late_keys(node, take):
        if key == "minProperties" and not take.every_count and _backend_counts_pairs(node):
            continue  # (checked late, and left to the backend, whose completions then write enough keys)
        if key in ("exclusiveMinimum", "exclusiveMaximum"):
            _widen(node, key)
        elif key != "oneOf":
            del node[key]
        elif "anyOf" not in node:
            node["anyOf"] = node.pop("oneOf")
        else:
            made = {"anyOf": node.pop("oneOf")}
            node["allOf"] = [*node.get("allOf", []), made]
    return made


# The keywords that assert something only of values of one type (draft 4 to 2020-12).
_KEYWORDS_OF_TYPE = {
    "object": frozenset({"properties", "required", "additionalProperties", "patternProperties", "propertyNames",
                         "minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "dependencies",
                         "unevaluatedProperties"}),
    "array": frozenset({"items", "prefixItems", "additionalItems", "contains", "minContains", "maxContains",
                        "minItems", "maxItems", "uniqueItems", "unevaluatedItems"}),
    "string": frozenset({"minLength", "maxLength", "pattern", "format", "contentMediaType", "contentEncoding"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
    "null": frozenset(), "boolean": frozenset(),
}
_OF_SOME_TYPE = frozenset().union(*_KEYWORDS_OF_TYPE.values())


def _narrow_to_one_of_types(node: dict, root: Any) -> None:
    """`node`'s `oneOf`, about to be read as `anyOf` by the backend: a type two of whose branches take each of its
    values is one no value of passes the `oneOf`, so it is taken out of the node's `type`. The "exactly one of these
    property sets" idiom (`oneOf: [{required: [a]}, {required: [b]}]`) without `type: object` took every string and
    number: the answer opened one, whose end the check refused, and ran to max_tokens (QA testsuite F2, 6 answers
    in 6)."""
    branches = node.get("oneOf")
    if not isinstance(branches, list):
        return
    declared = node.get("type", list(_KEYWORDS_OF_TYPE))
    declared = [declared] if isinstance(declared, str) else declared
    if not isinstance(declared, list) or not all(isinstance(t, str) for t in declared):
        return
    kept = [t for t in declared
            if sum(_takes_every(b, "number" if t == "integer" else t, root) for b in branches) < 2]
    if kept != declared and kept:
        node["type"] = kept[0] if len(kept) == 1 else kept


def _takes_every(branch: Any, kind: str, root: Any, depth: int = 0) -> bool:
    """`branch` (a subschema of `root`) takes every value of JSON type `kind` ("number" for numbers and integers):
    it asserts nothing of them (no keyword but annotations and those of other types, and a local `$ref` to such a
    subschema: a `oneOf` of `$ref`s took strings, QA testsuite2 F2)."""
    if branch is True:
        return True
    if not isinstance(branch, dict) or depth > _MAX_REF_DEPTH:
        return False
    if "$ref" in branch and not _takes_every(resolve_ref(root, branch["$ref"]), kind, root, depth + 1):
        return False
    types = branch.get("type", kind)
    if kind not in ([types] if isinstance(types, str) else types if isinstance(types, list) else []):
        return False
    return all(k in ("type", "$ref") or k in ANNOTATIONS or (k in _OF_SOME_TYPE and k not in _KEYWORDS_OF_TYPE[kind])
               for k in branch)


_MAX_REF_DEPTH = 8  # references `_takes_every` follows from one branch


def late_keys(node: dict, take: TakeOut) -> list[str]:
    """The keywords of the schema object `node` that a plan takes out of what the backend compiles: `DROPPED`
    (`uniqueItems` only when true), a format of `LATE_FORMATS`, min/maxProperties beside optional declared
    properties (llguidance counts keys only when all are required), minProperties where keys may repeat, and
    what `take` names."""
    out = [k for k in node if k in DROPPED and (k != "uniqueItems" or node[k] is True)]
    out += sorted(take.ignored.get(id(node), frozenset()) - DROPPED)
    out += misread_bounds(node)
    if node.get("format") in LATE_FORMATS:
        out.append("format")
    props, required = node.get("properties"), node.get("required")
    optional = isinstance(props, dict) and set(props) - set(required if isinstance(required, list) else ())
    if take.every_count or optional:
        out += [k for k in ("minProperties", "maxProperties") if k in node]
    elif _counts_repeatable_keys(node):
        out.append("minProperties")
    if take.one_of and "oneOf" in node:
        out.append("oneOf")
    return out


def _counts_repeatable_keys(node: dict) -> bool:
    """`minProperties` that may need two keys or more beyond the required ones, on an object whose keys are not
    all declared. The backend counts key/value pairs, and nothing stops an undeclared key from repeating:
    `{"": 1, "": 2}` met `minProperties: 2` (and the shortest completion writes just that), yet it parses as one
    property. Checked late, the count is the parsed object's; the backend keeps counting pairs too
    (`_backend_counts_pairs`), and where such an object's place is known a key it already has is refused as its
    closing quote is written, so its pairs are its properties and its budget completions (which write no key twice,
    `LlgMatcher.write_distinct_keys`) end valid. (One key beyond the required ones cannot repeat another, so
    `minProperties: 1` stays the backend's.)"""
    low, required = node.get("minProperties"), node.get("required")
    names = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
    return isinstance(low, int) and low - len(names) >= 2 and (node.get("additionalProperties") is not False
                                                                or bool(node.get("patternProperties")))


def _backend_counts_pairs(node: dict) -> bool:
    """`minProperties` here is checked late only because keys may repeat (`_counts_repeatable_keys`): the
    backend's count of key/value pairs is then a necessary condition, so it keeps the keyword too."""
    props, required = node.get("properties"), node.get("required")
    optional = isinstance(props, dict) and set(props) - set(required if isinstance(required, list) else ())
    return not optional and _counts_repeatable_keys(node)


def late_from_the_start(schema: Any) -> bool:
    """Some object of `schema` counts keys that may repeat (`_counts_repeatable_keys`), or some number has an
    interval the backend misreads (`misread_bounds`): its compile takes the late path from the start, not only
    when the backend refuses a keyword."""
    return any(_counts_repeatable_keys(node) if key == "minProperties" else bool(misread_bounds(node))
               for _, key, node in walk(schema) if key in ("minProperties", "exclusiveMinimum", "exclusiveMaximum"))


def misread_bounds(node: dict) -> list[str]:
    """The exclusive end of a number interval that llguidance 1.x misreads: an integer k with the other end less
    than 1 away, as `(0, 0.5]` or `(-1.5, -1)`. Its grammar then takes `k` itself (`0`, `-0`, `-1`): 9 of 10
    answers under `exclusiveMinimum: 0, maximum: 0.5` were `0`. An interval exactly 1 wide whose ends are both
    exclusive counts too: the backend's own rewrite moves one end inward (`exclusiveMaximum: 1` becomes `maximum:
    0.999999999999999`), which left `(0, 1)`, pydantic's `Field(gt=0, lt=1)`, answering `0` (QA frameworks F1).
    Such an end is made inclusive for the backend (`_widen`) and the client's interval checked on the finished
    number."""
    types = node.get("type", "number")
    if "number" not in (types if isinstance(types, list) else [types]):
        return []
    low, low_key = _interval_end(node, "minimum", "exclusiveMinimum", max)
    high, high_key = _interval_end(node, "maximum", "exclusiveMaximum", min)
    if low is None or high is None:
        return []
    moved = any(key is not None and moved_end(node, key) is not None for key in (low_key, high_key))
    if not (0 < high - low < 1 or (high - low == 1 and low_key is not None and high_key is not None and moved)):
        return []
    return [key for end, key in ((low, low_key), (high, high_key)) if key is not None and float(end).is_integer()]


def _interval_end(node: dict, inclusive: str, exclusive: str, tighter) -> tuple[float | None, str | None]:
    """(the interval's end on one side, the exclusive keyword that makes it, or None where it is inclusive).
    Draft 4 writes `exclusiveMinimum: true` beside `minimum`."""
    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    inc, exc = node.get(inclusive), node.get(exclusive)
    if exc is True and number(inc):
        return inc, exclusive
    ends = [(v, k) for v, k in ((inc, None), (exc, exclusive)) if number(v)]
    if not ends:
        return None, None
    end = tighter(v for v, _ in ends)
    return end, next(k for v, k in reversed(ends) if v == end)  # (at a tie, the exclusive keyword: it excludes)


def _widen(node: dict, key: str) -> None:
    """`misread_bounds`: the exclusive end `key` becomes an inclusive one the backend reads right, its nearest
    15-digit decimal inside the interval (`inward_end`: `exclusiveMaximum: 1` is `maximum: 0.999999999999999`,
    `exclusiveMinimum: 0` is `minimum: 1e-15`). Made inclusive at `k` itself, an upper end (or a negative lower one)
    let `1` be written, which no digit after it could leave: `1.000...` ran to `max_tokens` (QA frameworks F2). An
    end too large for that range, or whose neighbour lies at or past the other end (`(0, 1e-16]` made `[1e-15,
    1e-16]`, which holds no number), is made inclusive at `k` (a superset; the finished number is checked)."""
    upper = key == "exclusiveMaximum"
    inclusive = "maximum" if upper else "minimum"
    end = node.get(inclusive) if node.get(key) is True else node.get(key)  # (draft 4: a flag beside the end)
    bound = inward_end(end, upper)
    other, _ = _interval_end(node, "minimum", "exclusiveMinimum", max) if upper else \
        _interval_end(node, "maximum", "exclusiveMaximum", min)
    if bound is not None and (other is None or (bound > other if upper else bound < other)):
        end_as_inclusive(node, key, bound)
        return
    value = node.pop(key)
    if value is not True:  # (draft 4: `minimum` stays, now inclusive)
        node[inclusive] = value


def _placements(root: dict, take: TakeOut) -> tuple[dict[int, dict], list[dict]]:
    """The governed nodes (id() -> node): for each late keyword on each way the output can reach it, the node
    holding it when that is exactly placed, else the nearest exactly placed node around it unless one around it
    is governed already; and the nodes holding late keywords the output can reach. None governed past
    `_MAX_VISITS`. Exactly placed is what `LatePlan.child` follows."""
    governed: dict[int, dict] = {}
    holders: dict[int, dict] = {}
    seen: set[tuple] = set()
    # (node, exactly placed, the nearest exactly placed node around it, inside a governed one)
    stack: list[tuple[Any, bool, Any, bool]] = [(root, True, root, False)]
    while stack:
        n, known, anchor, covered = stack.pop()
        if not isinstance(n, dict):
            continue
        if known:
            anchor = n
        covered = covered or (known and id(n) in governed)
        state = (id(n), known, True) if covered else (id(n), known, id(anchor))
        if state in seen:
            continue
        seen.add(state)
        if len(seen) > _MAX_VISITS:
            return {}, []
        if late_keys(n, take):
            holders[id(n)] = n
            if known or not covered:
                governed[id(anchor)] = anchor  # (an exactly placed one is checked itself, inside another: sooner)
                covered = True
        nxt = []
        if isinstance(n.get("$ref"), str):
            nxt.append((resolve_ref(root, n["$ref"]), known))
        for key, value in n.items():
            if key in DROPPED:
                continue  # (dropped for the backend: what they hold is only ever checked whole)
            if key == "properties" and isinstance(value, dict):
                nxt += [(v, known) for v in value.values()]
            elif key == "additionalProperties" and isinstance(value, dict):
                nxt.append((value, known and "patternProperties" not in n))
            elif key == "items" and isinstance(value, dict):
                nxt.append((value, known and "prefixItems" not in n))
            elif key == "allOf" and isinstance(value, list):
                nxt += [(v, known) for v in value]
            elif key in ("anyOf", "oneOf", "prefixItems", "items") and isinstance(value, list):
                nxt += [(v, False) for v in value]
            elif key in ("patternProperties",) and isinstance(value, dict):
                nxt += [(v, False) for v in value.values()]
            elif key == "additionalItems" and isinstance(value, dict):
                nxt.append((value, False))
        stack += [(v, k, anchor, covered) for v, k in nxt]
    return governed, list(holders.values())


_MAX_EVALUATED_NAMES = 64  # names `_bound_unevaluated` declares (llguidance lays out each optional property)


def _bound_unevaluated(node: dict, key: str, root: Any, source: dict, take: TakeOut,
                       originals: dict[int, Any]) -> bool:
    """`unevaluatedProperties: false` (`unevaluatedItems: false`) of `source`, taken out of `node` (its copy in the
    backend's schema), is checked on the finished value; the backend left every other key open, and an answer wrote
    one as free text, then ran to max_tokens (QA latechecks F1: 7/10 answers at 200 tokens beside an `anyOf`).
    Where the subschemas that apply in place (`_in_place`) declare the only properties (prefix items) that can
    count as evaluated, the backend holds the value to them: each name some of them declare, where `node` does not
    declare it under its one declaration there (a name counts only where a subschema that holds declares it), or
    `{}` where they declare it differently, and `additionalProperties: false`; at most the longest prefix
    (`maxItems`), each place likewise. That only refuses values the check refuses; which branch evaluates a name is
    still the check's. (As the `anyOf` of its declarations, a `kind` of each branch's `const` kept llguidance from
    proving a `oneOf` disjoint, and a name shared by 100 branches made the schema too large: QA review F1, F2.)
    Left as it is where something evaluates other names or items too (`patternProperties`, `additionalProperties`,
    `items`, `contains`, another `unevaluated*`), or in a draft without the keyword (it asserts nothing there).
    Whether it changed `node`."""
    from constrain.rewrite import validator_class

    nodes = _in_place(root, source)
    if nodes is None or key not in validator_class(root).VALIDATORS:
        return False
    if key == "unevaluatedProperties":
        if any(n.get("patternProperties") or n.get("additionalProperties", False) is not False
               or n.get(key, False) is not False or not isinstance(n.get("properties", {}), dict) for n in nodes):
            return False
        declared: dict[str, dict[str, Any]] = {}  # name -> its declarations, by their JSON text (`true` is not `1`)
        for n in nodes:
            for name, sub in n.get("properties", {}).items():
                declared.setdefault(name, {}).setdefault(_json_key(sub), sub)
        props = node.get("properties", {})
        if len(declared) > _MAX_EVALUATED_NAMES or not isinstance(props, dict):
            return False
        extra = {name: _for_backend(next(iter(subs.values())), take, root, originals) if len(subs) == 1 else {}
                 for name, subs in declared.items() if name not in props}
        node["properties"] = {**props, **extra}
        node["additionalProperties"] = False
        return True
    prefix_key = "prefixItems" if "prefixItems" in validator_class(root).VALIDATORS else "items"  # (2019-09)
    places: list[dict[str, Any]] = []  # (place i: the schemas the prefixes declare there, by their JSON text)
    for n in nodes:
        items = n.get("items", False)
        prefix = n.get(prefix_key)
        if (items is not False and not (items is prefix and isinstance(prefix, list))) or "contains" in n \
                or n.get("additionalItems", False) is not False or n.get(key, False) is not False:
            return False
        for i, sub in enumerate(prefix if isinstance(prefix, list) else ()):
            if i == len(places):
                places.append({})
            places[i].setdefault(_json_key(sub), sub)
    own = node.get(prefix_key, [])
    if not isinstance(own, list):
        return False
    node[prefix_key] = own + [_for_backend(next(iter(subs.values())), take, root, originals)
                              if len(subs) == 1 else {} for subs in places[len(own):]]
    if not node[prefix_key]:
        del node[prefix_key]
    most = node.get("maxItems")
    if not (isinstance(most, int) and not isinstance(most, bool) and most <= len(places)):
        node["maxItems"] = len(places)
    return True


def _json_key(schema: Any) -> str:
    """A subschema's JSON text, keys sorted: equal for equal schemas, unlike `==`, which takes `true` for `1`."""
    return json.dumps(schema, sort_keys=True)


def _for_backend(schema: Any, take: TakeOut, root: Any, originals: dict[int, Any]) -> Any:
    """A copy of the client's subschema `schema` (of `root`) with its late keywords taken out (`_take_out_all`); its
    nodes join `originals` (the checks look up the client's node of each they meet: a `KeyError` on a copy was a
    500, QA fuzz F1)."""
    out = copy.deepcopy(schema)
    originals.update(_originals(out, schema))
    _take_out_all(schema_objects(out), take, root, originals)
    return out


def _in_place(root: Any, node: dict) -> list[dict] | None:
    """`node` and the subschemas that apply to the same value with it, each once: through `allOf`, local `$ref`s
    and the alternatives (`anyOf`, `oneOf`, `if`/`then`/`else`, `dependentSchemas`: `alternatives_of`), recursively
    (not `not` nor `dependencies`: what they evaluate never counts; the latter's names were offered, then refused
    at `}`, QA review F3), in the order they are written. None where one cannot be followed
    (a `$ref` out of reach, `$dynamicRef`)."""
    from constrain.rewrite import alternatives_of

    out: list[dict] = []
    queue: list[Any] = [node]
    for n in queue:
        if isinstance(n, bool):
            continue
        if not isinstance(n, dict) or "$dynamicRef" in n or "$recursiveRef" in n:
            return None
        if any(n is o for o in out):
            continue
        out.append(n)
        if "$ref" in n:
            target = resolve_ref(root, n["$ref"])
            if target is None:
                return None
            queue.append(target)
        alternatives = alternatives_of(n, dependencies=False)
        if alternatives is None or not isinstance(n.get("allOf", []), list):
            return None
        queue.extend(n.get("allOf", []) + alternatives)
    return out


@dataclass(frozen=True)
class MemberChecks:
    """The keywords of a governed node that the members written so far already break for good, whatever follows:
    a repeated item (`uniqueItems`), more items than `maxContains` holding `contains`, a name `propertyNames`
    refuses, a property count `counts` can no longer meet.
    `prefix` is checked on the container so far as each member is finished, `names` on each name as its quote
    closes, `counts` at each key and comma. So such a member is refused when it is written, not with the whole
    value (when it could no longer be taken back), and a key or comma before its value (a number after it could
    never end: the `,` or `}` that would end it would finish a refused object)."""

    prefix: dict
    names: dict | None
    counts: "PropertyCounts | None" = None
    evaluated: "EvaluatedNames | None" = None


@dataclass(frozen=True)
class PropertyCounts:
    """min/maxProperties of an object, judged on the key/value pairs written so far (a repeated key counts
    twice: a duplicate key at the limit is refused, which JSON discourages anyway). `most`: no comma once the
    object holds that many, no key past it. `least` with `after`: on a closed object whose keys the backend
    writes in the declared order (llguidance's order, as OpenAI's strict mode), only the properties declared
    after a key may follow it; a key with fewer of them left than the count still needs is a dead end
    (`{"last": 1` under `minProperties: 2` could never close)."""

    most: int | None
    least: int
    after: dict[str, int] | None  # declared name -> how many declared properties that may appear come after it

    def comma_holds(self, pairs: int) -> bool:
        """A comma after `pairs` members: room for one more."""
        return self.most is None or pairs < self.most

    def key_holds(self, key: str, pairs: int) -> bool:
        """`pairs` members so far, the last of them `key` (its value to come)."""
        if self.most is not None and pairs > self.most:
            return False
        return self.after is None or key not in self.after or pairs + self.after[key] >= self.least


# Keywords beside which the backend's key order is not the node's own `properties` order (merged properties,
# alternatives): no `PropertyCounts.after` there.
_MERGING = ("allOf", "anyOf", "oneOf", "$ref", "if", "then", "else", "dependentSchemas", "dependencies",
            "patternProperties", "unevaluatedProperties", "propertyNames")


def _property_counts(node: dict) -> PropertyCounts | None:
    def count(key: str) -> int | None:
        value = node.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    most, least, props = count("maxProperties"), count("minProperties"), node.get("properties")
    ordered = least is not None and least >= 2 and isinstance(props, dict) \
        and node.get("additionalProperties") is False and not any(k in node for k in _MERGING)
    if most is None and not ordered:
        return None
    names = [k for k, v in props.items() if v is not False] if ordered else []
    after = {k: len(names) - 1 - i for i, k in enumerate(names)} if ordered else None
    return PropertyCounts(most, least or 0, after)


@dataclass(frozen=True)
class EvaluatedNames:
    """`unevaluatedProperties: false`: the names some subschema in place declares, each with what the object's
    members so far must meet for a subschema that declares it to still hold (True: the node's own, always
    evaluated while it holds), in the order the backend writes them (`_bound_unevaluated` declares them so). A key
    that can be none of the names left is refused as it is written."""

    conditions: dict[str, Any]
    ordered: bool = True  # every subschema lists the names it declares in that order: the backend writes them so

    def allowed(self, plan: LatePlan, members: bytes) -> dict[bytes, str]:
        """The names a key after `members` (the object's text so far, closed) may take: raw (as a JSON string
        holds them) -> name. Only those after the last one written, in the backend's order (a name before it,
        which the check allowed, could not be written: after `"good"` of one pet only another pet's `"scales"` was
        left, and the answer's comma led to a dead end, QA review F2); all of them where the text is not JSON."""
        memo_key = ("names", id(self), members)
        if memo_key not in plan._memo:
            try:
                readings = _readings(members)
            except (ValueError, _NotFinite):
                readings = [None]
            value = readings[0] if isinstance(readings[0], dict) else {}
            order = list(self.conditions)
            last = max((order.index(k) for k in value if k in self.conditions), default=-1) if self.ordered else -1
            plan._memo[memo_key] = {
                json.dumps(name, ensure_ascii=False)[1:-1].encode(): name
                for name, cond in list(self.conditions.items())[last + 1:]
                if name not in value and (cond is True or all(plan.holds(cond, v) for v in readings))}
            if len(plan._memo) > 4096:
                plan._memo.clear()
        return plan._memo[memo_key]


_MAX_NAME_PATHS = 512  # subschemas in place `_evaluated_names` follows


def _evaluated_names(root: Any, node: dict) -> EvaluatedNames | None:
    """For `node` (the client's) with `unevaluatedProperties: false`: each name a subschema in place declares, and
    the condition under which one that declares it may still hold: its `properties`, those of each subschema on
    the way to it from `node`, and an `if`'s before its `then`, all on the members written so far (a may-hold:
    `required` and the rest are left to the check of the whole object). None where other names may count too (as
    in `_bound_unevaluated`), or in a draft without the keyword."""
    from constrain.rewrite import validator_class

    if node.get("unevaluatedProperties") is not False \
            or "unevaluatedProperties" not in validator_class(root).VALIDATORS:
        return None
    in_place = _in_place(root, node)
    if in_place is None:
        return None
    order = {name: i for i, name in enumerate(dict.fromkeys(k for n in in_place for k in n.get("properties", {})))}
    # (llguidance writes a branch's keys in the branch's order: where two subschemas list names in other orders,
    # the names are not held to one; QA review3 F1)
    ordered = all(list(n.get("properties", {})) == sorted(n.get("properties", {}), key=order.__getitem__)
                  for n in in_place)
    found: list[tuple[dict, tuple, tuple]] = []  # (a subschema, its guards, the dependentSchemas triggers on the way)
    stack: list[tuple[Any, tuple, frozenset, tuple]] = [(node, (), frozenset(), ())]
    while stack:
        n, guards, path, triggers = stack.pop()
        if isinstance(n, bool) or id(n) in path:
            continue
        if not isinstance(n, dict) or any(k in n for k in ("$dynamicRef", "$recursiveRef", "patternProperties")) \
                or n.get("additionalProperties", False) is not False \
                or n.get("unevaluatedProperties", False) is not False or len(found) >= _MAX_NAME_PATHS:
            return None
        props = n.get("properties", {})
        if not isinstance(props, dict):
            return None
        here = guards + (({"properties": props},) if props else ())
        found.append((n, here, triggers))
        path = path | {id(n)}
        if "$ref" in n:
            target = resolve_ref(root, n["$ref"])
            if target is None:
                return None
            stack.append((target, here, path, triggers))
        for k in ("allOf", "anyOf", "oneOf"):
            if k in n:
                if not isinstance(n[k], list):
                    return None
                stack.extend((m, here, path, triggers) for m in n[k])
        condition = n.get("if")
        if_props = condition.get("properties") if isinstance(condition, dict) else None
        if "if" in n:
            stack.append((condition, here, path, triggers))
        if "then" in n:
            stack.append((n["then"], here + (({"properties": if_props},) if isinstance(if_props, dict) else ()), path,
                          triggers))
        if "else" in n:
            stack.append((n["else"], here + _may_still_fail(condition), path, triggers))
        if "dependentSchemas" in n:  # (not `dependencies`, whose names a 2019-09 validator never counts: `_in_place`)
            if not isinstance(n["dependentSchemas"], dict):
                return None
            stack.extend((v, here, path, triggers + (t,)) for t, v in n["dependentSchemas"].items())
    conditions: dict[str, Any] = {name: [] for name in order}  # (in the backend's order)
    for n, guards, triggers in found:
        for name in n["properties"] if "properties" in n else ():
            # (a trigger the backend writes before the name must be there already: `"billing"` of `card`'s
            # dependentSchemas after no `"card"` left the object no way to close, QA review F2)
            written = tuple({"required": [t]} for t in triggers if ordered and order.get(t, -1) < order[name])
            if n is node or not guards + written:
                conditions[name] = True
            elif conditions[name] is not True:
                conditions[name].append({"allOf": list(guards + written)})
    return EvaluatedNames({name: c if c is True else {"anyOf": c} if c else False for name, c in conditions.items()},
                          ordered)


def _may_still_fail(condition: Any) -> tuple:
    """The guard of an `else` (`_evaluated_names`): its `if` may still fail, unless it only asks `properties` and
    `required`, every name it names is written, and it holds (then nothing written later changes it: `"y"` of the
    `else` after `"kind": "a"` of the `if`)."""
    if not isinstance(condition, dict) or set(condition) - ANNOTATIONS - {"properties", "required"}:
        return ()
    props, req = condition.get("properties", {}), condition.get("required", [])
    if not isinstance(props, dict) or not isinstance(req, list):
        return ()
    names = sorted(set(props) | {r for r in req if isinstance(r, str)})
    return ({"not": {"properties": props, "required": names}},)


def _member_checks(node: dict, root: Any = None, keywords: Any = None) -> MemberChecks | None:
    """What is checked of `node`'s value as each member is finished; with `root` (the client's schema, given where
    the backend holds `node`'s keys to the declared names), the names its `unevaluatedProperties: false` leaves.
    `keywords`: those the draft `node` is read in reads, a later draft's it lacks included (constrain/rewrite.py
    `later_keyword_validators`; None: every draft's). The array so far is held to `maxContains` only, never to
    `contains` (`["a", 1]` was refused at its first item: QA fuzz F4)."""
    known = (lambda key: True) if keywords is None else keywords.__contains__
    prefix = {k: node[k] for k in ("propertyNames",) if k in node and known(k)}
    if node.get("uniqueItems") is True:
        prefix["uniqueItems"] = True
    # (more items holding `contains` than `maxContains`: refused for good; as no `maxContains + 1` of them, since a
    # `minContains: 0` means one at least before 2019-09, where the later keyword is read too: `_contains_in_both`.
    # An array's: `contains` takes any other value, so the `not` refused every object at its first member)
    counted = known("unevaluatedProperties")  # (the drafts with maxContains, which jsonschema reads in `contains`)
    most = node.get("maxContains")
    if counted and "contains" in node and isinstance(most, int) and not isinstance(most, bool):
        prefix["not"] = {"type": "array", "contains": node["contains"], "minContains": most + 1}
    names = {"propertyNames": node["propertyNames"]} if "propertyNames" in node and known("propertyNames") else None
    counts = _property_counts(node)
    evaluated = _evaluated_names(root, node) if root is not None else None
    return MemberChecks(prefix, names, counts, evaluated) if prefix or counts or evaluated else None


def _originals(copied: Any, source: Any) -> dict[int, Any]:
    """id() of each object in `copied` (a deep copy of `source`) -> the same object in `source`."""
    out: dict[int, Any] = {}
    stack = [(copied, source)]
    while stack:
        c, s = stack.pop()
        if isinstance(c, dict):
            out[id(c)] = s
            stack += [(c[k], s[k]) for k in c]
        elif isinstance(c, list):
            stack += list(zip(c, s))
    return out


def _node_pointers(root: dict) -> dict[str, dict]:
    """JSON Pointer -> schema object, for every schema object with a keyword."""
    return {ptr[: ptr.rindex("/")]: node for ptr, _, node in walk(root)}


def _patterns(root: dict, node: dict) -> set[str] | None:
    """The regexes a check of `node` runs (`pattern`, `patternProperties` names), through $refs too; None
    when one is not a string or `unevaluatedProperties` meets `patternProperties` (jsonschema would match the
    names with the client's regex)."""
    found: set[int] = set()
    patterns: set[str] = set()
    stack = [node]
    while stack:
        top = stack.pop()
        if id(top) in found:
            continue
        found.add(id(top))
        for _, key, n in walk(top):
            if key == "pattern" and isinstance(n[key], str):
                patterns.add(n[key])
            elif key == "patternProperties" and isinstance(n[key], dict):
                if "unevaluatedProperties" in n:
                    return None
                patterns |= set(n[key])
            elif key == "pattern":
                return None
            if key == "$ref":
                target = resolve_ref(root, n[key])
                if isinstance(target, dict):
                    stack.append(target)
    return patterns


def _validator(source: Any, searches: dict[str, Callable[[str], bool]]):
    """jsonschema's validator for `source` (its draft, with `dependencies` and the later drafts' keywords it
    lacks as enforced: `validator_class`'s `later_keywords`, `source` being the rewritten schema) whose regex keywords
    search with the automata in `searches` instead of Python's `re`."""
    from constrain.rewrite import read_in_dialects, validator_class

    def pattern(validator, regex, instance, schema):
        if validator.is_type(instance, "string") and not searches[regex](instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {regex!r}")

    def pattern_properties(validator, pp, instance, schema):
        if validator.is_type(instance, "object"):
            for regex, sub in pp.items():
                for k, v in instance.items():
                    if searches[regex](k):
                        yield from validator.descend(v, sub, path=k, schema_path=regex)

    def additional_properties(validator, ap, instance, schema):
        if not validator.is_type(instance, "object"):
            return
        props = schema.get("properties", {})
        names = schema.get("patternProperties", {})
        extras = [k for k in instance if k not in props and not any(searches[r](k) for r in names)]
        if validator.is_type(ap, "object"):
            for k in extras:
                yield from validator.descend(instance[k], ap, path=k)
        elif not ap and extras:
            yield jsonschema.ValidationError(f"additional properties are not allowed ({extras!r})")

    classes: dict[type, type] = {}

    def checked(cls: type) -> type:
        """`cls` (a draft's validator class) with the checks above and numbers read as written."""
        if cls not in classes:
            exact = {key: _with_exact_value(cls.VALIDATORS[key]) for key in _EXACT_KEYWORDS if key in cls.VALIDATORS}
            exact.update({key: _multiple_of for key in ("multipleOf", "divisibleBy") if key in cls.VALIDATORS})
            types = cls.TYPE_CHECKER
            if types.is_type(1.0, "integer"):  # (drafts 6 on: a number with a zero fraction is an integer, `1e2`)
                types = types.redefine("integer", lambda checker, instance, base=types: (
                    base.is_type(instance, "integer") or (isinstance(instance, decimal.Decimal)
                                                          and _integral(instance))))
            # (a subschema naming a `$schema`, a function's draft-04 parameters inside the calls' schema, is read in
            # its draft with these checks too: jsonschema took its own class there, floats and Python's `re`,
            # `^(a+)+$` seconds per value on the engine thread, QA review9 F1, F2)
            classes[cls] = read_in_dialects(jsonschema.validators.extend(
                cls, {"pattern": pattern, "patternProperties": pattern_properties,
                      "additionalProperties": additional_properties, **exact}, type_checker=types), checked,
                later_keywords=True)
        return classes[cls]

    root = validator_class(source, later_keywords=True)
    return checked(root)(source, format_checker=_format_checker(root))


# ---- numbers as written -----------------------------------------------------------------------------------------
# JSON Schema judges a number as the decimal it spells: under `not: {multipleOf: 0.1}` jsonschema read `0.3` as a
# float (0.3 / 0.1 = 2.9999999999999996) and let it through, and refused it under a `oneOf` branch it satisfies
# (QA fuzz4 F1). The checks read each number exactly (an int, or the Decimal it writes) and a schema's float as
# the decimal its repr spells (as llg_backend reads bounds); nothing is ever expanded by its exponent (`1e-999999999`
# is compared and divided as digits and an exponent).

_EXACT_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum", "const")


def _exact(value: Any) -> Any:
    """`value` with each float as the Decimal its repr spells (what the schema wrote: `0.1`, not the double's
    0.1000000000000000055...), in lists and dicts too; anything else as it is (the same object where nothing
    changes)."""
    if isinstance(value, float):
        return decimal.Decimal(repr(value))
    if isinstance(value, list):
        items = [_exact(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else items
    if isinstance(value, dict):
        members = {k: _exact(v) for k, v in value.items()}
        return value if all(members[k] is v for k, v in value.items()) else members
    return value


def _with_exact_value(keyword: Callable) -> Callable:
    """jsonschema's `keyword` given the schema's value with its floats as written: a Decimal compares with a float
    as the double it is (`0.1` was below `minimum: 0.1`, 0.1000000000000000055...) and never equals it (`enum`,
    `const`: `0.1` was not `const: 0.1`)."""
    def check(validator, value, instance, schema):
        return keyword(validator, _exact(value), instance, schema)
    return check


def _digits(value: int | decimal.Decimal) -> tuple[int, int]:
    """(c, e), `value` == c * 10**e, both ints: read off the Decimal, never computed with its exponent."""
    if isinstance(value, int):
        return value, 0
    sign, digits, exp = value.as_tuple()
    if not isinstance(exp, int):
        raise ValueError(f"{value!r} is not finite")
    coefficient = int(decimal.Decimal((sign, digits, 0)))  # (no 4,300-digit limit, unlike int(str))
    return coefficient, exp


def _integral(value: decimal.Decimal) -> bool:
    """`value` has no fraction: the digits its exponent puts after the point are all 0 (`2.50e1`, not `2.5`)."""
    _, digits, exp = value.as_tuple()
    return isinstance(exp, int) and (exp >= 0 or not any(digits[exp:]))


def _is_multiple(value: int | decimal.Decimal, divisor: Any) -> bool:
    """`value` / `divisor` is an integer in exact decimal arithmetic, in work bounded by their digits (an exponent
    is only ever used modulo the divisor, or compared): `3E000225` is 6 * 10**224 * 5, `1e-999999999` no multiple of
    0.1. A divisor that is no positive number counts as holding no multiple."""
    c, e = _digits(value)
    dc, de = _digits(_exact(divisor))
    if dc <= 0:
        return False
    if c == 0:
        return True
    shift = e - de  # value / divisor = (c / dc) * 10**shift
    if shift >= 0:
        return c * pow(10, shift, dc) % dc == 0
    if -shift > abs(c).bit_length() * 0.302 + 1:  # (more than c has digits: 0 < |c| < 10**-shift <= its divisor)
        return False
    return c % (dc * 10 ** -shift) == 0


def _multiple_of(validator, divisor, instance, schema):
    """`multipleOf` (draft 3's `divisibleBy`) in exact decimal: jsonschema divides floats."""
    if validator.is_type(instance, "number") and not _is_multiple(instance, divisor):
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {divisor!r}")


def _readings(text: bytes | str) -> list[Any]:
    """The JSON value `text` spells, its numbers read exactly (an int, or the Decimal a fraction or exponent
    writes); where some number's nearest double is another decimal (17 significant digits or more, `1e-400`,
    which clients read as 0.0), also as clients read it (each such number as its double's repr spells it): a check
    holds only where it holds for both. _NotFinite: a number past the largest double (clients read ±Infinity), or
    whose exponent no Decimal holds (past 10**18); ValueError: not JSON."""
    moved = False

    def number(literal: str) -> decimal.Decimal:
        nonlocal moved
        double = float(literal)
        if math.isinf(double):
            raise _NotFinite(literal)
        try:
            exact = decimal.Decimal(literal)
        except decimal.InvalidOperation:
            raise _NotFinite(literal) from None
        moved |= exact != decimal.Decimal(repr(double))
        return exact

    value = json.loads(text, parse_float=number, parse_int=_finite_int)
    if not moved:
        return [value]
    return [value, json.loads(text, parse_float=lambda literal: decimal.Decimal(repr(float(literal))),
                              parse_int=_finite_int)]


def _format_checker(cls) -> jsonschema.FormatChecker:
    """The draft's own format checker (jsonschema.FormatChecker() holds every draft's, and reads `time` as draft 3
    did, HH:MM:SS with no zone, refusing every RFC 3339 time), with `hostname` and `duration` read as the grammar
    writes them (constrain/formats.py): jsonschema checks them only with packages this server does not install, and
    a format it cannot check holds, which under `propertyNames` let any key through."""
    formats = jsonschema.FormatChecker()
    formats.checkers = dict(cls.FORMAT_CHECKER.checkers)
    for name, regex, longest in (("hostname", HOSTNAME, 253), ("duration", DURATION, None)):
        if name not in formats.checkers:
            matcher = re.compile(regex)
            formats.checks(name)(lambda value, matcher=matcher, longest=longest: not isinstance(value, str) or (
                matcher.fullmatch(value) is not None and (longest is None or len(value) <= longest)))
    return formats


# ---- following the output -------------------------------------------------------------------------------------

@dataclass
class _Open(Frame):
    """An open container: what applies to it for sure and its alternatives (None: not known, see
    `LatePlan.child` and `LatePlan.alternatives`)."""

    applies: tuple[dict, ...] | None = None
    alts: list[tuple[dict, ...]] | None = None
    keys: set[str] | None = None  # where the backend counts key/value pairs: the keys so far (none may repeat)
    names: dict[bytes, str] | None = None  # the key being written may be one of these (`EvaluatedNames`): raw -> name


Check = tuple[tuple[dict, ...], ...]  # the value holds when it is valid against every subschema of one tuple


@dataclass
class Pending:
    """A checked value being written: the client's subschemas that decide it, where it began in the output and
    at what depth; for a governed container, what is checked as each of its members is finished."""

    check: Check
    start: int
    depth: int
    members: MemberChecks | None = None


class LateTracker(JsonFollower):
    """Follows the JSON output (constrain/json_follower.py) with what applies to each open container, and the
    checked values being written. `fork` gives a copy to try a token on: `finished` collects (check, value text)
    of the checked values a token finishes. A governed value is checked against its subschema; a value below a
    choice whose alternatives hold a late keyword is checked against them too, so that it is refused when
    finished, not only with the value around it (when it can no longer change)."""

    def __init__(self, plan: LatePlan, call_tag: bytes | None = None):
        super().__init__(call_tag)
        self.plan = plan
        self.out = bytearray()  # (from `origin` on: a fork holds only the text its pending value needs)
        self.origin = 0
        self.pending: list[Pending] = []  # (outermost first: a checked value may hold another)
        self.finished: list[tuple[Check, bytes]] = []
        self.repeated_key = False  # a key was written twice in an object whose pairs the backend counts
        self.member_refused = False  # a key or comma the members so far refuse for good (`MemberChecks`)
        self._here: tuple = (None, None)  # what applies to the value beginning: (for sure, alternatives)

    def fork(self) -> "LateTracker":
        f = LateTracker(self.plan)
        f.mode, f.escaped, f.buf = self.mode, self.escaped, bytearray(self.buf)
        f.calls = self.calls.copy() if self.calls is not None else None
        f.pending = list(self.pending)
        f.origin = self.pending[0].start if self.pending else self.origin + len(self.out)
        f.out = bytearray(self.out[f.origin - self.origin:])
        f.stack = [_Open(o.is_array, o.key, o.index, o.applies, o.alts, None if o.keys is None else set(o.keys),
                         o.names) for o in self.stack]
        return f

    def root_scalar(self) -> list[tuple[Check, bytes]]:
        """(check, text) of the checked values a number at the root, ended here, finishes."""
        if self.mode != "number" or self.stack:
            return []
        return [(p.check, bytes(self.out[p.start - self.origin:])) for p in self.pending]

    def _byte(self, c: int) -> None:
        self.out.append(c)
        opens_key = self.mode == "member" and c == _QUOTE
        super()._byte(c)
        if self.mode == "key":
            self._key_byte(opens_key)
        elif self.mode == "number" and self.pending and _past_doubles(self.buf):
            self.member_refused = True  # (no digit after it reads as a double again; QA review2 F1)

    def _value_begins(self, c: int) -> None:
        plan = self.plan
        if not self.stack:
            applies, alts = plan.applicable(plan.schema), plan.alternatives(plan.schema)
        else:
            top = self.stack[-1]
            step = top.index if top.is_array else top.key
            applies, alts = plan.child(top.applies, step), plan.child_alternatives(top.alts, step)
        start = self.origin + len(self.out) - 1  # (this byte is the value's first)
        if applies is not None:
            for a in applies:
                node = plan.governed.get(id(a))
                if node is not None:
                    self.pending.append(Pending(((node,),), start, len(self.stack), plan.members[id(node)]))
        sure = {id(a) for a in applies or ()}
        if alts and any(id(n) in plan.holders and id(n) not in sure for alt in alts for n in alt):
            check = tuple(tuple(plan.originals[id(n)] for n in alt) for alt in alts)
            self.pending.append(Pending(check, start, len(self.stack)))
        self._here = (applies, alts)

    def _frame(self, is_array: bool) -> _Open:
        applies, alts = self._here
        if alts is not None:  # (the choices whose types refuse this container cannot hold for it)
            kind = "array" if is_array else "object"
            alts = [alt for alt in alts if all(_may_be(n, kind) for n in alt)]
        counts_pairs = not is_array and any(_backend_counts_pairs(a) for a in applies or ())
        return _Open(is_array, applies=applies, alts=alts, keys=set() if counts_pairs else None)

    def _value_ends(self, kind: str) -> None:
        end = len(self.out) - (kind == "number")  # (the byte that ended a number is not part of it)
        while self.pending and self.pending[-1].depth == len(self.stack):
            p = self.pending.pop()
            self.finished.append((p.check, bytes(self.out[p.start - self.origin:end])))
        for p in self.members_checked():  # (a member of a checked container: the container so far, closed)
            if p.members.prefix:
                text = bytes(self.out[p.start - self.origin:end]) + (b"]" if self.stack[-1].is_array else b"}")
                self.finished.append((((p.members.prefix,),), text))

    def _key_byte(self, opens: bool) -> None:
        """A key's opening quote or one of its bytes: where the object's `unevaluatedProperties: false` leaves only
        some names (`EvaluatedNames`), a key that can be none of them is refused as it is written, so the answer
        takes another (a name only a branch the object already fails declares: `"bark"` after `"kind": "fish"`;
        refused only with the whole object, 40-70% of such answers ran to max_tokens: QA review)."""
        top = self.stack[-1]
        if opens:
            top.names = None
            for p in self.members_checked():
                if p.members.evaluated is not None:
                    top.names = p.members.evaluated.allowed(self.plan, self._members_so_far(p, len(self.out) - 1))
                    break
        if top.names is not None and _BACKSLASH not in self.buf:  # (an escape is judged with the whole name)
            self.member_refused |= not any(raw.startswith(self.buf) for raw in top.names)

    def _members_so_far(self, p: Pending, end: int) -> bytes:
        """The text of the object `p` checks, its members finished before `end` (an index into `out`), closed."""
        text = bytes(self.out[p.start - self.origin:end]).rstrip(b" \t\n\r")
        return (text[:-1] if text.endswith(b",") else text) + b"}"

    def _key_ends(self) -> None:
        top = self.stack[-1]
        if top.keys is not None:  # (a repeated key would make the backend's count of pairs overcount)
            self.repeated_key |= top.key in top.keys
            top.keys.add(top.key)
        if top.names is not None:
            self.member_refused |= top.key not in top.names.values()
        for p in self.members_checked():  # (a name `propertyNames` refuses: refused as its quote closes)
            if p.members.names is not None:
                self.finished.append((((p.members.names,),), b'{"' + bytes(self.buf) + b'": null}'))
            if p.members.counts is not None:  # (`index`: the commas so far, so this is key number index + 1)
                self.member_refused |= not p.members.counts.key_holds(top.key, top.index + 1)

    def _comma(self) -> None:
        top = self.stack[-1]
        if not top.is_array:
            for p in self.members_checked():
                if p.members.counts is not None:
                    self.member_refused |= not p.members.counts.comma_holds(top.index)

    def members_checked(self) -> list[Pending]:
        """The checked values whose keywords are checked as each member of the open container is finished."""
        depth = len(self.stack) - 1
        return [p for p in reversed(self.pending) if p.depth == depth and p.members] if self.stack else []


# ---- grammar and matcher ----------------------------------------------------------------------------------------

class _TokenSets:
    """Per vocabulary, the tokens that can finish a value in each lexical state (so a step tries few tokens):
    `quote`: hold a '"'; `delimiter`: hold what ends a number; `whole`: may finish a value begun before them and
    may hold a whole value ('}', ']', two quotes, a digit or a letter before a delimiter, a literal);
    `quote_whole`: a '"' and after it such a token's bytes (leave a string, then finish a value); `eos`: end the
    output (and so a number at the root); `blank`: whitespace only (the lookahead looks past it)."""

    def __init__(self, vocab: Vocabulary):
        self.token_bytes = vocab.token_bytes
        sets: dict[str, list[int]] = {"quote": [], "delimiter": [], "whole": [], "quote_whole": [],
                                      "eos": sorted(vocab.eos_token_ids), "blank": []}
        for tid, b in enumerate(vocab.token_bytes):
            if not b:
                continue
            if all(c in WS for c in b):
                sets["blank"].append(tid)
            q = b.find(b'"')
            if q >= 0:
                sets["quote"].append(tid)
                if _may_hold_value_ends(b[q + 1:]):
                    sets["quote_whole"].append(tid)
            if any(c in _NUMBER_END for c in b):
                sets["delimiter"].append(tid)
            if _may_hold_value_ends(b):
                sets["whole"].append(tid)
        for name, ids in sets.items():
            setattr(self, name, np.array(ids, dtype=np.int64))


def token_sets(vocab: Vocabulary) -> _TokenSets:
    """Built once per vocabulary (~0.5 s for 152k tokens)."""
    return per_vocabulary(_TokenSets, vocab)


def _leaves_any(words: np.ndarray, ids: list[int]) -> bool:
    """The mask row `words` (uint32) allows some token besides `ids`."""
    rest = words.copy()
    clear_ids(rest, np.array(ids, dtype=np.int64))
    return bool(rest.any())


def _may_hold_value_ends(b: bytes) -> bool:
    """`b` may end a container, a string, a number or a literal."""
    if any(c in _CLOSE for c in b) or b.count(b'"') >= 2 or any(w in b for w in (b"true", b"false", b"null")):
        return True
    scalar = False
    for c in b:
        if c in b"-0123456789tfnrueals":
            scalar = True
        elif scalar and c in _NUMBER_END:
            return True
        else:
            scalar = False
    return False


_LARGEST_EXPONENT = 330  # (past it, and past the mantissa's own digits, a number reads as ±Infinity)


def _reachable_exponents(digits: bytes, most: int):
    """The exponents (ascending, at most `most`) that digits written after `digits` can make: any where `digits`
    reads as 0 (leading zeros are allowed), else `digits` itself and those it begins."""
    written = int(digits or b"0")
    if not written:
        yield from range(most + 1)
        return
    width = 1
    if written <= most:
        yield written
    while written * 10 ** width <= most:
        yield from range(written * 10 ** width, min((written + 1) * 10 ** width, most + 1))
        width += 1


def _past_doubles(number: bytearray) -> bool:
    """A number's text so far already reads as ±Infinity whatever digits follow: its exponent is not negative and
    it reads so now (more digits only make it larger; before the exponent, an `e-400` could still bring it back)."""
    at = max(number.rfind(b"e"), number.rfind(b"E"))
    if at < 0 or number[at + 1:at + 2] == b"-" or not number[-1:].isdigit():
        return False
    try:
        return math.isinf(float(number))
    except ValueError:
        return False


class _NotFinite(Exception):
    """A JSON number past the largest double: Python's float, and JavaScript, read it as ±Infinity (or one whose
    exponent is past what a Decimal holds, 10**18: no check can read it exactly)."""


def _finite_int(text: str) -> int:
    if len(text.lstrip("-")) > 309:  # (past 10**309, and past Python's 4,300 digits an int reads: a ValueError)
        raise _NotFinite(text)
    value = int(text)
    try:
        float(value)
    except OverflowError:
        raise _NotFinite(text) from None
    return value


class LateGrammar(CheckedGrammar):
    """A backend grammar compiled without the late keywords, whose matchers check them on governed values."""

    def __init__(self, inner: Grammar, plan: LatePlan, vocab: Vocabulary):
        super().__init__(inner)
        self.plan = plan
        self.tokens = token_sets(vocab)  # (built here, on a compile thread, if start-up did not)

    def matcher(self, lane: int = 0) -> "LateMatcher":
        inner = self.inner.matcher(lane)
        base = backend_matcher(inner)
        if isinstance(base, LlgMatcher):  # (a repeated key would change the parsed value these checks judge)
            base.write_distinct_keys()
        return LateMatcher(inner, LateTracker(self.plan, self.call_tag), self.tokens)


class LateMatcher(CheckedMatcher):
    """Refuses the tokens that would finish a governed value its schema refuses."""

    dead_end = "every token the output constraint allows here would finish a value its schema refuses (a oneOf, " \
               "not, contains or other keyword that is checked as each value is finished)"

    def __init__(self, inner: Matcher, tracker: LateTracker, tokens: _TokenSets):
        super().__init__(inner, tokens.token_bytes, tracker.plan.walk_values())
        self.tracker = tracker
        self.tokens = tokens
        self._verdicts: dict[tuple[int, bytes], bool] = {}  # this step's, by subschema and the value's text
        self._allowed_here: np.ndarray | None = None  # this step's mask row while a check is active (`vet`)

    def _active(self) -> bool:
        return self.tracker.mode != "off" and self.tracker.in_json

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, tokens_left: int | None = None) -> None:
        super().fill_bitmask(bitmask, row, tokens_left)
        self._allowed_here = bitmask[row].numpy().view(np.uint32).copy() if self._active() else None

    def vet(self, token_id: int, tokens_left: int | None) -> int:
        """Also one token of lookahead: a token after which every token the grammar allows would finish a
        refused value (`-0` where integers and numbers >= 0 overlap in a oneOf: it can only end as 0, which both
        accept) is replaced by another this step allows, the first (one-byte tokens first) with a way on."""
        vetted = super().vet(token_id, tokens_left)
        allowed, self._allowed_here = self._allowed_here, None
        if allowed is None or not self._dead_end_after([vetted]):
            return vetted
        candidates = allowed_ids(allowed)  # (the row as filled: the refused tokens are cleared already)
        short = np.array([len(self.token_bytes[t] or b"") == 1 for t in candidates], dtype=bool)
        for alternative in np.concatenate([candidates[short], candidates[~short]])[:_LOOKAHEAD_TRIES].tolist():
            if alternative != vetted and not self._dead_end_after([alternative]):
                return alternative
        return vetted  # no way on found: the dead end ends the output at the next step, as before

    def _dead_end_after(self, path: list[int], blanks: int = _LOOKAHEAD_BLANKS) -> bool:
        """Whether every token the grammar allows after `path` would finish a value the checks refuse, or would
        give up (llguidance's lexer limits). Whitespace does not count as a way on: where nothing else is left,
        the tokens after it are looked at too, up to `blanks` deep (`{"a": 0` where `{"a": 0}` would repeat an
        item: only ` ` may follow, and only `}` after it)."""
        base = backend_matcher(self.inner)
        data = b"".join(self.token_bytes[t] or b"" for t in path)
        if not data:
            return False
        try:
            words = base.mask_after(path)
        except ConstraintError:  # llguidance's lexer limits: the output would end there with that error
            return True
        if words is None or not words.any():
            return False
        here = self.tracker
        self.tracker = here.fork()
        try:
            self._feed(data)
            if self._exponent_leads_nowhere():
                return True
            suspects = self._suspects()
            if suspects is not None:  # a token that can finish no value and is no whitespace is a way on (cheap:
                # most rows have one, and `_refused` judges each suspect in turn)
                free = words.copy()
                clear_ids(free, suspects)
                clear_ids(free, self.tokens.blank)
                if free.any():
                    return False
            refused = self._refused(words)
        finally:
            self.tracker = here
        rest = words.copy()
        clear_ids(rest, refused)
        blank = allowed_among(rest, self.tokens.blank)
        clear_ids(rest, blank)
        if rest.any():
            return False
        if not len(blank):
            return True
        return blanks > 0 and all(self._dead_end_after(path + [t], blanks - 1)
                                  for t in blank[:_LOOKAHEAD_TRIES].tolist())

    def _exponent_leads_nowhere(self) -> bool:
        """A checked number whose exponent is written without a `-` can only grow it, digit by digit: whether no
        exponent it can still reach finishes a value the checks take (`765e2`, `1.5e+` under `not: {type:
        integer}`: every one reads as an integer; a digit is always a way on to the one-token lookahead, and the
        walk ran into the dead end, most walks of a random model). Each reachable exponent is judged once, up to
        where the number reads as ±Infinity."""
        t = self.tracker
        buf = bytes(t.buf)
        at = max(buf.rfind(b"e"), buf.rfind(b"E"))
        if t.mode != "number" or not t.pending or at < 0:
            return False
        after = buf[at + 1:]
        if not after or after.startswith(b"-"):
            return False  # (a `-` may still come, or has)
        digits = after.lstrip(b"+")
        written = int(digits or b"0")
        for exponent in _reachable_exponents(digits, _LARGEST_EXPONENT + len(buf)):
            suffix = str(exponent)[len(str(written)):].encode() if written else str(exponent).encode()
            if _past_doubles(bytearray(buf + suffix)):
                return True  # (this one and every larger one read as ±Infinity)
            fork = t.fork()  # (ended by a comma, which finishes the number alone; what the container's members
            fork.feed(suffix + (b"," if fork.stack else b""))  # ask of a comma is not the number's to answer)
            checked = fork.finished if fork.stack else fork.root_scalar()
            if all(self._holds(check, text) for check, text in checked):
                return False
        return True

    def _suspects(self) -> np.ndarray | None:
        """Tokens that may finish a checked value from here (see `_TokenSets`; None: any allowed token)."""
        t, sets = self.tracker, self.tokens
        in_string = t.mode in ("string", "key")
        if t.mode in ("member", "key") and any(p.members.evaluated is not None for p in t.members_checked()):
            # (a key's every byte, and a quote that opens one: `EvaluatedNames`)
            return None if t.mode == "key" else np.concatenate([sets.quote, sets.whole])
        if t.mode == "key" and t.stack[-1].keys is not None:
            return sets.quote  # (a repeated key is refused as its quote closes; every other suspect holds a quote)
        if t.mode == "number" and t.pending and ((exponent_digits(bytes(t.buf)) or 0) >= 2
                                                 or (len(t.buf) > 300 and b"e" in t.buf.lower())):
            return None  # (a digit that takes it past the doubles: `_past_doubles`)
        if not t.pending or len(t.stack) > t.pending[-1].depth:  # (none, or inside the innermost: it or one in it)
            if not t.members_checked():
                return sets.quote_whole if in_string else sets.whole
            if t.mode == "literal":
                return None
            return sets.quote if in_string else np.concatenate([sets.whole, sets.delimiter])
        if in_string:
            return sets.quote
        if t.mode == "literal":
            return None  # (its few continuations)
        if not t.stack:  # a number at the root: ended by the end of output
            return np.concatenate([sets.delimiter, sets.eos])
        return sets.delimiter

    def _refused(self, words: np.ndarray) -> np.ndarray:
        """The tokens that finish a refused value; and those that repeat a key where the backend counts pairs,
        unless nothing else is left (the key may have no other ending: the late count still decides then)."""
        self._verdicts = {}
        suspects = self._suspects()
        ids = (allowed_ids(words) if suspects is None else allowed_among(words, suspects)).tolist()
        refused, repeating = [], []
        for t in ids:
            finishes_refused, repeats_key = self._verdict(self.tokens.token_bytes[t] or b"")
            if finishes_refused:
                refused.append(t)
            elif repeats_key:
                repeating.append(t)
        if repeating and _leaves_any(words, refused + repeating):
            refused += repeating
        return np.array(refused, dtype=np.int64)

    def _refuses(self, data: bytes) -> bool:
        return any(self._verdict(data))

    def _verdict(self, data: bytes) -> tuple[bool, bool]:
        """Whether `data` finishes a governed value its schema refuses (b"": the output ends here), and whether
        it repeats a key (`LateTracker.repeated_key`)."""
        if not data:
            return not all(self._holds(check, text) for check, text in self.tracker.root_scalar()), False
        fork = self.tracker.fork()
        fork.feed(data)
        refused = fork.member_refused or not all(self._holds(check, text) for check, text in fork.finished)
        return refused, fork.repeated_key

    def _holds(self, check: Check, text: bytes) -> bool:
        try:
            readings = _readings(text)  # (exact: `0.3` is a multiple of 0.1, QA fuzz4 F1)
        except _NotFinite:
            return False  # (read as ±Infinity: `1e500` passed `not: {type: integer}`, QA testsuite F1)
        except ValueError:
            return True  # (not JSON: the backend's grammar refuses it anyway)
        return any(all(self._valid(node, text, readings) for node in alt) for alt in check)

    def _valid(self, node: dict, text: bytes, readings: list[Any]) -> bool:
        key = (id(node), text)
        if key not in self._verdicts:
            self._verdicts[key] = all(self.tracker.plan.holds(node, value) for value in readings)
        return self._verdicts[key]

    def _feed(self, data: bytes) -> None:
        self.tracker.feed(data)
        self.tracker.finished.clear()

    judges_walks = True

    def _fork(self) -> LateTracker:
        return self.tracker.fork()

    def _refused_after(self, fork: LateTracker, ends: bool) -> bool:
        checked = fork.finished + (fork.root_scalar() if ends else [])
        return fork.member_refused or fork.repeated_key or not all(self._holds(check, text) for check, text in checked)

    def is_terminated(self) -> bool:
        return self.inner.is_terminated() and not self._refuses(b"")

    def can_end(self) -> bool:
        return self.inner.can_end() and not self._refuses(b"")
