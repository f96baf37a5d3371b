r"""Patterns as sets of strings: the complement of a JSON-schema `pattern` (what `not: {pattern: P}` means among
strings) and the disjoint regions of overlapping patterns (what llguidance needs of `patternProperties`).

JSON Schema's `pattern` is a search: a string passes when P matches somewhere in it. No regex syntax that both
llguidance (Rust `regex`) and the validators read says "does not match", so the complement is computed: P is
parsed with Python's own regex parser (no client regex is ever run), wrapped in `[\s\S]*` on each side it does not
anchor, turned into an NFA, then a DFA over classes of characters no part of P tells apart; each DFA state knows
which patterns have matched, the states of the wanted set become the accepting ones (for a complement: none
matched), and the minimised DFA is written back as a regex by state elimination.

Only true regular expressions are taken: literals, classes, `.`, groups, alternation, greedy or lazy repeats, and
`^`/`$` where they anchor a whole alternative. Lookarounds, backreferences, word boundaries, inline flags and
possessive repeats give None, as do automata past the `_MAX_*` limits (which also bound the work on hostile
patterns). Classes follow Python's `re` (`\d`: Unicode decimal digits; `\w`: alphanumerics and `_`; `\s`:
`str.isspace`); a class holding one of these whole is written with its shorthand, which the backends then get
spelled as every regex dialect reads it (`constrain/pattern_dialects.py`), as the client's patterns. `$` anchors
at the very end, as in ECMA-262 (Python's `$` also matches before a final newline).
"""

from __future__ import annotations

import bisect
import collections
import functools
import re
import re._constants as sre
import re._parser as sre_parse
from typing import Iterable

import numpy as np

_MAX_PATTERN_CHARS = 1000
_MAX_NFA_STATES = 4000
_MAX_DFA_STATES = 200
_MAX_OUTPUT_CHARS = 8000
# Searching only runs the DFA (no regex is written back), so it takes larger automata: a rewrite's complement
# (up to _MAX_OUTPUT_CHARS), `{1,255}`, a dozen alternative words searched anywhere.
_SEARCH_PATTERN_CHARS = _MAX_OUTPUT_CHARS
_SEARCH_NFA_STATES = 40_000
_SEARCH_DFA_STATES = 4000
_SEARCH_BUDGET = 5  # a budget of this many largest automata, shared by a schema's searches
_EXAMPLE_NFA_STATES = 10_000
# An example's pattern may be longer: its NFA is linear in it (a class is one edge, however many ranges), and Python
# spells `\p{L}` as ~9,400 characters: `\p{L}cole` had no example, and its string never closed (QA testsuite2 F3).
_EXAMPLE_PATTERN_CHARS = 32_000
_TOP = 0x10FFFF

Ranges = tuple[tuple[int, int], ...]  # sorted, disjoint, inclusive code point ranges
_ANY: Ranges = ((0, _TOP),)
_CONTROLS: Ranges = ((0, 0x1F),)
_CONTROLS_BUT_NEWLINE: Ranges = ((0, 0x09), (0x0B, 0x1F))  # (see `_write_class`)
_QUOTE: Ranges = ((0x22, 0x22),)
_BACKSLASH: Ranges = ((0x5C, 0x5C),)


class _Unsupported(Exception):
    pass


class Work:
    """A budget of automaton states shared by several calls (a schema's rewrites share one), so that a schema
    holding many patterns cannot buy unbounded work: once spent, every further call gives None."""

    def __init__(self, nfa_states: int = _MAX_NFA_STATES, dfa_states: int = _MAX_DFA_STATES,
                 max_nfa: int = _MAX_NFA_STATES, max_dfa: int = _MAX_DFA_STATES,
                 max_chars: int = _MAX_PATTERN_CHARS):
        self.nfa_states = nfa_states
        self.dfa_states = dfa_states
        self.max_nfa, self.max_dfa, self.max_chars = max_nfa, max_dfa, max_chars  # (per automaton, per pattern)

    @classmethod
    def for_search(cls) -> "Work":
        """The limits of `pattern_search`, and a budget for the searches of one schema."""
        return cls(_SEARCH_BUDGET * _SEARCH_NFA_STATES, _SEARCH_BUDGET * _SEARCH_DFA_STATES, _SEARCH_NFA_STATES,
                   _SEARCH_DFA_STATES, _SEARCH_PATTERN_CHARS)

    @classmethod
    def for_example(cls) -> "Work":
        """The limits of `pattern_examples`, and a budget for the examples of one schema: NFAs only (no state
        sets: a compile computes them), counted repeats up to the searches' limit."""
        return cls(_EXAMPLE_NFA_STATES * 4, 0, _EXAMPLE_NFA_STATES, _SEARCH_DFA_STATES, _EXAMPLE_PATTERN_CHARS)

    def spend_nfa(self) -> None:
        self.nfa_states -= 1
        if self.nfa_states < 0:
            raise _Unsupported("work budget spent")

    def spend_dfa(self) -> None:
        self.dfa_states -= 1
        if self.dfa_states < 0:
            raise _Unsupported("work budget spent")


