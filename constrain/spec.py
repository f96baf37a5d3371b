"""Request fields -> ConstraintSpec: shape checks and JSON-Schema validity, with errors the client can act on.

Takes the raw JSON values the client sent (dicts, lists, strings); never compiles anything and never imports HTTP.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import re
import threading
from collections import OrderedDict
from typing import Any, Iterator

import jsonschema

from constrain.grammar import ConstraintError, ConstraintSpec, in_written_order, refuse_unread_fields
from constrain.limits import DEFAULT_LIMITS, JSONTooDeep, check_schema_limits, read_json
from constrain.llg_backend import unreadable_pattern
from constrain.pattern_dialects import (MAX_PROPERTY_ESCAPES, property_escapes, python_pattern, schema_patterns,
                                        with_python_patterns)
from constrain.regex_sets import longest_literal, python_only_syntax
from constrain.rewrite import (as_read_where_unasserted, bounds_on_members, later_keywords_of, rewrite_schema,
                              types_of)
from constrain.support import (ANNOTATIONS, ASSERTIONS, escape_pointer_part, gives_another_base, map_subschemas,
                               keep_ref_targets, node_dialects, pointer_child, references_followable, resolve_ref, walk,
                               walk_with_refs)

log = logging.getLogger(__name__)

_BACKENDS = ("outlines", "llguidance", "auto")


def _schema_error(exc: jsonschema.SchemaError, param: str, base: str) -> ConstraintError:
    ptr = base + "".join("/" + escape_pointer_part(p) for p in exc.path)
    return ConstraintError(f"invalid JSON Schema at {ptr or 'the root'}: {exc.message}", param=param, pointer=ptr)


_OLD_DRAFTS = ("draft-03", "draft-04", "draft-06", "draft-07")
_LATEST = "https://json-schema.org/draft/2020-12/schema"
# `$schema` values, less their scheme and an empty fragment -> the URI validators and llguidance know (which
# resolves an unknown one as a document to fetch: a 400 "cannot compile constraint" for the https form of draft-07)
_DIALECTS = {
    "json-schema.org/draft-03/schema": "http://json-schema.org/draft-03/schema#",
    "json-schema.org/draft-04/schema": "http://json-schema.org/draft-04/schema#",
    "json-schema.org/draft-06/schema": "http://json-schema.org/draft-06/schema#",
    "json-schema.org/draft-07/schema": "http://json-schema.org/draft-07/schema#",
    "json-schema.org/draft/2019-09/schema": "https://json-schema.org/draft/2019-09/schema",
    "json-schema.org/draft/2020-12/schema": _LATEST,
    "json-schema.org/schema": _LATEST,  # ("the latest draft")
    "json-schema.org/hyper-schema": _LATEST,
    "json-schema.org/draft/next/schema": _LATEST,  # (the draft in the making: 2020-12 and what it adds)
    "": _LATEST,  # (no dialect named: as without `$schema`)
}
# Hyper-Schema's dialects are their drafts' (`links`, `base`, ... are annotations to a validator).
_DIALECTS.update({uri.replace("/schema", "/hyper-schema"): target for uri, target in _DIALECTS.items()
                  if uri.startswith("json-schema.org/draft") and "next" not in uri})
_OPENAPI_31 = "spec.openapis.org/oas/3.1/dialect/"  # (OpenAPI 3.1's dialects: 2020-12 and annotations)


def known_dialect(uri: Any) -> str | None:
    """The URI of the draft a `$schema` value names (its https or http form, with or without an empty fragment,
    OpenAPI 3.1's dialect as 2020-12), or None where it names none this server knows."""
    if not isinstance(uri, str):
        return None
    bare = re.sub(r"^https?://", "", uri.strip()).removesuffix("#")
    return _DIALECTS.get(bare) or (_LATEST if bare.startswith(_OPENAPI_31) else None)


def _with_known_dialect(schema: Any) -> Any:
    """`schema` with its root `$schema` written as `known_dialect` gives it (unchanged where it is already)."""
    if not isinstance(schema, dict) or "$schema" not in schema:
        return schema
    known = known_dialect(schema["$schema"])
    return schema if known in (None, schema["$schema"]) else {**schema, "$schema": known}


_NORMAL_MAX = 512  # normalised schemas remembered (by canonical JSON)
_normal: OrderedDict[bytes, Any] = OrderedDict()


def normalise_schema(schema: Any) -> Any:
    """The schema the backends compile: in drafts 4-7, the keywords beside a `$ref` are applied where they can
    be, as ajv applies them (`_ref_siblings`); then the exact rewrites of constrain/rewrite.py turn
    keywords no backend enforces into enforceable equivalents where a proof exists, and numeric bounds are shared
    with the members of combinators (`bounds_on_members`). Never modifies `schema`. Remembered by the schema in its
    properties' order (`in_written_order`): sorted, one of the same properties in another order got the first
    one's (QA cachekeys F1)."""
    try:
        key = _digest(in_written_order(schema), ordered=True)
    except RecursionError:  # (nesting deeper than the stack: not remembered, as `_digest` says of its own)
        key = None
    if key is not None:
        with _valid_lock:
            if key in _normal:
                _normal.move_to_end(key)
                return _normal[key]
    out = _endless_references_false(_meaningful_additional_items(_ref_siblings(
        with_python_patterns(_with_known_dialect(_counts_clamped(schema))))))
    try:
        out = bounds_on_members(rewrite_schema(out))
    except Exception:  # noqa: BLE001 - e.g. an invalid schema jsonschema cannot evaluate: compile it unrewritten
        log.debug("schema rewrite failed", exc_info=True)
    if out is True:  # the boolean schema `true` accepts every JSON value, as `{}` does (which the backends take)
        out = {}
    if key is not None:  # (a schema that is not plain JSON is not remembered)
        with _valid_lock:
            _normal[key] = out
            while len(_normal) > _NORMAL_MAX:
                _normal.popitem(last=False)
    return out


# Counts of characters, items and properties past which no output is ever written (2**32 - 1, over 4 billion): a
# count beyond it says the same of every output as this one. The backends read no such count: outlines-core wrote
# `minLength: 2**64 + 1` as no bound at all (strict answers too short), llguidance failed with "Value is not JSON
# serializable" past 64 bits and with a regex parse error on a string's length past 32.
_COUNT_PAIRS = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"),
                ("minContains", "maxContains"))
_COUNTS = frozenset(key for pair in _COUNT_PAIRS for key in pair)
_LONGEST_COUNT = 2**32 - 1


