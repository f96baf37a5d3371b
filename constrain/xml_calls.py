"""Tool calls written as tags around each argument, with string values raw: the "qwen3_coder" format of
Qwen3-Coder's, Qwen3.5's (and later Qwen3 releases') and Nemotron-3-Nano's chat templates, and the "glm45" and
"glm47" formats of GLM-4.5/4.6's and of GLM-4.7's and later templates (constrain/tools.py). The grammar that
writes them is in constrain/llg_backend.py (`compile_xml_calls`); here are their shapes, how each value is
written, and the parser. One call, in each:

    <tool_call>                        <tool_call>get_weather            <tool_call>get_weather<arg_key>loc...
    <function=get_weather>             <arg_key>location</arg_key>
    <parameter=location>               <arg_value>San Francisco</arg_value>
    San Francisco                      <arg_key>days</arg_key>
    </parameter>                       <arg_value>3</arg_value>
    <parameter=days>                   </tool_call>
    3
    </parameter>
    </function>
    </tool_call>

A value is written as those templates render one: a string as its own text ("raw"), anything else as JSON. So the
form of a value follows from its parameter's schema (`value_form`): raw where the schema takes strings only, or
strings and null (then the text `null` is the null), and the keywords it holds can be said of raw text (`enum`,
`const`, `minLength`, `maxLength`, `pattern`, the formats that constrain/formats.py writes as patterns, `uuid`,
`email`, `ipv4`, `ipv6`, `uri`, `duration` and `hostname`, held to 253 characters); JSON otherwise (a `format:
regex` string is then written quoted). The grammar and the parser both ask `value_form`, so they agree. A raw
value never holds the tag that ends it.

The whole output is one llguidance grammar (Lark), so a token may straddle a value and the tag after it (`.\n`):
JSON values are `%json` of their schema (with llguidance's support check: strict refusals carry the keyword's
pointer, the others are named as unenforced). The parameters come in the order the schema declares them, the
required ones always; a parameter the schema does not declare is never written. Parameters that combine objects
(a root `anyOf`/`oneOf` of objects, as pydantic's and zod's unions write them, `allOf`, a root `$ref`) are one list
of parameters per branch where each branch is plain enough (`object_variants`): before, only the root's own
properties were written, none in a union of objects, so every call was `{}`, valid against no branch. The checks
constrain/ applies while decoding JSON outputs (late keywords, `uniqueItems`, keys without escapes) follow JSON
documents, not these formats: the keywords they would enforce are refused in strict functions and named as
unenforced otherwise.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from constrain.formats import FORMAT_PATTERNS, NATIVE_FORMAT_PATTERNS, format_pattern
from constrain.grammar import ConstraintError, ConstraintSpec
from constrain.pattern_dialects import portable_pattern
from constrain.regex_sets import disjoint_regions
from constrain.support import (ASSERTIONS, STANDARD_FORMATS, escape_pointer_part, json_type, keep_ref_targets,
                               nested_resources, resolve_ref, unescape_pointer_part, walk, walk_with_refs)
from constrain.tools import HERMES_CLOSE, HERMES_OPEN

FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
ARG_KEY_OPEN, ARG_KEY_CLOSE, ARG_VALUE_OPEN, ARG_VALUE_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


@dataclass(frozen=True)
class XmlShape:
    """The text a format writes inside `<tool_call>` tags, around the function's name and each argument, and
    between calls. `value_close` is the tag that ends a value, which a raw value never holds; `tags` are the tags
    (beside `<tool_call>`) that a vocabulary may have as tokens of their own (GLM's are special tokens)."""

    before_name: str
    after_name: str
    before_key: str
    between: str  # after the key, before the value
    after_value: str
    before_close: str  # after the last argument, before `</tool_call>`
    separator: str  # between calls
    value_close: str
    tags: tuple[str, ...] = ()


GLM_TAGS = (ARG_KEY_OPEN, ARG_KEY_CLOSE, ARG_VALUE_OPEN, ARG_VALUE_CLOSE)
SHAPES = {
    "qwen3_coder": XmlShape(before_name="\n" + FUNCTION_OPEN, after_name=">\n", before_key=PARAMETER_OPEN,
                            between=">\n", after_value=f"\n{PARAMETER_CLOSE}\n", before_close=FUNCTION_CLOSE + "\n",
                            separator="\n", value_close=PARAMETER_CLOSE),
    # GLM-4.5 and 4.6 write a newline after the name and after each tag pair, and between calls; 4.7 and later none.
    "glm45": XmlShape(before_name="", after_name="\n", before_key=ARG_KEY_OPEN,
                      between=f"{ARG_KEY_CLOSE}\n{ARG_VALUE_OPEN}", after_value=ARG_VALUE_CLOSE + "\n",
                      before_close="", separator="\n", value_close=ARG_VALUE_CLOSE, tags=GLM_TAGS),
    "glm47": XmlShape(before_name="", after_name="", before_key=ARG_KEY_OPEN,
                      between=ARG_KEY_CLOSE + ARG_VALUE_OPEN, after_value=ARG_VALUE_CLOSE, before_close="",
                      separator="", value_close=ARG_VALUE_CLOSE, tags=GLM_TAGS),
}
# Keywords of a parameters object that this format writes: its properties, which of them are required, and words
# about it. `additionalProperties` takes nothing away: only declared parameters are written.
_OBJECT_KEYWORDS = {"type", "properties", "required", "additionalProperties", "$defs", "definitions", "title",
                    "description", "$schema", "$id", "$comment", "examples", "default", "strict"}
_RAW_KEYWORDS = {"type", "enum", "const", "minLength", "maxLength", "pattern", "format"}  # (what raw text can keep)
_ANY_TEXT = r"[\s\S]"


@dataclass(frozen=True)
class ValueForm:
    """How a parameter's value is written: `raw` text (a string; with `nullable`, the text `null` is null), which
    must match each of the Lark expressions `parts`; else JSON."""

    raw: bool
    nullable: bool = False
    parts: tuple[str, ...] = ()
    values: tuple[str, ...] | None = None  # the strings an enum or const allows, where one does

    def writable(self, value_close: str) -> bool:
        """Some value can be written raw: not every value the enum or const allows holds `value_close`, which
        would end it (the text `null` stays writable where the value may be null)."""
        return self.values is None or self.nullable or any(value_close not in v for v in self.values)

    def lexeme(self, value_close: str) -> str:
        """The Lark expression of the raw text, which never holds `value_close`."""
        parts = [*(self.parts or [_lark_regex(f"{_ANY_TEXT}*")]),
                 f"~{_lark_regex(f'{_ANY_TEXT}*{value_close}{_ANY_TEXT}*')}"]
        if self.nullable:
            parts.append('~"null"')
        lexeme = "(" + " & ".join(parts) + ")"
        return f'({lexeme} | "null")' if self.nullable else lexeme


JSON_FORM = ValueForm(raw=False)


def _types(schema: dict) -> set[str] | None:
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        return set(t)
    return None if t is None else set()


@functools.lru_cache(maxsize=1024)
def _pattern_region(pattern: str) -> str | None:
    """The strings `pattern` finds a match in (JSON Schema's search), as an unanchored Lark regex spelled as every
    regex dialect reads it (constrain/pattern_dialects.py); None when out of reach of constrain/regex_sets.py. A
    format's pattern (constrain/formats.py, put in the format's place by the rewrite) is its own region."""
    if pattern in _FORMAT_REGIONS:
        return _FORMAT_REGIONS[pattern]
    regions = disjoint_regions([portable_pattern(pattern)])
    if not regions:
        return None
    return _unanchored(portable_pattern(regions[0][0]))  # (regex_sets writes Python's classes as shorthands)


_FORMAT_REGIONS = {format_pattern(name): body for name, body in FORMAT_PATTERNS.items()}


def _unanchored(regex: str) -> str:
    if regex.startswith("^") and regex.endswith("$") and not regex.endswith("\\$"):
        return regex[1:-1]
    return regex


def _lark_regex(regex: str) -> str:
    return "/" + regex.replace("/", "\\/") + "/"


def value_form(schema: Any, root: dict) -> ValueForm:
    """The form of a parameter's value under `schema` (a subschema of the parameters object `root`)."""
    seen = 0
    # (keywords JSON Schema does not define assert nothing: OpenAPI's `nullable` or `example` beside a string put
    # it in quotes, where the model's template writes it raw: QA toolfmt2 F6; a `$ref` beside an `$id` is read
    # against that base, not the root's: JSON, whose document says so, QA review10 F2; and so is one where the
    # parameters hold such a base anywhere: a `$ref` reached through one names a place in it, QA review12 F1)
    while isinstance(schema, dict) and set(schema) & ASSERTIONS == {"$ref"} and not {"$id", "id"} & set(schema) \
            and seen < 16 and not nested_resources(root):
        schema, seen = resolve_ref(root, schema["$ref"]), seen + 1
    if not isinstance(schema, dict) or (set(schema) & ASSERTIONS) - _RAW_KEYWORDS:
        return JSON_FORM
    types = _types(schema)
    values = schema["enum"] if "enum" in schema else [schema["const"]] if "const" in schema else None
    if values is not None and not isinstance(values, list):
        return JSON_FORM
    if types is None:  # (only an enum or a const says what the value is)
        if values is None or not values:
            return JSON_FORM
        types = {"null" if v is None else "string" if isinstance(v, str) else "other" for v in values}
    if "string" not in types or types - {"string", "null"}:
        return JSON_FORM
    nullable = "null" in types and (values is None or None in values)
    parts = []
    if values is not None:
        strings = [v for v in values if isinstance(v, str)]
        if not strings:
            return JSON_FORM
        parts.append("(" + " | ".join(json.dumps(v) for v in strings) + ")")
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    if low or high is not None:
        if not isinstance(low, int) or (high is not None and not isinstance(high, int)):
            return JSON_FORM
        parts.append(_lark_regex(f"{_ANY_TEXT}{{{low},{'' if high is None else high}}}"))
    if "pattern" in schema:
        region = _pattern_region(schema["pattern"]) if isinstance(schema["pattern"], str) else None
        if region is None:
            return JSON_FORM
        parts.append(_lark_regex(region))
    fmt = schema.get("format")
    if fmt in STANDARD_FORMATS:
        regex = format_pattern(fmt) or NATIVE_FORMAT_PATTERNS.get(fmt)
        if regex is None:  # (a format only llguidance's JSON strings check)
            return JSON_FORM
        parts.append(_lark_regex(_unanchored(regex)))
        if fmt in ("hostname", "idn-hostname"):  # (RFC 1034's 253 characters, as JSON strings hold them)
            parts.append(_lark_regex(f"{_ANY_TEXT}{{0,253}}"))
    return ValueForm(raw=True, nullable=nullable, parts=tuple(parts),
                     values=tuple(strings) if values is not None else None)


def parts_form(schemas: tuple[Any, ...], root: dict) -> ValueForm | None:
    """The form of a value held to each of `schemas` (a `Variant`'s parameter): raw where each of them is raw,
    its text then matching every one's lexeme, and null where each takes null (elsewhere the text `null` is a
    string, which their string keywords hold to); JSON where none is. None where some are raw and others JSON (the
    value would be written in one form, and parsed, in some variants, as in another)."""
    forms = [value_form(schema, root) for schema in schemas]
    if len(forms) == 1 or not any(f.raw for f in forms):
        return forms[0] if len(forms) == 1 else JSON_FORM
    if not all(f.raw for f in forms):
        return None
    values = None
    for f in forms:
        if f.values is not None:
            values = f.values if values is None else tuple(v for v in values if v in f.values)
    return ValueForm(raw=True, nullable=all(f.nullable for f in forms), parts=sum((f.parts for f in forms), ()),
                     values=values)


def parameter_forms(params: Any) -> dict[str, ValueForm]:
    """Parameter name -> the form of its value, for a function's parameters (as rewritten by
    `tools.function_schema`); where they are a union of objects (`object_variants`), of each variant's parameters
    (whose forms agree)."""
    found = object_variants(params)
    if found is not None:
        return {key: parts_form(schemas, params) for v in found[0] for key, schemas, _ in v.props}
    if not isinstance(params, dict) or not isinstance(params.get("properties"), dict):
        return {}
    return {name: value_form(schema, params) for name, schema in params["properties"].items()}


@dataclass(frozen=True)
class Variant:
    """One way a function's arguments may be written: its parameters in order, as (name, schemas, pointers of the
    schemas in the parameters: the value is held to each of them, as where a `oneOf` branch narrows a property the
    root declares; `(False,)` where it has none), those always written, whether no other key may stand beside
    them, and the `oneOf` branches it was made from, as (the `oneOf`'s pointer, the branch's index)."""

    props: tuple[tuple[str, tuple[Any, ...], tuple[str, ...]], ...]
    required: frozenset[str]
    closed: bool = False
    origins: frozenset[tuple[str, int]] = frozenset()


class _Inexpressible(Exception):
    pass


_UNION_KEYWORDS = {"anyOf", "oneOf", "allOf", "$ref"}
_MOST_VARIANTS = 64


# (numbers in two, as `json_type` tells values: a `number` is either)
_ALL_TYPES = frozenset({"null", "boolean", "string", "integer", "fraction", "array", "object"})


def _never(schemas: tuple[Any, ...]) -> bool:
    return len(schemas) == 1 and schemas[0] is False


def _value_types(schema: Any) -> set[str]:
    """The JSON types (`json_type`'s) some value `schema` takes may have, told from its `type`, `enum` and `const`
    (every type where they do not say)."""
    if not isinstance(schema, dict):
        return set(_ALL_TYPES)
    types = _types(schema)
    out = set(_ALL_TYPES) if types is None else \
        {part for t in types for part in (("integer", "fraction") if t == "number" else (t,))}
    values = schema["enum"] if "enum" in schema else [schema["const"]] if "const" in schema else None
    if isinstance(values, list):
        out &= {json_type(v) for v in values}
    return out


def _no_value(schemas: list[Any]) -> bool:
    """No value is held to each of `schemas`: their types, or the strings, booleans and null their `enum`s and
    `const`s allow, have nothing in common (told only where that is plain: else False)."""
    if not set.intersection(*(_value_types(schema) for schema in schemas)):
        return True
    listed = [schema["enum"] if "enum" in schema else [schema["const"]] for schema in schemas
              if isinstance(schema, dict) and ("enum" in schema or "const" in schema)]
    if len(listed) < 2 or not all(isinstance(vs, list) and all(v is None or isinstance(v, (str, bool)) for v in vs)
                                  for vs in listed):
        return False
    return not set.intersection(*({json.dumps(v) for v in vs} for vs in listed))


def _joined(held: tuple[tuple[Any, ...], tuple[str, ...]],
            more: tuple[tuple[Any, ...], tuple[str, ...]]) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """The parts (schemas, pointers) of a key two merged lists both declare: the value is held to each schema
    (one that takes anything, `true` or `{}`, or one alike another, said once); `(False,)` where no value is
    both (a part that is `false`, types or strings that have nothing in common)."""
    parts = list(zip(held[0] + more[0], held[1] + more[1]))
    refused = [(schema, pointer) for schema, pointer in parts if schema is False]
    kept: list[tuple[Any, str]] = []
    for schema, pointer in parts:
        if schema not in (True, {}) and all(json.dumps(schema, sort_keys=True) != json.dumps(other, sort_keys=True)
                                            for other, _ in kept):
            kept.append((schema, pointer))
    if not refused and len(kept) > 1 and _no_value([schema for schema, _ in kept]):
        refused = kept
    if refused:
        return (False,), (refused[0][1],)
    kept = kept or parts[:1]  # (each takes anything)
    return tuple(schema for schema, _ in kept), tuple(pointer for _, pointer in kept)


def _merged(a: Variant, b: Variant) -> Variant | None:
    """The argument lists both `a` and `b` take (None: none, as where one requires a key the other closes out). A
    key both declare is held to both its schemas (`_joined`): a `oneOf` branch's `const` that narrows a property
    the root declares `{type: string}` (before, such a union was not written: QA xmlreal F2). A key whose schema
    is `false` in either, or that no value takes in both, is never written."""
    declared = ({k for k, _, _ in a.props}, {k for k, _, _ in b.props})
    props: dict[str, tuple[tuple[Any, ...], tuple[str, ...]]] = {}
    for mine, (theirs, closed) in ((a, (declared[1], b.closed)), (b, (declared[0], a.closed))):
        for key, schemas, pointers in mine.props:
            if key not in theirs and closed:
                continue  # (a key the other closes out is never written)
            props[key] = (schemas, pointers) if key not in props else _joined(props[key], (schemas, pointers))
    required = a.required | b.required
    if any(_never(props[r][0]) if r in props else a.closed or b.closed for r in required):
        return None  # (a required key one closes out, or that no value is: no object is both)
    return Variant(tuple((k, s, p) for k, (s, p) in props.items()), required, a.closed or b.closed,
                   a.origins | b.origins)


def _product(left: list[Variant], right: list[Variant]) -> list[Variant]:
    out = [m for v in left for w in right if (m := _merged(v, w)) is not None]
    if len(out) > _MOST_VARIANTS:
        raise _Inexpressible
    return out


def _string_values(schemas: tuple[Any, ...] | None) -> set[str] | None:
    """The strings a value held to each of `schemas` may be, where some of them is an `enum` or `const` of
    strings."""
    found = [values for schema in schemas or () if (values := _listed_strings(schema)) is not None]
    return set.intersection(*found) if found else None


def _listed_strings(schema: Any) -> set[str] | None:
    values = schema.get("enum") if isinstance(schema, dict) and "enum" in schema else \
        [schema["const"]] if isinstance(schema, dict) and "const" in schema else None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return None
    return set(values)


def _fails(v: Variant, w: Variant) -> bool:
    """Every argument object `v` writes fails `w`: it lacks a key `w` requires, or a key both require holds one
    of strings none of which `w` allows (a discriminator)."""
    written = {k for k, schemas, _ in v.props if not _never(schemas)}
    if not w.required <= written:
        return True
    mine, theirs = {k: s for k, s, _ in v.props}, {k: s for k, s, _ in w.props}
    for key in v.required & w.required:
        a, b = _string_values(mine.get(key)), _string_values(theirs.get(key))
        if a is not None and b is not None and not a & b:
            return True
    return False


def _variants(schema: Any, pointer: str, root: dict, depth: int,
              oneofs: dict[str, list[list[Variant]]]) -> list[Variant]:
    """The argument lists that write exactly the objects `schema` (at `pointer` in `root`) takes, each tagged with
    the `oneOf` branches it was made from; each `oneOf`'s pointer goes to `oneofs` with its branches' lists (whether
    one is written exactly is told from the whole's lists: `object_variants`)."""
    if depth > 16:
        raise _Inexpressible
    if schema is True:
        return [Variant((), frozenset())]
    if schema is False:
        return []
    if not isinstance(schema, dict) or (set(schema) & ASSERTIONS) - _OBJECT_KEYWORDS - _UNION_KEYWORDS:
        raise _Inexpressible
    types = _types(schema)
    if types is not None and "object" not in types:
        if not types:
            raise _Inexpressible
        return []  # (arguments are objects: such a branch takes none)
    extra = schema.get("additionalProperties", True)
    props, required = schema.get("properties", {}), schema.get("required", [])
    if extra not in (True, False, {}) or not isinstance(props, dict) or not isinstance(required, list) or \
            not all(isinstance(r, str) for r in required) or not isinstance(schema.get("allOf", []), list):
        raise _Inexpressible
    closed = extra is False
    out = [Variant(tuple((k, (s,), (f"{pointer}/properties/{escape_pointer_part(k)}",)) for k, s in props.items()),
                   frozenset(required), closed)]
    if "$ref" in schema:
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith(("#/$defs/", "#/definitions/")):
            raise _Inexpressible
        target = resolve_ref(root, ref)
        if target is None:
            raise _Inexpressible
        out = _product(out, _variants(target, unquote(ref[1:]), root, depth + 1, oneofs))
    for member, sub in enumerate(schema.get("allOf", ())):
        out = _product(out, _variants(sub, f"{pointer}/allOf/{member}", root, depth + 1, oneofs))
    for word in ("anyOf", "oneOf"):
        if word not in schema:
            continue
        if not isinstance(schema[word], list) or not schema[word]:
            raise _Inexpressible
        branches = [_product(out, _variants(sub, f"{pointer}/{word}/{b}", root, depth + 1, oneofs))
                    for b, sub in enumerate(schema[word])]
        if word == "oneOf":
            oneofs[f"{pointer}/oneOf"] = branches
            branches = [[Variant(v.props, v.required, v.closed, v.origins | {(f"{pointer}/oneOf", b)}) for v in vs]
                        for b, vs in enumerate(branches)]
        out = [v for vs in branches for v in vs]
        if len(out) > _MOST_VARIANTS:
            raise _Inexpressible
    return out


def object_variants(params: Any) -> tuple[list[Variant], list[str]] | None:
    """Where a function's parameters combine objects (a root `anyOf` or `oneOf` of objects, as pydantic's and zod's
    unions write them, an `allOf`, a root `$ref` to such a schema): the argument lists (`Variant`s) that write
    exactly the objects they take, each parameter under the schemas that hold its value, and the pointers of
    the `oneOf`s written as `anyOf` (their branches may overlap). None where they do not combine objects, or do so
    beyond what argument lists can write: keywords other than `properties`, `required` and boolean
    `additionalProperties`, a required key no branch declares, a key the tags cannot hold, a key written raw in one
    variant and as JSON in another or held to schemas of both forms (the parser could not tell which), references
    beyond `$defs`, nested `$id`s."""
    if not isinstance(params, dict) or not set(params) & _UNION_KEYWORDS or nested_resources(params):
        return None
    if any(k == "$ref" and isinstance(n[k], str) and not n[k].startswith(("#/$defs/", "#/definitions/"))
           for _, k, n in walk(params)):
        return None  # (a parameter's `parameter_document` reads `#/properties/...` at the parameters' root)
    oneofs: dict[str, list[list[Variant]]] = {}
    try:
        variants = _variants(params, "", params, 0, oneofs)
    except _Inexpressible:
        return None
    # (a `oneOf` is exact where every list made from one of its branches writes only objects its other branches
    # refuse, told from the whole's lists: a key that its branches tell apart by may be declared, and so written,
    # beside the `oneOf` (`allOf: [{properties: {a, b}}, {oneOf: [{required: [a]}, {required: [b]}]}]` wrote
    # `{a, b}`, which both take: QA review16 F1))
    loose = [at for at, branches in oneofs.items()
             if not all(_fails(v, w) for v in variants for at_, b in v.origins if at_ == at
                        for c, ws in enumerate(branches) if c != b for w in ws)]
    # (a key whose schema is false is never written: kept until here, as what it rules out of merged variants)
    variants = [Variant(tuple(p for p in v.props if not _never(p[1])), v.required, v.closed) for v in variants]
    forms: dict[str, tuple[bool, bool]] = {}
    for v in variants:
        for key, schemas, _ in v.props:
            form = parts_form(schemas, params)
            if form is None or not key or any(c in key for c in "<>\n") or \
                    forms.setdefault(key, (form.raw, form.nullable)) != (form.raw, form.nullable):
                return None
        if not v.required <= {k for k, _, _ in v.props}:
            return None
    if not variants:
        return None
    unique = {json.dumps([v.props, sorted(v.required)], sort_keys=True): v for v in variants}  # (alike branches)
    return list(unique.values()), loose


_DEFINITIONS = ("$defs", "definitions")


def _reached_definitions(params: dict, schema: Any) -> dict[str, set[str]] | None:
    """The names of the parameters' `$defs` and `definitions` entries that `schema` (one parameter's) reaches: through
    its `$ref`s, then theirs (an entry's, and those of what `#`, `#/properties/...` and `$anchor` references name,
    which `parameter_document` copies beside it), by keyword. None where that cannot be told (a reference that is
    no local pointer or known `$anchor`, to nothing, to the whole `$defs`; `$dynamicRef`, `$recursiveRef`; `$defs`
    that is no object)."""
    if any(not isinstance(params[k], dict) for k in _DEFINITIONS if k in params):
        return None
    defs = {k: params[k] for k in _DEFINITIONS if k in params}
    root = {k: v for k, v in params.items() if k not in _DEFINITIONS}  # (`#`: its copy holds no `$defs`)
    anchors: dict[str, Any] = {}  # name -> (keyword, entry) where an entry declares it, else its subschema
    for ptr, k, n in walk(params):
        if k == "$anchor" and isinstance(n[k], str):
            parts = ptr.split("/")
            entry = (parts[1], unescape_pointer_part(parts[2])) if len(parts) > 3 and parts[1] in defs else None
            anchors.setdefault(n[k], entry if entry is not None else n)
    reached: dict[str, set[str]] = {k: set() for k in _DEFINITIONS}
    work, seen = [schema], set()
    while work:
        node = work.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for _, k, n in walk(node):
            if k in ("$dynamicRef", "$recursiveRef"):
                return None
            if k != "$ref":
                continue
            ref = n[k]
            if not isinstance(ref, str) or not ref.startswith("#"):
                return None
            parts, target = unquote(ref[1:]).split("/"), resolve_ref(params, ref)
            if ref == "#":
                work.append(root)
            elif ref.startswith("#/"):
                if not isinstance(target, (dict, bool)) or (parts[1] in defs and len(parts) == 2):
                    return None  # (nothing, no schema, the whole `$defs`)
                if parts[1] in defs:  # (the entry is copied whole; what it names inside `walk` may not reach: `a/full`)
                    reached[parts[1]].add(unescape_pointer_part(parts[2]))
                    work.append(defs[parts[1]][unescape_pointer_part(parts[2])])
                work.append(target)
            elif unquote(ref[1:]) in anchors:
                found = anchors[unquote(ref[1:])]
                if isinstance(found, tuple):
                    reached[found[0]].add(found[1])
                    found = defs[found[0]][found[1]]
                work.append(found)
            else:
                return None
    return reached


def parameter_document(params: dict, key: str, pointer: str | None = None) -> dict | None:
    """The schema of a JSON-form parameter as a document of its own, which its `%json` is compiled from: the
    parameters' `$defs` it reaches beside it, and what its local `$ref`s name elsewhere in the parameters (`#`, the
    usual tree's; `#/properties/a`) copied under `$defs`. Compiled alone, `#` named the parameter itself (`[[]]`
    passed for a list of trees, QA toolfmt2 F1) and `#/properties/a` nothing (a 400, F2). Only the definitions it
    reaches (`_reached_definitions`): with every one, a definition only another parameter uses was checked as this
    one's, and one this format cannot enforce (an open object) refused a strict function whose calls never write
    it (QA xmlanyof F2). None where a `$ref` it holds sits at or below a nested `$id`, or where such a reference
    stays unresolved (one into a nested `$id`'s resource, or into what holds one: `keep_ref_targets` copies neither)."""
    pointer = f"/properties/{escape_pointer_part(key)}" if pointer is None else pointer
    schema = resolve_ref(params, "#" + quote(pointer))
    if not isinstance(schema, dict):
        return {}
    defs = {k: params[k] for k in _DEFINITIONS if k in params}
    reached = _reached_definitions(params, schema)
    copied = (f"{pointer}/", "/$defs/", "/definitions/")
    if reached is not None:
        defs = {k: {n: s for n, s in v.items() if n in reached[k]} if isinstance(v, dict) else v
                for k, v in defs.items()}
        copied = (f"{pointer}/", *(f"/{k}/{escape_pointer_part(n)}/" for k in reached for n in reached[k]))

    def elsewhere(ref: str) -> bool:
        return not ref.startswith(("#/$defs/", "#/definitions/"))

    def copy_of(target: Any) -> Any:  # (the parameters whole, for `#`: their definitions are the document's)
        if target is params and reached is not None:
            return copy.deepcopy({k: v for k, v in params.items() if k not in _DEFINITIONS})
        return copy.deepcopy(target)

    document = copy.deepcopy({**schema, **defs})
    # (a `$ref` at or below a nested `$id` names a place in that resource: read at the document's root, it took
    # `#/$defs/a` of the parameters for the resource's own, unsound, QA review10 F2; others, into such a resource
    # too, name what they name at the root: QA review11 F1)
    resources = nested_resources(params)
    if any(k == "$ref" and ptr.startswith(copied) and any(ptr.startswith(r + "/") for r in resources)
           for ptr, k, _ in walk(params)):
        return None
    # an `$anchor` another parameter declares: its subschema, copied under `$defs`, declares it here too (a 400
    # "Anchor 'A' does not exist": QA review9 F5); its own references are kept below as the others are
    declared = {n[k]: n for _, k, n in walk_with_refs(params) if k == "$anchor" and isinstance(n[k], str)}
    named = {n[k][1:] for _, k, n in walk_with_refs(document) if k == "$ref" and isinstance(n[k], str)
             and n[k].startswith("#") and not n[k].startswith("#/") and n[k] != "#"}
    here = {n[k] for _, k, n in walk_with_refs(document) if k == "$anchor"}
    for i, name in enumerate(sorted(named & set(declared) - here)):
        document.setdefault("$defs", {})[f"structgen-anchor-{i}"] = copy.deepcopy(declared[name])
    keep_ref_targets(params, document, elsewhere, copy_of)
    unresolved = any(k == "$ref" and isinstance(n[k], str) and (n[k] == "#" or n[k].startswith("#/"))
                     and elsewhere(n[k]) for _, k, n in walk_with_refs(document))
    return None if unresolved else document


def parts_document(params: dict, key: str, pointers: tuple[str, ...]) -> dict | None:
    """The document of a JSON-form parameter held to the schemas at `pointers` (a `Variant`'s parameter): the
    `parameter_document` of the one, or the `allOf` of each one's, their definitions (copies of the parameters'
    own, which a union's references alone name) beside it. None where one is None."""
    documents = [parameter_document(params, key, pointer) for pointer in pointers]
    if len(documents) == 1 or any(d is None for d in documents):
        return documents[0] if len(documents) == 1 else None
    out: dict[str, Any] = {"allOf": [{k: v for k, v in d.items() if k not in _DEFINITIONS} for d in documents]}
    for d in documents:
        for word in _DEFINITIONS:
            if word not in d:
                continue
            if not isinstance(d[word], dict) or any(out.setdefault(word, {}).setdefault(n, s) != s
                                                    for n, s in d[word].items()):
                return None
    return out


def document_pointer(i: int, params: dict, pointers: tuple[str, ...], inner: str) -> str:
    """`inner`, a pointer in the `parts_document` of the parameter held to the schemas at `pointers` (in the call
    schema), as a pointer in the call schema: below the parameters' own `$defs` (copied beside the parameter's
    schema) where it names one of them, below the k-th schema where it is in the k-th member of the `allOf` that
    holds several, else below the (first) schema."""
    held = re.match(r"/allOf/(\d+)(?=/|$)", inner) if len(pointers) > 1 else None
    if held is not None and int(held.group(1)) < len(pointers):
        return document_pointer(i, params, pointers[int(held.group(1)):][:1], inner[held.end():])
    pointer = pointers[0]
    parts = inner.split("/")
    if len(parts) > 2 and parts[1] in ("$defs", "definitions") and isinstance(params.get(parts[1]), dict) \
            and unescape_pointer_part(parts[2]) in params[parts[1]]:
        return f"/$defs/tool{i}{inner}"
    return pointer + inner


def unsupported_keywords(params: Any) -> list[str]:
    """Pointers (in `params`) of what this format cannot write: keywords about the parameters object beyond
    its properties, required names it does not declare, names the tags cannot hold."""
    found = object_variants(params)
    if found is not None:  # (a union of objects: each variant is written; an overlapping `oneOf` as `anyOf`)
        return found[1]
    return _beyond_properties(params)


def _beyond_properties(params: Any) -> list[str]:
    """`unsupported_keywords` where the parameters are written as one argument list, of their `properties`."""
    if not isinstance(params, dict):
        return [""]
    # (a keyword JSON Schema does not define asserts nothing: OpenAPI's `discriminator`, `x-...`)
    out = [f"/{escape_pointer_part(k)}" for k in params if k not in _OBJECT_KEYWORDS and k in ASSERTIONS]
    props = params.get("properties", {})
    if not isinstance(props, dict):
        return out + ["/properties"]
    if any(not isinstance(r, str) or r not in props for r in params.get("required", [])):
        out.append("/required")
    out += [f"/properties/{escape_pointer_part(n)}" for n in props if not n or any(c in n for c in "<>\n")]
    return out


def parse_xml_calls(text: str, forms: dict[str, dict[str, ValueForm]],
                    shape: XmlShape) -> tuple[list[dict], str | None] | None:
    """The calls (`{"name", "arguments", "arguments_text"}`) in `text` and the text before them, or None when it
    holds no complete calls in this shape. `forms`: function name -> `parameter_forms`."""
    start = text.find(HERMES_OPEN)
    if start < 0:
        return None
    calls, pos = [], start
    name_ends = (shape.after_name + shape.before_key, shape.after_name + shape.before_close + HERMES_CLOSE)
    while True:
        if not text.startswith(HERMES_OPEN + shape.before_name, pos):
            return None
        pos += len(HERMES_OPEN + shape.before_name)
        ends = [at for at in (text.find(end, pos) for end in name_ends) if at >= 0]
        if not ends or text[pos:min(ends)] not in forms:
            return None
        name, pos = text[pos:min(ends)], min(ends) + len(shape.after_name)
        arguments, written = {}, []
        while text.startswith(shape.before_key, pos):
            end = text.find(shape.between, pos)
            form = forms[name].get(text[pos + len(shape.before_key):end]) if end >= 0 else None
            if form is None:
                return None
            key, pos = text[pos + len(shape.before_key):end], end + len(shape.between)
            try:
                arguments[key], value_end = _value_at(text, pos, form, shape)
            except ValueError:
                return None
            value = json.dumps(arguments[key], ensure_ascii=False) if form.raw else \
                text[pos:value_end - len(shape.after_value)]
            written.append(f"{json.dumps(key, ensure_ascii=False)}: {value}")
            pos = value_end
        if not text.startswith(shape.before_close + HERMES_CLOSE, pos):
            return None
        pos += len(shape.before_close + HERMES_CLOSE)
        # arguments_text: the object as a stream of this answer sends it (a JSON value as written, a raw one quoted)
        calls.append({"name": name, "arguments": arguments, "arguments_text": "{" + ", ".join(written) + "}"})
        if not text[pos:].strip():
            return calls, text[:start].rstrip() or None
        if not text.startswith(shape.separator + HERMES_OPEN, pos):
            return None  # text after the calls
        pos += len(shape.separator)


_DECODER = json.JSONDecoder()
_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def _value_at(text: str, pos: int, form: ValueForm, shape: XmlShape) -> tuple[Any, int]:
    """The value that starts at `pos` and where the text goes on after its closing text (ValueError where there
    is none, or JSON does not parse). A raw value ends at the first closing text (it never holds one); JSON is read
    as JSON, whose strings may hold it."""
    if form.raw:
        end = text.find(shape.after_value, pos)
        if end < 0:
            raise ValueError("no closing tag")
        value = text[pos:end]
        return None if form.nullable and value == "null" else value, end + len(shape.after_value)
    # (JSON's whitespace may open it: where one key has two JSON rules in a union's argument lists, llguidance's
    # `%json`s take a space before the value, which `raw_decode` refused: the whole answer did not parse, QA
    # review16 F2)
    value, end = _DECODER.raw_decode(text, _JSON_SPACE.match(text, pos).end())
    if not text.startswith(shape.after_value, end):
        raise ValueError("no closing tag")
    return value, end + len(shape.after_value)


def function_forms(spec: ConstraintSpec) -> dict[str, dict[str, ValueForm]]:
    """Function name -> `parameter_forms`, for the functions of a tools spec."""
    from constrain.tools import function_schema

    return {name: parameter_forms(function_schema(spec, i)) for i, name in enumerate(spec.tool_names)}


# Root keywords that say something only together: rewritten one at a time, `then` and `else` said nothing.
_TOGETHER = (("if", "then", "else"), ("contains", "minContains", "maxContains"))


def _root_keywords(client: Any, found: list[str]) -> list[str]:
    """`found` (the unsupported pointers of a function's rewritten parameters), its root keywords beyond those this
    format writes named as the keywords the client wrote: the rewrite folds many of them (`minProperties`,
    `dependentRequired`, `if`/`then`, `not`) into one `allOf`, which named only the parameters object (QA toolfmt2
    F4). A client keyword is named where its rewrite beside the object keywords cannot be written on its own; one
    the rewrite drops as implied (`minProperties: 1` beside `required`) is enforced, and not named. Where none is
    (the keywords cannot be written only together), `found` stays as it was."""
    from constrain.spec import normalise_schema
    from constrain.tools import arguments_object_schema

    def at_root(pointer: str) -> bool:
        return pointer.count("/") == 1 and pointer[1:] not in ("properties", "required")

    if not isinstance(client, dict) or not any(at_root(p) for p in found):
        return found
    try:  # (written as argument lists per variant, only the `oneOf`s found are loose)
        if object_variants(arguments_object_schema(normalise_schema(client))) is not None:
            return found
    except ConstraintError:
        pass
    base = {k: v for k, v in client.items() if k in _OBJECT_KEYWORDS}
    others = [k for k in client if k not in _OBJECT_KEYWORDS and k in ASSERTIONS]
    groups = [[k for k in group if k in others] for group in _TOGETHER]
    groups = [g for g in groups if g] + [[k] for k in others if not any(k in group for group in _TOGETHER)]

    def unwritable(keys: list[str]) -> bool:
        try:
            rewritten = arguments_object_schema(normalise_schema({**base, **{k: client[k] for k in keys}}))
        except ConstraintError:
            return True
        # (a keyword whose rewrite stands beside the object keywords is not enforced where the whole is written as
        # one argument list, even one that argument lists per variant would write alone: `minProperties`)
        return any(at_root(p) for p in _beyond_properties(rewritten))

    named = [f"/{escape_pointer_part(k)}" for group in groups if unwritable(group) for k in group]
    if not named:
        return found
    return named + [p for p in found if not at_root(p)]


def as_the_client_wrote(spec: ConstraintSpec, pointer: str) -> tuple[str, ...]:
    """`pointer` (in the call schema) as the pointers of the keywords the client wrote: a keyword at a function's
    parameters' root, where the rewrite folded the client's into an `allOf`, is named as those (`_root_keywords`),
    else `pointer` itself. Per request: the grammar is shared by every spec whose schema rewrites alike, and the
    names it kept were the first request's (`dependentRequired` was told `/dependencies`' place, the parameters)."""
    from constrain.tools import TOOL_DEF

    m = TOOL_DEF.match(pointer)
    sources = spec.extra.get("tool_sources", ())
    rest = pointer[m.end():] if m is not None else ""
    if spec.tool_format not in SHAPES or m is None or int(m.group(1)) >= len(sources) or rest.count("/") != 1:
        return (pointer,)
    return tuple(pointer[:m.end()] + p for p in _root_keywords(sources[int(m.group(1))][1], [rest]))


def check_functions(spec: ConstraintSpec) -> list[str]:
    """The unsupported pointers of the spec's functions (in the call schema, named as the client wrote them per
    request: `as_the_client_wrote`), or a ConstraintError for the first one inside a strict function."""
    from constrain.tools import function_schema

    out = []
    for i in range(len(spec.tool_names)):
        for pointer in unsupported_keywords(function_schema(spec, i)):
            full = f"/$defs/tool{i}{pointer}"
            if i in spec.strict_tools:
                raise ConstraintError(f"strict schema uses a keyword that cannot be enforced at {full} in the "
                                      f"{spec.tool_format} tool-call format of this model's chat template",
                                      param="tools", pointer=full, code="unsupported_schema")
            out.append(full)
    return out