def complement_pattern(pattern: str, work: Work | None = None) -> str | None:
    """An anchored pattern matching exactly the strings in which `pattern` finds no match (None: out of reach)."""
    dfa = _search_dfa([pattern], work or Work())
    if dfa is None:
        return None
    return _region(dfa, frozenset())  # (None when P matches every string: an empty complement needs no pattern)


def disjoint_regions(patterns: list[str], work: Work | None = None,
                     explicit: bool = False) -> list[tuple[str, frozenset[int]]] | None:
    """The strings some of `patterns` find a match in, cut by which ones do: for each non-empty set R of indices
    whose region is not empty, an anchored pattern matching exactly the strings matched by the patterns in R and
    by no other. The regions are pairwise disjoint and their union is the union of the patterns (None: out of
    reach). `explicit`: classes written as their characters (`_write`), for a reader of no other spelling."""
    dfa = _search_dfa(patterns, work or Work())
    if dfa is None:
        return None
    out = []
    for sig in dict.fromkeys(dfa.sigs):
        if sig:
            region = _region(dfa, sig, explicit)
            if region is None:
                return None
            out.append((region, sig))
    return out


def pattern_search(pattern: str, work: Work | None = None):
    """A function telling whether `pattern` finds a match in a string, as JSON Schema's `pattern` means it, run
    on the automaton in time linear in the string (the client's regex itself is never run); None when the
    pattern is out of reach (the same limits as above)."""
    dfa = _search_dfa([pattern], work or Work.for_search())
    if dfa is None:
        return None
    starts = [lo for ranges in dfa.classes for lo, _ in ranges]
    owner = [c for c, ranges in enumerate(dfa.classes) for _ in ranges]
    order = sorted(range(len(starts)), key=starts.__getitem__)
    starts, owner = [starts[i] for i in order], [owner[i] for i in order]
    matched = [0 in sig for sig in dfa.sigs]

    def search(text: str) -> bool:
        state = 0
        for ch in text:
            state = dfa.trans[state][owner[bisect.bisect_right(starts, ord(ch)) - 1]]
        return matched[state]

    return search


def _below(op, av) -> list:
    """The item lists one item of a parsed pattern (`sre_parse.parse`) holds: a repeat's, a group's, a branch's."""
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
        return [av[2]]
    if op == sre.SUBPATTERN:
        return [av[-1]]
    if op == sre.BRANCH:
        return list(av[1])
    if op == sre.ATOMIC_GROUP:
        return [av]
    if op in (sre.ASSERT, sre.ASSERT_NOT):
        return [av[1]]
    return []


def item_lists(tree) -> Iterable:
    """Every item list of a parsed pattern, the whole first: what a check of sequences reads."""
    stack = [tree]
    while stack:
        items = stack.pop()
        yield items
        for op, av in items:
            stack.extend(_below(op, av))


def _parsed(pattern: str):
    try:
        return sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return None


def repeat_product(pattern: str) -> int:
    """The most copies of one piece of `pattern` (Python's syntax) its nested bounded counts write out: 13,824 for
    `((.{24}){24}){24}`, 30 for `(\\d{1,3}\\.){10}`, 1 without counts (an open count `{5,}` counts its least).
    An automaton grows with it; 0 where Python cannot read the pattern."""
    tree = _parsed(pattern)
    if tree is None:
        return 0
    best = 1
    stack: list[tuple[object, int]] = [(tree, 1)]
    while stack:
        items, factor = stack.pop()
        for op, av in items:
            if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
                low, high, _ = av
                factor_below = factor * max(1, low if high == sre.MAXREPEAT else high)
                best = max(best, factor_below)
            else:
                factor_below = factor
            stack.extend((below, factor_below) for below in _below(op, av))
    return best


def longest_literal(pattern: str) -> int:
    """The most characters `pattern` (Python's syntax) spells in a row as plain literals: the answer must write
    them whole, as a `const` string (constrain/limits.py `max_literal_chars`); 0 where Python cannot read it."""
    tree = _parsed(pattern)
    best = 0
    for items in item_lists(tree) if tree is not None else ():
        run = 0
        for op, _ in items:
            run = run + 1 if op == sre.LITERAL else 0
            best = max(best, run)
    return best


def python_only_syntax(pattern: str) -> str | None:
    """What in `pattern` (Python's syntax) only Python's `re` reads: a possessive quantifier (`a++`, `a{2}+`) or an
    atomic group (`(?>...)`), as Python 3.11 reads them. ECMA-262 has neither (`a++` is a syntax error there), and
    Rust's `regex` reads `a++` as a repeat of a repeat: both backends wrote `aaaa` under `^a{2}+$`, which means
    `aa` to Python. None where there is none, or where Python cannot read the pattern."""
    tree = _parsed(pattern)
    for items in item_lists(tree) if tree is not None else ():
        for op, _ in items:
            if op == sre.POSSESSIVE_REPEAT:
                return "a possessive quantifier (`*+`, `++`, `?+`, `{m,n}+`)"
            if op == sre.ATOMIC_GROUP:
                return "an atomic group (`(?>...)`)"
    return None