def _count_as_compiled(value: Any) -> Any:
    """A count as the backends read it: a whole number written with a fraction (`2.0`, `1e20`, which JSON Schema
    takes for integers) as an integer, which outlines-core otherwise ignored (`maxLength: 2.0` let any string
    through) and llguidance refused; past `_LONGEST_COUNT`, that. Anything else as it is."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > _LONGEST_COUNT:
        return _LONGEST_COUNT
    return value


def _counts_clamped(schema: Any) -> Any:
    """`schema` with each count written as the backends read it (`_count_as_compiled`; a copy, `schema` itself
    where none changes)."""
    def nodes(root: Any) -> list[dict]:
        return list({id(node): node for _, key, node in walk(root) if key in _COUNTS}.values())

    if not any(_counts_as_compiled(node) for node in nodes(schema)):
        return schema
    schema = copy.deepcopy(schema)
    for node in nodes(schema):
        node.update(_counts_as_compiled(node))
    return schema


def _counts_as_compiled(node: dict) -> dict[str, Any]:
    """The counts of `node` that `_count_as_compiled` changes, changed. A least count past its most one stays past
    it (`minLength: 2**64 + 5, maxLength: 2**64` would both have been 2**32 - 1: a schema no document meets,
    served)."""
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    out = {}
    for least, most in _COUNT_PAIRS:
        for key in (least, most):
            if key in node and number(node[key]):
                compiled = _count_as_compiled(node[key])
                if compiled != node[key] or type(compiled) is not type(node[key]):
                    out[key] = compiled
        sent_least, sent_most = node.get(least), node.get(most)
        if number(sent_least) and number(sent_most) and sent_least > sent_most:
            compiled_least, compiled_most = out.get(least, sent_least), out.get(most, sent_most)
            if compiled_least <= compiled_most:
                out[most] = compiled_least - 1
    return out


def _endless_references_false(schema: Any) -> Any:
    """`schema` with each subschema that refers (`$ref`) into a recursion no finite value ends (`_endless`) written
    `false`, which accepts the same documents: none. The rest of an endless recursion is then a schema with a
    `false` part the backends know (`properties: {"a": false}` beside `required: ["a"]`). Where a `$ref` points
    inside an endless subschema (`#/$defs/n/properties/x`), the schema is left as it is: the rewrites would turn
    the subschema `false`, and the pointer would name nothing."""
    if not isinstance(schema, dict) or not references_followable(schema):
        return schema
    endless = _endless(schema)
    if endless & _holding_targets(schema):  # (a `$ref` into one must still find its target: left as it is)
        return schema

    def rewrite(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if id(node) in endless and "$ref" in node:
            return False
        return map_subschemas(node, rewrite)

    return rewrite(schema) if endless else schema


def _holding_targets(root: dict) -> set[int]:
    """The ids of the subschemas that hold the target of a local `$ref` below them (`#/$defs/n/properties/x`)."""
    holding: set[int] = set()
    for _, key, node in walk(root):
        if key == "$ref" and isinstance(node[key], str) and node[key].startswith("#/"):
            at: Any = root
            for part in node[key][2:].split("/")[:-1]:
                found, at = pointer_child(at, part)
                if not found:
                    break
                holding.add(id(at))
    return holding


def _ref_siblings(schema: Any) -> Any:
    """Drafts 4-7 ignore every keyword beside a `$ref`; ajv applies them, as 2019-09 on do (so do the backends).
    An answer that satisfies them too is valid under both readings, and it is what the schema's author meant
    (`type: object` beside a `$ref` to a definition that names no type, which otherwise lets `null` through). So
    in those drafts the asserting siblings are kept, beside an `allOf` holding the reference, which every draft
    and every validator applies (the late checks' included). Only where the node only asserts, though: under a
    `not`, in a `oneOf` member, an `if` or a `contains`, a stricter schema lets more through (draft 7's `not:
    {$ref: <a string>, maxLength: 1}` refuses every string, and took "abc"), so there they are dropped first, as
    the draft reads them (`as_read_where_unasserted`, which drops the keywords a draft lacks there too). They are
    dropped, as the spec reads them, where their `type` and the referenced schema's share none (the two together
    would accept nothing), where the reference is recursive (llguidance compiles no siblings beside one) and where
    llguidance cannot read one of their patterns; `id`/`$id` beside a `$ref` below the root always are (they would
    move the reference's base). What asserts nothing (annotations, the containers of definitions) stays. In 2019-09,
    which applies a `$ref`'s siblings itself, only the first step is taken (for 2020-12's `prefixItems`)."""
    dialect = str(schema.get("$schema", "")) if isinstance(schema, dict) else ""
    if not any(d in dialect for d in (*_OLD_DRAFTS, "2019-09")):
        return schema
    try:
        schema = as_read_where_unasserted(_with_known_dialect(schema))
    except Exception:  # noqa: BLE001 - as `normalise_schema` treats the rewrites: the schema as it is
        log.debug("reading $ref siblings as the draft does failed", exc_info=True)
    if "2019-09" in dialect:
        return schema

    def applicable(siblings: dict, ref: str) -> bool:
        return (_types_meet(_types(siblings), referenced_types(schema, ref)) and not _recursive(schema, ref)
                and not any(key == "pattern" and isinstance(node[key], str) and unreadable_pattern(node[key])
                            for _, key, node in walk(siblings)))

    def rewrite(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            siblings = {k: v for k, v in node.items() if k in ASSERTIONS and k != "$ref"}
            # (the root's own `id` names the document, which validators resolve against whatever it holds)
            kept = {k: v for k, v in node.items()
                    if k not in ASSERTIONS and (k not in ("id", "$id") or node is schema)}
            if siblings and applicable(siblings, ref):
                # after the members already there, so that a `$ref` to `.../allOf/N` still names the same one
                prior = siblings.get("allOf") if isinstance(siblings.get("allOf"), list) else []
                node = {**kept, **siblings, "allOf": [*prior, {"$ref": ref}]}
            else:
                node = {"$ref": ref, **kept}
        out = map_subschemas(node, rewrite)
        for key, value in node.items():  # containers no draft names, which a `$ref` may point into
            if key not in ASSERTIONS and key not in ANNOTATIONS and isinstance(value, dict):
                out[key] = rewrite(value)
        return out

    return _dropped_targets_kept(schema, rewrite(schema), rewrite)


def _meaningful_additional_items(schema: Any) -> Any:
    """`schema` without the `additionalItems` that mean nothing: every one in 2020-12 (no keyword there), and in
    earlier drafts those beside an `items` that is no list (it then holds every item). llguidance 1.9.1 read one
    beside `prefixItems` as the old drafts read it beside a list, and dropped the `prefixItems`: `[true]` was taken
    under `prefixItems: [{type: integer}], additionalItems: false`, unsound, and `[1, "a"]` refused beside `items:
    {type: string}` (QA fuzz2 F1, F2). A reference into one still names it (`_dropped_targets_kept`)."""
    if not isinstance(schema, dict) or not any(key == "additionalItems" for _, key, _ in walk_with_refs(schema)):
        return schema
    latest = not any(d in str(schema.get("$schema", "")) for d in (*_OLD_DRAFTS, "2019-09"))

    def rewrite(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = map_subschemas(node, rewrite)
        for key, value in node.items():  # containers no draft names, which a `$ref` may point into
            if key not in ASSERTIONS and key not in ANNOTATIONS and isinstance(value, dict):
                out[key] = rewrite(value)
        if "additionalItems" in out and (latest or not isinstance(out.get("items"), list)):
            del out["additionalItems"]
        return out

    return _dropped_targets_kept(schema, rewrite(schema), rewrite)


def _dropped_targets_kept(before: dict, after: Any, rewrite: Any) -> Any:
    """`after` (`before` with the siblings of some `$ref`s dropped), where a local `$ref` named a subschema among
    those siblings (the draft ignores them as assertions, but a pointer into them still names them): the
    reference names `rewrite` of it, kept under `$defs` (`keep_ref_targets`). It was a 400, `Pointer
    '/properties/x/properties/k' does not exist`, for a schema valid in its draft (fuzz F2b)."""
    def dangling(ref: str) -> bool:
        return resolve_ref(after, ref) is None and resolve_ref(before, ref) is not None

    if not isinstance(after, dict) or not any(k == "$ref" and isinstance(n[k], str) and n[k].startswith("#/")
                                              and dangling(n[k]) for _, k, n in walk_with_refs(after)):
        return after
    out = copy.deepcopy(after)  # (it may share nodes with the client's schema, which is never modified)
    keep_ref_targets(before, out, dangling, rewrite)
    return out


def _recursive(root: dict, ref: str) -> bool:
    """The schema `ref` names refers back to itself, through the local `$ref`s below it."""
    stack, seen = [ref], {ref}
    while stack:
        for _, key, node in walk(resolve_ref(root, stack.pop())):
            inner = node[key]
            if key == "$ref" and isinstance(inner, str):
                if inner == ref:
                    return True
                if inner not in seen:
                    seen.add(inner)
                    stack.append(inner)
    return False


def _types(node: Any) -> frozenset | None:
    """The JSON types `node`'s own `type` keyword allows (None: it names none, or not readably)."""
    return types_of(node["type"]) if isinstance(node, dict) and "type" in node else None


def referenced_types(root: dict, ref: str) -> frozenset | None:
    """The types the schema `ref` names allows by its `type`, following `$ref`s as drafts 4-7 do (None: unknown)."""
    seen = set()
    while isinstance(ref, str) and ref not in seen:
        seen.add(ref)
        target = resolve_ref(root, ref)
        if not isinstance(target, dict):
            return None
        if "$ref" not in target:
            return _types(target)
        ref = target["$ref"]
    return None


def _types_meet(a: frozenset | None, b: frozenset | None) -> bool:
    return a is None or b is None or bool(a & b)


_VALID_MAX = 4096  # schemas remembered as valid (digests only: 4096 x ~100 bytes)
_valid: OrderedDict[bytes, None] = OrderedDict()
_valid_lock = threading.Lock()


def _digest(schema: Any, ordered: bool = False) -> bytes | None:
    """`ordered`: of the schema as written, its objects' keys in their order (which orders the properties of every
    document the schema is compiled to), else of its canonical JSON (keys sorted: what validity depends on)."""
    try:
        text = json.dumps(schema, sort_keys=not ordered, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return hashlib.blake2b(text.encode(), digest_size=20).digest()


def validate_schema(schema: Any, param: str, base: str = "") -> None:
    """Raise ConstraintError unless `schema` is a valid JSON Schema (2020-12 unless it names its draft).

    A schema found valid is remembered by the digest of its canonical JSON (bounded LRU): a repeated schema costs
    one serialisation (~10 us) instead of jsonschema's check (~1 ms). Failures are not remembered."""
    if not isinstance(schema, (dict, bool)):
        raise ConstraintError(f"{param}: a JSON Schema must be an object or a boolean", param=param, pointer=base)
    digest = _digest(schema)
    if digest is not None:
        with _valid_lock:
            if digest in _valid:
                _valid.move_to_end(digest)
                return
    _check_schema(schema, param, base)
    if digest is not None:
        with _valid_lock:
            _valid[digest] = None
            while len(_valid) > _VALID_MAX:
                _valid.popitem(last=False)


# A `\p{..}` (not an escaped backslash's `p`) that `unicode_properties` left as written: not a general category
_UNREAD_PROPERTY = re.compile(r"(?:^|[^\\])(?:\\\\)*(\\[pP]\{[^}]*\})")


def _check_schema(schema: Any, param: str, base: str) -> None:
    check_schema_limits(schema, param, base=base)
    if isinstance(schema, bool):
        return
    escapes = [(ptr, property_escapes(s)) for ptr, s in schema_patterns(schema)]
    if sum(count for _, count in escapes) > MAX_PROPERTY_ESCAPES:
        ptr = base + next(ptr for ptr, count in escapes if count)
        raise ConstraintError(f"the schema's patterns name more than {MAX_PROPERTY_ESCAPES} Unicode properties "
                              f"(\\p{{..}}, the first at {ptr})", param=param, pointer=ptr)
    for ptr, regex in schema_patterns(schema):
        unread = _UNREAD_PROPERTY.search(python_pattern(regex))
        if unread is not None:  # (a script: ECMA-262 and Rust read it, Python's re and so the checks here do not)
            raise ConstraintError(f"the pattern at {base + ptr} cannot be enforced: it names the Unicode property "
                                  f"`{unread[1]}`; of Unicode properties, this server reads the general categories "
                                  f"(\\p{{L}}, \\p{{Nd}}, \\p{{Letter}}, ...)", param=param, pointer=base + ptr,
                                  code="unsupported_schema")
        only_python = python_only_syntax(python_pattern(regex))
        if only_python is not None:
            raise ConstraintError(f"invalid JSON Schema at {base + ptr}: the regex {regex[:100]!r} uses "
                                  f"{only_python}, which ECMA-262 regexes (JSON Schema's) do not have", param=param,
                                  pointer=base + ptr)
    if "$schema" in schema and known_dialect(schema["$schema"]) is None:
        raise ConstraintError(f"unknown $schema {str(schema['$schema'])[:200]!r} (at {base}/$schema): name a JSON "
                              "Schema draft (04, 06, 07, 2019-09, 2020-12) or leave it out", param=param,
                              pointer=f"{base}/$schema", code="unsupported_schema")
    schema = with_python_patterns(_with_known_dialect(schema))  # (jsonschema checks patterns with Python's `re`)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    if cls is jsonschema.Draft3Validator:  # (its `required: true`, `divisibleBy`, `disallow`, `extends` were dropped)
        raise ConstraintError(f"draft-03 schemas are not supported (at {base}/$schema): write the schema in draft-04 "
                              "or later, where `required` is a list of names", param=param, pointer=f"{base}/$schema",
                              code="unsupported_schema")
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise _schema_error(exc, param, base) from None
    error = _later_keyword_error(schema, param, base)
    if error is not None:
        raise error
    dangling = _dangling_reference(schema)
    if dangling is not None:
        ptr, ref = dangling
        raise ConstraintError(f"the $ref at {base + ptr} names {ref[:200]!r}, which is not in the schema",
                              param=param, pointer=base + ptr)
    loop = _reference_loop(schema)
    if loop is not None:
        raise ConstraintError(f"the $ref at {base + loop} never reaches a schema: the references it leads through "
                              "only refer to one another", param=param, pointer=base + loop)
    loop = _in_place_loop(schema)
    if loop is not None:
        raise ConstraintError(f"the schema at {base + loop or 'the root'} applies itself to the value it checks: "
                              "through $ref and allOf/anyOf/oneOf/not/if/then/else/dependentSchemas it leads back to a "
                              "schema it is part of, at the same place in the value, so checking a value against "
                              "it never ends", param=param, pointer=base + loop)
    endless = _endless_at(_ref_siblings(schema))  # (as compiled: drafts 4-7 drop a recursive $ref's siblings)
    if endless is not None:
        raise ConstraintError(f"no JSON document satisfies the schema: each value of the schema at "
                              f"{base + endless or '/'} must hold another of its values (through required "
                              f"properties, minItems or contains, and $ref), without end", param=param,
                              pointer=base + endless)


def _later_keyword_error(schema: dict, param: str, base: str) -> ConstraintError | None:
    """A 400 for a keyword of a later draft in a node read in a draft that does not define it (draft 7's
    `prefixItems`) whose value the later draft's meta-schema refuses, or with a subschema the node's draft's
    meta-schema refuses. The product enforces such a keyword as the later draft defines it (constrain/rewrite.py
    `later_keyword_validators`) where the node's draft's meta-schema never looks: draft 7's `prefixItems: 3`
    compiled to a grammar that refused every array, so that no answer could end."""
    dialects = {node: known_dialect(dialect) or _LATEST for node, dialect in node_dialects(schema).items()}
    later_meta = jsonschema.Draft202012Validator(jsonschema.Draft202012Validator.META_SCHEMA)
    for ptr, key, node in walk(schema, base):
        dialect = dialects[id(node)]
        if key not in later_keywords_of(dialect):
            continue
        value, at = node[key], ptr[: ptr.rindex("/")]
        shape = map_subschemas({key: value}, lambda sub: {} if isinstance(sub, dict) else sub)
        found = jsonschema.exceptions.best_match(later_meta.iter_errors(shape))
        subschemas = [((key,), value)] if isinstance(value, dict) else \
            [((key, i), sub) for i, sub in enumerate(value) if isinstance(sub, dict)] \
            if key == "prefixItems" and isinstance(value, list) else []
        own = jsonschema.validators.validator_for({"$schema": dialect})
        for part, sub in subschemas if found is None else ():
            found = jsonschema.exceptions.best_match(own(own.META_SCHEMA).iter_errors(sub))
            if found is not None:
                found.path.extendleft(reversed(part))
                break
        if found is not None:
            return _schema_error(jsonschema.SchemaError.create_from(found), param, at)
    return None


def _dangling_reference(root: dict) -> tuple[str, str] | None:
    """The pointer and value of a local `$ref` (`#/...`), reached from the root, that names nothing in the schema
    (the backend's refusal named it in its own terms: `/$defs/tool0/...` for a function's parameters). Definitions
    no reference reaches are not looked at, as a validator never follows them, nor references a nested `$id` gives
    another base."""
    if any(gives_another_base(ptr, key, node) for ptr, key, node in walk_with_refs(root)):
        return None
    for ptr, key, node in _reached(root):
        ref = node[key] if key == "$ref" else None
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")) and resolve_ref(root, ref) is None:
            return ptr, ref
    return None


def _endless_at(root: dict) -> str | None:
    """Where the recursion is, when no finite value satisfies the whole schema (`_endless`): the pointer of the
    first endless `$ref` target reached from the root."""
    if not references_followable(root):
        return None
    endless = _endless(root)
    if id(root) not in endless:
        return None
    for _, key, node in _reached(root):
        if key == "$ref" and id(node) in endless and isinstance(node[key], str):
            target = resolve_ref(root, node[key])
            if isinstance(target, dict) and id(target) in endless:
                return node[key][1:]
    return ""


def _reference_loop(root: dict) -> str | None:
    """The pointer of a local `$ref`, reached from the root, that never reaches a schema: its target only leads,
    through `$ref`s and allOf/anyOf/oneOf, back into itself (`{"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref":
    "#/$defs/a"}`, or `a` being `{"anyOf": [{"$ref": "#/$defs/a"}]}`). No validator can decide such a schema, and
    llguidance allowed no token, or the first two, then failed mid-output. Definitions no reference reaches are not
    looked at (a validator never follows them either), nor schemas whose references a nested `$id` (or a dynamic
    reference) may move elsewhere than the document's own pointers."""
    if not references_followable(root):
        return None
    dead = _never_a_schema(root)
    for ptr, key, node in _reached(root):
        if key == "$ref":
            target = resolve_ref(root, node[key])
            if isinstance(target, dict) and id(target) in dead:
                return ptr
    return None


def _reached(root: dict) -> Iterator[tuple[str, str, dict]]:
    """`walk`'s items for the subschemas a validator may reach: the root's (not inside its definitions) and, once
    each, those of every local `$ref`'s target (a definition's references count where a reference reaches it)."""
    stack, scanned = [("", root)], {"#"}
    while stack:
        base, schema = stack.pop()
        for ptr, key, node in walk(schema, base):
            inside = ptr[len(base):].split("/")
            if "$defs" in inside[:-1] or "definitions" in inside[:-1]:
                continue
            yield ptr, key, node
            if key == "$ref":
                target = resolve_ref(root, node[key])
                if target is not None and node[key] not in scanned:
                    scanned.add(node[key])
                    stack.append((node[key][1:], target))


_IN_PLACE = ("not", "if", "then", "else")
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE_MAPS = ("dependentSchemas", "dependencies")


def _in_place_loop(root: dict) -> str | None:
    """The pointer of a subschema, reached from the root, that applies itself to the value it checks: a cycle of
    `$ref`s and keywords that apply subschemas to the same value (`{"$defs": {"a": {"if": {"$ref":
    "#/$defs/a"}}}}`, or `a` being `{"anyOf": [{"type": "null"}, {"$ref": "#/$defs/a"}]}`). A validator checking
    a value against it recurses until it fails (jsonschema: RecursionError, or a panic in its Rust registry, which
    the late checks met while decoding); JSON Schema calls such a schema an error. A recursion through
    `properties`, `items` and the like moves into the value, and ends. Unreferenced definitions, and schemas whose
    references a nested `$id` or a dynamic reference may move, are not looked at (as in `_reference_loop`)."""
    if not references_followable(root):
        return None
    where: dict[int, str] = {id(root): ""}  # the schemas a validator may reach, by id: their pointers
    nodes: dict[int, dict] = {id(root): root}
    for ptr, key, node in _reached(root):
        if id(node) not in where:
            where[id(node)], nodes[id(node)] = ptr[: -len(escape_pointer_part(key)) - 1], node

    def in_place(node: dict) -> list[dict]:
        subs = [resolve_ref(root, node["$ref"])] if "$ref" in node else []
        subs += [node[key] for key in _IN_PLACE if key in node]
        subs += [m for key in _IN_PLACE_LISTS if isinstance(node.get(key), list) for m in node[key]]
        subs += [v for key in _IN_PLACE_MAPS if isinstance(node.get(key), dict) for v in node[key].values()]
        return [sub for sub in subs if isinstance(sub, dict) and id(sub) in nodes]

    done: set[int] = set()
    for start in list(nodes.values()):  # depth first, without recursion: a chain may be thousands long
        if id(start) in done:
            continue
        path, on_path = [(start, iter(in_place(start)))], {id(start)}
        while path:
            node, subs = path[-1]
            sub = next(subs, None)
            if sub is None:
                path.pop()
                on_path.discard(id(node))
                done.add(id(node))
            elif id(sub) in on_path:
                return where[id(sub)]
            elif id(sub) not in done:
                path.append((sub, iter(in_place(sub))))
                on_path.add(id(sub))
    return None


def _never_a_schema(root: dict) -> set[int]:
    """The ids of the subschemas that never reach a schema: the rest, found from those without `$ref`, allOf, anyOf
    and oneOf, are those whose `$ref` target reaches one, and every allOf member, and some anyOf (and oneOf) member."""
    return _least_fixpoint(root, lambda node: _combined(root, node),
                           lambda node, ok: _combinators_hold(root, node, ok))


def _endless(root: dict) -> set[int]:
    """The ids of the subschemas no finite JSON value satisfies: each value they take must hold another value of
    them, without end, through a recursive `$ref` (`{"$defs": {"n": {"type": "object", "properties": {"a": {"$ref":
    "#/$defs/n"}}, "required": ["a"]}}}`: `{"a": {"a": ...`). A JSON document is finite, so such a subschema
    accepts none, as `false` does; llguidance compiled it all the same, and an output that entered it ran to
    `max_tokens` unfinished. Read generously: a subschema counts as having a finite value unless its `$ref`, every
    member of an anyOf/oneOf, one of an allOf, or each type it allows needs a value of one already counted
    endless (an object's required properties, an array's first `minItems` items or its `contains`). So only a
    recursion is ever found endless, never a schema the other checks refuse for what it asks. A later draft's
    `prefixItems`, `contains` and `minContains` count where they stand (`root` as `_ref_siblings` reads it: what
    it leaves of them is enforced, README, Drafts), `contains` asking for one item at least before 2019-09."""
    draft = str(root.get("$schema", ""))
    old = any(d in draft for d in _OLD_DRAFTS)  # (list `items` and additionalItems)
    before_2020 = old or "2019-09" in draft

    def needed(node: dict) -> list[list]:
        """Per type the node allows: the subschemas a value of that type must satisfy, inside it (the keywords of
        the schema's draft)."""
        types = _types(node)
        if types is None or types - {"object", "array"} or "const" in node or "enum" in node:
            return [[]]
        out = []
        if "object" in types:
            properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
            others = node.get("additionalProperties") if "patternProperties" not in node else None
            required = node.get("required") if isinstance(node.get("required"), list) else []
            out.append([properties[name] if name in properties else others for name in required
                        if isinstance(name, str)])
        if "array" in types:
            least = node.get("minItems") if isinstance(node.get("minItems"), int) else 0
            listed = "items" if before_2020 else "prefixItems"
            prefix = node.get(listed) if isinstance(node.get(listed), list) else []
            rest = node.get("additionalItems") if isinstance(node.get("items"), list) else node.get("items")
            items = prefix[:least] + ([rest] if least > len(prefix) else [])
            if before_2020 and isinstance(node.get("prefixItems"), list):
                items += node["prefixItems"][:least]
            least_contained = 1 if old else node.get("minContains", 1)
            contains = node.get("contains") if least_contained != 0 else None
            out.append(items + [contains])
        return out

    def edges(node: dict) -> list:
        return _combined(root, node) + [sub for subs in needed(node) for sub in subs]

    def finite(node: dict, ok) -> bool:
        return _combinators_hold(root, node, ok) and any(all(ok(sub) for sub in subs) for subs in needed(node))

    return _least_fixpoint(root, edges, finite)


def _combined(root: dict, node: dict) -> list:
    """The subschemas `node` applies to the same value: its `$ref` target and its allOf/anyOf/oneOf members."""
    ref = node.get("$ref")
    found = [resolve_ref(root, ref)] if isinstance(ref, str) else []
    return found + [m for key in ("allOf", "anyOf", "oneOf") if isinstance(node.get(key), list) for m in node[key]]


def _combinators_hold(root: dict, node: dict, ok) -> bool:
    """`ok` holds for `node`'s `$ref` target, every allOf member and some anyOf (and oneOf) member."""
    ref = node.get("$ref")
    if isinstance(ref, str) and not ok(resolve_ref(root, ref)):
        return False
    for key, every in (("allOf", True), ("anyOf", False), ("oneOf", False)):
        members = node.get(key)
        if isinstance(members, list) and members and not (all if every else any)(ok(m) for m in members):
            return False
    return True


def _least_fixpoint(root: dict, edges, holds) -> set[int]:
    """The ids of `root`'s subschemas for which `holds(node, ok)` never becomes true, where `ok(sub)` says whether
    it holds for a subschema (`{}`, booleans, None and unresolved references count as holding). Found from the
    nodes it holds for without help, through the reverse of `edges` (the subschemas `holds` looks at): a worklist,
    linear in the references and members (chains of thousands of `$ref`s)."""
    nodes = {id(node): node for _, _, node in walk(root)}
    reached: set[int] = set()

    def ok(sub) -> bool:
        return not isinstance(sub, dict) or id(sub) not in nodes or id(sub) in reached

    before: dict[int, list[dict]] = {}
    for node in nodes.values():
        for sub in edges(node):
            if isinstance(sub, dict) and id(sub) in nodes:
                before.setdefault(id(sub), []).append(node)
    work = [node for node in nodes.values() if holds(node, ok)]
    reached.update(id(node) for node in work)
    while work:
        for node in before.get(id(work.pop()), ()):
            if id(node) not in reached and holds(node, ok):
                reached.add(id(node))
                work.append(node)
    return set(nodes) - reached


SCHEMA_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


# The fields each `response_format` type reads, and those of its `json_schema` object (OpenAI's shapes, and the
# hosted-provider `{"type": "json_object", "schema": ...}`).
_RESPONSE_FORMAT_FIELDS = {"text": ("type",), "json_object": ("type", "schema"), "json_schema": ("type", "json_schema")}
_JSON_SCHEMA_FIELDS = ("name", "schema", "strict", "description")


def _response_format(rf: Any, named_schemas: dict | None) -> ConstraintSpec | None:
    p = "response_format"
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise ConstraintError("response_format must be an object with a string 'type'", param=p)
    kind = rf["type"]
    if kind in ("json", "regex") or rf.get("value") is not None:  # (TGI's chat takes its grammar here)
        return _tgi_grammar(rf, p)
    if kind in _RESPONSE_FORMAT_FIELDS:
        refuse_unread_fields(rf, _RESPONSE_FORMAT_FIELDS[kind], p, f" with type {kind!r} (a schema goes in "
                             f"'schema' with type 'json_object', in 'json_schema': {{'name', 'schema', 'strict'}} "
                             f"with type 'json_schema')")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = rf.get("schema")
        if schema is None:
            return ConstraintSpec(kind="json_object")
        validate_schema(schema, p)
        return ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), extra={"source": schema})
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise ConstraintError("response_format.json_schema must be an object with 'name' and 'schema'", param=p)
        refuse_unread_fields(js, _JSON_SCHEMA_FIELDS, "response_format.json_schema")
        name = js.get("name")
        if name is not None and not (isinstance(name, str) and SCHEMA_NAME.fullmatch(name)):
            # (OpenAI's rule; a client that omits the name is let through, as other compatible servers do)
            raise ConstraintError(f"invalid response_format.json_schema.name {name!r}: up to 64 letters, digits, "
                                  f"'_' and '-'", param="response_format.json_schema.name", code="invalid_value")
        strict = js.get("strict", False)
        if strict is None:
            strict = False
        if not isinstance(strict, bool):
            raise ConstraintError(f"response_format.json_schema.strict must be a boolean, not {strict!r}",
                                  param="response_format.json_schema.strict", code="invalid_request")
        if js.get("schema") is None:  # (as everywhere, a field set to null is a field not sent)
            if name is None:
                raise ConstraintError("response_format.json_schema needs 'schema' (or the 'name' of a preloaded "
                                      "schema)", param=p)
            if not named_schemas or name not in named_schemas:
                known = ", ".join(sorted(named_schemas or {})) or "none"
                raise ConstraintError(f"unknown schema name {name!r} (preloaded schemas: {known})",
                                      param="response_format.json_schema.name")
            schema = named_schemas[name]
        else:
            schema = js["schema"]
            validate_schema(schema, p)
        return ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=strict,
                              extra={"name": name, "source": schema})
    if kind in _GRAMMAR_FORMATS:
        raise ConstraintError(f"response_format.type {kind!r}: {_GRAMMAR_LANGUAGE}", param=p,
                              code="unsupported_parameter")
    raise ConstraintError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                          param=p)


