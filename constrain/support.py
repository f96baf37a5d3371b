"""Which JSON-Schema keywords each backend truly enforces, located by JSON Pointer.

Pure schema walking: no compiling here. The compiler uses it to refuse `strict` schemas with the pointer of the
first unenforceable keyword and to name the unenforced pointers of non-strict ones.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator
from urllib.parse import quote, unquote

# Keywords that constrain nothing (annotations) or that every backend handles structurally.
ANNOTATIONS = frozenset({
    "$schema", "$id", "$comment", "$anchor", "$vocabulary", "title", "description", "default", "examples",
    "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "contentSchema", "$defs",
    "definitions", "id", "example", "markdownDescription", "errorMessage", "x-intellij-html-description",
})
_SUBSCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
              "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
# Keywords whose values map names to subschemas: the keys there are names, not keywords (a property `default`).
NAMED_SUBSCHEMAS = frozenset(_SUBSCHEMA_MAPS) | {"dependencies"}
# Keywords whose values are JSON values, never subschemas: a `const` object with a "$ref" key is that object.
VALUE_KEYWORDS = frozenset({"const", "enum", "default", "examples", "example"})

# Formats JSON Schema defines (draft 2020-12, 7.3); any other name is an annotation every validator ignores.
STANDARD_FORMATS = frozenset({
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
    "relative-json-pointer", "regex",
})

# outlines-core 0.2.14, checked against its regex output and the MaskBench cases.
OUTLINES_ENFORCED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "$ref",
    "minLength", "maxLength", "pattern", "format", "minItems", "maxItems",
})
# Its date-time/time regexes make the zone optional (RFC 3339 requires it) and refuse offsets; uuid is
# lowercase-only; uri/email are narrower than the RFCs. Only "date" matches the format exactly.
OUTLINES_FORMATS = frozenset({"date"})


# Every JSON-Schema keyword that asserts something; anything else is an annotation or unknown (ignored by
# validators, so ignoring it loses nothing).
ASSERTIONS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains", "minContains",
    "maxProperties", "minProperties", "required", "dependentRequired", "dependencies", "properties",
    "patternProperties", "additionalProperties", "propertyNames", "items", "prefixItems", "additionalItems",
    "contains", "unevaluatedItems", "unevaluatedProperties", "allOf", "anyOf", "oneOf", "not", "if", "then",
    "else", "dependentSchemas", "$ref", "$dynamicRef", "$recursiveRef", "format",
})


def map_subschemas(node: dict, fn) -> dict:
    """A copy of the schema object `node` with `fn` applied to each of its direct subschemas (the same keywords
    `walk` descends into); keyword values that are not subschemas are kept as they are."""
    out = {}
    for key, value in node.items():
        if key in _SUBSCHEMA and isinstance(value, (dict, bool)):
            out[key] = fn(value)
        elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: fn(v) for k, v in value.items()}
        elif (key in _SUBSCHEMA_LISTS or key == "items") and isinstance(value, list):
            out[key] = [fn(v) for v in value]
        elif key == "dependencies" and isinstance(value, dict):
            out[key] = {k: fn(v) if isinstance(v, dict) else v for k, v in value.items()}
        else:
            out[key] = value
    return out


def escape_pointer_part(part: Any) -> str:
    """A key or index as one segment of a JSON Pointer (RFC 6901: `~` is `~0`, `/` is `~1`)."""
    return str(part).replace("~", "~0").replace("/", "~1")


def unescape_pointer_part(segment: str) -> str:
    """The key one JSON Pointer segment names."""
    return segment.replace("~1", "/").replace("~0", "~")


def walk(schema: Any, base: str = "") -> Iterator[tuple[str, str, dict]]:
    """(pointer of the keyword, keyword, the schema object holding it) for every keyword of every subschema."""
    stack = [(schema, base)]
    while stack:
        node, ptr = stack.pop()
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            kp = f"{ptr}/{escape_pointer_part(key)}"
            yield kp, key, node
            if key in _SUBSCHEMA and isinstance(value, dict):
                stack.append((value, kp))
            elif key == "items" and isinstance(value, list):
                stack.extend((v, f"{kp}/{i}") for i, v in enumerate(value))
            elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
                stack.extend((v, f"{kp}/{escape_pointer_part(k)}") for k, v in value.items())
            elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
                stack.extend((v, f"{kp}/{i}") for i, v in enumerate(value))
            elif key == "dependencies" and isinstance(value, dict):
                stack.extend((v, f"{kp}/{escape_pointer_part(k)}") for k, v in value.items() if isinstance(v, dict))


def schema_objects(schema: Any) -> list[dict]:
    """Every schema object `walk` reaches in `schema`, once each (a subschema shared by two places is one)."""
    return list({id(node): node for _, _, node in walk(schema)}.values())


def walk_with_refs(schema: Any, base: str = "") -> Iterator[tuple[str, str, dict]]:
    """As `walk`, then also through the subschemas local `$ref`s of `schema` (the root) name where `walk` does not
    go: `#/definitions/a/full` names a subschema under `full`, no keyword, which the backends compile all the same
    (JsonSchemaStore's schemas nest their definitions so)."""
    reached: set[int] = set()
    work = [(schema, base)]
    while work:
        refs = []
        for found in walk(*work.pop()):
            yield found
            _, key, holder = found
            reached.add(id(holder))
            if key == "$ref" and isinstance(holder[key], str):
                refs.append(holder[key])
        for ref in refs:
            target = resolve_ref(schema, ref)
            if isinstance(target, dict) and id(target) not in reached:
                reached.add(id(target))
                work.append((target, base + unquote(ref[1:])))


def keep_ref_targets(before: dict, after: dict, stale: Callable[[str], bool],
                     copy_of: Callable[[Any], Any]) -> None:
    """Each local `$ref` of `after` (a rewrite of `before`, with the same references) that names a place `stale`
    says no longer holds what `before` holds there (a keyword a rewrite dropped, a member it tightened) points
    instead at `copy_of` what `before` holds there, under `$defs/structgen-kept-N` (in place; nothing where that
    `$defs` is not an object). A pointer names a place in the document, whatever the rewrites make of it: such a
    reference was a 400 (`Pointer ... does not exist`) or named something else. A pointer reads in the resource
    around it (the subschema of the nearest nested `$id` above it, else the root): `stale` is asked of the
    reference as the root reads it, and the copy goes under the `$defs` of that resource, where
    `#/$defs/structgen-kept-N` names it (beside a nested `$id` anywhere every reference was left as it was: a
    400, QA review17 F3). Not where the place lies in another resource, or holds one: a copy moved out of one
    reads its references anew, and repeats its `$id` (nor a reference that is no pointer, an `$anchor`'s)."""
    bases = set(nested_bases(before))
    around = [""] + nested_bases(after)

    def resource(ptr: str) -> str:
        return max((b for b in around if ptr.startswith(b + "/")), key=len)

    kept: dict[tuple[str, str], str] = {}  # (by resource and place: `#/a%20b` and `#/a b` share one copy)
    holders = [(n, resource(p)) for p, key, n in walk_with_refs(after) if key == "$ref" and isinstance(n[key], str)]
    while holders:
        holder, base = holders.pop()
        ref = holder["$ref"]
        if ref in kept.values() or not (ref == "#" or ref.startswith("#/")):
            continue
        read = "#" + quote(base) + ref[1:]  # (the reference as the root reads it)
        place = base + unquote(ref[1:])
        if not stale(read):
            continue
        if (base, place) not in kept:
            target, owner = resolve_ref(before, read), resolve_ref(after, "#" + quote(base))
            if target is None or not isinstance(owner, dict) or not copy_reads_alike(bases, base, place):
                continue
            defs = owner.setdefault("$defs", {})
            if not isinstance(defs, dict):
                continue
            name = next(f"structgen-kept-{i}" for i in itertools.count() if f"structgen-kept-{i}" not in defs)
            defs[name] = moved = copy_of(target)
            kept[(base, place)] = f"#/$defs/{name}"
            holders += [(n, base) for _, key, n in walk(moved) if key == "$ref" and isinstance(n[key], str)]
        holder["$ref"] = kept[(base, place)]


def pointers_of(schema: Any, keywords: set[str], base: str = "") -> list[str]:
    """The pointers of `keywords` in every subschema (`walk_with_refs`: a oneOf llguidance left unenforced under
    `#/definitions/a/full` was named as the root `/`, so no check took it up)."""
    return [p for p, k, _ in walk_with_refs(schema, base) if k in keywords]


def client_pointer(source: Any, pointer: str) -> str:
    """`pointer`, found in the schema as compiled (after constrain/rewrite.py), told in terms of the client's schema
    `source`: itself when it names a place there, else the deepest subschema on its way that does (a rewrite
    puts generated keys and branches in the place of the keywords it replaced)."""
    if not pointer.startswith("/"):
        return pointer
    parts = pointer[1:].split("/")
    node, schema_at, kind = source, 0, "schema"  # kind: what `node` is (a schema, a map or list of schemas)
    for depth, raw in enumerate(parts, 1):
        found, node = pointer_child(node, raw)
        if not found:
            return "/" + "/".join(parts[:schema_at]) if schema_at else ""  # (RFC 6901's root: `/` is a name "")
        part = unescape_pointer_part(raw)
        if kind == "schema":
            kind = ("map" if part in _SUBSCHEMA_MAPS or part == "dependencies" else
                    "list" if part in _SUBSCHEMA_LISTS or (part == "items" and isinstance(node, list)) else
                    "schema" if part in _SUBSCHEMA else "value")
        elif kind in ("map", "list"):
            kind = "schema"
        if kind == "schema":
            schema_at = depth
    return pointer


def pointer_child(node: Any, segment: str) -> tuple[bool, Any]:
    """(True, the value) that one JSON Pointer segment (still ~-escaped) names inside `node`; (False, None) when
    it names nothing there."""
    part = unescape_pointer_part(segment)
    if isinstance(node, dict) and part in node:
        return True, node[part]
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return True, node[int(part)]
    return False, None


def resolve_ref(root: Any, ref: Any) -> Any:
    """The subschema a local `$ref` (a JSON Pointer fragment, percent-encoded as a URI fragment is: `#/$defs/a%20b`
    names `a b`, as validators and both backends read it) names in `root` (None: not a local pointer, or nothing
    there)."""
    if not (isinstance(ref, str) and ref.startswith("#")):
        return None
    node: Any = root
    path = unquote(ref[1:])
    if path and not path.startswith("/"):
        return None
    for part in path.split("/")[1:]:
        found, node = pointer_child(node, part)
        if not found:
            return None
    return node


def gives_another_base(ptr: str, key: str, node: dict) -> bool:
    """The keyword `walk` yields is a nested `$id` (`id` in draft 4) that gives the `$ref`s inside its subschema
    another base; a plain-name fragment (`"$id": "#name"`, drafts 6-7) changes no base."""
    return key in ("$id", "id") and ptr.count("/") > 1 and isinstance(node[key], str) and not node[key].startswith("#")


def node_dialects(schema: Any) -> dict[int, str | None]:
    """id() of each subschema of `schema` -> the `$schema` it is read in: the nearest one above it, its own
    included (a function's draft-04 parameters in the calls' schema); None where there is none."""
    out: dict[int, str | None] = {}
    stack: list[tuple[Any, str | None]] = [(schema, None)]
    while stack:
        node, dialect = stack.pop()
        if isinstance(node, dict):
            dialect = out[id(node)] = node["$schema"] if isinstance(node.get("$schema"), str) else dialect
            map_subschemas(node, lambda sub, d=dialect: stack.append((sub, d)) or sub)
    return out


def json_type(value: Any) -> str:
    """The JSON type of a value, with numbers split in two: `integer` (a float with no fraction too, as drafts 6 on
    read it) and `fraction`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "fraction"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def nested_bases(schema: Any) -> list[str]:
    """The pointers of the subschemas a nested `$id` gives another base (`gives_another_base`), found through
    `$ref`s too."""
    return [ptr[: ptr.rindex("/")] for ptr, key, node in walk_with_refs(schema) if gives_another_base(ptr, key, node)]


def copy_reads_alike(bases: set[str], base: str, place: str) -> bool:
    """A copy of the subschema at `place` (a pointer in the document) put in the resource at `base` ("" the root;
    `bases`: `nested_bases`) reads as the subschema does: `place` lies in that resource, below no other nested
    `$id`, and holds none (its references would read against another base, its `$id` would repeat)."""
    return (not base or base in bases) and not any(
        b == place or b.startswith(place + "/") or (b.startswith(base + "/") and place.startswith(b + "/"))
        for b in bases)


def id_keyword(dialect: Any) -> str:
    """The keyword that gives a subschema a base of its own under the `$schema` value `dialect`: draft 4's (and
    3's) `id` (an annotation, or a property's name, in later drafts), else `$id`."""
    return "id" if any(d in str(dialect) for d in ("draft-03", "draft-04")) else "$id"


def nested_resources(schema: Any) -> list[str]:
    """The pointers of the subschemas below the root whose `$id` gives them a base of their own, the keyword read
    in the draft in force there (the root's `$schema`, or a subschema's own, as a function's parameters carry in
    the calls' schema): draft 4's `id`, else `$id` (in 2020-12 an `id` is an annotation, and refusing it kept
    outlines from schemas it serves: review R3)."""
    found = list(walk(schema))
    dialects = {ptr[: ptr.rindex("/")]: id_keyword(node[key])
                for ptr, key, node in found if key == "$schema" and isinstance(node[key], str)}

    def keyword_at(place: str) -> str:
        governing = max((p for p in dialects if place == p or place.startswith(p + "/")), key=len, default=None)
        return dialects[governing] if governing is not None else "$id"

    return [ptr[: ptr.rindex("/")] for ptr, key, node in found
            if gives_another_base(ptr, key, node) and key == keyword_at(ptr[: ptr.rindex("/")])]


def references_followable(root: dict) -> bool:
    """Every $ref is a local JSON Pointer `resolve_ref` follows, and no $dynamicRef, $recursiveRef or nested $id
    moves what they mean: then a walk of the schema knows every subschema that may apply at a place. A nested
    $id changes the base of the $refs inside its subschema only, and a plain-name fragment (`"$id": "#name"`,
    drafts 6-7) changes no base at all. (Through `$ref`s too: one may name a resource under a keyword `walk` does
    not go into, `contentSchema`'s, whose own `$ref`s read against its `$id`: QA review5.)"""
    refs: list[str] = []
    for ptr, key, node in walk_with_refs(root):
        if key in ("$dynamicRef", "$recursiveRef"):
            return False
        if key == "$ref":
            if resolve_ref(root, node[key]) is None:
                return False
            refs.append(ptr)
    bases = nested_bases(root) if refs else []
    return not any(ref.startswith(base + "/") for ref in refs for base in bases)


def recursive_targets(schema: Any) -> set[str]:
    """The targets of local $refs (JSON Pointers, "" for the root) that can reach themselves through $refs: a DFA
    cannot express them, and llguidance cannot intersect them with sibling keywords while it compiles them.
    Conservative: a $ref anywhere under a target counts, used or not."""
    refs = [(ptr[: -len("/$ref")], node["$ref"][1:]) for ptr, key, node in walk(schema)
            if key == "$ref" and isinstance(node["$ref"], str) and node["$ref"].startswith("#")]
    targets = {t for _, t in refs}
    edges = {t: {t2 for owner, t2 in refs if owner == t or owner.startswith(t + "/") or t == ""} for t in targets}

    def reaches_itself(t: str) -> bool:
        seen, stack = set(), list(edges[t])
        while stack:
            n = stack.pop()
            if n == t:
                return True
            if n not in seen:
                seen.add(n)
                stack.extend(edges.get(n, ()))
        return False

    return {t for t in targets if reaches_itself(t)}


def _any_value(schema) -> bool:
    """A schema that accepts any JSON value (unbounded nesting: no DFA)."""
    return schema is True or (isinstance(schema, dict) and not any(k in ASSERTIONS for k in schema))


def _unclassed(pattern: str):
    """Each character of `pattern` outside its character classes (`[...]`, which are skipped whole), with whether
    a backslash escapes it."""
    cls, esc = False, False
    for ch in pattern:
        if esc:
            esc = False
            if not cls:
                yield ch, True
        elif ch == "\\":
            esc = True
        elif cls:
            cls = ch != "]"
        elif ch == "[":
            cls = True
        else:
            yield ch, False


def _fully_anchored(pattern) -> bool:
    """^...$ with no other anchor or top-level alternation: search and full match agree."""
    if not (isinstance(pattern, str) and pattern.startswith("^") and pattern.endswith("$")
            and not pattern.endswith("\\$")):
        return False
    depth = 0
    for ch, escaped in _unclassed(pattern[1:-1]):
        if escaped:
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch in "^$" or (ch == "|" and depth == 0):
            return False
    return True


def _word_boundary(pattern: str) -> bool:
    """Whether the pattern asserts a word boundary (`\\b`, `\\B`, and `\\<`, `\\>` as outlines-core's regex syntax reads
    them, outside a class), which outlines-core cannot build into its automaton ("cannot build DFAs for regexes with
    Unicode word boundaries")."""
    return any(escaped and ch in "bB<>" for ch, escaped in _unclassed(pattern))


_JSON_ESCAPED = frozenset(range(0x20)) | {0x22, 0x5C}  # characters a JSON string must escape


def escaped_code(pattern: str, i: int, in_class: bool) -> tuple[int | None, int, bool]:
    """(code point or None for a zero-width or safe shorthand, next index, safe) for the escape at pattern[i]."""
    e = pattern[i + 1] if i + 1 < len(pattern) else ""
    if e in ("d", "w") or (e in ("b", "B") and not in_class):
        return None, i + 2, True
    if e == "b":
        return 0x08, i + 2, True
    if e in ("x", "u", "U"):
        if pattern.startswith("{", i + 2):
            end = pattern.find("}", i + 3)
            if end < 0:
                return None, len(pattern), False
            digits, nxt = pattern[i + 3:end], end + 1
        else:
            width = {"x": 2, "u": 4, "U": 8}[e]
            digits, nxt = pattern[i + 2:i + 2 + width], i + 2 + width
        try:
            return int(digits, 16), nxt, True
        except ValueError:
            return None, nxt, False
    if not e or e.isalnum():
        return None, i + 2, False  # \s \S \W \D \n \t \p{..} ...: may hold what JSON escapes, or unknown
    return ord(e), i + 2, True


def _range_end(pattern: str, i: int, low: int | None) -> tuple[int | None, int, bool]:
    """In a character class, after its member `low` (read up to `i`): (the last code point of the range it opens,
    next index, readable); `low` itself where no range follows."""
    if low is None or not (pattern.startswith("-", i) and i + 1 < len(pattern) and pattern[i + 1] != "]"):
        return low, i, True
    if pattern[i + 1] == "\\":
        high, i, ok = escaped_code(pattern, i + 1, in_class=True)
        return high, i, ok and high is not None
    return ord(pattern[i + 1]), i + 2, True


def json_safe_pattern(pattern: str) -> bool:
    """True when no string the regex matches holds a character JSON must escape ('"', '\\', U+0000..U+001F).
    outlines-core puts a `pattern` between the quotes as it is: a regex that can match such a character would let
    it through raw (`[^,]+` writes a bare '"', and the JSON breaks). Conservative: `.`, negated classes and the
    negated shorthands count as unsafe."""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            code, i, ok = escaped_code(pattern, i, in_class=False)
            if not ok or code in _JSON_ESCAPED:
                return False
            continue
        if c == ".":
            return False
        if c == "[":
            i += 1
            if pattern.startswith("^", i):
                return False
            first = True
            while i < n and (pattern[i] != "]" or first):
                first = False
                if pattern[i] == "\\":
                    low, i, ok = escaped_code(pattern, i, in_class=True)
                    if not ok:
                        return False
                else:
                    low, i = ord(pattern[i]), i + 1
                high, i, ok = _range_end(pattern, i, low)
                if not ok:
                    return False
                if low is not None and any(low <= x <= high for x in _JSON_ESCAPED):
                    return False
            i += 1
            continue
        if ord(c) in _JSON_ESCAPED:
            return False
        i += 1
    return True


_CONTROLS_BUT_NEWLINE = frozenset(range(0x20)) - {0x0A}  # (a class holding them all meets llguidance's gap below)


def llguidance_escape_gap(pattern: str) -> bool:
    """True when a positive character class of `pattern` holds every control character (U+0000..U+001F; `\\n`
    aside) but not both '"' and '\\': llguidance (1.x) then lets the escapes \\" and \\\\ through inside the JSON
    string, as if they were such characters (`^[\\x00-\\x1f]{3}$` answered `"\\"\\\\"`; a class of every other
    character but `\\n` and '"' took `"x\\""` too). Negated classes and classes missing another control character
    are not affected. A class with a shorthand this cannot read (`\\p{..}`) counts as
    unaffected."""
    i, n = 0, len(pattern)
    while i < n:
        if pattern[i] == "\\":
            i += 2
            continue
        if pattern[i] != "[" or pattern.startswith("^", i + 1):
            i += 1
            continue
        i += 1
        covered: set[int] = set()
        quote = backslash = False
        known = True
        first = True
        while i < n and (pattern[i] != "]" or first):
            first = False
            if pattern[i] == "\\":
                e = pattern[i + 1] if i + 1 < n else ""
                if e in ("S", "W", "D"):  # (each holds '"' and '\\')
                    quote = backslash = True
                    i += 2
                    continue
                if e == "s":
                    covered.update((0x09, 0x0A, 0x0B, 0x0C, 0x0D))
                    i += 2
                    continue
                low, i, ok = escaped_code(pattern, i, in_class=True)
                if not ok:
                    known = False
                    continue
            else:
                low, i = ord(pattern[i]), i + 1
            high, i, ok = _range_end(pattern, i, low)
            if not ok:
                known, high = False, low
            if low is not None:
                covered.update(range(low, min(high, 0x1F) + 1))
                quote = quote or low <= 0x22 <= high
                backslash = backslash or low <= 0x5C <= high
        i += 1
        if known and covered >= _CONTROLS_BUT_NEWLINE and not (quote and backslash):
            return True
    return False


# outlines-core 0.2.14 builds a schema object from the first of these keywords it holds (else from its `type`, with
# that type's keywords), and reads no other keyword beside it but those `_OUTLINES_READS` names: `{"$ref": ...,
# "pattern": ...}` took any string, and `properties` beside an `anyOf` of `required` lists dropped the anyOf.
_OUTLINES_BUILDERS = ("properties", "allOf", "anyOf", "oneOf", "prefixItems", "enum", "const", "$ref")
_OUTLINES_READS = {"properties": frozenset({"properties", "required", "additionalProperties", "type"})}
# Keywords that only ever judge values of other types than an object's: idle beside `properties`
_NOT_FOR_OBJECTS = frozenset({
    "minLength", "maxLength", "pattern", "format", "items", "prefixItems", "additionalItems", "minItems", "maxItems",
    "uniqueItems", "contains", "minContains", "maxContains", "unevaluatedItems", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null", list: "array",
               dict: "object"}


def _outlines_builder(node: dict) -> str | None:
    return next((k for k in _OUTLINES_BUILDERS if k in node), None)


def _outlines_ignored_beside(node: dict, builder: str, root: Any) -> list[str]:
    """The assertions of `node` outlines-core leaves out, building it from `builder`, that could matter: none
    where they hold for every value it can build (an enum's values checked against them; a `type` that every
    branch of an anyOf, or a $ref's target, already keeps to)."""
    reads = _OUTLINES_READS.get(builder, frozenset({builder}))
    beside = [k for k in node if k in ASSERTIONS and k not in reads]
    if builder == "properties":
        return [k for k in beside if k not in _NOT_FOR_OBJECTS]
    if not beside:
        return []
    if builder in ("enum", "const"):
        values = node[builder] if builder == "enum" else [node[builder]]
        return [] if isinstance(values, list) and _all_valid(values, {k: node[k] for k in beside}, root) else beside
    if "type" in beside and _types_within(_outlines_types(node, root), node["type"]):
        beside.remove("type")
    return beside


def _all_valid(values: list, schema: dict, root: Any) -> bool:
    """Whether every value holds against `schema` (keywords beside an enum), as far as jsonschema decides it
    exactly and safely: not where a `pattern` (the client's regex, which Python's backtracking `re` could run for
    hours holding the interpreter: `^(a+)+$` on 30 `a`s and a `!` held the server 68 s, QA review5 F1) or a
    `format` (which it does not assert) is among them or what they reach."""
    import jsonschema

    if isinstance(root, dict):
        schema = {**schema, **{k: root[k] for k in ("$defs", "definitions") if k in root}}
    stack: list = [schema]
    while stack:  # (every dict and list in it, values too: a `pattern` key there only makes this say no)
        node = stack.pop()
        if isinstance(node, dict):
            if any(k in node for k in ("pattern", "patternProperties", "format")):
                return False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    try:
        check = jsonschema.Draft202012Validator(schema)
        return all(check.is_valid(v) for v in values)
    except Exception:  # noqa: BLE001 - (a $ref this context cannot resolve): not known to hold
        return False


def _outlines_types(node: Any, root: Any, depth: int = 0) -> set[str] | None:
    """The JSON types of the values outlines-core builds for `node`; None where not known."""
    if not isinstance(node, dict) or depth > 16:
        return None
    builder = _outlines_builder(node)
    if builder == "properties":
        return {"object"}
    if builder in ("anyOf", "oneOf") and isinstance(node[builder], list):
        found = [_outlines_types(branch, root, depth + 1) for branch in node[builder]]
        return None if any(t is None for t in found) else set().union(*found)
    if builder in ("enum", "const"):
        values = node[builder] if builder == "enum" else [node[builder]]
        return {_JSON_TYPES.get(type(v), "?") for v in values} if isinstance(values, list) else None
    if builder == "$ref":
        return _outlines_types(resolve_ref(root, node["$ref"]), root, depth + 1)
    if builder is None and "type" in node:
        return {node["type"]} if isinstance(node["type"], str) else set(node["type"])
    return None


def _types_within(found: set[str] | None, allowed: Any) -> bool:
    allowed = {allowed} if isinstance(allowed, str) else set(allowed) if isinstance(allowed, list) else set()
    return found is not None and all(t in allowed or (t == "integer" and "number" in allowed) for t in found)


def _outlines_target(root: Any, ref: str, walked: set[int]) -> bool:
    """outlines-core resolves `#/a/b` by plain keys (no ~ or % unescaping), `#name` as the root's key `name`:
    True only where that is the subschema a validator would find too, one that `outlines_unsupported` walks, and
    not one of any value (outlines writes any value, open objects among them, for it)."""
    if not ref.startswith("#") or (ref != "#" and not ref.startswith("#/")) or "~" in ref or "%" in ref:
        return False
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        node = node.get(part) if isinstance(node, dict) else None
    return isinstance(node, dict) and id(node) in walked and not _any_value(node)


def containers_only(root: dict, node: Any, depth: int = 0) -> bool:
    """`node` takes objects and arrays only: its `type` says so, or it is an `anyOf`/`oneOf` (or a local `$ref`)
    whose every branch does (a zod or RootModel union of objects at the root was refused: QA unions F2)."""
    if not isinstance(node, dict) or depth > 8:
        return False
    if "type" in node:
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        return bool(types) and all(t in ("object", "array") for t in types)
    if isinstance(node.get("$ref"), str):
        return containers_only(root, resolve_ref(root, node["$ref"]), depth + 1)
    branches = node.get("anyOf", node.get("oneOf"))
    return isinstance(branches, list) and bool(branches) \
        and all(containers_only(root, b, depth + 1) for b in branches)


def _value_keys_unwritable(value: Any) -> bool:
    """Whether an object in a `const` or `enum` value has a key outlines-core would write wrong: it puts such keys
    into its regex unescaped, so `a.b` took `a神b` (unsound) and `$ref` compiled to no string at all. Letters,
    digits, spaces, `_` and `-` are the same in a regex and in a JSON string."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if any(not (ch.isalnum() or ch in " _-") for key in node for ch in key):
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def outlines_unsupported(schema: Any) -> list[str]:
    """Pointers of what outlines-core cannot enforce exactly (empty = it compiles to an exact DFA)."""
    if schema is True or schema == {}:
        return [""]  # (the root) any JSON value: unbounded nesting
    if not isinstance(schema, dict):
        return [""]  # `false` (no value): nothing for outlines to compile
    bad: list[str] = []
    walked = {id(node) for _, _, node in walk(schema)}  # the subschemas checked below ({} has no keyword: never)
    # (outlines-core reads every `$ref` against the root: one below a nested `$id` names another place)
    resources = nested_resources(schema)
    if not containers_only(schema, schema):
        bad.append("/type")  # 0.2.14 loses transitions for top-level scalars ("2.5" is refused after "2")
    for ptr, key, node in walk(schema):
        value = node[key]
        if key in ANNOTATIONS or key not in ASSERTIONS:
            continue
        if key not in OUTLINES_ENFORCED:
            bad.append(ptr)
        elif key == "format" and value not in OUTLINES_FORMATS:
            bad.append(ptr)
        elif key in ("properties", "required") and node.get("type", "object") != "object":
            bad.append(ptr)  # outlines would build an object for a node typed otherwise
        elif key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            bad.extend(f"{ptr}/{escape_pointer_part(k)}" for k, v in value.items() if _any_value(v))
            if key == "properties":  # outlines-core writes property names between the quotes unescaped
                bad.extend(f"{ptr}/{escape_pointer_part(k)}" for k in value
                           if any(ord(ch) in _JSON_ESCAPED for ch in k))
        elif key in ("const", "enum") and _value_keys_unwritable(value):
            bad.append(ptr)
        elif key in ("items", "anyOf") and (_any_value(value) or (isinstance(value, list)
                                                                  and any(_any_value(v) for v in value))):
            bad.append(ptr)
        elif key in ("minLength", "maxLength", "format") and "pattern" in node:
            bad.append(ptr)  # outlines uses the pattern alone
        elif key == "pattern" and not (_fully_anchored(value) and json_safe_pattern(value)
                                       and not _word_boundary(value)):
            bad.append(ptr)  # outlines matches the whole string (JSON Schema searches), and does not escape
        elif key == "$ref" and not (isinstance(value, str) and _outlines_target(schema, value, walked)
                                    and not any(ptr.startswith(r + "/") for r in resources)):
            bad.append(ptr)  # outlines compiles the target: it must be a subschema checked here
        elif key == "items" and not isinstance(value, dict):
            bad.append(ptr)
        elif key == "additionalProperties" and value is not False:
            bad.append(ptr)
        elif key == "type" and (value == "object" or (isinstance(value, list) and "object" in value)):
            if node.get("additionalProperties") is not False:
                bad.append(ptr[: -len("/type")] + "/additionalProperties")  # extra keys: outlines forbids them
        elif key == "properties" and node.get("additionalProperties") is not False and "type" not in node:
            bad.append(ptr[: -len("/properties")] + "/additionalProperties")
        if key == "type" and (value == "array" or (isinstance(value, list) and "array" in value)) \
                and "items" not in node:
            bad.append(ptr)  # outlines writes any values, open objects among them, in an array without `items`
        if key == _outlines_builder(node):
            node_ptr = ptr[: -len(escape_pointer_part(key)) - 1]
            bad.extend(f"{node_ptr}/{escape_pointer_part(k)}" for k in _outlines_ignored_beside(node, key, schema))
    if not bad and recursive_targets(schema):
        bad.append("/$ref")
    return sorted(set(bad))