def finite_language(pattern: str, limit: int, work: Work | None = None) -> list[str] | None:
    """Every string in which `pattern` finds a match, when they are at most `limit` (`^(math|art)$`, `^[a-e]$`);
    None when they are more, unbounded (a pattern not anchored at both ends finds matches in endlessly many), or
    the pattern is out of reach. Paths of the search automaton from its start to a matching state, which must
    not pass a cycle."""
    dfa = _search_dfa([pattern], work or Work.for_search())
    if dfa is None:
        return None
    matched = [0 in sig for sig in dfa.sigs]
    live = set(i for i, m in enumerate(matched) if m)  # states from which a match can still be reached
    grew = True
    while grew:
        grew = False
        for state, row in enumerate(dfa.trans):
            if state not in live and any(t in live for t in row):
                live.add(state)
                grew = True
    found: list[str] = []

    def visit(state: int, prefix: list[str], path: set[int]) -> bool:
        if matched[state]:
            found.append("".join(prefix))
            if len(found) > limit:
                return False
        for c, target in enumerate(dfa.trans[state]):
            if target not in live:
                continue
            if target in path:
                return False  # a cycle on the way to a match: unboundedly many
            codes = [code for lo, hi in dfa.classes[c] for code in range(lo, min(hi, lo + limit) + 1)]
            if len(codes) > limit:
                return False
            for code in codes:
                if not visit(target, prefix + [chr(code)], path | {target}):
                    return False
        return True

    if 0 not in live:
        return []
    return found if visit(0, [], {0}) else None


def pattern_examples(pattern: str, work: Work | None = None) -> list[str]:
    """For each top-level alternative of `pattern` (`^all|tags$`: `^all` and `tags$`), a shortest string in which
    it finds a match, shortest first, without repeats: a completion that wrote what rules one alternative out can
    still finish with another. Written with letters, digits and other printable ASCII where the pattern allows,
    then other characters, `"`, `\\` and control characters only where nothing else fits (`_representative`). Empty
    when the pattern is out of reach or matches nothing. Shortest paths through each alternative's NFA (no DFA is
    built: linear in the pattern's size). A pattern's global `(?i)`, `(?s)` or `(?m)` is read as absent: such an
    example still matches."""
    work = work or Work.for_example()
    trees = _parse([pattern], work, ignored_flags=_WIDENING_FLAGS)
    if trees is None:
        return []
    found: dict[str, None] = {}
    for items, begin in _alternatives(list(trees[0])):
        try:
            nfa = _Nfa(work, shortest=True)
            example = _shortest(nfa, *nfa.search_one(items, begin))
        except (_Unsupported, RecursionError):
            continue
        if example is not None:
            found[example] = None
    return sorted(found, key=len)


def _alternatives(items: list, begin: bool = False) -> list[tuple[list, bool]]:
    """The top-level alternatives of a parsed pattern, each with whether it is anchored at the start."""
    if items[:1] in ([(sre.AT, sre.AT_BEGINNING)], [(sre.AT, sre.AT_BEGINNING_STRING)]):
        begin, items = True, items[1:]  # (Python's parser hoists a `^` common to all alternatives)
    if len(items) == 1 and items[0][0] is sre.BRANCH:
        return [alt for branch in items[0][1][1] for alt in _alternatives(list(branch), begin)]
    if len(items) == 1 and items[0][0] is sre.SUBPATTERN and not items[0][1][1] and not items[0][1][2]:
        return _alternatives(list(items[0][1][3]), begin)
    if len(items) == 2 and _anchored_at_end(items):  # `^(0|\$\([a-z]+\))$`: the group's, each anchored at the end
        inside = _alternatives(items[:1], begin)
        if len(inside) > 1:
            return [(alt + items[1:], b) for alt, b in inside]
    return [(items, begin)]


def _anchored_at_end(items: list) -> bool:
    r"""A parsed alternative ends with `$` (or `\Z`)."""
    return items[-1:] in ([(sre.AT, sre.AT_END)], [(sre.AT, sre.AT_END_STRING)])


def _trim_edges(items: list, begin: bool, end: bool) -> tuple[list, int]:
    """A search finds `X{m,n}` at a side it does not anchor exactly where it finds `X{m}` (a longer run holds the
    shorter one; `X{0,n}` is then nothing): the alternative with such repeats cut to their minimum, and the
    largest bounded span (n - m) cut (an unbounded one counts as 0: `X+` costs no states to count). Keeps the
    automata of `[a-z.-]{1,255}` at two states instead of 256."""
    items, cut = list(items), 0
    for side in ([] if end else [-1]) + ([] if begin else [0]):
        while items and items[side][0] in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            op, (lo, hi, sub) = items[side]
            if hi == lo:
                break
            cut = max(cut, 0 if hi == sre.MAXREPEAT else hi - lo)
            if lo:
                items[side] = (op, (lo, lo, sub))
                break
            items.pop(side)
    return items, cut