# response_format types other servers take for a grammar (vLLM's structural tags; grammar languages by name)
_GRAMMAR_FORMATS = ("structural_tag", "grammar", "ebnf", "gbnf", "lark")


def _regex(pattern: Any, param: str = "regex") -> ConstraintSpec:
    if not isinstance(pattern, str) or not pattern:
        raise ConstraintError(f"{param} must be a non-empty string", param=param)
    if len(pattern) > DEFAULT_LIMITS.max_regex_chars:
        raise ConstraintError(f"{param} is longer than {DEFAULT_LIMITS.max_regex_chars} characters", param=param,
                              code="schema_too_large")
    if property_escapes(pattern) > MAX_PROPERTY_ESCAPES:
        raise ConstraintError(f"{param} names more than {MAX_PROPERTY_ESCAPES} Unicode properties (\\p{{..}})",
                              param=param)
    pattern = python_pattern(pattern)
    unread = _UNREAD_PROPERTY.search(pattern)
    if unread is not None:
        raise ConstraintError(f"{param} cannot be enforced: it names the Unicode property `{unread[1]}`; of Unicode "
                              f"properties, this server reads the general categories (\\p{{L}}, \\p{{Nd}}, "
                              f"\\p{{Letter}}, ...)", param=param, code="unsupported_schema")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConstraintError(f"invalid regex in {param}: {exc}", param=param) from None
    only_python = python_only_syntax(pattern)
    if only_python is not None:
        raise ConstraintError(f"invalid regex in {param}: it uses {only_python}, which only Python reads so; "
                              f"the backends read another language", param=param)
    literal = longest_literal(pattern)
    if literal > DEFAULT_LIMITS.max_literal_chars:  # (as a `const` string: see Limits)
        raise ConstraintError(f"{param} spells {literal} characters in a row; the limit is "
                              f"{DEFAULT_LIMITS.max_literal_chars}", param=param, code="schema_too_large")
    return ConstraintSpec(kind="regex", pattern=pattern, extra=_from_field(param, "regex"))


