"""Where a recursive definition meets other keywords, the intersection written out before llguidance compiles it.

llguidance intersects what applies at one place (`allOf` members, a `$ref` beside other keywords, the keywords
beside an `anyOf`/`oneOf`, then the same property of two merged objects) while it compiles, resolving each `$ref`
it meets there. A definition it is still compiling, one that reaches itself, it cannot resolve: "circular
references with sibling keys are not supported" (its own TODO: name the intersection and refer to it). That is
done here. Each place where a recursive definition meets something is written as one schema: alternatives
distributed, definitions that do not recurse inlined, objects merged property by property, and a recursive
definition met with other keywords named as a definition of its own (`structgen-meet-N` beside the root's
definitions, one per distinct meeting), reached by plain `$ref`s, which llguidance compiles lazily.

Exact: each step is an identity of JSON Schema, read as llguidance reads it (keywords a merge does not combine are
kept as `allOf` members that hold no subschema; a name's regexes are asked of their automata, never run). Where
one would not be (two places' array layouts, `unevaluated*`, a `$ref` into a place rewritten here, a nested
`$schema` of another draft, regexes past the automata's limits), or past the budgets, nothing is rewritten and
llguidance's refusal stands. llg_backend's `checked_grammar_text` asks for the rewrite only where llguidance has
refused the schema as it is for such a meeting, so a schema it compiles is never changed.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable
from urllib.parse import unquote

from constrain.regex_sets import Work, disjoint_regions, pattern_search, regex_char
from constrain.support import (ANNOTATIONS, escape_pointer_part, map_subschemas, pointer_child, recursive_targets,
                               resolve_ref, walk)

_APPLICATORS = ("allOf", "anyOf", "oneOf", "$ref")
_OBJECT_KEYS = ("properties", "patternProperties", "additionalProperties")
_ARRAY_LAYOUT = ("prefixItems", "additionalItems")
_TOGETHER = (frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),  # (draft 4's flags)
             frozenset({"contains", "minContains", "maxContains"}), frozenset({"if", "then", "else"}))
_REFUSED_KEYS = ("unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef")
_MOST_MEETS = 20_000  # intersections written per schema
_MOST_DEFINITIONS = 2_000  # meetings of a recursive definition named

log = logging.getLogger(__name__)


class _GiveUp(Exception):
    """The schema is left as it is (llguidance's own refusal stands)."""


def intersected_recursive_meetings(root: Any, spell: Callable[[str], str] = str) -> Any:
    """`root` (as llguidance compiles it) with every place where a recursive definition meets other keywords
    written out (module docstring); `root` itself where there is none, or where that cannot be done exactly.
    `spell`: how a name's regex written here is spelled for llguidance."""
    meetings = _meetings_of(root, spell)
    if meetings is None:
        return root
    try:
        return meetings.rewritten()
    except (_GiveUp, RecursionError):
        return root
    except Exception:  # noqa: BLE001 - a fault here leaves llguidance's own refusal (a 400), logged, never a 500
        log.exception("writing out recursive meetings failed; the schema is handed on as it is")
        return root


def _meetings_of(root: Any, spell: Callable[[str], str]) -> "_Meetings | None":
    if not isinstance(root, dict):
        return None
    if not any(key == "$ref" for _, key, _ in walk(root)) or _refers_to_nothing(root) \
            or any(key in _REFUSED_KEYS or (key == "$schema" and node[key] != root.get("$schema"))
                   for _, key, node in walk(root)):
        return None
    recursive = recursive_targets(root)
    return _Meetings(root, recursive, spell) if recursive else None


class _Meetings:
    def __init__(self, root: dict, recursive: set[str], spell: Callable[[str], str]):
        self.root = root
        self.spell = spell
        self.recursive = recursive
        self.defs_key = "definitions" if "definitions" in root and "$defs" not in root else "$defs"
        taken = set(root.get(self.defs_key, {}) or {})
        self.names = (n for i in range(1, 10 ** 9) if (n := f"structgen-meet-{i}") not in taken)
        self.parts_cache: dict[int, tuple[Any, list]] = {}
        self.reach_cache: dict[str, bool] = {}
        self.defined: dict[tuple, str] = {}
        self.bodies: dict[str, Any] = {}
        self.pending: list[tuple[str, list]] = []
        self.visited: dict[int, tuple[Any, Any]] = {}
        self.sites: set[int] = set()  # the places written anew
        self.holding: set[int] = set()  # those written with their own definitions (where references find them)
        self.made: set[int] = set()  # objects written here (each already a meeting written out)
        self.kept: list = []
        self.reach_parts: dict[int, bool] = {}
        self.meets = 0
        self.texts: dict[int, str] = {}
        self.searches: dict[str, Any] = {}
        self.work = Work.for_search()

    # -- the walk over the schema ------------------------------------------------------------------------------

    def rewritten(self) -> dict:
        out = self.visit(self.root)
        if id(self.root) in self.sites:  # (its dialect and name, which the written-out root does not hold)
            if not isinstance(out, dict):
                raise _GiveUp
            out = {**out, **{k: self.root[k] for k in ("$schema", "$id", "id") if k in self.root}}
        while self.pending:
            name, parts = self.pending.pop()
            self.bodies[name] = self.visit(self.meet_resolved(parts))
        if not self.sites:
            return self.root
        for _, key, node in walk(self.root):
            if key == "$ref" and self.into_a_site(node["$ref"]):
                raise _GiveUp  # (a reference into a place written anew)
        out = self.without_false_definitions(out)
        if not isinstance(out, dict):
            raise _GiveUp  # (the root itself refuses every value: llguidance's refusal says so)
        out = {**out, self.defs_key: {**(out.get(self.defs_key) or {}), **self.bodies}}
        if _refers_to_nothing(out):
            raise _GiveUp  # (a reference into a place that came out `false`)
        return out

    def without_false_definitions(self, out: dict) -> Any:
        """`out` and the definitions written here, each reference to one that came out `false` read as `false`
        where it is, and so on up: llguidance drops an alternative it finds unsatisfiable while it intersects,
        but refuses a reference to an unsatisfiable definition."""
        while any(body is False for body in self.bodies.values()):
            false = {f"#/{self.defs_key}/{escape_pointer_part(n)}" for n, body in self.bodies.items() if body is False}
            fixed: dict[int, tuple[Any, Any]] = {}

            def fix(node: Any) -> Any:
                if not isinstance(node, dict):
                    return node
                if id(node) not in fixed:
                    out = False if node.get("$ref") in false else _falsified(map_subschemas(node, fix))
                    fixed[id(node)] = (node, out)
                return fixed[id(node)][1]

            out = fix(out)
            self.bodies = {n: fix(body) for n, body in self.bodies.items() if body is not False}
        return out

    def into_a_site(self, ref: str) -> bool:
        """The `$ref` names a place inside one written anew (the definitions it still holds aside)."""
        node: Any = self.root
        parts = unquote(ref[1:]).split("/")[1:]
        for part in parts:
            if id(node) in self.sites and not (id(node) in self.holding and part in ("definitions", "$defs")):
                return True
            _, node = pointer_child(node, part)
        return False

    def visit(self, node: Any) -> Any:
        """`node` with each meeting in it (itself included) written out."""
        if not isinstance(node, dict):
            return node
        if id(node) not in self.visited:
            parts = self.parts(node)
            if id(node) not in self.made and len(parts) > 1 and any(self.reaches(p) for p in parts):
                self.sites.add(id(node))
                met = self.meet(parts)
                out = map_subschemas(met, self.visit) if isinstance(met, dict) else met
                defs = {k: map_subschemas({k: node[k]}, self.visit)[k] for k in ("definitions", "$defs") if k in node}
                if defs and isinstance(out, dict):  # (a function's parameters' own: `#/$defs/tool1/$defs/a`)
                    out = {**out, **defs}
                    self.holding.add(id(node))
            else:
                out = map_subschemas(node, self.visit)
            self.visited[id(node)] = (node, out)
        return self.visited[id(node)][1]

    # -- what meets at a place -----------------------------------------------------------------------------------

    def parts(self, node: Any) -> list:
        """What applies at `node`, in llguidance's order: ("chunk", the keywords that are no applicator), ("ref",
        a `$ref`), ("alt", "anyOf"/"oneOf", branches); `allOf` members flattened in. `true` and `{}` give none."""
        if node is True:
            return []
        if node is False:
            return [("false",)]
        if id(node) in self.parts_cache:
            return self.parts_cache[id(node)][1]
        out: list = []
        chunk: dict = {}
        for key, value in node.items():
            if key in ANNOTATIONS:
                continue
            if key in _APPLICATORS:
                if chunk:
                    out.append(("chunk", chunk))
                    chunk = {}
                if key == "allOf" and isinstance(value, list):
                    for member in value:
                        out.extend(self.parts(member))
                elif key in ("anyOf", "oneOf") and isinstance(value, list):
                    out.append(("alt", key, value))
                elif key == "$ref" and isinstance(value, str):
                    out.append(("ref", value))
                else:
                    raise _GiveUp
            else:
                chunk[key] = value
        if chunk:
            out.append(("chunk", chunk))
        self.parts_cache[id(node)] = (node, out)
        return out

    def reaches(self, part: tuple) -> bool:
        """The part reaches a recursive definition through its `$ref`s (a meeting there may need one resolved)."""
        if part[0] == "ref":
            return self.ref_reaches(part[1])
        if part[0] == "false":
            return False
        if id(part[-1]) not in self.reach_parts:
            held = part[1] if part[0] == "chunk" else {part[1]: part[2]}
            self.reach_parts[id(part[-1])] = any(self.ref_reaches(n["$ref"]) for _, key, n in walk(held)
                                                 if key == "$ref")
        return self.reach_parts[id(part[-1])]

    def ref_reaches(self, ref: str) -> bool:
        if ref not in self.reach_cache:
            self.reach_cache[ref] = True  # (a cycle is recursive: the answer is true whichever way it is met)
            target = resolve_ref(self.root, ref)
            self.reach_cache[ref] = ref[1:] in self.recursive or any(
                self.ref_reaches(n["$ref"]) for _, key, n in walk(target) if key == "$ref")
        return self.reach_cache[ref]

    def key(self, part: tuple) -> tuple:
        """The part by its JSON text; an alternative's keyword with it (`anyOf` and `oneOf` of the same branches
        are two assertions)."""
        if part[0] == "ref":
            return part
        if id(part[-1]) not in self.texts:
            self.texts[id(part[-1])] = json.dumps(part[-1], sort_keys=True, default=str)
        return (*part[:-1], self.texts[id(part[-1])])

    # -- the intersection ----------------------------------------------------------------------------------------

    def meet(self, parts: list) -> Any:
        """One schema for all of `parts` together, in which no recursive definition meets anything."""
        self.meets += 1
        if self.meets > _MOST_MEETS:
            raise _GiveUp
        met = self._meet(parts)
        if isinstance(met, dict):
            self.made.add(id(met))
            self.kept.append(met)  # (its id stays its own)
        return met

    def _meet(self, parts: list) -> Any:
        if any(p[0] == "false" for p in parts):
            return False
        parts = self.without_implied(parts)
        if not parts:
            return True
        if len(parts) == 1:
            return self.as_schema(parts[0])
        if not any(self.reaches(p) for p in parts):
            if self.evidently_empty(parts):
                return False  # (llguidance refuses a reference to a definition it finds unsatisfiable)
            return {"allOf": [self.as_schema(p) for p in parts]}
        for i, p in enumerate(parts):
            if p[0] == "alt":
                branches = [self.meet(parts[:i] + self.parts(b) + parts[i + 1:]) for b in p[2]]
                branches = [b for b in branches if b is not False]
                if not branches:
                    return False
                return branches[0] if len(branches) == 1 else {p[1]: branches}
        for i, p in enumerate(parts):
            if p[0] == "ref":
                if p[1][1:] in self.recursive:
                    return {"$ref": f"#/{self.defs_key}/{escape_pointer_part(self.defined_as(parts))}"}
                return self.meet(parts[:i] + self.parts(resolve_ref(self.root, p[1])) + parts[i + 1:])
        return self.merged([p[1] for p in parts])

    def meet_resolved(self, parts: list) -> Any:
        """The meeting a definition written here names: its first recursive `$ref` resolved in place."""
        i = next(i for i, p in enumerate(parts) if p[0] == "ref" and p[1][1:] in self.recursive)
        return self.meet(parts[:i] + self.parts(resolve_ref(self.root, parts[i][1])) + parts[i + 1:])

    def defined_as(self, parts: list) -> str:
        key = tuple(self.key(p) for p in parts)
        if key not in self.defined:
            if len(self.defined) >= _MOST_DEFINITIONS:
                raise _GiveUp
            self.defined[key] = name = next(self.names)
            self.pending.append((name, parts))
        return self.defined[key]

    def as_schema(self, part: tuple) -> Any:
        if part[0] == "chunk":
            return part[1]
        if part[0] == "ref":
            return {"$ref": part[1]}
        return {part[1]: part[2]}

    def without_implied(self, parts: list) -> list:
        """`parts` less each one another implies: a repeat (X and X), keywords another place holds as well (a
        `type` a recursive definition declares itself; of two alike, the first stays), an `anyOf` one of whose
        branches is another part."""
        keys = [self.key(p) for p in parts]
        out: list = []
        for i, p in enumerate(parts):
            if keys[i] in keys[:i]:
                continue
            if p[0] == "chunk" and (
                    any(_implies(self.top_chunks(q), p[1]) for q in out)
                    or any(_implies(self.top_chunks(q), p[1]) and not (q[0] == "chunk" and _implies([p[1]], q[1]))
                           for q in parts[i + 1:])):
                continue
            if p[0] == "alt" and p[1] == "anyOf" and any(
                    len(bp := self.parts(b)) == 1 and self.key(bp[0]) in keys[:i] + keys[i + 1:] for b in p[2]):
                continue
            out.append(p)
        return out

    def evidently_empty(self, parts: list) -> bool:
        """No value meets the `type`s and the `enum`/`const` values the parts declare at their tops."""
        held = [h for p in parts for h in self.top_chunks(p)]
        types = [_types(h["type"]) for h in held if isinstance(h.get("type"), (str, list))]
        common = set.intersection(*types) if types else None
        if common is not None and not common:
            return True
        values = [h["enum"] if isinstance(h.get("enum"), list) else [h["const"]] for h in held
                  if isinstance(h.get("enum"), list) or "const" in h]
        return bool(values) and not any(all(any(_equal(v, w) for w in other) for other in values[1:])
                                        and (common is None or _value_types(v) & common) for v in values[0])

    def top_chunks(self, part: tuple) -> list[dict]:
        """Keywords that hold wherever the part does (a definition's own, for a `$ref`), chunk by chunk: a keyword
        is read beside the others of its own chunk only (`additionalProperties` beside that chunk's `properties`)."""
        if part[0] == "chunk":
            return [part[1]]
        if part[0] == "ref":
            target = resolve_ref(self.root, part[1])
            if isinstance(target, dict):
                return [q[1] for q in self.parts(target) if q[0] == "chunk"]
        return []

    def merged(self, chunks: list[dict]) -> Any:
        """The keywords of `chunks` as one schema object: `type`s intersected, `required` joined, objects merged
        property by property, `items` met; another keyword twice kept once where the values are equal, else
        the later ones as `allOf` members (they hold no subschema llguidance intersects)."""
        out: dict = {}
        later: list[dict] = []
        for c in chunks:
            if any(k in c for k in _ARRAY_LAYOUT) or isinstance(c.get("items"), list):
                if sum(1 for d in chunks if any(k in d for k in (*_ARRAY_LAYOUT, "items"))) > 1:
                    raise _GiveUp
        types = [_types(c["type"]) for c in chunks if "type" in c]
        values = [c["enum"] if key == "enum" else [c["const"]] for c in chunks for key in ("enum", "const")
                  if key in c]
        for c in chunks:
            done: set[str] = set()
            for key, value in c.items():
                if key in done or key in _OBJECT_KEYS or key in ("type", "required", "items", "enum", "const"):
                    continue
                group = next((g for g in _TOGETHER if key in g), frozenset({key}))
                block = {k: c[k] for k in c if k in group}
                done |= block.keys()
                if all(k in out for k in block) and all(_same(out[k], v) for k, v in block.items()) \
                        and not any(k in out for k in group - block.keys()):
                    continue
                if any(k in out for k in group):
                    later.append(block)
                else:
                    out.update(block)
        if types:
            common = set.intersection(*types)
            if not common:
                return False
            out["type"] = _type_value(common)
        if values:
            if any(not isinstance(v, list) for v in values):
                raise _GiveUp
            kept = [v for v in values[0] if all(any(_equal(v, w) for w in other) for other in values[1:])
                    and (not types or _value_types(v) & common)]
            if not kept:
                return False
            out["enum"] = kept
        required = [n for c in chunks for n in c.get("required", []) if isinstance(c.get("required"), list)]
        if required:
            out["required"] = list(dict.fromkeys(required))
        items = [c["items"] for c in chunks if "items" in c]
        if items:
            out["items"] = items[0] if len(items) == 1 else self.meet([p for s in items for p in self.parts(s)])
        objects = [c for c in chunks if any(k in c for k in _OBJECT_KEYS)]
        if objects:
            out.update(self.merged_objects(objects))
            if out.get("type") == "object" and any((out.get("properties") or {}).get(n) is False
                                                   for n in out.get("required", [])):
                return False  # (a name it requires cannot be written)
        if later:
            out["allOf"] = later
        return out

    def merged_objects(self, chunks: list[dict]) -> dict:
        """`properties`, `patternProperties` and `additionalProperties` of `chunks` as one object's, as llguidance
        merges two objects: a name one declares meets, in each of them, the `patternProperties` schemas whose
        regexes find it (asked of the regexes' automata, `regex_sets.pattern_search`; in its own place too, as
        JSON Schema reads one object), and in a place that neither declares it nor finds it, that place's
        `additionalProperties`."""
        names = list(dict.fromkeys(n for c in chunks for n in (c.get("properties") or {})))
        out: dict = {}
        if names:
            props = {}
            for name in names:
                schemas = []
                for c in chunks:
                    declared = c.get("properties") or {}
                    found = [v for pattern, v in (c.get("patternProperties") or {}).items()
                             if self.finds(pattern, name)]
                    if name in declared:
                        schemas.append(declared[name])
                    if name in declared or found:
                        schemas.extend(found)
                    elif "additionalProperties" in c:
                        schemas.append(c["additionalProperties"])
                props[name] = schemas[0] if len(schemas) == 1 else \
                    self.meet([p for s in schemas for p in self.parts(s)])
            out["properties"] = props
        patterns = list(dict.fromkeys(k for c in chunks for k in (c.get("patternProperties") or {})))
        if patterns:
            out["patternProperties"] = self.merged_patterns(chunks, patterns, names)
            if not out["patternProperties"]:
                del out["patternProperties"]
        rest = [c["additionalProperties"] for c in chunks if "additionalProperties" in c]
        if rest:
            out["additionalProperties"] = rest[0] if len(rest) == 1 else \
                self.meet([p for s in rest for p in self.parts(s)])
        return out

    def merged_patterns(self, chunks: list[dict], patterns: list[str], names: list[str]) -> dict:
        """The `patternProperties` of the merged object. A name no place declares meets the schemas of the regexes
        that find it, and, in each place none of whose regexes does, that place's `additionalProperties`. Where
        one regex finds no declared name, it stays as written; else the names are cut into regions found by
        exactly one set of the regexes (`regex_sets.disjoint_regions`, on automata), the declared names left out:
        llguidance wants an object's regexes disjoint, and writes no key a declared property and a regex share.
        A region's classes are written as their characters: llguidance reads `\\d`, `\\w` and `\\s` as ASCII."""
        if len(patterns) == 1 and not any(self.finds(patterns[0], n) for n in names):
            regions = [(patterns[0], frozenset({0}))]
        else:
            literals = ["^" + "".join(regex_char(c) for c in name) + "$" for name in names]
            found = disjoint_regions(patterns + literals, self.work, explicit=True)
            if found is None:
                raise _GiveUp  # (out of the automata's reach)
            regions = [(self.spell(region), sig) for region, sig in found if max(sig) < len(patterns)]
        out = {}
        for region, sig in regions:
            held = {patterns[i] for i in sig}
            schemas = []
            for c in chunks:
                own = [v for k, v in (c.get("patternProperties") or {}).items() if k in held]
                schemas += own if own else [c["additionalProperties"]] if "additionalProperties" in c else []
            out[region] = schemas[0] if len(schemas) == 1 else self.meet([p for s in schemas for p in self.parts(s)])
        return out

    def finds(self, pattern: str, name: str) -> bool:
        if pattern not in self.searches:
            self.searches[pattern] = pattern_search(pattern, self.work)
        search = self.searches[pattern]
        if search is None:
            raise _GiveUp  # (past the automata's limits)
        return search(name)


def _refers_to_nothing(root: dict) -> bool:
    """Some `$ref` of `root` names no place in it."""
    return any(resolve_ref(root, node["$ref"]) is None for _, key, node in walk(root) if key == "$ref")


def _falsified(node: dict) -> Any:
    """`false` where each of `node`'s alternatives is, where one of its `allOf` members is, or where it requires an
    object with a name whose value it refuses; else `node` as it is (a `false` alternative stays in its place: a
    `$ref` may name the ones after it)."""
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list) and all(b is False for b in node[key]):
            return False
    if isinstance(node.get("allOf"), list) and any(m is False for m in node["allOf"]):
        return False
    if node.get("type") == "object" and isinstance(node.get("required"), list) and any(
            (node.get("properties") or {}).get(n) is False for n in node["required"]):
        return False
    return node