def search_region(pattern: str, work: Work | None = None, min_cut: int = 16, explicit: bool = False) -> str | None:
    """The anchored pattern of the strings `pattern` finds a match in, when a search of it has a counted repeat
    of span `min_cut` or more at a side it does not anchor (`_trim_edges`), else None: the same names, without
    the count that derivative-based regex engines (llguidance's) unroll into thousands of states."""
    trees = _parse([pattern], work or Work())
    if trees is None:
        return None
    cut = 0
    for items, begin in _alternatives(list(trees[0])):
        end = _anchored_at_end(items)
        cut = max(cut, _trim_edges(items[:-1] if end else items, begin, end)[1])
    if cut < min_cut:
        return None
    dfa = _dfa_of([list(trees[0])], work or Work())
    return None if dfa is None else _region(dfa, frozenset([0]), explicit)


def _shortest(nfa: "_Nfa", start: int, end: int) -> str | None:
    """The characters of a shortest path from `start` to `end` (0-1 breadth first: an epsilon move costs nothing,
    a character one), or None."""
    best = {start: 0}
    came: dict[int, tuple[int, str]] = {}
    queue = collections.deque([start])
    while queue:
        state = queue.popleft()
        if state == end:
            out = []
            while state != start:
                state, ch = came[state]
                out.append(ch)
            return "".join(reversed(out))
        for cost, moves in ((0, [(t, "") for t in nfa.eps[state]]),
                            (1, [(t, _representative(s)) for s, t in nfa.edges[state]])):
            for nxt, ch in moves:
                if ch is None or best.get(nxt, len(nfa.eps) + 1) <= best[state] + cost:
                    continue
                best[nxt], came[nxt] = best[state] + cost, (state, ch)
                queue.appendleft(nxt) if cost == 0 else queue.append(nxt)
    return None


_PREFERRED = [*range(ord("a"), ord("z") + 1), *range(ord("0"), ord("9") + 1), *range(ord("A"), ord("Z") + 1),
              *(c for c in range(0x20, 0x7F) if not chr(c).isalnum() and chr(c) not in '"\\')]


@functools.lru_cache(maxsize=1024)
def _representative(ranges: Ranges) -> str | None:
    """A character of `ranges` to write: printable ASCII by preference, else the first code point that is not a
    control character or a surrogate, then `"`, `\\`, a tab, a line feed, a carriage return (a JSON string holds
    them escaped), then another control character (`^a\\x01$` has no other example)."""
    inside = lambda c: any(lo <= c <= hi for lo, hi in ranges)  # noqa: E731
    for c in _PREFERRED:
        if inside(c):
            return chr(c)
    for lo, hi in ranges:
        c = max(lo, 0xA0)
        if 0xD800 <= c <= 0xDFFF:
            c = 0xE000
        if c <= hi:
            return chr(c)
    escaped = next((ch for ch in '"\\\t\n\r' if inside(ord(ch))), None)  # (two bytes each in a JSON string)
    return escaped or next((chr(lo) for lo, _ in ranges if lo < 0xD800), None)


def without_lookaheads(pattern: str, work: Work | None = None, explicit: bool = False) -> str | None:
    """`pattern`, when it opens with `^` and lookaheads (`^(?!draft-)...`, `^(?=.{1,9}$)...`), as one anchored
    pattern without them: the strings the rest matches from the start, which each positive lookahead matches
    from the start too and no negative one does. None: no such opening, or out of reach."""
    parsed = _parse([pattern], work or Work())
    if parsed is None:
        return None
    items = list(parsed[0])
    begin = [(sre.AT, sre.AT_BEGINNING)]
    looks = []
    while items[:1] == begin and len(items) > 1 and items[1][0] in (sre.ASSERT, sre.ASSERT_NOT) \
            and items[1][1][0] == 1:  # (direction 1: ahead)
        looks.append((items[1][0] is sre.ASSERT, list(items[1][1][1])))
        items = begin + items[2:]
    if not looks:
        return None
    dfa = _dfa_of([items] + [begin + sub for _, sub in looks], work or Work())
    if dfa is None:
        return None
    return _region(dfa, frozenset([0] + [k + 1 for k, (positive, _) in enumerate(looks) if positive]), explicit)


# Global flags under which every match of the pattern read without them is still a match: `(?i)abc` matches
# "abc", `(?s)a.b` "a-b", `(?m)^a$` "a". Examples may ignore them; sets of strings may not.
_WIDENING_FLAGS = sre.SRE_FLAG_IGNORECASE | sre.SRE_FLAG_DOTALL | sre.SRE_FLAG_MULTILINE


def _parse(patterns: list[str], work: Work, ignored_flags: int = 0) -> list | None:
    if not all(isinstance(p, str) and len(p) <= work.max_chars for p in patterns):
        return None
    try:
        trees = [sre_parse.parse(p) for p in patterns]
    except (re.error, RecursionError, OverflowError):
        return None
    if any(t.state.flags & ~(sre.SRE_FLAG_UNICODE | ignored_flags) for t in trees):
        return None  # (?i), (?s), (?m), (?x)...
    return trees