def _choice(choice: Any, param: str = "choice") -> ConstraintSpec:
    if (not isinstance(choice, list) or not choice or not all(isinstance(c, str) and c for c in choice)):
        raise ConstraintError(f"{param} must be a non-empty list of non-empty strings", param=param)
    if len(choice) > DEFAULT_LIMITS.max_choices:
        raise ConstraintError(f"{param} has more than {DEFAULT_LIMITS.max_choices} entries", param=param,
                              code="schema_too_large")
    if sum(map(len, choice)) > DEFAULT_LIMITS.max_choice_chars:
        raise ConstraintError(f"{param} holds more than {DEFAULT_LIMITS.max_choice_chars} characters", param=param,
                              code="schema_too_large")
    longest = max(map(len, choice))
    if longest > DEFAULT_LIMITS.max_literal_chars:  # (as a `const` string: see Limits)
        raise ConstraintError(f"{param} has an entry of {longest} characters; the limit is "
                              f"{DEFAULT_LIMITS.max_literal_chars}", param=param, code="schema_too_large")
    return ConstraintSpec(kind="choice", choices=tuple(dict.fromkeys(choice)), extra=_from_field(param, "choice"))


def _from_field(param: str, usual: str) -> dict[str, Any]:
    """`extra` naming the request field a constraint came from, where it is not the usual one for its kind."""
    return {} if param == usual else {"param": param}


