r"""A JSON-schema `pattern` spelled so that every regex dialect a client may validate with accepts what it accepts.

JSON Schema names ECMA-262's regexes, but the validators people use read a pattern's shorthands and `.` in their
own dialect, and so do the backends:

- `\d`, `\w`: ASCII in ECMA-262 (ajv, browsers) and llguidance; Unicode in Python's `re` (jsonschema) and Rust's
  `regex` (pydantic-core, outlines-core). outlines-core wrote `"٣"` under `^\d$`, which ajv refuses.
- `\D`, `\W`: llguidance's ASCII reading lets `"٣"` or `"é"` through, which jsonschema refuses.
- `\s`, `\S`: Python and Rust count U+0085 as a space, ECMA-262 does not; ECMA-262 counts U+FEFF, they do not.
- `.`: ECMA-262 excludes \n, \r, U+2028 and U+2029; the others only \n.

`portable_pattern` spells each of these, and each class holding one, as an explicit class of the characters it
takes in every dialect, so an answer validates whichever dialect checks it (`[\s\S]` still takes anything). It is
only ever narrower than each reading, which is right for a `pattern` a value must match, and for the names'
patterns of an object that takes no other keys; elsewhere, narrowing a names' pattern would move a key to another
schema (constrain/llg_backend.py decides). Nothing here runs a client's regex.
"""

from __future__ import annotations

import copy
import functools
import re
import unicodedata

from constrain.regex_sets import Ranges, negate_ranges, python_class, ranges_of, regex_char, union_ranges
from constrain.support import escaped_code, walk

_SURROGATES: Ranges = ((0xD800, 0xDFFF),)  # not characters: no Rust regex may name them
_CONTROLS: Ranges = ((0x00, 0x1F),)
_CONTROLS_BUT_NEWLINE: Ranges = ((0x00, 0x09), (0x0B, 0x1F))  # (see `_write_class`)
_QUOTE_AND_BACKSLASH: Ranges = ((0x22, 0x22), (0x5C, 0x5C))