def _search_dfa(patterns: list[str], work: Work) -> "_Dfa | None":
    trees = _parse(patterns, work)
    return None if trees is None else _dfa_of([list(t) for t in trees], work)


def _dfa_of(trees: list[list], work: Work) -> "_Dfa | None":
    """The DFA searching with each parsed pattern of `trees` at once (each state knows which have matched)."""
    try:
        nfa = _Nfa(work)
        parts = [nfa.search(t) for t in trees]
        start = nfa.state()
        nfa.eps[start] = [a for a, _ in parts]
        return _Dfa.build(nfa, start, [b for _, b in parts], work)
    except (_Unsupported, RecursionError):
        return None


def _region(dfa: "_Dfa", sig: frozenset, explicit: bool = False) -> str | None:
    """An anchored pattern for the strings whose DFA state has signature `sig` (None: empty or too large)."""
    dfa = _Dfa(dfa.classes, dfa.trans, {i for i, s in enumerate(dfa.sigs) if s == sig}).minimised()
    if not dfa.finals:
        return None
    try:
        return f"^(?:{_write(dfa.to_regex(), explicit)})$"
    except _Unsupported:
        return None


# ---- character sets --------------------------------------------------------------------------------------------

def ranges_of(codes: Iterable[int]) -> Ranges:
    out: list[list[int]] = []
    for c in sorted(set(codes)):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return tuple((a, b) for a, b in out)


def union_ranges(*sets: Ranges) -> Ranges:
    spans = sorted(r for s in sets for r in s)
    out: list[list[int]] = []
    for a, b in spans:
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def negate_ranges(s: Ranges) -> Ranges:
    out, nxt = [], 0
    for a, b in s:
        if a > nxt:
            out.append((nxt, a - 1))
        nxt = b + 1
    if nxt <= _TOP:
        out.append((nxt, _TOP))
    return tuple(out)


def _contains(s: Ranges, sub: Ranges) -> bool:
    return union_ranges(s, sub) == s


def python_class(name: str) -> Ranges:
    """Python `re`'s (str pattern) definition of \\d ("digit"), \\w ("word") or \\s ("space")."""
    return _python_classes()[name]