# Constraint fields of other OpenAI-compatible servers, read as the constraint they mean there, so that a client
# written for one of them is never silently unconstrained here:
#   vLLM: guided_json, guided_regex, guided_choice, and structured_outputs {json, regex, choice, json_object};
#   llama.cpp and SGLang: json_schema (a schema, or its JSON text);
#   TGI: grammar {"type": "json" | "regex" | "json_object", "value": ...}.
# Grammars written in a grammar language (GBNF, EBNF, Lark, structural tags) are refused, never ignored.
COMPAT_CONSTRAINT_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
                            "json_schema", "grammar", "ebnf", "structural_tag", "format")
# vLLM's `structured_outputs`: the constraints it may name (one of them; those of a grammar language are refused),
# and its options that change nothing this server enforces (accepted, named in `x-structgen-ignored-fields`).
_STRUCTURED_OUTPUTS_KINDS = {"json": "schema", "regex": "regex", "choice": "choice", "json_object": "json_object"}
_STRUCTURED_OUTPUTS_CONSTRAINTS = ("json", "regex", "choice", "json_object", "grammar", "structural_tag")
STRUCTURED_OUTPUTS_OPTIONS = ("disable_fallback", "disable_any_whitespace", "whitespace_pattern")
_STRUCTURED_OUTPUTS_INTERNAL = ("_backend", "_backend_was_auto")  # (vLLM's own, in a serialised params object)
_GRAMMAR_LANGUAGE = "grammars in a grammar language (GBNF, EBNF, Lark, structural tags) are not supported by this " \
                    "server: send a JSON schema (response_format), a `regex` or a `choice`"