_ASCII_DIGIT: Ranges = ((0x30, 0x39),)
_ASCII_WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
# Rust's \s: the Unicode White_Space property.
_RUST_SPACE: Ranges = ((0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                       (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000))
# The symbols Rust's \w counts as Alphabetic: circled and squared letters.
_ALPHABETIC_SYMBOLS: Ranges = ((0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169), (0x1F170, 0x1F189))


# ECMA-262's \s: WhiteSpace (tab, VT, FF, U+FEFF and the space separators, Zs) and LineTerminator (LF, CR,
# U+2028, U+2029).
_ECMA_SPACE: Ranges = ((0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                       (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF))
# Where Unicode assigns letters, marks and numbers (planes 0-3, and plane 14's variation selectors).
_ASSIGNED = (range(0x32400), range(0xE0000, 0xE1000))
_WORD_CATEGORIES = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc"})


@functools.cache
def _dialects() -> tuple[dict[str, Ranges], ...]:
    """Each dialect's \\d, \\w, \\s and their negations (computed on first use, in ~0.15 s)."""
    # Rust's \w: Alphabetic, marks, Nd, Pc and the joiners (here all letters, marks and numbers: a little wider).
    rust_word = union_ranges(_ALPHABETIC_SYMBOLS, ((0x200C, 0x200D),), ranges_of(
        c for part in _ASSIGNED for c in part if unicodedata.category(chr(c)) in _WORD_CATEGORIES))
    readings = (
        {"d": _ASCII_DIGIT, "w": _ASCII_WORD, "s": _ECMA_SPACE},  # ECMA-262; llguidance's \\d and \\w
        {"d": python_class("digit"), "w": python_class("word"), "s": python_class("space")},  # Python's `re`
        {"d": python_class("digit"), "w": rust_word, "s": _RUST_SPACE},  # Rust's `regex`; llguidance's \\s
    )
    return tuple({**r, **{k.upper(): negate_ranges(v) for k, v in r.items()}} for r in readings)


def _intersection(*sets: Ranges) -> Ranges:
    return negate_ranges(union_ranges(*(negate_ranges(s) for s in sets)))


def _holds(chars: Ranges, part: Ranges) -> bool:
    return union_ranges(chars, part) == chars


_SHORTHANDS = frozenset("dDwWsS")
_CONTROL_ESCAPES = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D}
_DOT = "[^\\n\\r\\u2028\\u2029]"  # ECMA-262's `.`, which the other dialects' also take
_ANY_DOT = "[^\\n]"  # Python's and Rust's `.`, which holds ECMA-262's
_BEYOND_ASCII: Ranges = ((0x80, 0x10FFFF),)


def _taken(readings: list[Ranges], widest: bool) -> Ranges:
    """The characters every reading takes; with `widest`, a set that holds those any reading takes: ASCII as the
    readings give it, and beyond ASCII every character where one is taken (a Unicode class written out, ~12 KB for
    `\\w`, made llguidance's lexer give up on unanchored names' patterns, JSONSchemaBench's Github_medium o65507)."""
    if not widest:
        return _intersection(*readings)
    taken = union_ranges(*readings)
    return union_ranges(taken, _BEYOND_ASCII) if taken and taken[-1][1] >= 0x80 else taken


@functools.lru_cache(maxsize=4096)
def portable_pattern(pattern: str) -> str:
    """`pattern` with `.` and every shorthand (alone or in a class) spelled as explicit characters: those every
    dialect takes. A class whose members this cannot read with certainty (`\\p{..}`, `\\a`, octal) stays as
    written, the rest is still rewritten; a `[` in a class is the character, as ECMA-262 and Python read it, and
    written escaped for Rust's regex; a pattern whose classes' extent the dialects read differently (a class
    opening with `]`, which ECMA-262 reads as an empty class) is returned as it is."""
    return _spell_classes(pattern, widest=False)


@functools.lru_cache(maxsize=1024)
def widest_pattern(pattern: str) -> str:
    """`pattern` spelled as `portable_pattern` spells it, but with classes that hold the characters any dialect
    takes (`_taken`): a name that some dialect's reading matches, this matches. For the names' patterns of an object
    whose other keys may hold anything: such a name's value then gets the pattern's schema, which every dialect
    finds valid (a dialect that does not match the name asks nothing of its value)."""
    return _spell_classes(pattern, widest=True)


def _spell_classes(pattern: str, widest: bool) -> str:
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            e = pattern[i + 1:i + 2]
            if e in _SHORTHANDS:
                out.append(_write_class(_taken([reading[e] for reading in _dialects()], widest)))
            else:
                out.append(pattern[i:i + 2])
            i += 2
        elif ch == ".":
            out.append(_ANY_DOT if widest else _DOT)
            i += 1
        elif ch == "[":
            end, written = _rewrite_class(pattern, i, widest)
            if end is None:
                return pattern
            out.append(written)
            i = end
        else:
            out.append(ch)
            i += 1
    return "".join(out)


# Rust's regex (llguidance's dialect) reads these in a class as intersection, difference and symmetric difference;
# ECMA-262 as the characters they are: a class holding one is written out as its characters
_SET_OPERATORS = ("&&", "--", "~~")


def _rewrite_class(pattern: str, start: int, widest: bool) -> tuple[int | None, str]:
    """(index after the class opening at `start`, its spelling): the class as written where it names no
    shorthand or holds a member not read here, else the characters it takes in every dialect (with `widest`: in
    any dialect), as one positive class. (None, "") where the dialects may not agree on where the class ends."""
    i, n = start + 1, len(pattern)
    negated = pattern.startswith("^", i)
    i += negated
    if pattern.startswith("]", i):
        return None, ""
    literal: list[Ranges] = []
    shorthands: list[str] = []
    while i < n and pattern[i] != "]":
        if pattern[i] == "\\" and pattern[i + 1:i + 2] in _SHORTHANDS:
            shorthands.append(pattern[i + 1])
            i += 2
            continue
        low, i = _class_char(pattern, i)
        if low is None:
            return _as_written(pattern, start, i)
        high = low
        if pattern.startswith("-", i) and i + 1 < n and pattern[i + 1] != "]":
            high, i = _class_char(pattern, i + 1)
            if high is None or high < low:
                return _as_written(pattern, start, i)
        literal.append(((low, high),))
    if i >= n:
        return None, ""
    end = i + 1
    if not shorthands and not any(op in pattern[start:end] for op in _SET_OPERATORS):
        return end, _bracket_escaped(pattern[start:end])
    # What each dialect reads the class's members as; the class takes what every (or any) dialect's reading takes.
    read = [union_ranges(*literal, *(reading[k] for k in shorthands)) for reading in _dialects()]
    taken = _taken([negate_ranges(r) for r in read] if negated else read, widest)
    return (end, _write_class(taken)) if taken else (None, "")


def _as_written(pattern: str, start: int, i: int) -> tuple[int | None, str]:
    """The class opening at `start` as written (a `[` in it escaped: `_bracket_escaped`), for one with a member
    not read here; its end is the first `]` not escaped from pattern[i] on (None where the pattern ends first)."""
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
        elif pattern[i] == "]":
            return i + 1, _bracket_escaped(pattern[start:i + 1])
        else:
            i += 1
    return None, ""


def _bracket_escaped(written: str) -> str:
    """A class as written, with each `[` in it (after its opening one) escaped. ECMA-262 (without the `v` flag) and
    Python's `re` read such a `[` as the character, and the class as ending at the first `]`; Rust's regex (both
    backends) reads a nested class or a POSIX one (`[[:alpha:]]`), so `[[:alpha:]]+` wrote `abc`, which jsonschema
    refuses (it asks for a `]` after each of those characters)."""
    out, i = [written[0]], 1
    while i < len(written):
        if written[i] == "\\":
            out.append(written[i:i + 2])
            i += 2
            continue
        out.append("\\[" if written[i] == "[" else written[i])
        i += 1
    return "".join(out)


def _class_char(pattern: str, i: int) -> tuple[int | None, int]:
    """(code point, next index) of the class member at pattern[i]; None for one that is not a single character."""
    if pattern[i] != "\\":
        return ord(pattern[i]), i + 1
    if pattern[i + 1:i + 2] in _CONTROL_ESCAPES:
        return _CONTROL_ESCAPES[pattern[i + 1]], i + 2
    code, nxt, readable = escaped_code(pattern, i, in_class=True)
    return (code if readable else None), nxt


@functools.lru_cache(maxsize=64)
def _write_class(chars: Ranges) -> str:
    """A positive class of `chars` (surrogates left out). llguidance 1.9 lets the escapes \\" and \\\\ through a
    class holding every control character (`\\n` aside) but not both '"' and '\\' (see
    `support.llguidance_escape_gap`): such a set loses its control characters, which JSON writes as escapes and no
    answer needs there."""
    chars = _intersection(chars, negate_ranges(_SURROGATES))
    if _holds(chars, _CONTROLS_BUT_NEWLINE) and not _holds(chars, _QUOTE_AND_BACKSLASH):
        chars = _intersection(chars, negate_ranges(_CONTROLS))
    items = "".join(regex_char(chr(a)) if a == b else f"{regex_char(chr(a))}-{regex_char(chr(b))}" for a, b in chars)
    return f"[{items}]"


def with_portable_patterns(schema):
    """A copy of `schema` whose every `pattern` keyword is `portable_pattern`'s spelling (`schema` itself where
    nothing changes)."""
    changed = {ptr: portable_pattern(node[key]) for ptr, key, node in walk(schema)
               if key == "pattern" and isinstance(node[key], str) and portable_pattern(node[key]) != node[key]}
    if not changed:
        return schema
    schema = copy.deepcopy(schema)
    for ptr, key, node in walk(schema):
        if ptr in changed:
            node[key] = changed[ptr]
    return schema


# ---- Unicode general categories: `\p{..}` ------------------------------------------------------------------------

# ECMA-262 (with the `u` flag, as JSON Schema 2019-09 on reads patterns) and Rust name general categories as `\p{L}`,
# `\p{Letter}`, `\p{gc=L}` or `\p{General_Category=Letter}`; Python's `re` has no `\p` at all.
_CATEGORY_NAMES = {
    "L": "Letter", "LC": "Cased_Letter", "Lu": "Uppercase_Letter", "Ll": "Lowercase_Letter",
    "Lt": "Titlecase_Letter", "Lm": "Modifier_Letter", "Lo": "Other_Letter", "M": "Mark", "Mn": "Nonspacing_Mark",
    "Mc": "Spacing_Mark", "Me": "Enclosing_Mark", "N": "Number", "Nd": "Decimal_Number", "Nl": "Letter_Number",
    "No": "Other_Number", "P": "Punctuation", "Pc": "Connector_Punctuation", "Pd": "Dash_Punctuation",
    "Ps": "Open_Punctuation", "Pe": "Close_Punctuation", "Pi": "Initial_Punctuation", "Pf": "Final_Punctuation",
    "Po": "Other_Punctuation", "S": "Symbol", "Sm": "Math_Symbol", "Sc": "Currency_Symbol", "Sk": "Modifier_Symbol",
    "So": "Other_Symbol", "Z": "Separator", "Zs": "Space_Separator", "Zl": "Line_Separator",
    "Zp": "Paragraph_Separator", "C": "Other", "Cc": "Control", "Cf": "Format", "Co": "Private_Use",
}
_CATEGORY_OF_NAME = {**{k: k for k in _CATEGORY_NAMES}, **{v: k for k, v in _CATEGORY_NAMES.items()},
                     "digit": "Nd", "punct": "P", "Combining_Mark": "M", "cntrl": "Cc"}
# The members a category takes here: C's writable ones (its surrogates Cs have no UTF-8, its unassigned Cn no
# character this table knows), LC's cased letters; any other, the categories its name begins
_MEMBERS = {"C": ("Cc", "Cf", "Co"), "LC": ("Lu", "Ll", "Lt")}


@functools.cache
def _categories() -> dict[str, Ranges]:
    """Each two-letter general category's characters in Python's Unicode tables (~0.5 s, once), and "Cn" (those
    they leave unassigned)."""
    codes: dict[str, list[int]] = {}
    for c in range(0x110000):
        codes.setdefault(unicodedata.category(chr(c)), []).append(c)
    return {k: ranges_of(v) for k, v in codes.items()}


def _category(name: str) -> Ranges | None:
    """The characters of the general category `name` (any of its spellings; `_MEMBERS`), or None."""
    short = _CATEGORY_OF_NAME.get(name.split("=", 1)[1] if name.startswith(("gc=", "General_Category=")) else name)
    if short is None:
        return None
    members = _MEMBERS.get(short, (short,))
    return union_ranges(*(r for k, r in _categories().items() if k.startswith(members)))


def unicode_properties(pattern: str) -> str:
    """`pattern` with each general category (`\\p{L}`, `\\P{Nd}`, `\\p{Letter}`, in a class or not) spelled as the
    characters Python's Unicode tables give it, which every dialect reads alike (Python's `re` has no `\\p`).
    Characters those tables leave unassigned are never taken: a newer Unicode may have given them the category,
    and what every dialect matches is what an answer may hold. A property not read here (a script, `\\p{Cn}`)
    stays as written, and Python's `re` refuses the pattern."""
    if "\\p{" not in pattern and "\\P{" not in pattern:
        return pattern
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = negated_class = False
    while i < n:
        ch = pattern[i]
        if ch == "\\" and pattern[i + 1:i + 2] in ("p", "P") and pattern.startswith("{", i + 2):
            end = pattern.find("}", i + 3)
            chars = _category(pattern[i + 3:end]) if end > 0 else None
            if chars is None:
                out.append(pattern[i:i + 2])
                i += 2
                continue
            unassigned = _categories()["Cn"]
            if pattern[i + 1] == "P":
                chars = negate_ranges(union_ranges(chars, unassigned))
            if negated_class:  # (the class refuses these: refuse the unassigned too)
                chars = union_ranges(chars, unassigned)
            body = _class_body(chars)
            out.append(body if in_class else f"[{body}]")
            i = end + 1
        elif ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
        elif ch == "[" and not in_class:
            in_class, negated_class = True, pattern.startswith("^", i + 1)
            out.append("[^" if negated_class else "[")
            i += 2 if negated_class else 1
        elif ch == "]" and in_class:
            in_class = negated_class = False
            out.append(ch)
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


@functools.lru_cache(maxsize=64)
def _class_body(chars: Ranges) -> str:
    """The inside of a class of `chars` (surrogates left out: no Rust regex may name them)."""
    chars = _intersection(chars, negate_ranges(_SURROGATES))
    return "".join(regex_char(chr(a)) if a == b else f"{regex_char(chr(a))}-{regex_char(chr(b))}" for a, b in chars)


# Each category spelled out is up to ~10 KB of pattern: a request may name this many.
MAX_PROPERTY_ESCAPES = 64


def property_escapes(pattern: str) -> int:
    return pattern.count("\\p{") + pattern.count("\\P{")


def with_python_patterns(schema):
    """A copy of `schema` whose `pattern`s and `patternProperties` names are `python_pattern`'s spellings
    (`schema` itself where none needs one)."""
    if not any(python_pattern(s) != s for _, s in schema_patterns(schema)):
        return schema
    schema = copy.deepcopy(schema)
    for _, key, node in walk(schema):
        if key == "pattern" and isinstance(node[key], str):
            node[key] = python_pattern(node[key])
        elif key == "patternProperties" and isinstance(node[key], dict):
            spelled: dict[str, list] = {}
            for name, value in node[key].items():
                spelled.setdefault(python_pattern(name), []).append(value)
            # Two names spelled alike (`^a\\0$`, `^a\\x00$`) match the same keys, which must pass both schemas.
            node[key] = {name: values[0] if len(values) == 1 else {"allOf": values} for name, values in spelled.items()}
    return schema


@functools.lru_cache(maxsize=4096)
def python_pattern(pattern: str) -> str:
    """An ECMA-262 `pattern` as Python's `re` (so jsonschema) and Rust's `regex` (the backends) read it alike:
    `ecma_escapes`, then `unicode_properties`."""
    return unicode_properties(ecma_escapes(pattern))


_CODE_POINT = re.compile(r"\\u\{([0-9A-Fa-f]{1,6})\}")
_SURROGATE_PAIR = re.compile(r"\\u(D[89ABab][0-9A-Fa-f]{2})\\u(D[C-Fc-f][0-9A-Fa-f]{2})")
_GROUP_NAME = re.compile(r"\(\?<([A-Za-z_][A-Za-z0-9_]*)>")
_NAMED_BACKREFERENCE = re.compile(r"\\k<([A-Za-z_][A-Za-z0-9_]*)>")


def ecma_escapes(pattern: str) -> str:
    """`pattern` with the ECMA-262 spellings that Python's `re` or Rust's `regex` refuse or read otherwise, spelled
    as both read them: a named group `(?<n>...)` as `(?P<n>...)` and `\\k<n>` as the numbered backreference it is
    (which the backends then refuse as one, with its pointer, not as an invalid schema), `\\u{1F600}` and a
    surrogate pair `\\uD83D\\uDE00` as `\\U0001F600` (one code point, as ajv's `u` mode reads them), `\\0` as
    `\\x00` (Rust reads a backreference), `\\cJ` as `\\x0A`, and `[\\b]` (a backspace in a class) as `\\x08`."""
    if "\\" not in pattern and "(?<" not in pattern:
        return pattern
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    groups: dict[str, int] = {}  # name -> number
    count = 0  # capturing groups opened so far
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            e = pattern[i + 1:i + 2]
            found = _CODE_POINT.match(pattern, i) if e == "u" else None
            pair = _SURROGATE_PAIR.match(pattern, i) if e == "u" else None
            reference = _NAMED_BACKREFERENCE.match(pattern, i) if e == "k" and not in_class else None
            if found and int(found[1], 16) <= 0x10FFFF:
                out.append(f"\\U{int(found[1], 16):08X}")
                i = found.end()
            elif pair:
                high, low = int(pair[1], 16), int(pair[2], 16)
                out.append(f"\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08X}")
                i = pair.end()
            elif reference and reference[1] in groups:
                out.append(f"(?:\\{groups[reference[1]]})")
                i = reference.end()
            elif e == "0" and not pattern[i + 2:i + 3].isdigit():
                out.append("\\x00")
                i += 2
            elif e == "c" and pattern[i + 2:i + 3].isascii() and pattern[i + 2:i + 3].isalpha():
                out.append(f"\\x{ord(pattern[i + 2]) % 32:02X}")
                i += 3
            elif e == "b" and in_class:
                out.append("\\x08")
                i += 2
            else:
                out.append(pattern[i:i + 2])
                i += 2
            continue
        if ch == "(" and not in_class:
            group = _GROUP_NAME.match(pattern, i)
            if group or not pattern.startswith("?", i + 1) or pattern.startswith("(?P<", i):
                count += 1
            if group:
                groups.setdefault(group[1], count)
                out.append(f"(?P<{group[1]}>")
                i = group.end()
                continue
        elif ch == "[" and not in_class:
            in_class = True
        elif ch == "]" and in_class:
            in_class = False
        out.append(ch)
        i += 1
    return "".join(out)


def schema_patterns(schema):
    """(pointer, regex) of every `pattern` and `patternProperties` name."""
    for ptr, key, node in walk(schema):
        if key == "pattern" and isinstance(node[key], str):
            yield ptr, node[key]
        elif key == "patternProperties" and isinstance(node[key], dict):
            yield from ((ptr, k) for k in node[key])


def without_edge_anchors(regex: str) -> str:
    """`regex` less a `^` that begins it and a `$` that ends it, which a whole match makes idle. With them, no
    example was found inside a whole-match wrapper (so a walk in `^\\w+\\.txt$` never closed), and outlines-core
    refused the regex ("anchored universal start state doesn't exist")."""
    regex = regex[1:] if regex.startswith("^") else regex
    if regex.endswith("$") and (len(regex) - 1 - len(regex[:-1].rstrip("\\"))) % 2 == 0:
        regex = regex[:-1]
    return regex