@functools.cache
def _python_classes() -> dict[str, Ranges]:
    """\\d, \\w and \\s read off `re` itself, once, over all code points (~0.1 s)."""
    every = np.arange(_TOP + 1, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
    return {name: tuple((m.start(), m.end() - 1) for m in re.finditer(shorthand, every))
            for name, shorthand in (("digit", r"\d+"), ("word", r"\w+"), ("space", r"\s+"))}


_CATEGORIES = {
    sre.CATEGORY_DIGIT: ("digit", False), sre.CATEGORY_NOT_DIGIT: ("digit", True),
    sre.CATEGORY_SPACE: ("space", False), sre.CATEGORY_NOT_SPACE: ("space", True),
    sre.CATEGORY_WORD: ("word", False), sre.CATEGORY_NOT_WORD: ("word", True),
}
_SHORTHANDS = (("digit", "\\d", "\\D"), ("word", "\\w", "\\W"), ("space", "\\s", "\\S"))


def _class_ranges(items) -> Ranges:
    negate, parts = False, []
    for op, arg in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            parts.append(((arg, arg),))
        elif op is sre.RANGE:
            parts.append(((arg[0], arg[1]),))
        elif op is sre.CATEGORY and arg in _CATEGORIES:
            name, negated = _CATEGORIES[arg]
            parts.append(negate_ranges(python_class(name)) if negated else python_class(name))
        else:
            raise _Unsupported(op)
    s = union_ranges(*parts)
    return negate_ranges(s) if negate else s


# ---- NFA (Thompson) from Python's parse tree ----------------------------------------------------------------------

class _Nfa:
    def __init__(self, work: Work, shortest: bool = False):
        """`shortest`: for `_shortest` paths only, each counted repeat `X{m,n}` is built as `X{m}` (a shortest
        match never takes more copies than it must), so `[^a]{1,4000}z` has an example."""
        self.work = work
        self.shortest = shortest
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[Ranges, int]]] = []

    def state(self) -> int:
        if len(self.eps) >= self.work.max_nfa:
            raise _Unsupported("automaton too large")
        self.work.spend_nfa()
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def chars(self, s: Ranges) -> tuple[int, int]:
        a, b = self.state(), self.state()
        self.edges[a].append((s, b))
        return a, b

    def search(self, items: list) -> tuple[int, int]:
        """A match anywhere: each top-level alternative gets `[\\s\\S]*` on the sides it does not anchor."""
        alternatives = _alternatives(items)
        if len(alternatives) == 1:
            return self.search_one(*alternatives[0])
        return self._alternation([self.search_one(alt, begin) for alt, begin in alternatives])

    def search_one(self, items: list, begin: bool) -> tuple[int, int]:
        """A match anywhere of one top-level alternative (`_alternatives`), anchored at the start or not."""
        end = _anchored_at_end(items)
        items, _ = _trim_edges(items[:-1] if end else items, begin, end)
        parts = ([] if begin else [self._star(self.chars(_ANY))]) + [self.sequence(items)] \
            + ([] if end else [self._star(self.chars(_ANY))])
        return self._concat(parts)

    def sequence(self, items) -> tuple[int, int]:
        return self._concat([self.item(op, arg) for op, arg in items])

    def item(self, op, arg) -> tuple[int, int]:
        if op is sre.LITERAL:
            return self.chars(((arg, arg),))
        if op is sre.NOT_LITERAL:
            return self.chars(negate_ranges(((arg, arg),)))
        if op is sre.ANY:
            return self.chars(negate_ranges(((10, 10),)))  # `.` is any character but a line feed
        if op is sre.IN:
            return self.chars(_class_ranges(arg))
        if op is sre.BRANCH:
            return self._alternation([self.sequence(alt) for alt in arg[1]])
        if op is sre.SUBPATTERN:
            _, add_flags, del_flags, sub = arg
            if add_flags or del_flags:
                raise _Unsupported("scoped flags")
            return self.sequence(sub)
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):  # laziness changes where a match is, not whether one exists
            lo, hi, sub = arg
            hi = lo if self.shortest else hi
            if max(lo, 0 if hi == sre.MAXREPEAT else hi) >= self.work.max_dfa:
                raise _Unsupported("a count past the DFA limit")  # counting to n takes n states
            parts = [self.sequence(sub) for _ in range(lo)]
            if hi == sre.MAXREPEAT:
                parts.append(self._star(self.sequence(sub)))
            else:
                parts += [self._optional(self.sequence(sub)) for _ in range(hi - lo)]
            return self._concat(parts)
        raise _Unsupported(op)  # anchors inside, lookarounds, backreferences, atomic groups, possessive repeats

    def _concat(self, parts: list[tuple[int, int]]) -> tuple[int, int]:
        if not parts:
            s = self.state()
            return s, s
        for (_, end), (start, _) in zip(parts, parts[1:]):
            self.eps[end].append(start)
        return parts[0][0], parts[-1][1]

    def _alternation(self, parts: list[tuple[int, int]]) -> tuple[int, int]:
        a, b = self.state(), self.state()
        for start, end in parts:
            self.eps[a].append(start)
            self.eps[end].append(b)
        return a, b

    def _optional(self, part: tuple[int, int]) -> tuple[int, int]:
        """The part or nothing, between states of its own: an edge that skipped from the part's own start to its
        own end would also skip into a loop at either (`(\\.[0-9]+)?` took `12` for `.2`)."""
        a, b = self.state(), self.state()
        self.eps[a] += [part[0], b]
        self.eps[part[1]].append(b)
        return a, b

    def _star(self, part: tuple[int, int]) -> tuple[int, int]:
        a = self.state()
        self.eps[a].append(part[0])
        self.eps[part[1]].append(a)
        return a, a


# ---- DFA over classes of characters ---------------------------------------------------------------------------