def _compat_schema(value: Any, param: str) -> ConstraintSpec:
    """A JSON schema sent in a compatibility field, as an object or as its JSON text; not strict, as
    response_format's `json_object` with a schema."""
    if isinstance(value, str):
        try:
            value = read_json(value)
        except JSONTooDeep as exc:
            raise ConstraintError(f"{param} {exc}, which this server does not read", param=param) from None
        except ValueError as exc:
            raise ConstraintError(f"{param} must be a JSON schema or its JSON text: {exc}", param=param) from None
        try:  # (JSON text may spell a lone UTF-16 surrogate, "\ud800", which no UTF-8 output can hold)
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ConstraintError(f"{param} is not valid Unicode text: its JSON holds a lone surrogate (a \\u escape "
                                  "of half a UTF-16 pair)", param=param) from None
    validate_schema(value, param)
    return ConstraintSpec(kind="json_schema", schema=normalise_schema(value),
                          extra={"source": value, "param": param})


def compat_options_ignored(fields: dict[str, Any]) -> list[str]:
    """The options of the compatibility fields among `fields` that are accepted but change nothing here, as
    `field.option`, for the `x-structgen-ignored-fields` header."""
    outputs = fields.get("structured_outputs")
    if not isinstance(outputs, dict):
        return []
    return [f"structured_outputs.{name}" for name in STRUCTURED_OUTPUTS_OPTIONS + _STRUCTURED_OUTPUTS_INTERNAL
            if outputs.get(name) not in (None, False)]  # (false: the default, which asks for nothing)