def _same(a: Any, b: Any) -> bool:
    """The same JSON at every depth (Python's `==` calls `{"const": 1}` and `{"const": true}` equal)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(v, w) for v, w in zip(a, b))
    return a == b


def _equal(a: Any, b: Any) -> bool:
    """Equal as JSON Schema compares values: numbers by value (1 and 1.0), never `true` and 1 (arrays and objects
    by their text, which may only call two equal values unequal)."""
    if isinstance(a, (list, dict)) or isinstance(b, (list, dict)):
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    if isinstance(a, bool) or isinstance(b, bool) or not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        return _same(a, b)
    return a == b


def _value_types(value: Any) -> set[str]:
    """The `type` names a value has (`_types`' spelling: an integer is an "integer", 1.5 a "fraction")."""
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return {"integer"}
    if isinstance(value, float):
        return {"fraction"}
    return {"string" if isinstance(value, str) else "array" if isinstance(value, list) else "object"}


def _implies(held: list[dict], chunk: dict) -> bool:
    """Every keyword of `chunk` holds where `held`'s chunks do: one of them has the same value (and the same
    keywords it reads beside it: `additionalProperties: false` beside other `properties` is another assertion, as
    is draft 4's `maximum` beside another `exclusiveMaximum`), or a `type` among fewer."""
    return bool(held) and all(any(_holds(h, k, v, chunk) for h in held) for k, v in chunk.items())


def _holds(held: dict, key: str, value: Any, chunk: dict) -> bool:
    if key == "type":
        return "type" in held and _types(held["type"]) <= _types(value)
    beside = next((g - {key} for g in _TOGETHER if key in g), _READ_BESIDE.get(key, ()))
    return key in held and _same(held[key], value) \
        and all(_same(held.get(r, _ABSENT), chunk.get(r, _ABSENT)) for r in beside)


_ABSENT = object()
_READ_BESIDE = {"additionalProperties": ("properties", "patternProperties"), "patternProperties": ("properties",),
                "additionalItems": ("items",),
                "items": ("prefixItems",)}


def _types(value: Any) -> set[str]:
    names = value if isinstance(value, list) else [value]
    out = set()
    for n in names:
        out |= {"integer", "fraction"} if n == "number" else {n}
    return out


def _type_value(types: set[str]) -> Any:
    names = sorted(t for t in types if t not in ("integer", "fraction"))
    if {"integer", "fraction"} <= types:
        names.append("number")
    elif "integer" in types:
        names.append("integer")
    return names[0] if len(names) == 1 else names