class _Dfa:
    def __init__(self, classes: list[Ranges], trans: list[list[int]], finals: set[int],
                 sigs: list[frozenset] | None = None):
        self.classes = classes  # a partition of all code points
        self.trans = trans  # trans[state][class] -> state (complete)
        self.finals = finals
        self.sigs = sigs  # from build: for each state, the indices of the patterns that matched

    @staticmethod
    def build(nfa: _Nfa, start: int, ends: list[int], work: Work) -> "_Dfa":
        labels = sorted({s for edges in nfa.edges for s, _ in edges})
        classes, members = _partition(labels)
        label_classes = {lab: m for lab, m in zip(labels, members)}

        def closure(states: Iterable[int]) -> frozenset:
            todo = list(states)
            seen = set(todo)
            while todo:
                for t in nfa.eps[todo.pop()]:
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            return frozenset(seen)

        first = closure([start])
        index, order, trans = {first: 0}, [first], []
        while len(trans) < len(order):
            current = order[len(trans)]
            row = []
            for c in range(len(classes)):
                nxt = closure(t for s in current for lab, t in nfa.edges[s] if c in label_classes[lab])
                if nxt not in index:
                    if len(order) >= work.max_dfa:
                        raise _Unsupported("automaton too large")
                    work.spend_dfa()
                    index[nxt] = len(order)
                    order.append(nxt)
                row.append(index[nxt])
            trans.append(row)
        sigs = [frozenset(k for k, end in enumerate(ends) if end in s) for s in order]
        return _Dfa(classes, trans, set(), sigs)

    def minimised(self) -> "_Dfa":
        """Moore's partition refinement (states are few: _MAX_DFA_STATES); state 0 stays initial."""
        n = len(self.trans)
        block = [int(i in self.finals) for i in range(n)]
        while True:
            keys = [(block[i], *(block[t] for t in self.trans[i])) for i in range(n)]
            ids: dict = {}
            for k in [keys[0]] + keys:  # numbered in order of first appearance, from state 0
                ids.setdefault(k, len(ids))
            new = [ids[k] for k in keys]
            if len(ids) == len(set(block)):
                break
            block = new
        trans = [[]] * len(ids)
        for i in range(n):
            trans[new[i]] = [new[t] for t in self.trans[i]]
        return _Dfa(self.classes, trans, {new[i] for i in self.finals})

    def to_regex(self) -> "_Node":
        """State elimination (Brzozowski-McCluskey): cheapest state first; _Unsupported past _MAX_OUTPUT_CHARS."""
        n = len(self.trans)
        live = self._live()
        start, final = n, n + 1
        edges: dict[int, dict[int, _Node]] = {i: {} for i in range(n + 2)}
        edges[start][0] = _EPS
        for i in live:
            by_target: dict[int, list[Ranges]] = {}
            for c, t in enumerate(self.trans[i]):
                if t in live:
                    by_target.setdefault(t, []).append(self.classes[c])
            for t, sets in by_target.items():
                edges[i][t] = _set(union_ranges(*sets))
            if i in self.finals:
                edges[i][final] = _EPS
        todo = set(live)
        while todo:
            def cost(k: int) -> int:
                ins = sum(1 for i in edges if k in edges[i] and i != k)
                return ins * sum(1 for j in edges[k] if j != k)
            k = min(todo, key=lambda k: (cost(k), k))
            todo.discard(k)
            loop = _star(edges[k].pop(k)) if k in edges[k] else _EPS
            outs = edges.pop(k)
            for i in edges:
                into = edges[i].pop(k, None)
                if into is None:
                    continue
                for j, out in outs.items():
                    edges[i][j] = _alt(edges[i].get(j), _cat(_cat(into, loop), out))
                    if edges[i][j].size > _MAX_OUTPUT_CHARS:
                        raise _Unsupported("regex too long")
        if final not in edges[start]:
            raise _Unsupported("empty language")
        return edges[start][final]

    def _live(self) -> set[int]:
        """States reachable from 0 from which a final state is reachable."""
        reach, todo = {0}, [0]
        while todo:
            for t in self.trans[todo.pop()]:
                if t not in reach:
                    reach.add(t)
                    todo.append(t)
        live = set(self.finals) & reach
        changed = True
        while changed:
            changed = False
            for i in reach - live:
                if any(t in live for t in self.trans[i]):
                    live.add(i)
                    changed = True
        return live


def _partition(labels: list[Ranges]) -> tuple[list[Ranges], list[set[int]]]:
    """The coarsest classes of code points no label tells apart, and for each label the classes it holds."""
    bounds = sorted({0, _TOP + 1} | {a for lab in labels for a, _ in lab} | {b + 1 for lab in labels for _, b in lab})
    starts = [[a for a, _ in lab] for lab in labels]
    by_signature: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for lo, nxt in zip(bounds, bounds[1:]):
        sig = tuple(i for i, lab in enumerate(labels)
                    if (k := bisect.bisect_right(starts[i], lo) - 1) >= 0 and lab[k][1] >= lo)
        by_signature.setdefault(sig, []).append((lo, nxt - 1))
    classes = [union_ranges(tuple(spans)) for spans in by_signature.values()]
    members: list[set[int]] = [set() for _ in labels]
    for c, sig in enumerate(by_signature):
        for i in sig:
            members[i].add(c)
    return classes, members


# ---- regex terms and writing them -----------------------------------------------------------------------------

class _Node(tuple):
    """(kind, size, payload): kind eps | set | cat | alt | opt | star; size bounds the written length."""

    @property
    def kind(self) -> str:
        return self[0]

    @property
    def size(self) -> int:
        return self[1]


_EPS = _Node(("eps", 0, None))


def _set(s: Ranges) -> _Node:
    return _Node(("set", len(_write_class(s)), s))


def _cat(a: _Node, b: _Node) -> _Node:
    if a is _EPS:
        return b
    if b is _EPS:
        return a
    parts = (a[2] if a.kind == "cat" else (a,)) + (b[2] if b.kind == "cat" else (b,))
    return _Node(("cat", a.size + b.size, parts))


def _alt(a: _Node | None, b: _Node) -> _Node:
    if a is None or a == b:
        return b
    if a is _EPS:
        return _opt(b)
    if b is _EPS:
        return _opt(a)
    if a.kind == "opt" or b.kind == "opt":
        return _opt(_alt(a[2] if a.kind == "opt" else a, b[2] if b.kind == "opt" else b))
    if a.kind == "set" and b.kind == "set":
        return _set(union_ranges(a[2], b[2]))
    parts = tuple(dict.fromkeys((a[2] if a.kind == "alt" else (a,)) + (b[2] if b.kind == "alt" else (b,))))
    return _Node(("alt", sum(p.size for p in parts) + 4 + len(parts), parts))