def _compat_constraints(fields: dict[str, Any]) -> list[tuple[str, ConstraintSpec]]:
    """The constraints the compatibility fields among `fields` (a body's other fields) carry, with their names."""
    found: list[tuple[str, ConstraintSpec]] = []

    def add(param: str, kind: str, value: Any) -> None:
        if value is None or (value is False and kind == "json_object"):
            return
        if kind == "schema":
            found.append((param, _compat_schema(value, param)))
        elif kind == "regex":
            found.append((param, _regex(value, param)))
        elif kind == "choice":
            found.append((param, _choice(value, param)))
        elif kind == "json_object":
            if value is not True:
                raise ConstraintError(f"{param} must be a boolean", param=param)
            found.append((param, ConstraintSpec(kind="json_object", extra={"param": param})))
        else:  # a grammar language
            raise ConstraintError(_GRAMMAR_LANGUAGE, param=param, code="unsupported_parameter")

    for name, kind in (("guided_json", "schema"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                       ("guided_grammar", "grammar"), ("json_schema", "schema"), ("ebnf", "grammar"),
                       ("structural_tag", "grammar")):
        add(name, kind, fields.get(name))
    outputs = fields.get("structured_outputs")
    if outputs is not None:
        if not isinstance(outputs, dict):
            raise ConstraintError("structured_outputs must be an object", param="structured_outputs")
        if outputs.get("disable_additional_properties"):  # (vLLM: objects closed to keys the schema does not name)
            raise ConstraintError("structured_outputs.disable_additional_properties is not supported by this server: "
                                  "close the objects in the schema (`additionalProperties: false`)",
                                  param="structured_outputs.disable_additional_properties",
                                  code="unsupported_parameter")
        refuse_unread_fields(outputs, _STRUCTURED_OUTPUTS_CONSTRAINTS + STRUCTURED_OUTPUTS_OPTIONS
                             + ("disable_additional_properties",), "structured_outputs",
                             unlisted=_STRUCTURED_OUTPUTS_INTERNAL)
        for key in _STRUCTURED_OUTPUTS_CONSTRAINTS:
            add(f"structured_outputs.{key}", _STRUCTURED_OUTPUTS_KINDS.get(key, "grammar"), outputs.get(key))
        if all(outputs.get(key) is None for key in _STRUCTURED_OUTPUTS_CONSTRAINTS):  # (`json_object: false` is one)
            raise ConstraintError("structured_outputs names no constraint: it takes one of "
                                  f"{', '.join(repr(k) for k in _STRUCTURED_OUTPUTS_CONSTRAINTS)}",
                                  param="structured_outputs")
    grammar = fields.get("grammar")
    if isinstance(grammar, dict):  # TGI
        found.append(("grammar", _tgi_grammar(grammar)))
    elif grammar is not None:  # llama.cpp: GBNF text
        add("grammar", "grammar", grammar)
    ollama = fields.get("format")  # Ollama's: "json", or a schema
    if ollama == "json":
        add("format", "json_object", True)
    elif isinstance(ollama, dict):
        add("format", "schema", ollama)
    elif ollama not in (None, ""):  # ("": no format, as Ollama reads it)
        raise ConstraintError("format must be \"json\" or a JSON schema (Ollama's field)", param="format")
    return found


def _tgi_grammar(grammar: dict, param: str = "grammar") -> ConstraintSpec:
    """TGI's grammar (its `grammar` field, and its chat's `response_format`): `json` (its alias `json_object`) with a
    schema as `value`, `json_schema` with `{"name", "schema"}`, or `regex` with a pattern. `json_object` without a
    value asks for any JSON object."""
    kind = grammar.get("type")
    if kind not in ("json", "json_object", "json_schema", "regex"):
        raise ConstraintError(f"{param}.type must be 'json', 'json_object', 'json_schema' or 'regex'", param=param)
    refuse_unread_fields(grammar, ("type", "value"), param)
    value = grammar.get("value")
    if value is None and kind == "json_object":
        return ConstraintSpec(kind="json_object", extra={"param": param})
    if value is None:
        raise ConstraintError(f"{param}.value is required with {param}.type {kind!r}: the "
                              f"{'pattern' if kind == 'regex' else 'schema'} to follow", param=f"{param}.value")
    if kind == "regex":
        return _regex(value, param)
    if kind == "json_schema":
        if not isinstance(value, dict) or value.get("schema") is None:
            raise ConstraintError(f'{param}.value must be {{"name": ..., "schema": {{...}}}} with {param}.type '
                                  "'json_schema'", param=f"{param}.value")
        refuse_unread_fields(value, ("name", "schema"), f"{param}.value")
        return _compat_schema(value["schema"], param)
    return _compat_schema(value, param)


def spec_from_request(*, response_format=None, regex=None, choice=None, tools=None, tool_choice=None,
                      parallel_tool_calls=None, tool_format="json_array", backend=None, named_schemas=None,
                      other_fields=None) -> ConstraintSpec | None:
    """The one constraint a request carries, or None for free text. `other_fields` are the body's fields beyond
    OpenAI's, where other servers' constraint fields (COMPAT_CONSTRAINT_FIELDS) are read; `tool_format` is how
    the model writes tool calls (constrain/tools.py). Raises ConstraintError(param=...)."""
    if backend is not None and backend not in _BACKENDS:
        raise ConstraintError(f"constraint backend must be one of {', '.join(_BACKENDS)}", param="backend")
    specs: list[tuple[str, ConstraintSpec]] = []
    if response_format is not None:
        s = _response_format(response_format, named_schemas)
        if s is not None:
            specs.append(("response_format", s))
    if regex is not None:
        specs.append(("regex", _regex(regex)))
    if choice is not None:
        specs.append(("choice", _choice(choice)))
    if tools is not None or tool_choice is not None:
        from constrain.tools import tools_spec

        s = tools_spec(tools, tool_choice, parallel_tool_calls, tool_format)
        if s is not None:
            specs.append(("tools", s))
    specs += _compat_constraints(other_fields or {})
    if not specs:
        return None
    specs = _with_answer(specs)
    if len(specs) > 1:
        names = " and ".join(n for n, _ in specs)
        raise ConstraintError(f"only one output constraint per request: got {names}", param=specs[1][0])
    spec = specs[0][1]
    if backend in _BACKENDS:  # ("auto" too: the policy, whatever the server's backend)
        answer = spec.answer and dataclasses.replace(spec.answer, backend=backend)
        spec = dataclasses.replace(spec, backend=backend, answer=answer)
    return spec


# Formats whose calls a JSON object answer cannot be told from as it streams: Llama 3's call is a bare object.
_OBJECT_CALLS = ("llama3_json",)


def _with_answer(specs: list[tuple[str, ConstraintSpec]]) -> list[tuple[str, ConstraintSpec]]:
    """`tools` and `response_format` together, as OpenAI takes them: under tool_choice "auto" the output is calls or
    an answer under the response_format (`ConstraintSpec.answer`); under "required" or a named function, calls
    (there is no answer). Other pairs are left for the caller to refuse."""
    names = [n for n, _ in specs]
    if sorted(names) != ["response_format", "tools"]:
        return specs
    tools, answer = (dict(specs)[n] for n in ("tools", "response_format"))
    if tools.tool_choice != "auto":
        return [("tools", tools)]
    if tools.tool_format in _OBJECT_CALLS:
        raise ConstraintError(f"this model writes a tool call as a bare JSON object ({tools.tool_format}), which an "
                              "answer under `response_format` could not be told from: send `tools` or "
                              "`response_format`, or `tool_choice: \"required\"`", param="response_format")
    if answer.kind not in ("json_object", "json_schema") or answer.kind == "json_schema" \
            and not _objects_only(_ref_siblings(answer.extra.get("source", answer.schema))):
        # (a regex answer spelled `[{"name": "f", ...}]` and came back as a call no function's schema held: QA
        # review8 F3; so did a `$ref` to an array, F4)
        raise ConstraintError("with `tools`, the `response_format` must be a JSON object (`json_object`, or a "
                              "`json_schema` of `type: object`): the answer is told from tool calls by it",
                              param="response_format")
    return [("tools", dataclasses.replace(tools, answer=answer))]


def _objects_only(schema: Any) -> bool:
    """The schema (as the client sent it, its draft's `$ref` siblings read: rewrites may move its `type`) takes
    objects only, or refers (by a local `$ref`, through others) to one that does. (Drafts 4-7 ignore a `type:
    object` beside a `$ref` to an array, whose calls came back as tool_calls: QA review9 F3.)"""
    node, seen = schema, set()
    while isinstance(node, dict) and node.get("type") != "object" and isinstance(node.get("$ref"), str) \
            and id(node) not in seen:
        seen.add(id(node))
        node = resolve_ref(schema, node["$ref"])
    return isinstance(node, dict) and node.get("type") == "object"
