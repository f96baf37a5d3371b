"""Exact schema rewrites: turn keywords no backend enforces into enforceable equivalents, or drop them when provably
redundant. Every rewrite preserves the set of accepted instances exactly; when a proof is out of reach the keyword
is left alone (and the backend then refuses it in strict mode, with its pointer).

Rewrites (each unit-tested with jsonschema on accepted and refused documents, tests/constrain/test_rewrite.py):
- keywords of a type the node's `type` does not take (`minimum` beside `type: string`) say nothing: dropped;
- finite values: a node with `enum`/`const` (directly or in an `allOf` member) accepts exactly those of its values
  that validate against the whole node: it becomes `{"enum": [those values]}` (decided by jsonschema as
  `validator_class` reads the schema, `multipleOf` in decimal, in the root's $ref context; skipped when a
  `format` could be involved, since jsonschema does not assert formats, or a `pattern`/`patternProperties`, since
  Python's backtracking `re` must never run a client's regex);
- a `pattern` or a `patternProperties` name that opens with `^` and lookaheads (`^(?!draft-)...`) becomes the one
  anchored pattern they and the rest mean (constrain/regex_sets.py: neither backend reads lookarounds);
- a `pattern` with a long count at a side it does not anchor (`\\p{L}{1,255}`) becomes the anchored pattern of
  the strings it finds a match in (llguidance unrolls the count until it gives up mid-output);
- a `format` JSON Schema does not define (`url`, `int64`, ...) is an annotation: dropped; `uri-reference`,
  `iri`, `iri-reference`, `uri-template`, `json-pointer` and `relative-json-pointer` (regular RFC grammars
  llguidance has no matcher for) and `date`, `time`, `date-time` (which its matchers take too loosely) become the
  grammar's `pattern` (constrain/formats.py);
- `oneOf` whose branches are pairwise provably disjoint is an `anyOf` (types, finite value sets, a required
  property whose values are disjoint or that one branch forbids); any other `oneOf` of up to 8 branches is
  `anyOf` over i of (Bi and not Bj for every j != i), when each `not Bj` has a `not`-free form (below; this
  covers the "exactly one of these property sets" idiom, `oneOf` of branches that only require properties);
- `not S` becomes a `not`-free schema keyword by keyword: a value fails S iff its type is not allowed or it fails
  one keyword of its type, so the negation is an `anyOf` of pieces: the complementary `type`; for `properties`,
  the property present with a value failing its schema; for `required`, a name absent (`properties: {a:
  false}`); `min/maxLength`, `min/maxItems`, `minimum`/`maximum` (and the exclusive forms) flipped; `enum`/`const`
  of strings, numbers, booleans and null by the other values (strings by a complement pattern of their trie,
  numbers by the open intervals between them); `pattern`
  by its complement pattern (constrain.regex_sets.py); `anyOf`, `allOf` and `not` by De Morgan. It is
  computed among the values the surrounding schema allows, which makes some negations possible that are not
  alone: `not: {type: integer}` among integers is nothing, while alone it would be "a number with a fraction",
  which no keyword says. Out of reach (the `not` or `oneOf` is left alone): patterns beyond regular expressions
  or too large to complement, `format`, `multipleOf`, `items`, `additionalProperties` (except between closed
  objects), `patternProperties`, `propertyNames`, `dependencies`, `if`, `min/maxProperties`, `uniqueItems`,
  enums of objects or arrays;
- `if A then B else C` becomes `anyOf: [A and B, (not A) and C]` (without `then`: A or C; without `else`: B or
  not A), when `not A` has a `not`-free form as above; `then`/`else` without `if` are dropped; `allOf` members
  that are `if`/`then` on one property's `const` become one `anyOf` together (`_discriminated_conditionals`);
- an integer node (`null` and `boolean` besides, or not) between bounds of at most 1,024 integers that still holds
  a `not` or `if` (none of the forms above) becomes the `enum` of the values it accepts (constrain/finite_values.py);
- a `patternProperties` pattern whose schema asserts nothing, where other names may hold anything too, is dropped;
- a `$ref` whose target accepts nothing becomes `false` (`_references_to_nothing`);
- `uniqueItems: false` dropped; `uniqueItems: true` dropped when at most one item is allowed, and turned into
  `maxItems: 1` when every item must equal one constant; over items of at most 64 values (constrain/finite_values.py)
  it bounds `maxItems` by their number;
- `contains: C` on arrays of at most 8 items (2020-12): an `anyOf` over the position of an item valid against C
  (`prefixItems` of `true`s then C, with the `minItems` that puts an item there); where no count of items meets it
  (C is `false` and an item must hold it, `minContains` above `maxContains` or `maxItems`), the node's other types,
  or `false`;
- `dependentRequired`/`dependencies` (array form) on a required property: its dependents become required; when
  already required, dropped; `dependentSchemas`/`dependencies` (schema form) on a required property of a node
  that takes objects only: `allOf` (elsewhere a value of another type holds every dependency);
  otherwise, for at most 5 triggers, `anyOf: [{"properties": {k: false}}, {"required": [k, ...]}]` per trigger.
  `dependencies` keeps its draft 4-7 meaning in every draft (see `validator_class`);
- `minProperties` implied by `required`, `maxProperties` implied by a closed `properties` list: dropped; other
  min/maxProperties become an anyOf of few alternatives of which optional properties are present (each requires
  or forbids them: llguidance counts keys only then);
- `propertyNames` with finitely many names (an enum): each becomes a declared property (its declared schema, else
  `additionalProperties`) with `additionalProperties: false`; other `propertyNames` that only constrains strings
  (`pattern`, lengths): the keys other than the declared ones
  become `patternProperties: {those names: additionalProperties}` with `additionalProperties: false`, and a
  declared property whose name it refuses is forbidden (decided on automata, never by running the regex); any
  other `propertyNames` on a closed object: dropped, after the same forbidding (decided by jsonschema);
- overlapping `patternProperties`: one pattern per region of names matched by exactly a set of the patterns;
- a declared property whose name a `patternProperties` regex also matches takes that pattern's schema into its own
  (unless equal but for annotations), and the pattern is cut down to the names no property declares;
- a `$ref` to a recursive definition where it meets other keywords (an `allOf` member, an `anyOf`/`oneOf` branch
  beside other keywords, a `$ref` with siblings) is replaced by a copy of its target (llguidance cannot intersect a
  definition it is still compiling); inside such a copy, a `type` that the branches imply anyway is dropped
  beside a branch back to the definition being copied.

Before anything, a keyword the draft a node is read in does not define (draft 4's `const`, ...), and in drafts 4-7
one beside a `$ref`, is left out where the node does not only assert (under `not`, in a `oneOf` member, an `if`, a
`contains`): the draft reads it as nothing there (`as_read_where_unasserted`; constrain/spec.py's `_ref_siblings`
runs it first). What it leaves of a later draft's keywords (draft 7's `const`, ..., 2020-12's `prefixItems`) the
rewrites read as that draft defines them (`validator_class`'s `later_keywords`), as the late checks do; its
`prefixItems` becomes the draft's own `items` list (`_prefix_items_as_items`), draft 4's `const` the `enum` of its
value (`_const_as_enum`). Then `unevaluatedProperties` (2019-09 and later) whose evaluated properties are known
without the value (those named beside it and through `allOf` and local `$ref`s, where no `anyOf`, `oneOf`, `if`...
among them evaluates another name) becomes `additionalProperties` on the node with those names declared there, or
is dropped where an `additionalProperties` among them evaluates everything already. The rest is skipped entirely
for schemas still using `unevaluated*`, `$dynamicRef`/`$recursiveRef`, or a nested `$id` that moves what a `$ref`
inside it means (their meaning depends on context a local rewrite cannot see; a nested `$id` no `$ref` resolves
against changes nothing).
"""

from __future__ import annotations

import copy
import fractions
import functools
import itertools
import json
import math
from typing import Any, Callable
from urllib.parse import quote, unquote

import attrs
import jsonschema

from constrain.finite_values import finite_values, integer_range
from constrain.formats import LIBRARY_FORMATS, NATIVE_FORMAT_PATTERNS, format_pattern
from constrain.pattern_dialects import portable_pattern, widest_pattern
from constrain.regex_sets import (Work, complement_pattern, disjoint_regions, finite_language, regex_char,
                                  search_region, without_lookaheads)
from constrain.support import (ASSERTIONS, NAMED_SUBSCHEMAS, STANDARD_FORMATS, copy_reads_alike, escape_pointer_part,
                               gives_another_base, json_type, keep_ref_targets, map_subschemas, nested_bases,
                               node_dialects, recursive_targets, references_followable, resolve_ref, pointer_child,
                               unescape_pointer_part, walk, walk_with_refs)

_ALL_TYPES = frozenset({"null", "boolean", "object", "array", "string", "integer", "fraction"})
_ANNOT = frozenset({"$schema", "$id", "id", "$comment", "title", "description", "default", "examples", "example",
                    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "$anchor", "markdownDescription"})
_UNDECIDABLE_KEYS = ("format", "pattern", "patternProperties")
_MAX_ONEOF = 64  # branches checked pairwise
_MAX_ONEOF_NEGATED = 8  # oneOf branches rewritten through their negations
_MAX_ONEOF_NEGATION_PIECES = 64  # negation pieces one such branch multiplies
_MAX_ONEOF_VALUES = 64  # a oneOf of at most this many values, none negated, as their enum
_MAX_LATE_INTEGERS = 1024  # a bounded integer node left to a late check: integers in range listed as its enum
_MAX_LATE_INTEGERS_LISTED = 4096  # those one schema may list (each checked by jsonschema: ~60 us; ~0.25 s in all)
# ... and the subschemas those checks may read in all (an integer's check reads each its node holds or reaches): a
# node whose `not` held an `anyOf` of 100 multiples took 1.4 s to list, four of 1,000 82 s
_MAX_LATE_INTEGER_READS = 32_768
_EXACT_INTEGERS = 2 ** 53  # integers a 64-bit float holds exactly: llguidance reads an enum's numbers so
_MAX_COUNT_ANYOF = 16  # min/maxProperties: alternatives of which declared properties are present
_MAX_UNIQUE_DOMAIN = 64  # uniqueItems: items with at most this many values bound maxItems (outlines unrolls it)
_REGEX_NFA_STATES, _REGEX_DFA_STATES = 20_000, 1_000  # regex work one schema may cause (regex_sets.Work): ~1.5 s
# A `pattern`'s length as `_search_counts` gets it: each `\p{...}` spelled out as its characters (~9,400 for \p{L};
# [\p{L}\p{N}] ~11,600). A long class is one NFA edge: its cost is in its ranges (~0.1 s at this length).
_REGEX_PATTERN_CHARS = 24_000
_MAX_DEP_ANYOF = 5  # dependency triggers turned into anyOf (2^n alternatives; at 7, llguidance ran out of parser items)
_CONTEXT_KEYS = ("unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef", "$recursiveAnchor",
                 "$dynamicAnchor")


def _equal(a: Any, b: Any) -> bool:
    """JSON equality as JSON Schema defines it (1 == 1.0, true != 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _iter_nodes(node: Any):
    """Every dict reachable in the schema document (subschemas and keyword values alike)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            yield n
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)


def _has_key(node: Any, key: str) -> bool:
    return any(key in n for n in _iter_nodes(node))


def validator_class(root: dict, later_keywords: bool = False) -> type:
    """The schema's draft (2020-12 when it names none) as the product reads it. With the dependency keywords of every
    draft: a schema that writes `dependencies` means its draft 4-7 sense, whatever draft it declares (2019-09 split
    it into `dependentRequired` and `dependentSchemas` and left the old name without meaning, so a 2020-12 validator
    would ignore it); enforcing the keyword keeps every output valid under either reading. With `multipleOf` in
    decimal, each number as written (a float as its shortest repr), as JSON Schema defines it and as the grammars
    and the late checks read it (constrain/late_keywords.py): jsonschema divides floats, 0.3 / 0.1 =
    2.9999999999999996. In draft 4, with a numeric `exclusiveMinimum`/`exclusiveMaximum` and a boolean `items` as
    the later drafts read them (`_bound_beside_flag`).
    With `later_keywords`, for a schema `as_read_where_unasserted` has read (the rewrites', the late checks'), also
    with the keywords of a later draft its draft does not define at all (`later_keyword_validators`), as the later
    draft defines them: what that left of them stands where a node only asserts, and is enforced (README, Drafts).
    Read as the draft reads them, as nothing, draft 4's `contains` and `propertyNames` and draft 6's `if` kept
    every value: the late checks let `{"v": []}` through `contains: {"enum": [2]}`, and an enum kept members they
    refuse (QA typedrop F6); draft 7's `prefixItems: [{"type": "integer"}]` took `["a"]`.
    Never for a client's schema as it is: under a `not` or in a `oneOf` member the draft's reading is meant."""
    cls = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
    return _as_the_product_reads(cls, later_keywords)


def later_keyword_validators(cls: type) -> dict[str, Callable]:
    """The validators of the keywords a later draft defines and `cls`'s draft does not define at all, as the
    draft that brought each one in defines it: draft 7's `const`, `contains`, `propertyNames`, `if` (in draft 4
    and 6); 2019-09's `unevaluatedProperties` and `unevaluatedItems`, which read `items` lists and
    `additionalItems` as drafts 4-7 do, and its `minContains`/`maxContains` (drafts 4-7); 2020-12's `prefixItems`
    (drafts 4 to 2019-09). Such a keyword is enforced where it stands, so an answer is valid under either
    reading: an old draft's `items` still applies to every item beside a `prefixItems`, and `contains` asks for
    one item at least whatever `minContains` says (`_contains_in_both`)."""
    draft7, draft2019, draft2020 = (d.VALIDATORS for d in (jsonschema.Draft7Validator, jsonschema.Draft201909Validator,
                                                          jsonschema.Draft202012Validator))
    out = {key: draft7[key] for key in ("const", "contains", "propertyNames", "if") if key not in cls.VALIDATORS}
    if "unevaluatedItems" not in cls.VALIDATORS:
        out.update({key: draft2019[key] for key in ("unevaluatedProperties", "unevaluatedItems")},
                   contains=_contains_in_both(draft2019["contains"]))
    if "prefixItems" not in cls.VALIDATORS:
        out["prefixItems"] = draft2020["prefixItems"]
    return out


@functools.cache
def later_keywords_of(dialect: str) -> frozenset[str]:
    """The keywords `later_keyword_validators` brings to the draft `dialect` names, those its validators read beside
    them too (`then`, `else`, `minContains`, `maxContains`)."""
    root = {"$schema": dialect}
    return _keywords_read(validator_class(root, later_keywords=True)) - _keywords_read(validator_class(root))


def _contains_in_both(counted: Callable) -> Callable:
    """2019-09's `contains` (`counted`), which counts the items it takes against `minContains`/`maxContains`, in a
    draft before it, whose `contains` asks for one such item at least: `minContains: 0` allows none only in
    2019-09 on."""
    def check(validator, contains, instance, schema):
        least = schema.get("minContains", 1)
        floored = {**schema, "minContains": 1} if isinstance(least, int) and not isinstance(least, bool) and \
            least < 1 else schema
        yield from counted(validator, contains, instance, floored)
    return check


@functools.cache
def _as_the_product_reads(cls: type, later_keywords: bool = False) -> type:
    extra = {}
    if later_keywords:
        extra.update(later_keyword_validators(cls))
    for draft in (jsonschema.Draft7Validator, jsonschema.Draft202012Validator):
        for key in ("dependencies", "dependentRequired", "dependentSchemas"):
            if key in draft.VALIDATORS and key not in cls.VALIDATORS:
                extra[key] = draft.VALIDATORS[key]
    if "multipleOf" in cls.VALIDATORS:
        extra["multipleOf"] = _exact_multiple_of
    if "exclusiveMinimum" not in cls.VALIDATORS:  # (draft 4: a flag beside `minimum`)
        later = jsonschema.Draft6Validator.VALIDATORS
        for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            extra[bound] = _bound_beside_flag(cls.VALIDATORS[bound], later[bound], flag)
            extra[flag] = _numeric_exclusive(later[flag])
        extra["items"] = later["items"]  # (the same for a list or an object; a boolean, too)
    return read_in_dialects(jsonschema.validators.extend(cls, extra), later_keywords=later_keywords)


# Draft 4 has no boolean subschemas, and its exclusive bounds are flags beside `minimum`/`maximum` (a number there,
# or `items: false`, is no valid draft-4 schema). The rewrites write the later drafts' forms (the negation of
# `maximum: 5` is `exclusiveMinimum: 5`, shared bounds, intervals between values; items that take no value are
# `false`), which the backends read so, and so does the product. Draft 4 as jsonschema reads it took the number
# for nothing, and as a flag beside a `minimum`, and failed on `items: false` (QA typedrop: the late checks, which
# read the rewritten schema, let `0` through `not: {oneOf: [{not: {maximum: 1}}, {multipleOf: 0.5}]}`, and took
# every value for invalid where `items: false` was in a `oneOf` branch, so that no answer could end).
def _bound_beside_flag(draft4: Callable, later: Callable, flag: str) -> Callable:
    def check(validator, value, instance, schema):
        return (draft4 if isinstance(schema.get(flag), bool) else later)(validator, value, instance, schema)
    return check


def _numeric_exclusive(later: Callable) -> Callable:
    def check(validator, value, instance, schema):
        if not isinstance(value, bool):
            yield from later(validator, value, instance, schema)
    return check


def _exact_multiple_of(validator, divisor, instance, schema):
    """Exact: the number as written in decimal (a float's shortest repr, an int as it is) over the divisor."""
    if not validator.is_type(instance, "number"):
        return
    try:
        quotient = fractions.Fraction(repr(instance)) / fractions.Fraction(repr(divisor))
    except (ValueError, OverflowError):  # inf: a number too large for a double
        yield jsonschema.ValidationError(f"{instance!r} is not a finite number")
        return
    if quotient.denominator != 1:
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {divisor!r}")