def _opt(a: _Node) -> _Node:
    return a if a.kind in ("eps", "opt", "star") else _Node(("opt", a.size + 5, a))


def _star(a: _Node) -> _Node:
    if a.kind in ("eps", "star"):
        return a
    return _Node(("star", a.size + 5, a[2] if a.kind == "opt" else a))


def _write(n: _Node, explicit: bool = False) -> str:
    """The regex of `n`; `explicit`: classes as their characters, never Python's shorthands (`_write_class`)."""
    if n.kind == "eps":
        return ""
    if n.kind == "set":
        return _write_class(n[2], explicit)
    if n.kind == "alt":
        return "|".join(_write(p, explicit) for p in n[2])
    if n.kind == "cat":
        out, parts, i = [], n[2], 0
        while i < len(parts):
            p = parts[i]
            if i + 1 < len(parts) and parts[i + 1].kind == "star" and parts[i + 1][2] == p:
                out.append(_atom(p, explicit) + "+")  # x x* is x+
                i += 2
                continue
            out.append(f"(?:{_write(p, explicit)})" if p.kind == "alt" else _write(p, explicit))
            i += 1
        return "".join(out)
    return _atom(n[2], explicit) + ("?" if n.kind == "opt" else "*")


def _atom(n: _Node, explicit: bool = False) -> str:
    return _write(n, explicit) if n.kind == "set" else f"(?:{_write(n, explicit)})"


def regex_char(ch: str) -> str:
    """One character, literal in ECMA-262, Rust and Python regexes alike, in or out of a class."""
    if ch.isascii() and ch.isalnum():
        return ch
    code = ord(ch)
    return f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}"


def _char(code: int) -> str:
    return regex_char(chr(code))


def _items(s: Ranges) -> str:
    """The ranges as a class's items, less surrogates at their ends: no Rust regex may name one (llguidance refused
    `^(?!a)\\S$` rewritten with `\\uD800-\\uDFFF`, QA review8 F6), and no JSON text holds one."""
    clipped = ((0xE000 if 0xD800 <= a <= 0xDFFF else a, 0xD7FF if 0xD800 <= b <= 0xDFFF else b) for a, b in s)
    return "".join(_char(a) if a == b else f"{_char(a)}-{_char(b)}" for a, b in clipped if a <= b)


@functools.lru_cache(maxsize=4096)
def _write_class(s: Ranges, explicit: bool = False) -> str:
    """The shortest spelling of `s`: its characters, their complement, or (unless `explicit`) with Python's
    shorthands (`\\w` as `re` reads it: Unicode), which pattern_dialects.portable_pattern narrows later to what
    every dialect reads, and so changes."""
    if _contains(s, _CONTROLS_BUT_NEWLINE) and not (_contains(s, _QUOTE) and _contains(s, _BACKSLASH)):
        # llguidance 1.9.1 reads a class holding every control character (which JSON writes as escapes; `\n`
        # aside) as letting any escape through, \" and \\ included: such a class would accept what it excludes.
        raise _Unsupported("control characters without quote or backslash")
    if s == _ANY:
        return "[\\s\\S]"
    if len(s) == 1 and s[0][0] == s[0][1]:
        return _char(s[0][0])
    comp = negate_ranges(s)
    candidates = [f"[{_items(s)}]"]
    # A negated class naming '"' or '\\' is rewritten by constrain/llg_backend.py: never written here.
    if not _holds_quote_or_backslash(comp):
        candidates.append(f"[^{_items(comp)}]")
    for name, short, negated_short in () if explicit else _SHORTHANDS:
        for cat, written in ((python_class(name), short), (negate_ranges(python_class(name)), negated_short)):
            if _contains(s, cat):
                rest = _minus(s, cat)
                candidates.append(f"[{written}{_items(rest)}]" if rest else written)
            if _contains(comp, cat) and not _holds_quote_or_backslash(rest := _minus(comp, cat)):
                candidates.append(f"[^{written}{_items(rest)}]")
        inside, outside = _minus(s, negate_ranges(python_class(name))), _minus(s, python_class(name))
        if inside and outside:  # part of a shorthand's set, and more: (?:[^\W<excluded>]|[<the rest>])
            excluded = _minus(python_class(name), s)
            if not _holds_quote_or_backslash(excluded):
                single = len(outside) == 1 and outside[0][0] == outside[0][1]
                other = _char(outside[0][0]) if single else f"[{_items(outside)}]"
                candidates.append(f"(?:[^{negated_short}{_items(excluded)}]|{other})")
    candidates = [c for c in candidates if "[]" not in c and "[^]" not in c]  # (surrogates only: no items)
    return min(candidates, key=len) if candidates else "[^\\s\\S]"


def _minus(s: Ranges, t: Ranges) -> Ranges:
    return negate_ranges(union_ranges(negate_ranges(s), t))


def _holds_quote_or_backslash(s: Ranges) -> bool:
    return any(a <= c <= b for a, b in s for c in (0x22, 0x5C))