def read_in_dialects(cls: type, of_draft: Callable[[type], type] = lambda cls: cls,
                     later_keywords: bool = False) -> type:
    """`cls` (a class jsonschema.validators.create or extend made; set in place) whose `evolve` reads a subschema
    that names a `$schema` (the root itself, checked as a node or reached by `$ref: "#"`; a function's draft-04
    parameters) in `of_draft(validator_class(subschema, later_keywords))`: that draft as the product reads it.
    jsonschema's own `evolve` (which `descend` and `$ref` go through too) takes the draft's plain class there, which
    reads no `dependencies` from 2019-09 on (QA typedrop P1: a 2020-12 root's `enum` kept a member its
    `dependencies` refuses) and drops whatever `cls` adds."""
    def evolve(self, **changes):
        schema = changes.get("schema", self.schema)
        dialect = isinstance(schema, dict) and isinstance(schema.get("$schema"), str)
        new = of_draft(validator_class(schema, later_keywords)) if dialect else type(self)
        fields = {f.alias: getattr(self, f.name) for f in attrs.fields(type(self)) if f.init}
        return new(**{**fields, **changes})

    cls.evolve = evolve
    return cls


class _Ctx:
    def __init__(self, root: dict):
        self.root = root
        self.validator = validator_class(root, later_keywords=True)(root)  # (`root` as_read_where_unasserted read)
        # (the draft's own keywords, without a later draft's it lacks: which of `items`/`prefixItems` writes a tuple)
        self.draft_keywords = validator_class(root).VALIDATORS
        self.root_decidable = self.decidable(root)
        self.changed = False
        self.regex_work = Work(_REGEX_NFA_STATES, _REGEX_DFA_STATES)  # shared by all of this schema's patterns
        # `_search_counts`' own budget: it reads longer patterns (`pattern` values only, which limits.py holds to
        # 2,000 characters before their `\p{..}` are spelled out; names may be much longer).
        self.search_work = Work(_REGEX_NFA_STATES // 4, _REGEX_DFA_STATES // 4, max_chars=_REGEX_PATTERN_CHARS)
        self.complements: dict[str, str | None] = {}  # a oneOf negates each branch once per other branch
        self.regions: dict[tuple[str, ...], list | None] = {}  # `_joined_patterns`' partitions
        self.inlining: set[str] = set()  # the `$ref`s `_inlined_patterns` is copying the targets of
        self.pattern_copies = _MAX_PATTERN_COPIES  # schema objects `_inlined_patterns` may still copy
        self.integers_to_list = _MAX_LATE_INTEGERS_LISTED  # integers `_late_integers_as_enum` may still check
        self.integer_reads = _MAX_LATE_INTEGER_READS  # subschemas its checks may still read
        self.refs = refs_in(root)
        # (pointer of a node holding a `$ref`, the pointer the `$ref` names), for local `$ref`s (`_asserted`): `#`,
        # the root's, too, and those in subschemas only a `$ref` reaches (QA review8 F2)
        self.ref_sources = _ref_sources(root)
        self.here = ""  # the pointer of the node the rewrite steps are given (`_rewrite`)
        self.one_ofs_apart: dict[str, bool] = {}  # (`one_of_apart`, by pointer)

    def resolve(self, ref: Any) -> Any:
        return resolve_ref(self.root, ref)

    def one_of_apart(self, ptr: str) -> bool:
        """The node at `ptr` holds a `oneOf` whose branches take values of pairwise disjoint types (`_asserted`).
        `ptr` is a plain JSON Pointer, percent-encoded to resolve: `#/properties/a%20b` names `a b`, and a property
        `a%20b` beside a `oneOf` of disjoint types in `a b` had its own `oneOf` of overlapping branches narrowed."""
        if ptr not in self.one_ofs_apart:
            node = self.resolve("#" + quote(ptr))
            branches = node.get("oneOf") if isinstance(node, dict) else None
            kinds = [self.types(b) for b in branches] if isinstance(branches, list) else None
            self.one_ofs_apart[ptr] = kinds is not None and all(
                not (a & b) for i, a in enumerate(kinds) for b in kinds[i + 1:])
        return self.one_ofs_apart[ptr]

    def is_valid(self, schema: Any, value: Any) -> bool:
        return self.validator.evolve(schema=schema).is_valid(value)

    def decidable(self, schema: Any) -> bool:
        """jsonschema decides `schema` exactly and safely: no `format` (it does not assert formats) and no regex
        of the client's (`pattern`, `patternProperties`: Python's backtracking `re` can run for hours on a crafted
        pattern, holding the GIL and so stalling the whole server). Through a `$ref`, the whole document counts."""
        if _has_key(schema, "$ref") and schema is not self.root:
            return self.root_decidable
        return not any(_has_key(schema, k) for k in _UNDECIDABLE_KEYS)

    # ---- what a schema can accept, over-approximated ---------------------------------------------------------
    def types(self, s: Any, depth: int = 0, seen: dict[int, tuple[Any, frozenset]] | None = None) -> frozenset:
        """The JSON types `s` may accept (over-approximated). Each subschema is judged once a call (`seen`): a
        chain of definitions, each an `anyOf` of references to the next, took exponential time (QA review3 F1: 22
        s for 1.5 KB, under `contains`)."""
        if seen is None:
            seen = {}
        if id(s) in seen and seen[id(s)][0] is s:
            return seen[id(s)][1]
        out = self._types(s, depth, seen)
        seen[id(s)] = (s, out)
        return out

    def _types(self, s: Any, depth: int, seen: dict[int, tuple[Any, frozenset]]) -> frozenset:
        if s is True or depth > 20:
            return _ALL_TYPES
        if s is False:
            return frozenset()
        if not isinstance(s, dict):
            return _ALL_TYPES
        out = set(_ALL_TYPES)
        t = s.get("type")
        if isinstance(t, str):
            t = [t]
        if isinstance(t, list):
            allowed = set()
            for x in t:
                if x == "number":
                    allowed |= {"integer", "fraction"}
                elif x in _ALL_TYPES:
                    allowed.add(x)
                else:
                    return _ALL_TYPES  # unknown type name: stay conservative
            out &= allowed
        vals = self.values(s)
        if vals is not None:
            out &= {json_type(v) for v in vals}
        if "$ref" in s:
            target = self.resolve(s["$ref"])
            if target is not None:
                out &= self.types(target, depth + 1, seen)
        for m in s.get("allOf", []) if isinstance(s.get("allOf"), list) else []:
            out &= self.types(m, depth + 1, seen)
        for key in ("anyOf", "oneOf"):
            if isinstance(s.get(key), list):
                u = set()
                for m in s[key]:
                    u |= self.types(m, depth + 1, seen)
                out &= u
        return frozenset(out)

    @staticmethod
    def values(s: Any) -> list | None:
        """A finite list containing every value `s` accepts (None: not known to be finite)."""
        if not isinstance(s, dict):
            return None
        if "const" in s:
            return [s["const"]]
        if isinstance(s.get("enum"), list):
            return list(s["enum"])
        for m in s.get("allOf", []) if isinstance(s.get("allOf"), list) else []:
            if isinstance(m, dict) and "$ref" not in m:
                v = _Ctx.values(m)
                if v is not None:
                    return v
        return None

    def required(self, s: dict) -> set:
        req = set(s.get("required", [])) if isinstance(s.get("required"), list) else set()
        for m in s.get("allOf", []) if isinstance(s.get("allOf"), list) else []:
            if isinstance(m, dict):
                req |= self.required(self._deref(m))
        return req

    def _deref(self, s: Any, depth: int = 0) -> Any:
        while isinstance(s, dict) and set(s) - _ANNOT == {"$ref"} and depth < 20:
            t = self.resolve(s["$ref"])
            if t is None:
                return s
            s, depth = t, depth + 1
        return s

    def prop_schema(self, s: dict, name: str) -> Any:
        """A schema every value of property `name` satisfies in objects `s` accepts (a superset is fine)."""
        props = s.get("properties")
        if isinstance(props, dict) and name in props:
            return props[name]
        # (with patternProperties the name may match one: the client's regexes are never run, see `decidable`)
        if s.get("additionalProperties") is False and not s.get("patternProperties"):
            return False
        for m in s.get("allOf", []) if isinstance(s.get("allOf"), list) else []:
            if isinstance(m, dict):
                sub = self.prop_schema(self._deref(m), name)
                if sub is not True:
                    return sub
        return True

    def disjoint(self, a: Any, b: Any, depth: int = 0) -> bool:
        """True only when no JSON value validates against both `a` and `b` (False: unknown)."""
        if depth > 8:
            return False
        a, b = self._deref(a), self._deref(b)
        common = self.types(a) & self.types(b)
        if not common:
            return True
        for x, y in ((a, b), (b, a)):
            vals = self.values(x)
            if vals is not None and isinstance(y, (dict, bool)) and self.decidable(y) \
                    and not any(self.is_valid(y, v) for v in vals):
                return True
        if common == {"object"} and isinstance(a, dict) and isinstance(b, dict):
            ra, rb = self.required(a), self.required(b)
            for name in ra | rb:
                pa, pb = self.prop_schema(a, name), self.prop_schema(b, name)
                if name in ra and name in rb and self.disjoint(pa, pb, depth + 1):
                    return True
                if (name in ra and pb is False) or (name in rb and pa is False):
                    return True
        return False


def rewrite_schema(schema: Any) -> Any:
    """An equivalent schema with the rewrites above applied (the input is never modified)."""
    if not isinstance(schema, dict):
        return schema
    schema = as_read_where_unasserted(schema)
    plain = _unevaluated_items_as_items(_unevaluated_as_additional(_unevaluated_saying_nothing(
        _prefix_items_as_items(_const_as_enum(schema)))))
    if plain is not schema:
        return rewrite_schema(plain)
    for n in _iter_nodes(schema):
        if any(k in n for k in _CONTEXT_KEYS):
            return schema
    if not references_followable(schema):
        return schema
    root = copy.deepcopy(schema)
    ctx = _Ctx(schema)  # validation and $ref resolution against the original: rewrites never change meaning
    try:
        out = _rewrite(root, "", ctx, ctx.refs)
        out = _inline_recursive_meetings(out, ctx)
        out = _references_to_nothing(out, ctx)
    except RecursionError:
        return schema
    return out if ctx.changed else schema


def _ref_sources(root: Any) -> list[tuple[str, str]]:
    """(pointer of a node holding a `$ref`, the pointer the `$ref` names), for the local `$ref`s of `root`."""
    return [(ptr[:-len("/$ref")], unquote(node["$ref"][1:])) for ptr, key, node in walk_with_refs(root)
            if key == "$ref" and isinstance(node["$ref"], str) and node["$ref"].startswith("#")]


@functools.cache
def _keywords_read(cls: type) -> frozenset:
    """The keywords validators of `cls` read: its own, and those its keywords read beside them (`if`'s `then` and
    `else`; 2019-09's `contains`, its `minContains` and `maxContains`; draft 4's `maximum`, its boolean
    `exclusiveMaximum`)."""
    known = set(cls.VALIDATORS) | {"exclusiveMaximum", "exclusiveMinimum"}
    if "if" in known:
        known |= {"then", "else"}
    if "unevaluatedProperties" in known:
        known |= {"minContains", "maxContains"}
    return frozenset(known)


@functools.cache
def _ignores_ref_siblings(cls: type) -> bool:
    """Validators of `cls` read nothing beside a `$ref` (drafts 4-7)."""
    return cls({"$ref": "#/definitions/a", "type": "string", "definitions": {"a": {}}}).is_valid(1)


# Every keyword some draft from 4 on reads (`validator_class` adds the dependency keywords to each).
_EVERY_KEYWORD = frozenset().union(*(_keywords_read(_as_the_product_reads(d))
                                     for d in (jsonschema.Draft4Validator, jsonschema.Draft6Validator,
                                               jsonschema.Draft7Validator, jsonschema.Draft201909Validator,
                                               jsonschema.Draft202012Validator)))
# Keywords whose value is one subschema, and those whose value is a list of them.
_ONE_SUBSCHEMA = frozenset({"items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
                            "unevaluatedItems", "unevaluatedProperties", "additionalItems"})
_SUBSCHEMA_LIST = frozenset({"items", "allOf", "anyOf", "oneOf", "prefixItems"})
_MAX_UNDEFINED_PASSES = 8


def as_read_where_unasserted(schema: dict) -> dict:
    """`schema` without the keywords the draft a node is read in does not define (draft 4's `const`, `contains`,
    `propertyNames`, `if`; draft 6's `if`; `dependentRequired` before 2019-09, ...), and in drafts 4-7 without
    those beside a `$ref` (which those drafts ignore), where that node is not only asserted (`_asserted`: below a
    `not`, an `if`, a `oneOf` member, a `contains`): the draft reads them as nothing, as its validator (and the
    late checks, constrain/late_keywords.py) do. Where a node only asserts, such a keyword stays and is enforced as
    a later draft reads it (`$ref` siblings as constrain/spec.py's `_ref_siblings` keeps them): an answer then
    meets it too, valid under either reading. Read so under a `not` (or where one member of a `oneOf` must fail),
    it let through what the draft refuses (draft 4's `{"type": "number", "not": {"const": 1}}`, which nothing
    satisfies, took -9: QA numbers F1; draft 7's `{"type": "string", "not": {"$ref": "#/definitions/s",
    "maxLength": 1}}` with `s` a string, "abc": QA fixdraft). A node is read in the draft of the nearest `$schema`
    above it (its own included; the root's otherwise), as the late checks read it (`_dialects`); the dependency
    keywords are read in every draft (`validator_class`). A `$ref` to or into a keyword left out names a copy of it
    under `$defs` (`keep_ref_targets`). A copy where one changes; `schema` itself otherwise (and where a `$ref`
    cannot be followed: which nodes are only asserted is then unknown)."""
    for _ in range(_MAX_UNDEFINED_PASSES):
        if not references_followable(schema):
            return schema
        drops = _undefined_in_unasserted(schema)
        bases = set(nested_bases(schema))
        if bases:  # (a keyword a `$ref` points into stays, read as before, where `keep_ref_targets` cannot copy it)
            targets = [target for _, target in _ref_sources(schema) if not copy_reads_alike(bases, "", target)]
            drops = [(ptr, key) for ptr, key in drops
                     if not any(t == (g := f"{ptr}/{escape_pointer_part(key)}") or t.startswith(g + "/")
                                for t in targets)]
        if not drops:
            return schema
        out = copy.deepcopy(schema)
        for ptr, key in drops:
            node = resolve_ref(out, "#" + quote(ptr))  # (a plain pointer: `a%20b` names `a%20b`)
            if isinstance(node, dict):
                node.pop(key, None)
        gone = [f"{ptr}/{escape_pointer_part(key)}" for ptr, key in drops]
        keep_ref_targets(schema, out, lambda ref: any((r := unquote(ref)[1:]) == g or r.startswith(g + "/")
                                                      for g in gone), copy.deepcopy)
        schema = out
    return schema


def _undefined_in_unasserted(root: dict) -> list[tuple[str, str]]:
    """(pointer of a node, keyword) for each keyword `as_read_where_unasserted` leaves out. The walk goes into the
    subschemas of the keywords the node's draft reads there (and of `$defs`/`definitions`), then those a `$ref`
    names that it did not reach (`#/definitions/a/full`, or inside a keyword kept as a later draft reads it)."""
    sources = _ref_sources(root)
    root_dialect = root.get("$schema")
    drops: list[tuple[str, str]] = []
    seen: set[str] = set()

    def reading(dialect: Any) -> type:
        return validator_class({"$schema": dialect} if dialect != root_dialect and isinstance(dialect, str) else root)

    def visit(node: Any, ptr: str, dialect: Any) -> None:
        if not isinstance(node, dict) or ptr in seen:
            return
        seen.add(ptr)
        dialect = node["$schema"] if isinstance(node.get("$schema"), str) else dialect
        cls = reading(dialect)
        read = _keywords_read(cls)
        siblings_ignored = "$ref" in node and len(node) > 1 and _ignores_ref_siblings(cls)
        if (siblings_ignored or any(key in _EVERY_KEYWORD and key not in read for key in node)) \
                and not _asserted_among(ptr, sources):
            if siblings_ignored:
                read = frozenset({"$ref"})  # (drafts 4-7 read nothing beside it)
            drops.extend((ptr, key) for key in node if key in _EVERY_KEYWORD and key not in read)
        for key, value in node.items():
            if key not in read and key not in ("$defs", "definitions"):
                continue  # (not a keyword of this draft: nothing in it is read as a subschema here)
            kp = f"{ptr}/{escape_pointer_part(key)}"
            if key in NAMED_SUBSCHEMAS and isinstance(value, dict):
                for name, sub in value.items():
                    visit(sub, f"{kp}/{escape_pointer_part(name)}", dialect)
            elif isinstance(value, list) and key in _SUBSCHEMA_LIST:
                for i, sub in enumerate(value):
                    visit(sub, f"{kp}/{i}", dialect)
            elif key in _ONE_SUBSCHEMA:
                visit(value, kp, dialect)

    visit(root, "", root_dialect)
    for _, target in sources:
        if target not in seen:
            dialect, node = root_dialect, root
            for part in target.split("/")[1:]:
                dialect = node["$schema"] if isinstance(node, dict) and isinstance(node.get("$schema"), str) \
                    else dialect
                node = pointer_child(node, part)[1]
            visit(node, target, dialect)
    return drops


def _references_to_nothing(root: Any, ctx: _Ctx) -> Any:
    """A local `$ref` whose target accepts nothing (`false`, or an `allOf` holding such a schema: what `not: {}`,
    the "disallowed" idiom `not` of every type, and a `oneOf` of equal branches rewrite to) becomes `false` itself.
    llguidance 1.9.1 refuses a reference to `false` ("Unsatisfiable schema"), where `false` in its place is only a
    property that may not appear (EDDN's schemas, JSONSchemaBench Github_medium o4179). A required property that
    became `false` makes its object impossible (`_impossible_keys`, which llguidance would not see: it drops such
    a key), which may make other references' targets accept nothing: passes until none changes."""
    for _ in range(_MAX_NOTHING_PASSES):
        if not isinstance(root, dict):
            return root
        verdicts: dict[str, bool] = {}

        def nothing(s: Any) -> bool:
            if s is False:
                return True
            if not isinstance(s, dict):
                return False
            members = s.get("allOf")
            if isinstance(members, list) and any(nothing(m) for m in members):
                return True
            ref = s.get("$ref")
            if not (isinstance(ref, str) and ref.startswith("#")):
                return False
            if ref not in verdicts:
                verdicts[ref] = False  # (a reference that reaches itself first accepts something, or loops: left)
                verdicts[ref] = nothing(resolve_ref(root, ref))
            return verdicts[ref]

        refs = refs_in(root)
        if not any(nothing({"$ref": r}) for r in refs):
            return root

        def replaced(s: Any) -> Any:
            if not isinstance(s, dict):
                return s
            if "$ref" in s and nothing(s):
                return False
            out = map_subschemas(s, replaced)
            return _impossible_keys(out, ctx) if out.get("properties") != s.get("properties") else out

        ctx.changed = True
        before, root = root, replaced(root)
        if isinstance(root, dict):  # (a `$ref` into a subschema that became `false` names a copy of what it named)
            keep_ref_targets(before, root, lambda ref: resolve_ref(root, ref) is None, copy.deepcopy)
    return root


_MAX_NOTHING_PASSES = 8


_LOWER_BOUNDS, _UPPER_BOUNDS = ("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")


def bounds_on_members(schema: Any) -> Any:
    """Each `allOf`/`anyOf`/`oneOf` member (but a `$ref`) also holds the numeric bounds of the node around it and,
    in an `allOf`, of its sibling members (the tighter where it has its own), down through nested members: the
    same instances, with every interval on one schema object. llguidance 1.x misreads an interval whose exclusive
    integer end lies less than 1 from its other end (constrain/late_keywords.py `misread_bounds`, which then has
    the number checked as it is finished), and that check reads one object: `maximum: 1.5` beside `not: {const:
    1}` (rewritten to `anyOf: [{exclusiveMaximum: 1}, {exclusiveMinimum: 1}]`) let `1` through. A copy where one
    changes; draft 4's boolean exclusive bounds are left alone. A `$ref` to (or into) a member that changed names
    the member as written, kept under `$defs` (`keep_ref_targets`): it took the bounds of a place it is not in,
    and refused valid values (QA review F4)."""
    if not isinstance(schema, dict) or not any(key in _LOWER_BOUNDS + _UPPER_BOUNDS for _, key, _ in walk(schema)):
        return schema
    root = json.loads(json.dumps(schema))  # (a tree: the rewrites share subschemas, which deepcopy would keep)
    changed: list[str] = []  # (the pointers of the members that took bounds)
    for ptr, key, node in walk(root):  # (parents before members: what a member receives it passes on)
        members = node[key] if key in ("allOf", "anyOf", "oneOf") and isinstance(node[key], list) else []
        members = [(i, m) for i, m in enumerate(members) if isinstance(m, dict) and "$ref" not in m]
        bounds = _plain_bounds([node] + [m for _, m in members] if key == "allOf" else [node])
        if bounds is None:
            continue
        for i, member in members:
            for k, v in bounds.items():
                merged = (max if k in _LOWER_BOUNDS else min)(member[k], v) if k in member else v
                if member.get(k) != merged:
                    member[k] = merged
                    changed.append(f"{ptr}/{i}")
    if not changed:
        return schema
    keep_ref_targets(schema, root, lambda ref: any(targeted(p, [ref]) for p in changed),
                     lambda target: json.loads(json.dumps(target)))
    return root


def _plain_bounds(nodes: list[dict]) -> dict | None:
    """The tightest value of each numeric bound among `nodes`; None where there is none, or a boolean (draft 4)
    exclusive bound."""
    out: dict = {}
    for node in nodes:
        for k in _LOWER_BOUNDS + _UPPER_BOUNDS:
            v = node.get(k)
            if isinstance(v, bool):
                return None
            if isinstance(v, (int, float)) and math.isfinite(v):
                out[k] = v if k not in out else (max if k in _LOWER_BOUNDS else min)(out[k], v)
    return out or None


def _unevaluated_as_additional(schema: dict) -> dict:
    """`unevaluatedProperties: U` (2019-09 and later) where the properties evaluated beside it are known without
    the value: the node and what applies with it through `allOf` and local `$ref`s (recursively) name them in
    `properties` and `patternProperties`, and the alternatives among them (`anyOf`, `oneOf`, `if`, ...) evaluate
    no other name (`_applying_with`). It then means `additionalProperties: U` on the node with every such name and
    pattern declared there (as `{}`, which asserts nothing); and nothing at all when one of them has
    `additionalProperties` (which evaluates every other property) or its own `unevaluatedProperties`. Not where a
    `$ref` points at or into the keyword, nor where the node or one that applies with it lies below a nested `$id`
    (the `$ref`s there are read against another base, where `resolve_ref` reads the root: a definition of the same
    name there declared more names, QA review F2; a `$ref` it cannot follow, an `$anchor`'s, leaves its holder as it
    is). A copy where one changes; `schema` itself otherwise. Drafts 4-7 enforce what `as_read_where_unasserted`
    left of it as 2019-09 does (README, Drafts): left to the late checks there, an answer that wrote `{"b": 1` under
    `enum: [{"a": 1}, {"b": 1}]` beside `properties: {"a": {}}` had no way to end."""
    if "unevaluatedProperties" not in validator_class(schema, later_keywords=True).VALIDATORS:
        return schema  # (never: drafts 4-7 read what `as_read_where_unasserted` left of it as 2019-09 does)
    if not any(key == "unevaluatedProperties" for _, key, _ in walk(schema)):
        return schema
    root = copy.deepcopy(schema)
    changed = False
    refs = refs_in(root)  # (one a `$ref` points at or into stays: its target would be gone, QA fuzz F3)
    holders = {id(n): n for ptr, key, n in walk(root) if key == "unevaluatedProperties" and not targeted(ptr, refs)}
    elsewhere = {id(x) for ptr, key, n in walk_with_refs(root) if gives_another_base(ptr, key, n)
                 for x in _iter_nodes(n)}  # (through `$ref`s too: into a `contentSchema`'s resource, QA review5)
    for node in holders.values():
        reached: set[int] = set()
        adjacent = _applying_with(root, node, reached)
        if adjacent is None or reached & elsewhere:
            continue
        others = [a for a in adjacent if a is not node]
        changed = True
        extra = node.pop("unevaluatedProperties")
        if "additionalProperties" in node or any("additionalProperties" in a or "unevaluatedProperties" in a
                                                 for a in others):
            continue  # every property is evaluated already
        props = node.get("properties", {})
        pp = node.get("patternProperties", {})
        for a in others:
            props = {**props, **{k: {} for k in a.get("properties", {}) if k not in props}}
            pp = {**pp, **{k: {} for k in a.get("patternProperties", {}) if k not in pp}}
        if props:
            node["properties"] = props
        if pp:
            node["patternProperties"] = pp
        node["additionalProperties"] = extra
    return root if changed else schema


def _prefix_items_as_items(schema: dict) -> dict:
    """2020-12's `prefixItems` in a node read in a draft before it (draft 7's, which `as_read_where_unasserted` left
    where the node only asserts) as that draft's own tuple, an `items` list, which the backends enforce: llguidance
    ignores it there, and the late checks refused the array only once it closed, so an answer that wrote `[1.5`
    under `prefixItems: [{"type": "integer"}]` had no way to end. Each place holds its `prefixItems` schema and what
    the draft holds it to (an `items` schema, which then also holds the items past the list as `additionalItems`;
    the `items` list's place or its `additionalItems`), so the rewrite means what both readings do together. Not
    where a `$ref` points into the keywords it changes, nor in a schema with `unevaluatedItems` (2019-09's, which
    counts an `items` list's places as evaluated and `prefixItems`' not), nor where a place would meet a recursive
    `$ref` in an `allOf` (llguidance refuses it: "circular references with sibling keys"). A copy where one
    changes."""
    found = [(ptr, node) for ptr, key, node in walk(schema) if key == "prefixItems"]
    if not found or any(key == "unevaluatedItems" for _, key, _ in walk(schema)):
        return schema
    root = copy.deepcopy(schema)
    reading = _node_readings(root)
    refs, recursive = refs_in(root), recursive_targets(root)
    changed = False
    for ptr, key, node in [(p, k, n) for p, k, n in walk(root) if k == "prefixItems"]:
        at = ptr[: -len("/prefixItems")]
        if "prefixItems" in reading(node).VALIDATORS or not isinstance(node["prefixItems"], list) \
                or any(targeted(f"{at}/{k}", refs) for k in ("prefixItems", "items", "additionalItems")):
            continue
        prefix, items = node["prefixItems"], node.get("items")
        if isinstance(items, list):
            rest = node.get("additionalItems")
            places = [items[i] if i < len(items) else rest for i in range(max(len(prefix), len(items)))]
        else:
            places = [items] * len(prefix)
        written = [_both(p, other) for p, other in itertools.zip_longest(prefix, places)]
        if any(isinstance(w, dict) and "allOf" in w and w not in prefix and w not in places
               and any(isinstance(n.get("$ref"), str) and unquote(n["$ref"])[1:] in recursive
                       for n in _iter_nodes(w)) for w in written):
            continue  # (llguidance compiles no `allOf` of a recursive `$ref` and a sibling: left to the late checks)
        changed = True
        del node["prefixItems"]
        if not prefix:
            continue
        if not isinstance(items, list):
            node.pop("additionalItems", None)  # (beside no `items` list it means nothing; below it would)
            if items is not None:
                node["additionalItems"] = items
        node["items"] = written
    return root if changed else schema


def _node_readings(root: dict) -> Callable[[dict], type]:
    """The validator class each subschema of `root` is read in (the nearest `$schema` above it, its own included;
    the root's otherwise), by the subschema."""
    dialects = node_dialects(root)

    def reading(node: dict) -> type:
        dialect = dialects.get(id(node))
        return validator_class({"$schema": dialect} if isinstance(dialect, str) else root)
    return reading


def _const_as_enum(schema: dict) -> dict:
    """Draft 4's `const` (draft 6's keyword, which `as_read_where_unasserted` left where its node only asserts) as
    the `enum` of its one value, which draft 4 has: llguidance ignores `const` there without a word, and nothing
    checked it late, so draft 4's `properties: {"a": {"const": 1}}` took `{"a": 2}`, strict. Beside an `enum`, in
    an `allOf`. A copy where one changes."""
    if not any(key == "const" for _, key, _ in walk(schema)):
        return schema
    root = copy.deepcopy(schema)
    reading = _node_readings(root)
    changed = False
    for _, _, node in [(p, k, n) for p, k, n in walk(root) if k == "const"]:
        if "const" in reading(node).VALIDATORS or not isinstance(node.get("allOf", []), list):
            continue
        changed = True
        value = node.pop("const")
        if "enum" in node:
            _add_all_of(node, {"enum": [value]})
        else:
            node["enum"] = [value]
    return root if changed else schema


def _both(first: Any, second: Any) -> Any:
    """A schema for what both `first` and `second` accept (None: absent, which asserts nothing)."""
    if second is None or (first is not None and (second is True or second == {})):
        return first
    if first is None or first is True or first == {}:
        return second
    return {"allOf": [first, second]}


# Beside `unevaluatedItems`, these evaluate items too (or may, depending on the value).
_EVALUATING_ITEMS = ("items", "contains", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref",
                     "$dynamicRef", "$recursiveRef", "dependentSchemas")


def _unevaluated_saying_nothing(schema: dict) -> dict:
    """`schema` without its `unevaluatedItems` (and likewise `unevaluatedProperties`) where every one is `true` or
    `{}`: each asserts nothing, and the only keywords that read what they evaluate are their like, so leaving them
    all out changes nothing. Kept, one turned every rewrite off for the whole schema (fuzz3 F2). A copy where one
    changes."""
    refs = refs_in(schema)
    out = schema
    for key in ("unevaluatedItems", "unevaluatedProperties"):
        places = [(ptr, n) for ptr, k, n in walk(out) if k == key]
        if not places or any(n[key] not in (True, {}) or targeted(ptr, refs) for ptr, n in places):
            continue
        out = copy.deepcopy(out)
        for _, n in [(ptr, n) for ptr, k, n in walk(out) if k == key]:
            del n[key]
    return out


def _unevaluated_items_as_items(schema: dict) -> dict:
    """`unevaluatedItems: U` (2020-12) on a node where nothing but `prefixItems` evaluates items: it means `items: U`
    there (the items past the prefix), which the backends enforce; left out of what they compile, an item U refuses
    was written and the answer ran to max_tokens. Beside a `contains: C` (which evaluates the items it matches,
    whatever `minContains`/`maxContains` say), an item past the prefix is evaluated or held to U: `items: {anyOf:
    [C, U]}`, C alone where U is `false`, the `contains` kept (QA fuzz2 F4: 1 walk in 20 ended). A copy where one
    changes; `schema` itself otherwise. In 2019-09, where `items` may be a list (the prefix) and `additionalItems`
    the rest: `additionalItems: U` beside such a list, nothing beside `items` as one schema or beside
    `additionalItems` (every item is evaluated), else `items: U` (QA fuzz2 F7: 11 walks in 20 ended). Beside
    `items` (2020-12), which evaluates every item past the prefix, it says nothing and goes."""
    known = validator_class(schema).VALIDATORS
    if "prefixItems" not in known:  # (drafts 4-7 read what `as_read_where_unasserted` left of it as 2019-09 does)
        return _unevaluated_items_as_additional(schema)
    refs = refs_in(schema)  # (no target is renamed)
    found = {ptr for ptr, key, n in walk(schema)
             if key == "unevaluatedItems" and not targeted(ptr, refs)
             and ("items" in n or not any(k in n for k in _EVALUATING_ITEMS if k != "contains"))}
    if not found:
        return schema
    root = copy.deepcopy(schema)
    for node in [n for ptr, key, n in walk(root) if key == "unevaluatedItems" and ptr in found]:
        unevaluated = node.pop("unevaluatedItems")
        if "items" in node:  # (with `prefixItems`, it evaluates every item: this says nothing, fuzz3 F2)
            continue
        if "contains" not in node:
            node["items"] = unevaluated
        elif node["contains"] is True or unevaluated is True:
            node["items"] = True
        else:
            contained = copy.deepcopy(node["contains"])
            node["items"] = contained if unevaluated is False else {"anyOf": [contained, unevaluated]}
    return root


def _unevaluated_items_as_additional(schema: dict) -> dict:
    """2019-09's form of `_unevaluated_items_as_items` (there `contains` is left out: what it evaluates changed
    in 2020-12)."""
    refs = refs_in(schema)
    beside = [k for k in _EVALUATING_ITEMS if k != "items"] + ["additionalItems"]
    found = {ptr for ptr, key, n in walk(schema)
             if key == "unevaluatedItems" and not targeted(ptr, refs) and not any(k in n for k in beside)}
    if not found:
        return schema
    root = copy.deepcopy(schema)
    for node in [n for ptr, key, n in walk(root) if key == "unevaluatedItems" and ptr in found]:
        unevaluated = node.pop("unevaluatedItems")
        items = node.get("items")
        if isinstance(items, list):
            node["additionalItems"] = unevaluated
        elif items is None:
            node["items"] = unevaluated
    return root


def _applying_with(root: dict, node: dict, reached: set[int] | None = None) -> list[dict] | None:
    """`node` and the subschemas that apply with it through `allOf` and local `$ref` (each once), or None when
    one of them evaluates properties depending on the value, or holds something other than a schema object
    there (a `$ref` out of reach, a `properties` that is not an object). Alternatives beside them (`anyOf`,
    `oneOf`, `if`/`then`/`else`, `dependentSchemas`) that evaluate no name but those these declare change nothing
    evaluated: a conditional `required` (`if`... `then: {required: [r]}`) kept the whole schema from the rewrites,
    and an answer that wrote a later key first had no way to close (QA unions F1). `reached` gets the id() of
    each subschema looked at on the way."""
    reached = set() if reached is None else reached
    out: list[dict] = []
    alternatives: list[Any] = []
    stack: list[Any] = [node]
    while stack:
        n = stack.pop()
        if n is True:
            continue
        if not isinstance(n, dict) or any(k in n for k in ("$dynamicRef", "$recursiveRef", "unevaluatedItems")):
            return None
        if any(n is o for o in out):
            continue
        if not isinstance(n.get("properties", {}), dict) or not isinstance(n.get("patternProperties", {}), dict):
            return None
        out.append(n)
        if "$ref" in n:
            target = resolve_ref(root, n["$ref"])
            if target is None:
                return None
            stack.append(target)
        if "allOf" in n:
            if not isinstance(n["allOf"], list):
                return None
            stack.extend(n["allOf"])
        found = alternatives_of(n)
        if found is None:
            return None
        alternatives += found
    names = {k for a in out for k in a.get("properties", {})}
    seen: set[int] = set()  # (what the alternatives reach: each judged once, the same way whichever reaches it)
    within = all(_evaluates_within(root, a, names, seen) for a in alternatives)
    reached.update(seen, (id(a) for a in out))
    return out if within else None


def alternatives_of(n: dict, dependencies: bool = True) -> list[Any] | None:
    """The subschemas of `n` that apply depending on the value (`anyOf`, `oneOf`, `if`/`then`/`else`,
    `dependentSchemas`, and `dependencies` unless not `dependencies`: a 2019-09 validator applies it, as drafts 4-7
    do, but counts no property it evaluates); None where one is malformed."""
    out: list[Any] = []
    for k in ("anyOf", "oneOf"):
        if k in n:
            if not isinstance(n[k], list):
                return None
            out += n[k]
    out += [n[k] for k in ("if", "then", "else") if k in n]
    for k in ("dependentSchemas", "dependencies") if dependencies else ("dependentSchemas",):
        if k in n:
            if not isinstance(n[k], dict):
                return None
            out += [v for v in n[k].values() if not isinstance(v, list)]
    return out


def _evaluates_within(root: dict, schema: Any, names: set[str], seen: set[int]) -> bool:
    """Whichever way `schema` and what applies in place with it (all alternatives, not `not`) hold, the properties
    they evaluate are among `names`: no `properties` beyond them, no `patternProperties`, no `additionalProperties`
    but `false` (which evaluates nothing: the object has no other key), no `unevaluatedProperties`."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or any(k in schema for k in ("patternProperties", "unevaluatedProperties",
                                                                  "$dynamicRef", "$recursiveRef")):
        return False
    if schema.get("additionalProperties", False) is not False:
        return False
    props = schema.get("properties", {})
    if not isinstance(props, dict) or not set(props) <= names:
        return False
    if id(schema) in seen:
        return True
    seen.add(id(schema))
    inner = alternatives_of(schema)
    if inner is None or not isinstance(schema.get("allOf", []), list):
        return False
    inner += schema.get("allOf", [])
    if "$ref" in schema:
        target = resolve_ref(root, schema["$ref"])
        if target is None:
            return False
        inner.append(target)
    return all(_evaluates_within(root, sub, names, seen) for sub in inner)


_MAX_INLINED_NODES = 20_000  # schema objects copied in by _inline_recursive_meetings


def _inline_recursive_meetings(root: dict, ctx: _Ctx) -> dict:
    """A `$ref` to a recursive definition that meets sibling keywords (an `allOf` member, an `anyOf`/`oneOf`
    member beside other keywords, a `$ref` beside other keywords) is replaced by a copy of its target. llguidance
    intersects the two at compile time, and cannot intersect a definition it is still compiling ("circular
    references with sibling keys"). Exact: a local `$ref` means its target (nested `$id` never reaches here).
    A copy inlines the meetings inside it too, except with a definition whose copy is being made (those stay
    `$ref`s); each definition is copied once and shared, and meetings past `_MAX_INLINED_NODES` copied objects
    (counted as written out) stay `$ref`s."""
    recursive = recursive_targets(root)
    if not recursive:
        return root
    # the names a reference steps through (`#/components/Color`): a key by such a name may hold a reference's target
    referenced = {unescape_pointer_part(part) for n in _iter_nodes(root)
                  if isinstance(n.get("$ref"), str) for part in n["$ref"].split("#", 1)[-1].split("/")}
    left = [_MAX_INLINED_NODES]
    copies: dict[str, Any] = {}
    making: set[str] = set()

    def recursive_ref(s: Any) -> str | None:
        """The recursive definition `s` is only a local `$ref` to (annotations aside)."""
        if isinstance(s, dict) and set(s) - _ANNOT == {"$ref"} and isinstance(s["$ref"], str) \
                and s["$ref"].startswith("#") and s["$ref"][1:] in recursive:
            return s["$ref"][1:]
        return None

    def target(s: Any) -> str | None:
        t = recursive_ref(s)
        return t if t not in making else None

    def copy_of(ref: dict, t: str) -> Any:
        """The target of `ref` (its own meetings inlined), or `ref` itself once the budget is spent."""
        if t not in copies:
            found = resolve_ref(root, "#" + t)
            if isinstance(found, dict):
                found = {k: v for k, v in found.items() if k not in ("$schema", "$id", "id", "$anchor", "$defs",
                                                                     "definitions")}
            making.add(t)
            copies[t] = go(found)
            making.discard(t)
        size = sum(1 for _ in itertools.islice(_iter_nodes(copies[t]), left[0] + 1))
        if size > left[0]:
            return ref
        left[0] -= size
        return copies[t]

    def drop_implied_type(node: dict) -> dict:
        """{type: T, anyOf: [...]} where every branch is of type T anyway: without the `type`, nothing meets the
        branches. Used where a branch refers to a definition being copied (a copy cannot hold itself)."""
        key = next((k for k in ("anyOf", "oneOf") if isinstance(node.get(k), list)), None)
        if key is None or set(node) - _ANNOT != {"type", key} \
                or not any(recursive_ref(m) in making for m in node[key]) \
                or not ctx.types({key: node[key]}) <= ctx.types({"type": node["type"]}):
            return node
        return {k: v for k, v in node.items() if k != "type"}

    def go(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        node = drop_implied_type(node)
        if any(k in node for k in ("$ref", "allOf", "anyOf", "oneOf")):
            # keywords JSON Schema does not know assert nothing (pydantic's `discriminator` beside a oneOf,
            # `x-order` or `nullable` beside a `$ref`), but llguidance counts them as sibling keys of a reference:
            # they are left out there, unless a reference may point into one
            node = {k: v for k, v in node.items() if k in ASSERTIONS or k in _ANNOT or k in referenced}
        siblings = len(set(node) - _ANNOT) > 1
        out = map_subschemas(node, go)
        for key in ("allOf", "anyOf", "oneOf"):
            if isinstance(node.get(key), list) and (key == "allOf" or siblings):
                out[key] = [copy_of(m, t) if (t := target(m)) else out[key][i] for i, m in enumerate(node[key])]
        if siblings and (t := target({"$ref": node.get("$ref")})):
            # the copy takes the $ref's place (llguidance lays out merged properties in the order it meets them)
            members = [copy_of({"$ref": node["$ref"]}, t), *out.get("allOf", [])]
            out = {("allOf" if k == "$ref" else k): (members if k == "$ref" else v) for k, v in out.items()
                   if k != "allOf"}
        return out

    out = go(root)
    if out != root:
        ctx.changed = True
    return out


def refs_in(schema: Any) -> list[str]:
    """Every `$ref` value in `schema`."""
    return [n["$ref"] for n in _iter_nodes(schema) if isinstance(n.get("$ref"), str)]


def targeted(ptr: str, refs: list[str]) -> bool:
    """Some `$ref` of `refs` points at the node at `ptr` or inside it (a `$ref` is a URI: `%20` is a space)."""
    return bool(ptr) and any((r := unquote(ref)) == "#" + ptr or r.startswith("#" + ptr + "/") for ref in refs)


def _rewrite(node: Any, ptr: str, ctx: _Ctx, refs: list[str]) -> Any:
    if not isinstance(node, dict):
        return node
    node = _finite(node, ptr, ctx, refs)
    if not isinstance(node, dict):
        return node
    targets = [r for ref in refs if (r := unquote(ref)).startswith("#" + ptr + "/")]
    merged = _discriminated_conditionals(node, ctx)  # (before its members' own rewrite: `_conditional`)
    if not (targets and _moves_targets(node, merged, ptr, targets)):  # (QA review F1: `#/allOf/1` read `{}`)
        node = merged
    # children first
    for key, value in list(node.items()):
        kp = f"{ptr}/{escape_pointer_part(key)}"
        if key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas") \
                and isinstance(value, dict):
            node[key] = {k: _rewrite(v, f"{kp}/{escape_pointer_part(k)}", ctx, refs) for k, v in value.items()}
        elif key == "dependencies" and isinstance(value, dict):
            node[key] = {k: _rewrite(v, f"{kp}/{escape_pointer_part(k)}", ctx, refs) if isinstance(v, dict) else v
                         for k, v in value.items()}
        elif key in ("allOf", "anyOf", "oneOf", "prefixItems") and isinstance(value, list):
            node[key] = [_rewrite(v, f"{kp}/{i}", ctx, refs) for i, v in enumerate(value)]
        elif key == "items" and isinstance(value, list):
            node[key] = [_rewrite(v, f"{kp}/{i}", ctx, refs) for i, v in enumerate(value)]
        elif key in ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
                     "propertyNames") and isinstance(value, dict):
            node[key] = _rewrite(value, kp, ctx, refs)
    ctx.here = ptr
    for step in (_keywords_of_other_types, _impossible_keys, _impossible_contains, _lookaheads, _search_counts,
                 _format, _not, _one_of, _conditional, _late_integers_as_enum, _unique_items, _contains,
                 _property_names, _patterns_as_properties, _dependencies, _properties_count, _pattern_properties,
                 _declared_out_of_patterns, _joined_patterns):
        before = node
        node = step(node, ctx)
        moved = node is not before and targets and _moves_targets(before, node, ptr, targets)
        if moved and (ptr or node is not False):  # (the whole schema as `false` leaves no reference to follow)
            node = before  # (a `$ref` points into what the step rewrote: `#/then/properties/n`, QA testsuite2 F1)
        if not isinstance(node, dict):
            break
    return node


def _moves_targets(before: dict, after: Any, ptr: str, targets: list[str]) -> bool:
    """Some `$ref` of `targets` (each inside the node at `ptr`) points under a keyword of `before` that `after` no
    longer holds as it was: the backend found no subschema there (`Pointer '/oneOf/0/properties/w' does not
    exist`, a 400 for a schema valid in every draft)."""
    for target in targets:
        key = unescape_pointer_part(target[len(ptr) + 2:].split("/", 1)[0])
        if key in before and (not isinstance(after, dict) or after.get(key) is not before[key]):
            return True
    return False


# The keywords that say something of values of one type only (`format`: every format JSON Schema defines is of
# strings); `unevaluated*` are left, as they make the rewrite skip the schema (_CONTEXT_KEYS).
_KEYWORDS_OF_TYPE = {
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "string": ("minLength", "maxLength", "pattern", "format"),
    "array": ("items", "prefixItems", "additionalItems", "contains", "minContains", "maxContains", "minItems",
              "maxItems", "uniqueItems"),
    "object": ("properties", "patternProperties", "additionalProperties", "required", "minProperties",
               "maxProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies"),
}


def _keywords_of_other_types(node: dict, ctx: _Ctx) -> dict:
    """Keywords of a type the node's `type` does not take say nothing there: dropped, so that none is refused or
    named for what no backend could build (`{"type": "string", "minimum": 1e19}` was a 400: no number range past
    1e18; a lookbehind `pattern` beside `type: integer` a 400 under strict). One a `$ref` points into stays (the
    others still go: `_rewrite` undid the whole step, and a `minimum: 1e19` beside it was a 400 again)."""
    types = types_of(node["type"]) if "type" in node else None
    if types is None:
        return node
    taken = {"number" if t in ("integer", "fraction") else t for t in types}
    dropped = [k for kind, keys in _KEYWORDS_OF_TYPE.items() if kind not in taken for k in keys if k in node
               and not targeted(f"{ctx.here}/{escape_pointer_part(k)}", ctx.refs)]
    if not dropped:
        return node
    ctx.changed = True
    return {k: v for k, v in node.items() if k not in dropped}


def _impossible_keys(node: dict, ctx: _Ctx) -> Any:
    """An object that `required` gives a key it may not have (declared `false`, or undeclared where
    `additionalProperties` is false and no `patternProperties` may admit it) cannot exist: the node keeps its other
    types, or is `false` (backends drop such a key silently: llguidance wrote `{}` for `required: ["a"]` with no
    properties and `additionalProperties: false`). Patterns are not run on the key (a client's regex may
    backtrack for ever): with any, an undeclared key counts as admitted."""
    req = node.get("required")
    props = node.get("properties", {})
    if not isinstance(req, list) or not isinstance(props, dict):
        return node

    def admitted(key: str) -> bool:
        if key in props:
            return props[key] is not False
        return node.get("additionalProperties") is not False or bool(node.get("patternProperties"))

    if all(admitted(k) for k in req if isinstance(k, str)):
        return node
    return _without_type(node, "object", ctx)


def _without_type(node: dict, kind: str, ctx: _Ctx) -> Any:
    """`node` where no value of type `kind` can meet it: its other types, or `false` where it has none."""
    types = types_of(node["type"]) if "type" in node else _ALL_TYPES
    if types is None:
        return node
    ctx.changed = True
    names = _type_value(types - {kind})
    return False if not names else {**node, "type": names}


def _impossible_contains(node: dict, ctx: _Ctx) -> Any:
    """An array no item count meets for `contains`: C accepts nothing that an item may be (`false`, what rewrites
    to it, or no type the node's `items`/`prefixItems` allow) while at least one item must hold it (`minContains`
    absent or above 0), `minContains` above `maxContains`, or above `maxItems`. The node keeps its other types, or
    is `false`: compiled, every answer opened an array it could never close and ran to max_tokens, where the
    README promises such a schema a 400 (QA testsuite2 F4)."""
    if "contains" not in node:  # (draft 4's too, where it is left: `validator_class`'s `later_keywords`)
        return node
    # (the counts are 2019-09's, read before it too where they are left, as 2019-09 defines them; there `contains`
    # asks for one item at least whatever `minContains` says: `_contains_in_both`)
    def count(key: str, default: int | None) -> int | None:
        v = node.get(key, default)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    least, most, longest = count("minContains", 1), count("maxContains", None), node.get("maxItems")
    if least is None:
        return node
    if "unevaluatedProperties" not in ctx.draft_keywords:  # (before 2019-09)
        least = max(least, 1)
    wanted = ctx.types(node["contains"])
    unmet = (least > 0 and not any(ctx.types(item) & wanted for item in _item_schemas(node, ctx))) \
        or (most is not None and least > most) \
        or (isinstance(longest, int) and not isinstance(longest, bool) and least > longest)
    return _without_type(node, "array", ctx) if unmet else node


def _item_schemas(node: dict, ctx: _Ctx) -> list[Any]:
    """The schemas `node`'s own keywords hold its items to: each place of the prefix (`prefixItems`; `items` as a
    list before 2020-12), and what comes after (`items`, `additionalItems`; absent, `true`). Others (an `allOf`'s)
    only narrow them further."""
    if "prefixItems" in ctx.draft_keywords:
        prefix, rest = node.get("prefixItems", []), node.get("items", True)
    elif isinstance(node.get("items"), list):
        prefix, rest = node["items"], node.get("additionalItems", True)
    else:
        prefix, rest = [], node.get("items", True)
    return [*prefix, rest] if isinstance(prefix, list) else [True]


def _add_all_of(node: dict, sub: Any) -> None:
    """Join `sub` to the node's allOf. A new allOf goes last: llguidance lays out merged object properties in
    the order it meets the keywords, so the node's own `properties` keep their places first."""
    node.setdefault("allOf", [])
    if isinstance(node["allOf"], list):
        node["allOf"] = node["allOf"] + [sub]


def _finite(node: dict, ptr: str, ctx: _Ctx, refs: list[str]) -> dict | bool:
    """An enum/const node with other keywords: the values those keywords let through, as an enum; `false` where
    none is (`enum: []` was an empty alternation to outlines-core, which wrote `{"w":  }`)."""
    vals = ctx.values(node)
    if vals == [] and not any(k in node for k in ("$defs", "definitions")) and not targeted(ptr, refs):
        ctx.changed = True
        return False  # (a client's own `enum: []`)
    if vals is None or set(node) - _ANNOT <= {"enum", "const", "type"}:
        return node
    if targeted(ptr, refs) or not ctx.decidable(node):
        return node
    keep = []
    for v in vals:
        if ctx.is_valid(node, v) and not any(_equal(v, k) for k in keep):
            keep.append(v)
    ctx.changed = True
    out = {k: v for k, v in node.items() if k in _ANNOT and k not in ("$defs", "definitions")}
    for k in ("$defs", "definitions"):  # may still be the target of a $ref from outside this node
        if k in node:
            out[k] = node[k]
    if not keep and not any(k in out for k in ("$defs", "definitions")):
        return False
    out["enum"] = keep
    return out


def _lookaheads(node: dict, ctx: _Ctx) -> dict:
    """A `pattern`, or a `patternProperties` name, that opens with `^` and lookaheads (neither backend reads them)
    becomes the one anchored pattern they and the rest mean (constrain/regex_sets.py): `^(?!x-)[a-z]+$` as a name
    was a 400, strict or not (JsonSchemaStore's web-types, helper-25). Where regex dialects read it differently
    (`.`, `\\w`, ...), it is spelled as the strings every dialect matches (`_narrowest`): a `pattern` where it is
    asserted (negated, fewer strings would be more values: QA review8 F1), and a name of a closed object (a name
    left out is refused); or, for a name of an object whose other keys may hold anything, as those any dialect
    matches (`_widest`: a name gets the name's schema, which every dialect then finds valid), where that object is
    asserted (under a `not` or a `oneOf` branch, more names would be fewer objects: QA review6 F1). Elsewhere, only
    a pattern or a name every dialect reads alike."""
    pattern = node.get("pattern")
    if isinstance(pattern, str) and "(?" in pattern:
        # (negated, narrowed, it took what a dialect refuses: `not: {pattern: "^(?!x)\\w$"}` took "é", QA review8 F1)
        spelled = _narrowest(pattern) if _asserted(ctx.here, ctx) else pattern if _read_alike(pattern) else None
        plain = without_lookaheads(spelled, ctx.regex_work, explicit=True) if spelled is not None else None
        if plain is not None:
            ctx.changed = True
            node = {**node, "pattern": plain}
    names = node.get("patternProperties")
    if isinstance(names, dict) and any("(?" in n for n in names):
        other = node.get("additionalProperties", True)
        widened = other in (True, {}) and node.get("unevaluatedProperties", True) in (True, {}) \
            and _asserted(ctx.here, ctx)

        def spelled(name: str) -> str | None:
            if _read_alike(name):
                return name
            return _narrowest(name) if other is False else _widest(name) if widened else None

        plain_names = {}
        for name in names:
            written = spelled(name) if "(?" in name else None
            plain_names[name] = (without_lookaheads(written, ctx.regex_work, explicit=True)
                                 if written is not None else None) or name
        if len(set(plain_names.values())) == len(names) and any(k != v for k, v in plain_names.items()):
            ctx.changed = True  # (two names meeting in one spelling are left as written)
            node = {**node, "patternProperties": {plain_names[name]: value for name, value in names.items()}}
    return node


def _read_alike(pattern: str) -> bool:
    """Whether every regex dialect reads `pattern` alike: no `.` or shorthand spelled otherwise by one, nor a
    class that opens with `]` (which `portable_pattern` leaves as it is)."""
    return "[]" not in pattern and "[^]" not in pattern and portable_pattern(pattern) == widest_pattern(pattern)


def _narrowest(pattern: str) -> str | None:
    """`pattern` spelled to match what every regex dialect's reading matches: its classes as every dialect takes
    them, but inside a negative lookahead as any dialect takes them (narrowed there, the negation refused fewer
    strings: `^(?!\\d)[0-9\u0663a]+$` took "\u0663", which Python's `\\d` matches: QA review6 F2)."""
    return _spelled_around_negations(pattern, portable_pattern, widest_pattern)


def _widest(pattern: str) -> str | None:
    """`pattern` spelled to match what any regex dialect's reading matches (`_narrowest`'s opposite)."""
    return _spelled_around_negations(pattern, widest_pattern, portable_pattern)


def _spelled_around_negations(pattern: str, outside, inside) -> str | None:
    """`pattern` with its text outside negative lookaheads spelled by `outside` and what each `(?!...)` holds by
    `inside`. None: a lookaround inside a negative lookahead, a group that does not close, or a class that
    opens with `]` (which dialects read differently)."""
    if "[]" in pattern or "[^]" in pattern:
        return None
    out, at, i, in_class = [], 0, 0, False
    while i < len(pattern):  # (a `(?!` escaped, `\\(?!`, or in a class, `[(?!]`, opens no lookahead: QA review7 F2)
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class or ch == "[":
            in_class = ch == "[" or ch != "]"
            i += 1
            continue
        if not pattern.startswith("(?!", i):
            i += 1
            continue
        depth, j = 1, i + 3
        while j < len(pattern) and depth:
            ch = pattern[j]
            if ch == "\\":
                j += 1
            elif in_class:
                in_class = ch != "]"
            elif ch == "[":
                in_class = True
            elif ch in "()":
                depth += 1 if ch == "(" else -1
            j += 1
        held = pattern[i + 3:j - 1]
        if depth or "(?" in held:
            return None
        out.append(outside(pattern[at:i]) + "(?!" + inside(held) + ")")
        at = i = j
    return "".join(out) + outside(pattern[at:])


def _as_every_dialect(pattern: str) -> str:
    """`pattern` as the backends read it (`portable_pattern`: `.` and the shorthands as the characters every
    dialect takes), so that regex_sets, which reads them as Python does (`\\w`: Unicode; `.`: all but a line
    feed), computes with what the backends would enforce; its result is then written `explicit`ly, without Python's
    shorthands, which `portable_pattern` would narrow."""
    return portable_pattern(pattern)


def _search_counts(node: dict, ctx: _Ctx) -> dict:
    """A `pattern` with a long count at a side it does not anchor (`[\\p{L}\\p{N}]{1,255}`, which llguidance unrolls
    until it gives up mid-output, as it does for `patternProperties` names: `_pattern_properties`) becomes the
    anchored pattern of the strings it finds a match in (`regex_sets.search_region`)."""
    pattern = node.get("pattern")
    if not isinstance(pattern, str):
        return node
    region = search_region(_as_every_dialect(pattern), ctx.search_work, explicit=True)
    if region is None:
        return node
    ctx.changed = True
    return {**node, "pattern": region}


def _format(node: dict, ctx: _Ctx) -> dict:
    """A `format` JSON Schema does not define (`url`, `int64`, ...) is an annotation validators ignore: dropped;
    pydantic's (`uuid4`, `LIBRARY_FORMATS`) become the pattern pydantic checks where a value must hold them. A
    format whose RFC grammar is regular and that llguidance lacks becomes that grammar's `pattern`."""
    name = node.get("format")
    if not isinstance(name, str):
        return node
    pattern = format_pattern(name)
    if name in STANDARD_FORMATS and pattern is None:
        return node
    if name in LIBRARY_FORMATS and not _asserted(ctx.here, ctx):
        pattern = None  # (an annotation to JSON Schema: under `not`, a value need not be one)
    elif name in _PART_PATTERNS and not _asserted(ctx.here, ctx):
        return node  # (checked on finished values, exactly)
    node = {k: v for k, v in node.items() if k != "format"}
    if pattern is not None and "pattern" not in node:
        node["pattern"] = pattern
    elif pattern is not None:
        _add_all_of(node, {"pattern": pattern})
    most, longest = node.get("maxLength"), _FORMAT_LONGEST.get(name)
    if longest is not None and not (isinstance(most, int) and not isinstance(most, bool) and most <= longest):
        node["maxLength"] = longest
    ctx.changed = True
    return node


_FORMAT_LONGEST = {"idn-hostname": 253}  # characters a format's pattern leaves unbounded (RFC 1034's names)
# Formats whose pattern is part of what jsonschema's check takes (constrain/formats.py): written so only where a
# value must hold the format. Under `not` the part would let through what the rest of the format holds for (`"a@b"`
# under `not: {format: idn-email}`), so there, and where the value may or may not hold it (`if`, a `oneOf` branch,
# `contains`), the format stays, and is checked on finished values (constrain/late_keywords.py).
_PART_PATTERNS = frozenset({"idn-email", "idn-hostname", "duration"})
_UNASSERTED = frozenset({"not", "if", "oneOf", "contains"})


def _asserted(ptr: str, ctx: _Ctx) -> bool:
    return _asserted_among(ptr, ctx.ref_sources, ctx.one_of_apart)


def _asserted_among(ptr: str, ref_sources: list[tuple[str, str]],
                    one_of_apart: Callable[[str], bool] | None = None) -> bool:
    """Whether the node at `ptr` only asserts what it holds: no `not`, `if`, `oneOf` or `contains` on its way from
    the root, nor on the way to any `$ref` to it or to a node it is in, and so on back. Any node's: a `$ref` to
    `#/properties/a`, or `#`, from under a `not` negates it too (QA review8 F2). A definition no `$ref` reaches is
    not asserted; a `$ref` reached again (a recursive schema) adds no way in that the others do not hold. A
    `oneOf` whose branches `one_of_apart` finds of disjoint types asserts them as an `anyOf` would: no value meets
    two, so one held to more is still valid."""
    seen, work = {ptr}, [ptr]
    while work:
        parts = (at := work.pop()).split("/")[1:]
        # (a property so named counts too: left to the checks, never wrong)
        if any(part in _UNASSERTED and not (part == "oneOf" and one_of_apart is not None
                                            and one_of_apart("".join(f"/{p}" for p in parts[:i])))
               for i, part in enumerate(parts)):
            return False
        sources = [source for source, target in ref_sources if at == target or at.startswith(target + "/")]
        if not sources and parts[:1] in (["$defs"], ["definitions"]):
            return False
        work += [source for source in sources if source not in seen]
        seen.update(sources)
    return True


def _format_of(pattern: Any) -> str | None:
    """The format whose pattern `_format` wrote `pattern` for, if any."""
    return next((name for name in _FORMAT_LONGEST if pattern == format_pattern(name)), None)


def _not(node: dict, ctx: _Ctx) -> dict:
    if "not" not in node:
        return node
    n = node["not"]
    if n is False:
        node = dict(node)
        del node["not"]
        ctx.changed = True
        return node
    if _says_nothing(n):
        ctx.changed = True
        return False  # `not` of the schema accepting everything: this node accepts nothing
    rest = {k: v for k, v in node.items() if k != "not"}
    repl = _negation(n, ctx, ctx.types(rest), rest)
    if repl is None:
        return node
    ctx.changed = True
    if repl is False:  # (the rest asserts all `not` holds)
        return False
    node = rest
    _add_all_of(node, repl)
    return node


def _negation(n: Any, ctx: _Ctx, within: frozenset = _ALL_TYPES, context: Any = None, depth: int = 0) -> Any:
    """A schema without `not` that, among values of the types `within` that satisfy `context` (a schema, or None
    for no knowledge), accepts exactly those `n` refuses; None when out of reach. The caller conjoins the answer
    with that context, so it may be loose outside it: `not: {type: integer}` is inexpressible alone (a number
    with a fraction), but among values known to be integers it is simply nothing.

    A schema is the conjunction of its keywords, and each keyword other than `type` constrains only values of
    its own type (`minLength` holds for every non-string). So a value fails `n` iff its type is not allowed, or
    it is of some keyword's type and fails that keyword: the answer is the `anyOf` of one piece per keyword."""
    if depth > 8:
        return None
    if n is False or n is True:
        return not n
    n = ctx._deref(n)
    if not isinstance(n, dict) or {"$defs", "definitions"} & set(n):
        return None
    body = {k: v for k, v in n.items() if k in ASSERTIONS}  # (unknown keywords assert nothing)
    if not body:
        return False
    if set(body) == {"not"}:
        return body["not"]
    if "$ref" in body:
        return None  # with siblings: drafts up to 7 ignore them, later ones do not
    allowed = types_of(body["type"]) if "type" in body else _ALL_TYPES
    if allowed is None:
        return None
    pieces: list = []
    if within - allowed:
        names = _type_value(_ALL_TYPES - allowed) or _type_value(within - allowed)
        if names is None:
            return None
        pieces.append({"type": names})
    inside = within & allowed
    for key, value in body.items():
        if key == "type" or not inside or _asserted_by(context, key, value):
            continue
        failing = _keyword_negation(key, value, body, ctx, inside, context, depth)
        if failing is None:
            return None
        pieces += [p for p in (_restrict_types(piece, inside) for piece in failing) if p is not None]
    if not pieces:
        return False
    return pieces[0] if len(pieces) == 1 else {"anyOf": pieces}


# Keywords whose verdict depends on the value and their own value only (not on siblings: `additionalProperties`
# reads `properties`, draft 4's `maximum` its boolean `exclusiveMaximum`).
_SELF_CONTAINED = frozenset({"enum", "const", "multipleOf", "maxLength", "minLength", "pattern", "format", "maxItems",
                             "minItems", "uniqueItems", "maxProperties", "minProperties", "required",
                             "dependentRequired", "propertyNames"})


def _asserted_by(context: Any, key: str, value: Any, depth: int = 0) -> bool:
    """The context (see `_negation`) asserts keyword `key` with `value` itself, or through an `allOf` member: no
    value it accepts fails that keyword, so a negation leaves the keyword's piece out (`not: {format: date,
    pattern: "^2"}` beside `format: date` is `not: {pattern: "^2"}`: the complement of the date pattern, intersected
    with it, was more than llguidance could decide empty, a 400)."""
    if key not in _SELF_CONTAINED or not isinstance(context, dict) or depth > 8:
        return False
    if key in context and json.dumps(context[key], sort_keys=True) == json.dumps(value, sort_keys=True):
        return True
    members = context.get("allOf")
    return isinstance(members, list) and any(_asserted_by(m, key, value, depth + 1) for m in members)


def types_of(t: Any) -> frozenset | None:
    """A `type` value as a set of _ALL_TYPES ("number" is "integer" and "fraction"); None if malformed."""
    t = t if isinstance(t, list) else [t]
    out: set[str] = set()
    for x in t:
        if x == "number":
            out |= {"integer", "fraction"}
        elif isinstance(x, str) and x in _ALL_TYPES and x != "fraction":
            out.add(x)
        else:
            return None
    return frozenset(out) if out else None


def _type_value(types: frozenset) -> list[str] | None:
    """A set of _ALL_TYPES as `type` names; None when it has numbers with a fraction but not integers."""
    if "fraction" in types and "integer" not in types:
        return None
    names = sorted(x for x in types if x not in ("integer", "fraction"))
    if "fraction" in types:
        names.append("number")
    elif "integer" in types:
        names.append("integer")
    return names


def _restrict_types(piece: Any, types: frozenset) -> Any:
    """`piece`, narrowed to values of `types` where that can be said (None: it has no such value). Narrowing
    only drops values the caller's context excludes, so a piece that cannot be narrowed stays as it is."""
    if types == _ALL_TYPES:
        return piece
    if isinstance(piece, dict) and "type" in piece:
        own = types_of(piece["type"])
        if own is None:
            return piece
        names = _type_value(own & types)
        if names == []:
            return None
        return piece if names is None else {**piece, "type": names}
    names = _type_value(types)
    return piece if names is None else {"type": names, "allOf": [piece]}


_KEYWORD_TYPE = {"required": "object", "minItems": "array", "maxItems": "array", "minLength": "string",
                 "maxLength": "string", "minimum": "number", "maximum": "number", "exclusiveMinimum": "number",
                 "exclusiveMaximum": "number"}


def _keyword_negation(key: str, value: Any, body: dict, ctx: _Ctx, within: frozenset, context: Any,
                      depth: int) -> list | None:
    """Schemas whose union is exactly the values failing keyword `key` (within the caller's context, see
    `_negation`); None when not expressible here."""
    kind = _KEYWORD_TYPE.get(key)
    if key == "properties" and isinstance(value, dict):
        out = []
        for name, sub in value.items():
            known = ctx.prop_schema(context, name) if isinstance(context, dict) else None
            known_types = ctx.types(known) if known is not None else _ALL_TYPES
            failing = _negation(sub, ctx, known_types, known, depth + 1)
            if failing is None:
                return None
            if failing is not False:
                out.append({"type": "object", "required": [name], "properties": {name: failing}})
        return out
    if key == "required" and isinstance(value, list) and all(isinstance(x, str) for x in value):
        return [{"type": "object", "properties": {x: False}} for x in dict.fromkeys(value)]
    if key in ("minItems", "minLength") and _count(value):
        return [{"type": kind, key.replace("min", "max"): value - 1}] if value > 0 else []
    if key in ("maxItems", "maxLength") and _count(value):
        return [{"type": kind, key.replace("max", "min"): value + 1}]
    if key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") and _number(value) \
            and not any(isinstance(body.get(k), bool) for k in ("exclusiveMinimum", "exclusiveMaximum")):
        opposite = {"minimum": "exclusiveMaximum", "maximum": "exclusiveMinimum",
                    "exclusiveMinimum": "maximum", "exclusiveMaximum": "minimum"}[key]
        return [{"type": kind, opposite: value}]
    if key in ("enum", "const"):
        values = [value] if key == "const" else value
        if not isinstance(values, list):
            return None
        return _other_values([v for v in values if json_type(v) in within])
    if key == "not":
        return [] if value is False else [value]  # failing `not X` is matching X (`not: false` never fails)
    if key in ("anyOf", "allOf") and isinstance(value, list):
        parts = [_negation(b, ctx, within, context, depth + 1) for b in value]
        if any(p is None for p in parts):
            return None
        if key == "allOf":  # not (A and B) = not A or not B
            return [p for p in parts if p is not False]
        return [] if any(p is False for p in parts) else [{"allOf": parts}]  # not (A or B) = not A and not B
    if key in ("items", "additionalProperties", "additionalItems") and (value is True or value == {}):
        return []
    if key == "contains" and not {"minContains", "maxContains"} & body.keys():
        # failing `contains: C` is an array no item of which holds C. Left to the late checks, `not: {contains:
        # C}` let `[1, 1, 2` be written under `items: {enum: [1, 2]}`, `maxItems: 3`, which nothing could close.
        return [{"type": "array", "items": {"not": value}}] if "array" in within else []
    if key == "additionalProperties" and value is False and "patternProperties" not in body:
        # "Has a key outside `properties`" needs an existential over keys, except where the context is closed
        # too: then that key is one of the context's own names.
        names = _closed_names(context)
        if names is None:
            return None
        declared = body.get("properties", {})
        return [{"type": "object", "required": [x]} for x in names if x not in declared]
    if key == "uniqueItems" and value is False:
        return []
    if key == "pattern" and isinstance(value, str):
        if "string" not in within:
            return []
        if value not in ctx.complements:
            ctx.complements[value] = complement_pattern(value, ctx.regex_work)
        other = ctx.complements[value]
        return None if other is None else [{"type": "string", "pattern": other}]
    return None


def _closed_names(s: Any) -> list[str] | None:
    """The only property names objects accepted by `s` can have (None: not known to be limited)."""
    if not isinstance(s, dict) or s.get("additionalProperties") is not False or "patternProperties" in s:
        return None
    props = s.get("properties", {})
    return list(props) if isinstance(props, dict) else None


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _number(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and math.isfinite(v))


def _other_values(values: list) -> list | None:
    """Pieces accepting exactly the JSON values not in `values` (None when objects or arrays are among them, or
    their strings defy a complement pattern). Numbers leave the open intervals between them."""
    kinds = {json_type(v) for v in values}
    if kinds - {"string", "boolean", "null", "integer", "fraction"}:
        return None
    numbers = sorted({v for v in values if _number(v)})
    other_types = {"array", "object"} | ({"string", "boolean", "null"} - kinds) | ({"number"} if not numbers else set())
    pieces: list = [{"type": sorted(other_types)}]
    for low, high in zip([None] + numbers, numbers + [None]):
        bounds = {k: b for k, b in (("exclusiveMinimum", low), ("exclusiveMaximum", high)) if b is not None}
        pieces.append({"type": "number", **bounds})
    strings = [v for v in values if isinstance(v, str)]
    if strings:
        pattern = _other_strings_pattern(strings)
        if pattern is None:
            return None
        pieces.append({"type": "string", "pattern": pattern})
    booleans = {v for v in values if isinstance(v, bool)}
    if len(booleans) == 1:
        pieces.append({"type": "boolean", "enum": [not next(iter(booleans))]})
    return pieces


_MAX_COMPLEMENT_CHARS = 4096  # `not: {enum: [strings]}`: the pattern grows ~20x the strings (4096: ~0.1 s to compile)


def _other_strings_pattern(words: list[str]) -> str | None:
    """An anchored regex matching every string except `words`: walk their trie; a string is another string when
    it leaves the trie (a character no word continues with, then anything), or ends where no word ends."""
    if sum(len(w) for w in words) > _MAX_COMPLEMENT_CHARS or any('"' in w or "\\" in w for w in words):
        return None  # (llguidance 1.9.1 lets `\\"` through a class without '"' that holds control characters)
    trie: dict = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = True  # a word ends here

    def rest(node: dict) -> str:
        chars = sorted(k for k in node if k)
        leave = f"[^{''.join(regex_char(c) for c in chars)}]" if chars else "[\\s\\S]"
        alts = [leave + "[\\s\\S]*"] + [regex_char(c) + rest(node[c]) for c in chars]
        group = "(?:" + "|".join(alts) + ")"
        return group if node.get("") else group + "?"

    return "^" + rest(trie) + "$"


def _conditional(node: dict, ctx: _Ctx) -> dict:
    """`if A then B else C` holds for (A and B) or (not A and C): without `else`, B or not A; without `then`,
    A or C (no negation needed); `then`/`else` without `if`, or `if` alone, assert nothing. `not A` is computed as
    for `not` (among the values the rest of the node allows); when it is out of reach the keywords stay."""
    keys = [k for k in ("if", "then", "else") if k in node]
    if not keys:  # (drafts 4 and 6 too, where they are left: `validator_class`'s `later_keywords`)
        return node
    rest = {k: v for k, v in node.items() if k not in keys}
    a, b, c = node.get("if"), node.get("then", True), node.get("else", True)
    if a is None or (b is True and c is True):
        ctx.changed = True
        return rest
    if b is True:
        _add_all_of(rest, {"anyOf": [a, c]})
    else:
        not_a = _negation(a, ctx, ctx.types(rest), rest)
        if not_a is None:
            return node
        if c is True:
            _add_all_of(rest, {"anyOf": [b, not_a]})
        else:
            _add_all_of(rest, {"anyOf": [{"allOf": [a, b]}, {"allOf": [not_a, c]}]})
    ctx.changed = True
    return rest


def _discriminated_conditionals(node: dict, ctx: _Ctx) -> dict:
    """`allOf` members `{"if": {"properties": {p: {"const": v_i}}}, "then": B_i}` (the discriminator idiom of
    editor schemas: JsonSchemaStore's minecraft-predicate has 17 on one property) become one member, an `anyOf` of
    a branch per value (p is v_i, and the B_i of that value), one where p holds another value (`not` of their
    enum), one where p is absent and one for values that are not objects (every `if` holds there: all the B_i;
    where the `if`s also require p, an object without it is in the `not` branch instead). Exact and linear: each
    member rewritten alone (`_conditional`) is an `anyOf` of two, whose product llguidance expands (8 members were
    "schema too large"; fewer gave up mid-output). The first such member's place holds it, the others' `{}`."""
    members = node.get("allOf")
    if not isinstance(members, list):
        return node
    groups: dict[tuple[str, bool], list[int]] = {}
    for i, member in enumerate(members):
        found = _discriminator(member)
        if found is not None:
            groups.setdefault(found, []).append(i)
    if not groups:
        return node
    (prop, required), at = max(groups.items(), key=lambda item: len(item[1]))
    if len(at) < 2:
        return node
    values: list[Any] = []
    thens: list[list[Any]] = []  # the B_i of each distinct value
    for i in at:
        value = members[i]["if"]["properties"][prop]["const"]
        k = next((j for j, v in enumerate(values) if _equal(v, value)), None)
        if k is None:
            values.append(value)
            thens.append([])
        thens[-1 if k is None else k].append(members[i]["then"])
    every = _together([members[i]["then"] for i in at])
    branches: list[Any] = []
    if node.get("type") != "object":
        others = {"type": ["array", "boolean", "null", "number", "string"]}
        branches.append(others if set(every) <= {"properties"} else {**others, "allOf": [every]})
    if not required:
        branches.append({"type": "object", "properties": {prop: False}, "allOf": [every]})
    branches += [{"type": "object", "required": [prop], "properties": {prop: {"const": v}}, "allOf": [_together(b)]}
                 for v, b in zip(values, thens)]
    condition = {"properties": {prop: {"enum": values}}, **({"required": [prop]} if required else {})}
    branches.append({"type": "object", "not": condition})
    out = list(members)
    out[at[0]] = {"anyOf": branches}
    for i in at[1:]:
        out[i] = {}
    ctx.changed = True
    return {**node, "allOf": out}


def _together(schemas: list[Any]) -> dict:
    """One schema for all of `schemas`: where each holds only `properties` (annotations aside), as `then`s usually
    do, those merged (a name several declare: the `allOf` of its schemas), which llguidance intersects without
    going deeper at each (17 in an `allOf` were "allOf intersection too deep"); else their `allOf`."""
    if not all(isinstance(x, dict) and set(x) - _ANNOT <= {"properties"} and isinstance(x.get("properties", {}), dict)
               for x in schemas):
        return {"allOf": schemas}
    merged: dict[str, list[Any]] = {}
    for x in schemas:
        for name, sub in x.get("properties", {}).items():
            merged.setdefault(name, []).append(sub)
    return {"properties": {name: subs[0] if len(subs) == 1 else {"allOf": subs} for name, subs in merged.items()}}


def _discriminator(member: Any) -> tuple[str, bool] | None:
    """(p, whether the `if` requires p) of an `allOf` member that is only `{"if": {"properties": {p: {"const":
    v}}, "required": [p]}, "then": B}` (`required` optional; annotations aside; v not an object or an array), else
    None."""
    if not isinstance(member, dict) or set(member) - _ANNOT != {"if", "then"}:
        return None
    condition, then = member["if"], member["then"]
    if not isinstance(condition, dict) or not isinstance(then, (dict, bool)) \
            or set(condition) - _ANNOT - {"required"} != {"properties"}:
        return None
    props = condition["properties"]
    if not isinstance(props, dict) or len(props) != 1:
        return None
    [(prop, value)] = props.items()
    if not isinstance(value, dict) or set(value) - _ANNOT != {"const"} \
            or not isinstance(value["const"], (str, int, float, bool, type(None))):
        return None  # (`not` of an enum of objects or arrays is out of `_not`'s reach: that branch would take all)
    required = condition.get("required")
    if required is not None and required != [prop]:
        return None
    return prop, required is not None


def _one_of(node: dict, ctx: _Ctx) -> dict:
    branches = node.get("oneOf")
    if not isinstance(branches, list) or not (1 <= len(branches) <= _MAX_ONEOF):
        return node
    # Only values that pass the node's other keywords matter: test each branch conjoined with them.
    rest = {k: v for k, v in node.items() if k != "oneOf" and k not in _ANNOT}
    ctxd = [{"allOf": [b, rest]} if rest else b for b in branches]
    disjoint = all(ctx.disjoint(ctxd[i], ctxd[j]) for i in range(len(branches)) for j in range(i + 1, len(branches)))
    if not disjoint:
        branches = _exactly_one_by_negation(branches, ctx)
        if branches is None:
            return _one_of_values(node, ctx)
        if not branches:
            ctx.changed = True
            return False
    ctx.changed = True
    if "anyOf" in node:
        node = {k: v for k, v in node.items() if k != "oneOf"}
        _add_all_of(node, {"anyOf": branches})
        return node
    # Same place in the object: llguidance orders merged properties by the order it meets the keywords.
    return {("anyOf" if k == "oneOf" else k): (branches if k == "oneOf" else v) for k, v in node.items()}


def _one_of_values(node: dict, ctx: _Ctx) -> Any:
    """A `oneOf` node that takes few values (constrain/finite_values.py) as the `enum` of them, where its
    branches have no negation to write (arrays, objects): `oneOf: [{enum: [[3, 4]]}, {enum: [[1, 2]]}, {enum:
    [[3, 4]]}]` was checked as each value finished, and after `[3` only `,4]` could follow, which it refused
    (QA realworld F2)."""
    return _as_enum(node, finite_values(node, ctx.root, _MAX_ONEOF_VALUES, ctx.validator), ctx)


def _as_enum(node: dict, values: list | None, ctx: _Ctx) -> Any:
    """`node` as the `enum` of `values`, the values it takes (None: not known, `node` as it is; none: `false`).
    Keywords that assert nothing (`$defs`, annotations) stay."""
    if values is None:
        return node
    ctx.changed = True
    if not values:
        return False
    return {**{k: v for k, v in node.items() if k not in ASSERTIONS}, "enum": values}


_FEW_VALUED_TYPES = frozenset({"integer", "null", "boolean"})  # (`_late_integers_as_enum`: finite_values lists them)


def _late_integers_as_enum(node: dict, ctx: _Ctx) -> Any:
    """An integer node between bounds of at most 1,024 integers that still holds a `not` or `if` (the steps
    before found no keyword form: `not: {multipleOf: 2}` beside `multipleOf: 13`) as the `enum` of the integers
    it accepts. Left to the late check, the number's digits were free: `{multipleOf: 13, not: {multipleOf: 2},
    minimum: 100, maximum: 999}` let `13` be written, which no digit completes to an odd multiple, and 7 random
    walks in 20 gave up. So too beside `null` and `boolean` (`type: ["integer", "null"]`, an optional number as
    generated schemas write it). At most 4,096 integers are checked in one schema (fifty such nodes took 3 s),
    their checks reading at most 32,768 subschemas in all (`_subschemas_reached` per integer: four nodes whose
    `not` held an `anyOf` of 1,000 multiples took 82 s). Not past ±2**53, where llguidance writes an enum's
    integers as the doubles it reads them as (`100000000000000032`, a multiple of 3, under `not: {multipleOf:
    3}` from 1e17 to 1e17 + 40)."""
    if not ({"not", "if"} & set(node)) or not {"integer"} <= ctx.types(node) <= _FEW_VALUED_TYPES:
        return node
    ends = integer_range(node)
    if ends is None:
        return node
    first, last = ends
    count = last - first + 1
    if count > min(_MAX_LATE_INTEGERS, ctx.integers_to_list) or max(abs(first), abs(last)) > _EXACT_INTEGERS:
        return node
    reads = max(count, 0) * _subschemas_reached(node, ctx, ctx.integer_reads // max(count, 1) + 1)
    if reads > ctx.integer_reads:
        return node
    ctx.integers_to_list -= max(count, 0)
    ctx.integer_reads -= reads
    return _as_enum(node, finite_values(node, ctx.root, _MAX_LATE_INTEGERS, ctx.validator), ctx)


def _subschemas_reached(node: Any, ctx: _Ctx, most: int) -> int:
    """The objects and list members `node` holds and its local `$ref`s reach (each once): what one check of it may
    read. Counted up to `most` (past it, `most` + 1)."""
    seen, stack, count = set(), [node], 0
    while stack and count <= most:
        item = stack.pop()
        if isinstance(item, list):
            count += len(item)
            stack.extend(item)
        elif isinstance(item, dict) and id(item) not in seen:
            seen.add(id(item))
            count += 1
            stack.extend(item.values())
            if isinstance(item.get("$ref"), str):
                stack.append(ctx.resolve(item["$ref"]))
    return min(count, most + 1)


def _exactly_one_by_negation(branches: list, ctx: _Ctx) -> list | None:
    """oneOf [B1, ..., Bn] is anyOf over i of (Bi and, for every j != i, not Bj): exact whenever each Bj has a
    `not`-free negation among the values of Bi (`_negation`, an anyOf of pieces). Pieces of a type Bi cannot
    have are left out; the pieces a branch multiplies are capped so that llguidance's intersection of them stays
    small."""
    if len(branches) > _MAX_ONEOF_NEGATED:
        return None
    names: dict[str, Any] = {}
    for b in branches:
        b = ctx._deref(b)
        if isinstance(b, dict) and isinstance(b.get("properties"), dict):
            names.update({x: {} for x in b["properties"]})
    # llguidance lays out an object's properties in the order it meets them: without this, each branch would
    # put its own names first and the others' (from the negations) after.
    order = [{"properties": names}] if names else []
    out: list = []
    for i, branch in enumerate(branches):
        own = ctx._deref(branch)
        types = ctx.types(own)
        conjuncts: list = []
        size = 1
        for j, other in enumerate(branches):
            if j == i:
                continue
            negation = _negation(other, ctx, types, own)
            if negation is None:
                return None
            if negation is True:
                continue
            pieces = negation["anyOf"] if isinstance(negation, dict) and set(negation) == {"anyOf"} \
                else [negation]
            pieces = [p for p in pieces if p is not False and ctx.types(p) & types]
            if not pieces:
                break  # every value of Bi also matches Bj: Bi never matches alone
            size *= len(pieces)
            conjuncts.append(pieces[0] if len(pieces) == 1 else {"anyOf": pieces})
        else:
            if size > _MAX_ONEOF_NEGATION_PIECES:
                return None
            out.append({"allOf": [*order, branch, *conjuncts]} if conjuncts else branch)
    return out


def _unique_items(node: dict, ctx: _Ctx) -> dict:
    """`uniqueItems: false` says nothing; under `uniqueItems: true` an array holds at most as many items as
    its items schema has values: that bound becomes `maxItems` (a small domain only), so the array closes once
    every value is used instead of opening an item that could only repeat one (a dead end: `{"a": 0|1}`
    objects, the third one). With at most one value, the keyword itself is then redundant; with fewer values
    than `minItems`, no array is valid."""
    if "uniqueItems" not in node:
        return node
    u = node["uniqueItems"]
    mx = node.get("maxItems")
    items = node.get("items")
    prefix = node.get("prefixItems")
    if u is False or (u is True and isinstance(mx, int) and not isinstance(mx, bool) and mx <= 1):
        node = {k: v for k, v in node.items() if k != "uniqueItems"}
        ctx.changed = True
        return node
    if u is True and isinstance(items, dict) and prefix is None:
        values = finite_values(items, ctx.root, _MAX_UNIQUE_DOMAIN, ctx.validator)
        if values is None:
            return node
        size = len(values)
        least = node.get("minItems", 0)
        if _number(least) and least > size:  # (no array can hold that many: the node keeps its other types)
            types = types_of(node["type"]) if "type" in node else _ALL_TYPES
            if types is None:
                return node
            ctx.changed = True
            names = _type_value(types - {"array"})
            return False if not names else {**node, "type": names}
        most = min(mx, size) if isinstance(mx, int) and not isinstance(mx, bool) else size
        tuple_key = "prefixItems" if "prefixItems" in ctx.draft_keywords else "items"  # (before 2020-12)
        orders = _unique_orders(values, least if _number(least) else 0, most, tuple_key)
        if orders is not None:
            ctx.changed = True
            out = {k: v for k, v in node.items() if k != "uniqueItems"}
            _add_all_of(out, {"anyOf": orders})
            return out
        if size <= 1:
            node = {k: v for k, v in node.items() if k != "uniqueItems"}
        elif most == mx:
            return node
        node = {**node, "maxItems": most}
        ctx.changed = True
    return node


_MAX_UNIQUE_ORDERS = 64  # unique arrays of container values laid out one by one (4 values: 64 orders)


def _unique_orders(values: list, least: int, most: int, tuple_key: str) -> list | None:
    """Each array of distinct `values` (from `least` to `most` of them), as a tuple of one-value `enum`s (draft 4
    has no `const`: such tuples held nothing, review2 F1), where some value
    is an object or an array (scalars are steered while written: constrain/unique_items.py) and they are few. As
    each is written, the checks refuse a repeat only once it is finished: in `[{"a": 1}, {"b": 2}, {"b": 2` only
    the `}` that finishes the repeat could follow, and half the answers ended with `constraint_too_complex` (QA
    fuzz2 F6)."""
    least = math.ceil(least)  # (`minItems: 1.5`)
    if not any(isinstance(v, (dict, list)) for v in values) or least > most:  # (none: `anyOf: []` took no value,
        return None  # where only arrays are impossible: review4 F2)
    counts = [math.perm(len(values), k) for k in range(least, most + 1)]
    if sum(counts) > _MAX_UNIQUE_ORDERS:
        return None
    return [{tuple_key: [{"enum": [v]} for v in order], "minItems": len(order), "maxItems": len(order)}
            for k in range(least, most + 1) for order in itertools.permutations(values, k)]


_MAX_CONTAINS_ITEMS = 8  # `contains` laid out position by position up to this maxItems (n(n+1)/2 subschemas)
_MAX_CONTAINS_PLACES = 70  # and `minContains: m` as the sets of m places, up to this many (8 choose 4)


def _contains(node: dict, ctx: _Ctx) -> dict:
    """`contains: C` (at least one item valid against C) on an array of at most N items, N <= 8: the item at some
    position k < N is, so an `anyOf` over k of `prefixItems: [true]*k + [C]` with `minItems: k + 1` (the node's
    `items` still applies to every item). Checked late, the array's end was refused only once the last place was
    written, a dead end. With no `maxContains` beside; with `minContains: m`, over the sets of m positions. Before
    2020-12 the positions are an `items` list (draft 7's `contains: {"type": "string"}` beside `maxItems: 2` let
    `[1, 2` be written, which nothing could close), beside the node's own `items` list too, and `minContains: 0`
    asks for one item there as well (`_contains_in_both`).
    The node's own `prefixItems` apply beside each position's (with only a later slot able to hold C, the late
    check let the walk fill the earlier ones and the budget found no end: QA fuzz F2). `maxContains: 0` (with
    `minContains: 0`) says no item holds C: `items: {not: C}` in an `allOf` (checked late, an item C took was
    written and refused only once finished: QA fuzz2 F7)."""
    most, least = node.get("maxContains"), node.get("minContains")
    if "contains" in node and _count(most) and most == 0 and _count(least) and least == 0 and "$ref" not in node \
            and "unevaluatedItems" in ctx.draft_keywords:  # (2019-09 on: `minContains: 0` allows none only there)
        ctx.changed = True
        out = {k: v for k, v in node.items() if k not in ("contains", "minContains", "maxContains")}
        # (among the types the node's items may take: `not: {type: integer}` is inexpressible alone; this pass
        # rewrites no `not` it makes)
        within = frozenset().union(*(ctx.types(s) for s in _item_schemas(node, ctx)))
        negation = _negation(node["contains"], ctx, within)
        _add_all_of(out, {"items": {"not": node["contains"]} if negation is None else negation})
        return out
    least = node.get("minContains", 1)
    if _count(least) and "unevaluatedProperties" not in ctx.draft_keywords:  # (before 2019-09: one at least)
        least = max(least, 1)
    if "contains" in node and "maxContains" in node and _count(least) and "$ref" not in node:
        return _contains_counted(node, ctx, least)
    if "contains" not in node or not (_count(least) and least >= 1) or "$ref" in node:
        return node
    mx, items = node.get("maxItems"), node.get("items", True)
    if not (isinstance(mx, int) and not isinstance(mx, bool) and least <= mx <= _MAX_CONTAINS_ITEMS) \
            or not isinstance(items, (dict, bool, list)) or math.comb(mx, least) > _MAX_CONTAINS_PLACES:
        return node
    ctx.changed = True
    out = {k: v for k, v in node.items() if k not in ("contains", "minContains")}
    # (`minContains: m`: some m places hold C; checked late, an item that left too few places for the rest was
    # written, and the array could not close: QA fuzz2 F5)
    # (before 2020-12 the places are the draft's own `items` list, `{}` for any item: draft 4 has no `true`)
    tuple_key, anything = ("prefixItems", True) if "prefixItems" in ctx.draft_keywords else ("items", {})
    places = [{tuple_key: [node["contains"] if i in chosen else anything for i in range(chosen[-1] + 1)],
               "minItems": chosen[-1] + 1} for chosen in itertools.combinations(range(mx), least)]
    _add_all_of(out, {"anyOf": places})
    return out


def _contains_counted(node: dict, ctx: _Ctx, least: int) -> dict:
    """`contains: C` beside `maxContains: M` on an array of at most N items, N <= 8: the items C takes are some
    set of between `least` (`minContains`, read as `_contains` reads it) and M places, and every other item is
    not C: an `anyOf` over those sets, each a `prefixItems` of C at its places and not-C between them, not-C after
    them. Checked late, an item C took past the M-th was refused only once finished, a dead end (`prefixItems:
    [{type: integer}], contains: {type: string}, maxContains: 1, maxItems: 3` wrote `[1, "a", "b` and could not
    close). Only where not-C is written without `not` (`_negation`; a `not` is checked late as well), for up to
    _MAX_CONTAINS_PLACES sets."""
    most, mx, contains = node["maxContains"], node.get("maxItems"), node["contains"]
    if not (_count(most) and isinstance(mx, int) and not isinstance(mx, bool) and least <= most
            and mx <= _MAX_CONTAINS_ITEMS) or isinstance(contains, bool):
        return node
    sets = [chosen for k in range(least, min(most, mx) + 1) for chosen in itertools.combinations(range(mx), k)]
    within = frozenset().union(*(ctx.types(s) for s in _item_schemas(node, ctx)))
    negation = _negation(contains, ctx, within) if 0 < len(sets) <= _MAX_CONTAINS_PLACES else None
    # (`false`: every item the node allows is C, so the places are those of the first items, where the draft has
    # boolean subschemas: `items: {enum: ["a", "b"]}, contains: {type: string}, maxContains: 1` wrote `["a", "b`)
    if negation is None or negation is True or (negation is False and "const" not in ctx.draft_keywords):
        return node
    ctx.changed = True
    out = {k: v for k, v in node.items() if k not in ("contains", "minContains", "maxContains")}
    tuple_key, rest_key = ("prefixItems", "items") if "prefixItems" in ctx.draft_keywords \
        else ("items", "additionalItems")
    places = [{tuple_key: [contains if i in chosen else negation for i in range(chosen[-1] + 1)],
               "minItems": chosen[-1] + 1, rest_key: negation} if chosen else {"items": negation} for chosen in sets]
    _add_all_of(out, {"anyOf": places})
    return out


def _dependencies(node: dict, ctx: _Ctx) -> dict:
    out = node
    for key in ("dependentRequired", "dependencies", "dependentSchemas"):
        deps = out.get(key)
        if not isinstance(deps, dict):
            continue
        req = list(out.get("required", [])) if isinstance(out.get("required"), list) else []
        left, extra_req, extra_all, alts = {}, [], [], []
        for trigger, dep in deps.items():
            if isinstance(dep, list) and all(isinstance(d, str) for d in dep):
                if set(dep) <= set(req) or not dep:
                    continue
                if trigger in req:
                    extra_req += [d for d in dep if d not in req and d not in extra_req]
                    continue
                alts.append({"anyOf": [{"properties": {trigger: False}}, {"required": [trigger] + list(dep)}]})
                left[trigger] = dep
            elif isinstance(dep, (dict, bool)) and key != "dependentRequired":
                if dep is True or dep == {}:
                    continue
                if trigger in req and types_of(out.get("type")) == {"object"}:  # (a value of another type: not
                    # an object, which holds every dependency, while `allOf` would ask it to hold the dependency's
                    # schema: `2` under `required: [a], dependentSchemas: {a: {type: object}}`, QA rewritefuzz F1)
                    extra_all.append(dep)
                    continue
                alts.append({"anyOf": [{"properties": {trigger: False}}, dep]})
                left[trigger] = dep
            else:
                left[trigger] = dep
                alts.append(None)
        if any(a is None for a in alts) or len(alts) > _MAX_DEP_ANYOF:
            if not extra_req and not extra_all and len(left) == len(deps):
                continue
            # Only the exact, local simplifications; the rest stays for the backend to refuse.
            alts = []
        else:
            left = {}
        out = dict(out)
        if left:
            out[key] = left
        else:
            del out[key]
        for s in extra_all + alts:
            _add_all_of(out, s)
        if extra_req:
            out["required"] = req + extra_req
        ctx.changed = True
    return out


def _properties_count(node: dict, ctx: _Ctx) -> dict:
    out = node
    mn = node.get("minProperties")
    if isinstance(mn, int) and not isinstance(mn, bool) and isinstance(node.get("required"), list) \
            and len(set(x for x in node["required"] if isinstance(x, str))) >= mn:
        out = {k: v for k, v in out.items() if k != "minProperties"}
    mx = node.get("maxProperties")
    props = node.get("properties", {})
    if isinstance(mx, int) and not isinstance(mx, bool) and isinstance(props, dict) \
            and node.get("additionalProperties") is False and not node.get("patternProperties") \
            and len(props) <= mx:
        out = {k: v for k, v in out.items() if k != "maxProperties"}
    out = _open_object_counts(_closed_object_counts(out))
    if out is not node:
        ctx.changed = True
    return out


def _closed_object_counts(node: dict) -> dict:
    """On a closed object (every key a declared property), min/maxProperties only count the optional properties
    present: "at least k of them" is an anyOf of which k are required, "at most k" an anyOf of which the others
    are absent (when the alternatives are few)."""
    props = node.get("properties")
    req = node.get("required", [])
    if not (isinstance(props, dict) and node.get("additionalProperties") is False
            and not node.get("patternProperties") and isinstance(req, list) and set(req) <= set(props)):
        return node
    optional = [k for k, v in props.items() if k not in req and v is not False]
    out = node
    for key in ("minProperties", "maxProperties"):
        bound = node.get(key)
        if not isinstance(bound, int) or isinstance(bound, bool):
            continue
        # how many optional properties must be present (min), or absent (max)
        count = bound - len(set(req)) if key == "minProperties" else len(optional) - (bound - len(set(req)))
        if count > len(optional) or (count > 0 and math.comb(len(optional), count) > _MAX_COUNT_ANYOF):
            continue  # unsatisfiable (the backend says so) or too many alternatives
        out = {k: v for k, v in out.items() if k != key}
        if count <= 0:
            continue  # true of every object the node accepts
        combos = itertools.combinations(optional, count)
        if key == "minProperties":
            branches = [{"required": list(c)} for c in combos]
        else:
            branches = [{"properties": {x: False for x in c}} for c in combos]
        _add_all_of(out, branches[0] if len(branches) == 1 else {"anyOf": branches})
    return out


def _open_object_counts(node: dict) -> dict:
    """min/maxProperties where keys beyond the declared properties may appear (llguidance counts keys only when
    every declared property is required or forbidden): an anyOf of alternatives in which each optional declared
    property is required or forbidden, each keeping the bound. "At least m" needs only the alternatives with fewer
    than the missing count present (the others: any `m - |required|` of them required); "at most M" those with at
    most `M - |required|` present. With both bounds, the latter, carrying both."""
    lo, hi = (node.get(k) for k in ("minProperties", "maxProperties"))
    lo = lo if isinstance(lo, int) and not isinstance(lo, bool) else None
    hi = hi if isinstance(hi, int) and not isinstance(hi, bool) else None
    props = node.get("properties", {})
    req = node.get("required", [])
    if (lo is None and hi is None) or not isinstance(props, dict) or not isinstance(req, list) \
            or not all(isinstance(r, str) for r in req):
        return node
    optional = [k for k, v in props.items() if k not in req and v is not False]
    if not optional:
        return node  # nothing to split: the backend counts the keys itself
    missing = len(optional) + 1 if hi is None else hi - len(set(req))  # optional properties that may be present
    need = 0 if lo is None else lo - len(set(req))  # present keys needed beyond the required ones
    if missing < 0:
        return node  # unsatisfiable: the backend says so
    sizes = range(min(missing, need - 1 if hi is None else missing, len(optional)) + 1)
    some_size = need if hi is None and 0 < need <= len(optional) else None
    # (counted before they are listed: 30 optional properties and a bound of 17 are ~10^8 alternatives)
    alternatives = sum(math.comb(len(optional), j) for j in sizes) + \
        (math.comb(len(optional), some_size) if some_size is not None else 0)
    if not alternatives or alternatives > _MAX_COUNT_ANYOF:
        return node
    exact = [c for j in sizes for c in itertools.combinations(optional, j)]
    some = list(itertools.combinations(optional, some_size)) if some_size is not None else []
    bounds = {k: node[k] for k in ("minProperties", "maxProperties") if k in node}
    branches = [{"required": list(c)} for c in some]
    branches += [{"required": list(c), "properties": {x: False for x in optional if x not in c}, **bounds}
                 for c in exact]
    out = {k: v for k, v in node.items() if k not in bounds}
    _add_all_of(out, branches[0] if len(branches) == 1 else {"anyOf": branches})
    return out


def _property_names(node: dict, ctx: _Ctx) -> dict:
    if "propertyNames" not in node:
        return node
    pn = node["propertyNames"]
    props = node.get("properties", {})
    if isinstance(props, dict) and props and targeted(f"{ctx.here}/properties", ctx.refs) \
            and (pn is False or node.get("additionalProperties") is False):
        return node  # (a declared property a `$ref` points at is not made `false` below: the checks keep the names)
    if pn is False and isinstance(props, dict):  # (no name at all: an object has no property; a key was written)
        ctx.changed = True
        out = {k: v for k, v in node.items() if k not in ("propertyNames", "patternProperties")}
        out["properties"], out["additionalProperties"] = {k: False for k in props}, False
        return out
    if pn is True or _name_patterns(ctx._deref(pn)) == []:
        ctx.changed = True
        return {k: v for k, v in node.items() if k != "propertyNames"}
    if isinstance(props, dict):
        declared = _names_as_properties(node, ctx) if not node.get("patternProperties") else node
        if declared is not node:
            return declared
        if _name_patterns(ctx._deref(pn)) is not None:
            return _names_as_patterns(node, ctx)
    if not (isinstance(props, dict) and node.get("additionalProperties") is False
            and not node.get("patternProperties") and isinstance(pn, (dict, bool)) and ctx.decidable(pn)):
        return node
    out = {k: v for k, v in node.items() if k != "propertyNames"}
    out["properties"] = {k: (v if ctx.is_valid(pn, k) else False) for k, v in props.items()}
    req = out.get("required")
    if isinstance(req, list) and any(out["properties"].get(r, True) is False for r in req):
        return node  # a required name refused: the node accepts no object; leave it to the backend
    ctx.changed = True
    return out


def _names_as_properties(node: dict, ctx: _Ctx) -> dict:
    """`propertyNames` with finitely many names (an enum, pydantic's `dict[Literal["math", "art"], int]`) on an object
    without patternProperties: every name becomes a declared property (its schema the declared one, else
    `additionalProperties`) and `additionalProperties: false`; a declared property it does not name is left out.
    As patternProperties the names could repeat (4 of 16 answers wrote `{"art": -8, "art": -21, ...}`, which
    parses with values lost) and a comma could follow the last name left (a dead end); a declared property is
    written once."""
    pn = ctx._deref(node["propertyNames"])
    values = ctx.values(pn)
    if values is None or not ctx.decidable(pn):
        return node
    names = list(dict.fromkeys(v for v in values if isinstance(v, str) and ctx.is_valid(pn, v)))
    if len(names) > _MAX_NAMED_PROPERTIES:
        return node
    props = node.get("properties", {})
    req = node.get("required")
    if isinstance(req, list) and any(r not in names for r in req if isinstance(r, str)):
        return node  # a required name refused: the node accepts no object; leave it to the backend
    extra = node.get("additionalProperties", True)
    out = {k: v for k, v in node.items() if k not in ("propertyNames", "additionalProperties", "properties")}
    ordered = [k for k in props if k in names] + [k for k in names if k not in props]
    out["properties"] = {k: props[k] if k in props else extra for k in ordered}
    out["additionalProperties"] = False
    ctx.changed = True
    return out


def _patterns_as_properties(node: dict, ctx: _Ctx) -> dict:
    """`patternProperties` on a closed object whose patterns match finitely many names (`^(math|art)$`, `^[a-e]$`;
    at most 64 in all): each name becomes a declared property, its schema the allOf of the declared one and those
    of the patterns that match it, as `_names_as_properties` does for `propertyNames` and for the same reasons
    (a name written at most once; no comma after the last one left). Names found on the patterns' automata
    (constrain/regex_sets.py), never by running a client's regex."""
    patterns = node.get("patternProperties")
    props = node.get("properties", {})
    if not isinstance(patterns, dict) or not patterns or node.get("additionalProperties") is not False \
            or not isinstance(props, dict):
        return node
    matched: dict[str, list] = {}
    for pattern, schema in patterns.items():
        # The names every regex dialect matches (the object is closed: the others are refused); a name holding a
        # lone surrogate (`\ud83d` in the pattern) cannot be written, and llguidance then refuses the pattern.
        names = finite_language(portable_pattern(pattern), _MAX_NAMED_PROPERTIES, ctx.regex_work)
        if names is None or any("\ud800" <= c <= "\udfff" for name in names for c in name):
            return node
        for name in names:
            matched.setdefault(name, []).append(schema)
    if len(set(matched) | set(props)) > _MAX_NAMED_PROPERTIES:
        return node
    out = {k: v for k, v in node.items() if k not in ("patternProperties", "properties")}
    out["properties"] = {k: _all_of([v, *matched.get(k, [])]) for k, v in props.items()}
    out["properties"].update({k: _all_of(v) for k, v in matched.items() if k not in props})
    ctx.changed = True
    return out


def _all_of(schemas: list) -> Any:
    return schemas[0] if len(schemas) == 1 else {"allOf": schemas}


def _names_as_patterns(node: dict, ctx: _Ctx) -> dict:
    """`propertyNames` N: keys other than the declared ones must be names N accepts, so they become
    `patternProperties` over N minus the declared names, with `additionalProperties: false`, and a declared
    property whose name N refuses is forbidden. Only for an N that says string things (`pattern`, lengths, an enum
    of strings), written as regexes; the declared names are cut out of N, and tested against it, with automata
    (constrain/regex_sets.py), never by running N's regex. Beside `patternProperties` of its own, the names N
    accepts are cut by which of those patterns match them: each region gets the schemas of the patterns that
    match it (`additionalProperties` where none does), and a declared name those patterns of its region too
    (checked only as a key's quote closed, a key N could never accept was written until max_tokens: QA fuzz2
    F3, 5 walks in 20 ended)."""
    props = node.get("properties", {})
    names = _name_patterns(ctx._deref(node["propertyNames"]))
    own = node.get("patternProperties") or {}
    if own and ctx.values(ctx._deref(node["propertyNames"])) is not None:
        return node  # (finitely many names: their regions became properties in no order the schema gives, and
        # llguidance writes properties in declared order: review2 F4)
    if names is None or len(props) > _MAX_PATTERN_PROPERTIES or not isinstance(own, dict) \
            or len(own) > _MAX_PATTERN_PROPERTIES \
            or any(portable_pattern(p) != widest_pattern(p) for p in own):  # (a region read one way by the
        return node  # automata and another by a validator: `\w` holds `é` in Python's regexes, not in ECMA's)
    own_patterns = list(own)
    literals = ["^" + "".join(regex_char(c) for c in k) + "$" for k in props]
    extra = node.get("additionalProperties", True)
    every = frozenset(range(len(names)))
    first_own, first_literal = len(names), len(names) + len(own_patterns)

    def schema_of(sig: frozenset) -> Any:
        """What a key in this region holds its value to beside `properties`: its patterns' schemas, else `extra`."""
        matched = [own[own_patterns[i - first_own]] for i in sorted(sig) if first_own <= i < first_literal]
        return extra if not matched else matched[0] if len(matched) == 1 else {"allOf": matched}

    if literals or len(names) > 1 or own_patterns:
        regions = disjoint_regions(names + own_patterns + literals, ctx.regex_work)
        if regions is None:
            return node
        others = {r: schema_of(sig) for r, sig in regions if every <= sig and not any(i >= first_literal
                                                                                     for i in sig)}
        literal_sigs = {i - first_literal: sig for _, sig in regions for i in sig if i >= first_literal}
    else:
        others, literal_sigs = {names[0]: extra}, {}
    out = {k: v for k, v in node.items() if k not in ("propertyNames", "additionalProperties", "patternProperties")}
    if props:
        declared = {}
        for i, (k, v) in enumerate(props.items()):
            sig = literal_sigs.get(i, frozenset())
            beside = [own[own_patterns[j - first_own]] for j in sorted(sig) if first_own <= j < first_literal]
            declared[k] = False if not every <= sig else v if not beside else {"allOf": [v, *beside]}
        out["properties"] = declared
    req = out.get("required")
    if isinstance(req, list) and any(out.get("properties", {}).get(r) is False for r in req):
        return node  # a required name refused: the node accepts no object; leave it to the backend
    kept = {r: v for r, v in others.items() if v is not False}
    if own_patterns and kept and all(finite_language(r, _MAX_NAMED_PROPERTIES, ctx.regex_work) is not None
                                     for r in kept):
        return node  # (as with an enum of names above: finite regions become properties in an order of their own)
    if kept:
        out["patternProperties"] = kept
    out["additionalProperties"] = False
    longest = _names_longest(ctx._deref(node["propertyNames"]))
    if longest is not None:  # (left to the checks on finished names)
        out["propertyNames"] = {"maxLength": longest}
    ctx.changed = True
    return out


def _names_longest(pn: dict) -> int | None:
    """The length a host-name format holds names to, which `_name_patterns` leaves out of its regexes: the checks
    on finished names keep it (a longer key's quote is refused). None where the names are held otherwise."""
    if pn.get("format") != "hostname" and not _format_of(pn.get("pattern")):
        return None
    most, longest = pn.get("maxLength"), _FORMAT_LONGEST["idn-hostname"]
    return None if isinstance(most, int) and most < longest else longest


def _name_patterns(pn: Any) -> list[str] | None:
    """Regexes whose intersection is the strings `pn` accepts, when it constrains only strings that way ([]: every
    string, as `type: string` says of names; None: anything else, e.g. `not`, a `$ref` with siblings). A format
    llguidance checks only in JSON strings is its pattern (`NATIVE_FORMAT_PATTERNS`: a key was free text, checked
    when its quote closed, and a key that could never be a host name ran the answer to max_tokens); the formats
    with patterns of their own are patterns by then (`_format`)."""
    if not isinstance(pn, dict):
        return None
    body = {k: v for k, v in pn.items() if k in ASSERTIONS}
    if set(body) - {"type", "pattern", "minLength", "maxLength", "enum", "const", "format"}:
        return None
    types = types_of(body["type"]) if "type" in body else _ALL_TYPES
    if types is None or "string" not in types:
        return None
    out = []
    if "format" in body:  # (a host name's 253 characters are not counted here: cut by length, its automaton
        # grows past the regions' limits, and the keyword would stay a check on finished keys)
        if body["format"] not in NATIVE_FORMAT_PATTERNS:
            return None
        out.append(f"^{NATIVE_FORMAT_PATTERNS[body['format']]}$")
    if "pattern" in body:
        from constrain.llg_backend import unreadable_pattern  # (the backend that reads names' patterns)

        # (one no backend reads stays `propertyNames`: named unenforced, a 400 only under strict, as the keyword
        # would be; as a name pattern it was a 400 without strict too, QA latechecks F5)
        if not isinstance(body["pattern"], str) or unreadable_pattern(body["pattern"]) is not None:
            return None
        out.append(body["pattern"])
    lo, hi = body.get("minLength", 0), body.get("maxLength")
    if hi is not None and hi == _FORMAT_LONGEST.get(_format_of(body.get("pattern"))):
        hi = None  # (a length `_format` put there: not counted in names, as above)
    if not _count(lo) or (hi is not None and not _count(hi)):
        return None
    if lo or hi is not None:
        out.append(f"^[\\s\\S]{{{lo},{'' if hi is None else hi}}}$")
    if "enum" in body or "const" in body:
        values = [body["const"]] if "const" in body else body["enum"]
        strings = [v for v in values if isinstance(v, str)] if isinstance(values, list) else []
        if not strings or "enum" in body and "const" in body:
            return None
        out.append("^(?:" + "|".join("".join(regex_char(c) for c in v) for v in strings) + ")$")
    return out


_MAX_NAMED_PROPERTIES = 64  # propertyNames enums declared as properties (llguidance lays out each optional one)
_MAX_PATTERN_PROPERTIES = 16  # overlapping patternProperties cut into disjoint regions (at most 2^n - 1 of them)
_MAX_PATTERN_COPIES = 2_000  # schema objects `_inlined_patterns` copies in one schema


def _pattern_properties(node: dict, ctx: _Ctx) -> dict:
    """A `patternProperties` regex with a long count at a side it does not anchor (`[A-Za-z0-9.:-]{1,255}`, which
    llguidance unrolls until it gives up mid-output) becomes the anchored pattern of the same names
    (`regex_sets.search_region`). Overlapping ones (llguidance wants them disjoint): one pattern per region of
    names matched by exactly a set R of the patterns, with the schemas of R together (an `allOf`). A name matched
    by several patterns must pass each of their schemas: so it does in its region. A pattern whose schema
    asserts nothing, where other names may hold anything too (`additionalProperties` absent, or annotations
    alone), says nothing and goes (`"^$[a-zA-Z0-9$_]*$": {"description": "reserved"}`, a `$` llguidance refused
    mid-pattern, made a real-world schema a 400)."""
    pp = node.get("patternProperties")
    if not isinstance(pp, dict) or not pp:
        return node
    if any(_says_nothing(schema) for schema in pp.values()) and _says_nothing(node.get("additionalProperties", True)) \
            and not _has_key(ctx.root, "unevaluatedProperties"):
        ctx.changed = True
        pp = {p: schema for p, schema in pp.items() if not _says_nothing(schema)}
        node = {k: pp if k == "patternProperties" else v for k, v in node.items() if k != "patternProperties" or pp}
        if not pp:
            return node
    if len(pp) > _MAX_PATTERN_PROPERTIES:
        return node
    regions = {p: search_region(p, ctx.regex_work) for p in pp}
    if any(regions.values()) and len({regions[p] or p for p in pp}) == len(pp):
        ctx.changed = True
        return {**node, "patternProperties": {regions[p] or p: schema for p, schema in pp.items()}}
    if len(pp) < 2:
        return node
    patterns = list(pp)
    regions = disjoint_regions(patterns, ctx.regex_work)
    if regions is None or all(len(members) == 1 for _, members in regions):
        return node  # out of reach, or already disjoint (left as the client wrote them)
    ctx.changed = True
    out = {}
    for region, members in regions:
        schemas = [pp[patterns[i]] for i in sorted(members)]
        out[region] = schemas[0] if len(schemas) == 1 else {"allOf": schemas}
    return {**node, "patternProperties": out}


def _says_nothing(schema: Any) -> bool:
    """`schema` accepts every value: `true`, or nothing but annotations (and definitions: a step that would move
    one a `$ref` names is undone, `_rewrite`)."""
    return schema is True or (isinstance(schema, dict) and not (set(schema) - _ANNOT))


def _joined_patterns(node: dict, ctx: _Ctx) -> dict:
    """`patternProperties` in several of the schemas an `allOf` joins (the node's own, its members', theirs), or
    that meet one of an `anyOf`/`oneOf`'s branches (theirs, and their members'): llguidance merges them into one
    object and refuses patterns of two of them that overlap ("not disjoint"), though a name both match must simply
    pass both schemas (the root's `a` beside an `anyOf` branch's `^.{1,2}$`: JSONSchemaBench Handwritten
    allOfPProp7-10 were a 400). Every such schema's patterns become regions of one partition of all their names
    (matched by exactly a set of the patterns, `disjoint_regions`), each schema holding the regions its own
    patterns cover: exact for each alone (its patterns match the same names, each with the same schemas). Where
    the schemas several of them give one region meet patterns of their own (a `propertyNames` rewritten to
    patterns beside a `patternProperties`, under one shared name), and all of them hold together (no branch among
    them), the first holds them all as one `allOf`, aligned in turn, and the others `{}` (still matched by a
    pattern there, so no `additionalProperties` applies). A member or branch that is only a `$ref` to such a
    schema is replaced by a copy of it, rewritten. A copy of the node where this changes it."""
    if not any(isinstance(node.get(key), list) for key in _JOINING) or _pattern_holders(node, ctx) < 2 \
            or any(targeted(f"{ctx.here}/{key}", ctx.refs) for key in (*_JOINING, "patternProperties")):
        return node
    out = _fresh_members(node, ctx, ctx.here)
    carriers = _pattern_carriers(out)
    if len(carriers) < 2:
        return node
    together = len(carriers) == len(_pattern_carriers(out, branches=False))
    patterns = list(dict.fromkeys(p for c in carriers for p in c["patternProperties"]))
    if len(patterns) > _MAX_PATTERN_PROPERTIES:
        return node
    if tuple(patterns) not in ctx.regions:  # (a definition an allOf names by `$ref` meets each such allOf)
        ctx.regions[tuple(patterns)] = disjoint_regions(patterns, ctx.regex_work) if len(patterns) > 1 \
            else [(patterns[0], frozenset({0}))]
    regions = ctx.regions[tuple(patterns)]
    if regions is None:
        return node
    trivial = all(len(sig) == 1 for _, sig in regions)  # (then each region is its pattern, written as it was)
    changed = not trivial
    new_pp: list[dict] = [{} for _ in carriers]
    for region, sig in regions:
        key = patterns[next(iter(sig))] if trivial else region
        own = {c: [carrier["patternProperties"][patterns[i]] for i in sorted(sig)
                   if patterns[i] in carrier["patternProperties"]] for c, carrier in enumerate(carriers)}
        own = {c: schemas for c, schemas in own.items() if schemas}
        whole = {"allOf": [s for schemas in own.values() for s in schemas]}
        aligned = _joined_patterns(whole, ctx) if len(own) > 1 and together else whole  # (else: llguidance's)
        for c, schemas in own.items():
            if aligned is not whole:
                new_pp[c][key] = aligned if c == min(own) else {}
            else:
                new_pp[c][key] = schemas[0] if len(schemas) == 1 else {"allOf": schemas}
        changed |= aligned is not whole
    if not changed:
        return node
    ctx.changed = True
    for carrier, pp in zip(carriers, new_pp):
        carrier["patternProperties"] = pp
    return out


# The keywords whose subschemas llguidance merges with the node's own keywords: all at once, or branch by branch.
_JOINING = ("allOf", "anyOf", "oneOf")


def _fresh_members(node: dict, ctx: _Ctx, ptr: str) -> dict:
    """A copy of `node` (at `ptr`) whose `allOf` members and `anyOf`/`oneOf` branches, and theirs, are copies too
    (so they can be changed in place); one that is only a local `$ref` to a schema holding patterns becomes a
    rewritten copy of its target."""
    out = dict(node)
    for key in _JOINING:
        if isinstance(node.get(key), list):
            out[key] = [_fresh_members(_inlined_patterns(m, f"{ptr}/{key}/{i}", ctx), ctx, f"{ptr}/{key}/{i}")
                        if isinstance(m, dict) else m for i, m in enumerate(node[key])]
    return out


def _inlined_patterns(member: dict, ptr: str, ctx: _Ctx) -> dict:
    """`member` itself, or, where it is only a local `$ref` (annotations aside) to a schema holding
    `patternProperties` or `propertyNames` (here or in its `allOf`), a copy of the target, rewritten at `ptr`.
    Exact: a local `$ref` means its target, and the copy's own `$ref`s still name the same places."""
    ref = member.get("$ref")
    if set(member) - _ANNOT != {"$ref"} or not isinstance(ref, str) or not ref.startswith("#"):
        return member
    target = ctx.resolve(ref)
    if not isinstance(target, dict) or not _holds_patterns(target) or ref in ctx.inlining \
            or any(k in n for n in _iter_nodes(target) for k in ("$id", "id", "$anchor", "$dynamicAnchor")):
        return member
    size = sum(1 for _ in itertools.islice(_iter_nodes(target), ctx.pattern_copies + 1))
    if size > ctx.pattern_copies:
        return member
    ctx.pattern_copies -= size
    here = ctx.here
    ctx.inlining.add(ref)  # (a definition whose patterns lead back to it is copied once on the way)
    try:
        return _rewrite(copy.deepcopy(target), ptr, ctx, ctx.refs)
    finally:
        ctx.here = here
        ctx.inlining.discard(ref)


def _pattern_holders(node: dict, ctx: _Ctx) -> int:
    """How many of `node`, its `allOf` members and `anyOf`/`oneOf` branches (recursively, and through those that
    are only a local `$ref`) hold `patternProperties` or `propertyNames` themselves: what `_joined_patterns` may
    align."""
    if set(node) - _ANNOT == {"$ref"}:
        target = ctx.resolve(node["$ref"])
        return int(_holds_patterns(target))
    count = int(bool(node.get("patternProperties")) or "propertyNames" in node)
    return count + sum(_pattern_holders(m, ctx) for key in _JOINING if isinstance(node.get(key), list)
                       for m in node[key] if isinstance(m, dict))


def _holds_patterns(schema: Any) -> bool:
    """`schema`, its `allOf` members or `anyOf`/`oneOf` branches (recursively) hold `patternProperties` or
    `propertyNames`."""
    if not isinstance(schema, dict):
        return False
    if schema.get("patternProperties") or "propertyNames" in schema:
        return True
    return any(_holds_patterns(m) for key in _JOINING if isinstance(schema.get(key), list) for m in schema[key])


def _pattern_carriers(node: dict, branches: bool = True) -> list[dict]:
    """`node` and its `allOf` members, and with `branches` its `anyOf`/`oneOf` branches (recursively), that hold
    `patternProperties`, in document order."""
    out = [node] if isinstance(node.get("patternProperties"), dict) and node["patternProperties"] else []
    for key in _JOINING if branches else ("allOf",):
        for m in node.get(key) if isinstance(node.get(key), list) else []:
            if isinstance(m, dict):
                out += _pattern_carriers(m, branches)
    return out


def _declared_out_of_patterns(node: dict, ctx: _Ctx) -> dict:
    """Declared properties whose names `patternProperties` also match: each such property takes the matching
    patterns' schemas into its own (an `allOf`, leaving out a schema equal to its own but for annotations) and
    the patterns are cut down to the names no property declares. llguidance would intersect the two schemas
    itself, but it cannot intersect a `$ref` to a definition it is still compiling (a recursive one); after
    this rewrite, equal schemas (the common case: a catch-all pattern repeating a property's schema) never meet.
    Decided on automata (constrain/regex_sets.py), never by running the client's regexes."""
    props, pp = node.get("properties"), node.get("patternProperties")
    if not (isinstance(props, dict) and isinstance(pp, dict) and props and pp) \
            or len(props) + len(pp) > 4 * _MAX_PATTERN_PROPERTIES:
        return node
    patterns = list(pp)
    literals = ["^" + "".join(regex_char(c) for c in name) + "$" for name in props]
    regions = disjoint_regions(patterns + literals, ctx.regex_work)
    if regions is None:
        return node
    matched: dict[int, list[int]] = {}  # declared property -> the patterns matching its name
    rest: dict[int, str] = {}  # pattern -> the region of the names it alone matches, no declared one among them
    for region, sig in regions:
        names = [i - len(patterns) for i in sig if i >= len(patterns)]
        pats = sorted(i for i in sig if i < len(patterns))
        if names:
            matched[names[0]] = pats
        elif len(pats) == 1:
            rest[pats[0]] = region
        else:
            return node  # overlapping patterns (left to _pattern_properties, or out of its reach)
    if not any(matched.values()):
        return node
    ctx.changed = True
    new_props = {}
    for i, (name, schema) in enumerate(props.items()):
        extra = [pp[patterns[p]] for p in matched.get(i, [])]
        extra = [s for s in extra if not _equal(_assertions(s), _assertions(schema))]
        new_props[name] = {"allOf": [schema, *extra]} if extra else schema
    new_pp = {rest[p]: pp[pattern] for p, pattern in enumerate(patterns) if p in rest}
    out = {**node, "properties": new_props, "patternProperties": new_pp}
    if not new_pp:
        del out["patternProperties"]
    return out


def _assertions(schema: Any) -> Any:
    """The schema without its top-level annotations (title, description...)."""
    return {k: v for k, v in schema.items() if k not in _ANNOT} if isinstance(schema, dict) else schema
