"""The outlines-core backend: schema -> regex -> Index -> a compact token DFA with cached mask rows and distances.

Per-token cost is a cached row copy: a state's mask is a pure function of the state, written once. Each state
also knows the fewest tokens to an accepting state, which gives the exact budget rule (#9). Never imports HTTP.

Fixes applied to outlines-core 0.2.14's JSON regex so both backends accept the same documents: strings also
accept `\\uXXXX` escapes (json.dumps writes them for non-ASCII; a surrogate pair as one character, a lone surrogate
not at all) and raw U+007F..U+009F; whitespace between JSON tokens is the caller's bounded pattern.
"""

from __future__ import annotations

import copy
import json
import re
from collections import OrderedDict

import numpy as np
import outlines_core
import torch

from constrain.grammar import ConstraintError, Grammar, Matcher
from constrain.json_follower import MAX_EXPONENT_DIGITS
from constrain.pattern_dialects import with_portable_patterns
from constrain.support import walk
from constrain.token_dfa import INF as _INF
from constrain.token_dfa import TokenDFA, outlines_vocabulary_from_bytes
from constrain.vocabulary import Vocabulary, ids_to_words

__all__ = ["OutlinesGrammar", "OutlinesMatcher", "TokenDFA", "compile_outlines", "outlines_vocabulary", "schema_regex"]
_CHAR_OLD = '[^"\\\\\\x00-\\x1F\\x7F-\\x9F]'
_CHAR_NEW = '[^"\\\\\\x00-\\x1F]'
_ESC_OLD = '\\\\["\\\\/bfnrt]'
# A `\u` escape of a character outside the surrogates, or a whole surrogate pair: one character of a string, as
# minLength and maxLength count it (two escapes counted as two let `\ud83d\ude00` pass `minLength: 2`)
_ESC_NEW = ('\\\\(["\\\\/bfnrt]|u([0-9A-Ca-cE-Fe-f][0-9A-Fa-f]{3}|[Dd][0-7][0-9A-Fa-f]{2}'
            '|[Dd][89ABab][0-9A-Fa-f]{2}\\\\u[Dd][C-Fc-f][0-9A-Fa-f]{2}))')
_BUDGET_ROWS = 512  # cached budget rows per grammar: ~10 MB on a 152k vocabulary


def schema_regex(schema, whitespace_pattern: str = "[ ]?") -> str:
    """outlines-core's regex of the schema, JSON's escapes spelled out. Raises ValueError where outlines-core would
    write an object open to any key (its generic key, a string before the colon): the support check
    (`outlines_unsupported`) lets only closed objects through, whose keys cannot repeat, so the outlines grammar
    goes without the distinct-keys check; a generic key means the check missed a place where outlines writes any
    value, which is not the schema either. The fixes below are made on a regex whose string patterns are
    placeholders, then the patterns put back: a pattern's own text is never read as outlines-core's
    (`^([0-9]+)(,[ ]?([0-9]+))*$` holds the very text of its item separator)."""
    schema = with_portable_patterns(schema)
    marks = _unused_marks(schema)
    schema, integers = _wide_integers_held_out(schema, marks)
    schema, patterns = _patterns_held_out(schema, marks)
    regex = outlines_core.json_schema.build_regex_from_schema(json.dumps(schema), whitespace_pattern)
    if outlines_core.json_schema.STRING + whitespace_pattern + ":" in regex:
        raise ValueError("outlines would write an object open to any key here (any value)")
    regex = regex.replace(_CHAR_OLD, _CHAR_NEW).replace(_ESC_OLD, _ESC_NEW).replace(_NUMBER_OLD, _NUMBER_NEW)
    if whitespace_pattern:
        item_comma = re.compile(r"(\\*)\)\(," + re.escape(whitespace_pattern) + r"\(")
        regex = item_comma.sub(
            lambda m: m[0] if len(m[1]) % 2 else f"{m[1]})({whitespace_pattern},{whitespace_pattern}(", regex)
    for placeholder, pattern in patterns.items():
        regex = regex.replace(placeholder, _string_body(pattern, whitespace_pattern))
    for placeholder, number in integers.items():
        regex = regex.replace(f'"{placeholder}"', re.escape(str(number)))
    return regex


def _unused_marks(schema) -> tuple[str, str]:
    """Two private-use characters the schema holds nowhere, to open and close placeholders with: a string const
    that spelled a placeholder was written as the integer it stood for."""
    held = set(json.dumps(schema, ensure_ascii=False))
    marks = next(((chr(c), chr(c + 1)) for c in range(0xE000, 0xF8FF, 2)
                  if chr(c) not in held and chr(c + 1) not in held), None)
    if marks is None:
        raise ValueError("the schema holds every private-use character, which outlines' translation marks its "
                         "patterns with")
    return marks


# The integers outlines-core reads exactly (serde_json's i64 and u64); it reads others as doubles, and wrote
# `const: 18446744073709551617` as `1.8446744073709552e+19`.
_EXACT_INTEGERS = range(-2**63, 2**64)


def _wide_integers_held_out(schema, marks: tuple[str, str]) -> tuple[object, dict[str, int]]:
    """A copy of `schema` whose `const` and `enum` integers outside `_EXACT_INTEGERS` (in arrays and objects
    too) are placeholder strings, and each placeholder's integer (written back as its digits, where outlines-core
    wrote the string); `schema` itself where it has none."""
    found = [ptr for ptr, key, node in walk(schema) if key in ("const", "enum") and _holds_wide(node[key])]
    if not found:
        return schema, {}
    schema, integers = copy.deepcopy(schema), {}

    def held_out(value):
        if _wide(value):
            placeholder = f"{marks[0]}i{len(integers)}{marks[1]}"
            integers[placeholder] = value
            return placeholder
        if isinstance(value, list):
            return [held_out(v) for v in value]
        if isinstance(value, dict):
            return {k: held_out(v) for k, v in value.items()}
        return value

    for ptr, key, node in walk(schema):
        if ptr in found and key in ("const", "enum"):
            node[key] = held_out(node[key])
    return schema, integers


def _holds_wide(value) -> bool:
    if isinstance(value, list):
        return any(_holds_wide(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_wide(v) for v in value.values())
    return _wide(value)


def _wide(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value not in _EXACT_INTEGERS


def _patterns_held_out(schema, marks: tuple[str, str]) -> tuple[object, dict[str, str]]:
    """A copy of `schema` whose every `pattern` is a placeholder (between `marks`, which no schema regex of
    outlines-core's holds), and each placeholder's pattern; `schema` itself where it has none."""
    found = [ptr for ptr, key, node in walk(schema) if key == "pattern" and isinstance(node[key], str)]
    if not found:
        return schema, {}
    schema, patterns = copy.deepcopy(schema), {}
    for ptr, key, node in walk(schema):
        if ptr in found:
            placeholder = f"{marks[0]}p{len(patterns)}{marks[1]}"
            patterns[placeholder], node[key] = node[key], placeholder
    return schema, patterns


def _string_body(pattern: str, whitespace_pattern: str) -> str:
    """What outlines-core writes between a string's quotes for `pattern` (it drops the anchors)."""
    regex = outlines_core.json_schema.build_regex_from_schema(json.dumps({"type": "string", "pattern": pattern}),
                                                              whitespace_pattern)
    if not (regex.startswith('("') and regex.endswith('")')):
        raise ValueError(f"outlines-core wrote a pattern as {regex[:80]!r}")
    return regex[2:-2]


# As llguidance reads JSON, so that both backends take the same documents: an exponent's sign is optional (`1e5`),
# and it has at most two significant digits, as the llguidance grammar's check while decoding holds it
# (constrain/distinct_keys.py: `-5E81779` parsed as infinity); whitespace may come before an array's comma as
# before an object's (`[1 ,2]`: outlines-core writes `)(,`, the whitespace pattern and `(` between an array's items,
# each item a group; a string's pattern would have to hold that whole text, after an unescaped `)`, to be read as
# items: `^[0-9]+(,[ ]?[0-9]+)*$` is not).
_NUMBER_OLD = outlines_core.json_schema.NUMBER
_NUMBER_NEW = _NUMBER_OLD.replace("[eE][+-][0-9]+", "[eE][+-]?0*[0-9]{1,%d}" % MAX_EXPONENT_DIGITS)


def core_regex_length(regex: str) -> int:
    """The length of outlines-core's own regex behind `schema_regex`'s: what the size limit bounds (the schema's
    size, not the spelling of JSON's escapes, which the surrogate pairs made three times longer per string)."""
    return (len(regex) - regex.count(_ESC_NEW) * (len(_ESC_NEW) - len(_ESC_OLD))
            - regex.count(_CHAR_NEW) * (len(_CHAR_NEW) - len(_CHAR_OLD)))


def outlines_vocabulary(vocab: Vocabulary) -> outlines_core.Vocabulary:
    return outlines_vocabulary_from_bytes(vocab.token_bytes, vocab.eos_token_ids)


def compile_outlines(vocab: Vocabulary, regex: str, ov: outlines_core.Vocabulary | None = None) -> TokenDFA:
    """In-process build (seconds on a 152k vocabulary, cannot be cancelled): the server compiles in
    constrain/compile_worker.py's processes instead; this serves scripts and tests."""
    try:
        return TokenDFA.build(regex, ov if ov is not None else outlines_vocabulary(vocab), vocab.eos_token_ids)
    except (ValueError, RuntimeError) as exc:
        raise ConstraintError(f"outlines cannot compile this constraint: {str(exc)[:300]}") from None


class OutlinesGrammar(Grammar):
    backend = "outlines"

    def __init__(self, dfa: TokenDFA, vocab: Vocabulary, unenforced: tuple[str, ...] = (),
                 call_tag: bytes | None = None):
        self.dfa = dfa
        self.vocab = vocab
        self.unenforced = unenforced
        self.call_tag = call_tag
        self._rows: dict[int, np.ndarray] = {}
        self._budget_rows: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._distances: dict[int, np.ndarray] = {}
        self._eos = vocab.eos_words()

    @property
    def nbytes(self) -> int:
        """The size the grammar cache counts (read again at each use): the automaton and the mask rows written so
        far. A fixed allowance of 64 rows counted an enum of 1,990 words at 11 MB while the rows of the states
        decoding had visited held 85 MB more (QA round 27)."""
        return self.dfa.nbytes + 4 * self.vocab.words * (len(self._rows) + len(self._budget_rows))

    def matcher(self, lane: int = 0) -> "OutlinesMatcher":
        return OutlinesMatcher(self)

    def _live(self, state: int, budget: int | None) -> np.ndarray:
        """The state's tokens whose next state accepts within `budget` more tokens (None: ever)."""
        d = self.dfa
        lo, hi = d.offsets[state], d.offsets[state + 1]
        if budget is None and not d.dead[state]:  # (no pass over a string state's ~150k successors)
            return d.tokens[lo:hi]
        dist = d.dist[d.nexts[lo:hi]]
        limit = _INF - 1 if budget is None else budget
        return d.tokens[lo:hi][dist <= limit]

    def row(self, state: int) -> np.ndarray:
        """The state's mask row (EOS bits set when accepting): written once, then shared."""
        r = self._rows.get(state)
        if r is None:
            r = ids_to_words(self._live(state, None).astype(np.int64), self.vocab.words)
            if self.dfa.final[state]:
                r |= self._eos
            self._rows[state] = r
        return r

    def budget_row(self, state: int, budget: int) -> np.ndarray:
        """The state's row under a tight budget: only tokens whose next state accepts within `budget` more tokens
        (EOS bits when accepting). Cached by the largest successor distance within the budget (a state's
        successors have few distinct distances), so the last tokens before max_tokens cost a row copy rather
        than a filter over the state's transitions (~0.4 ms in a string on a 152k vocabulary). Bounded, oldest
        out first."""
        distances = self.distances(state)
        within = int(np.searchsorted(distances, budget, side="right"))
        key = (state, int(distances[within - 1]) if within else -1)
        r = self._budget_rows.get(key)
        if r is None:
            ids = self._live(state, key[1]) if key[1] >= 0 else np.zeros(0, dtype=np.int32)
            r = ids_to_words(ids.astype(np.int64), self.vocab.words)
            if self.dfa.final[state]:
                r |= self._eos
            self._budget_rows[key] = r
            while len(self._budget_rows) > _BUDGET_ROWS:
                self._budget_rows.popitem(last=False)
        return r

    def _successor_distances(self, state: int) -> np.ndarray:
        d = self.dfa
        return d.dist[d.nexts[d.offsets[state]:d.offsets[state + 1]]]

    def distances(self, state: int) -> np.ndarray:
        """The distinct finite distances to acceptance of the state's successors, ascending (small integers:
        counted, ~3x faster than `np.unique` over a string state's 150k transitions)."""
        s = self._distances.get(state)
        if s is None:
            dist = self._successor_distances(state)
            s = self._distances[state] = np.flatnonzero(np.bincount(dist[dist < _INF])).astype(np.int32)
        return s

    def slack(self, state: int) -> int:
        """Largest finite distance among the state's successors: budgets above it need no filtering (computed with
        the DFA, as asked at every fill of a budgeted row)."""
        return int(self.dfa.slack[state])


class OutlinesMatcher(Matcher):
    def __init__(self, grammar: OutlinesGrammar):
        self._g = grammar
        self._state = 0

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, tokens_left: int | None = None) -> None:
        out = bitmask[row].numpy()
        g, s = self._g, self._state
        if tokens_left is None or tokens_left - 1 >= g.slack(s) or g.dfa.dist[s] > tokens_left:
            # No budget limit needed, or no document fits any more (max_tokens below the shortest one): the
            # plain mask, and the answer ends at the limit, as llguidance's does.
            out[:] = g.row(s)
        else:  # tight budget: only tokens whose next state can still accept within the remaining tokens
            out[:] = g.budget_row(s, max(tokens_left - 1, -1))

    def accept(self, token_id: int) -> bool:
        state = self._next(self._state, token_id)
        if state is None:
            return False
        self._state = state
        return True

    def _next(self, state: int, token_id: int) -> int | None:
        """The state `token_id` leads to from `state`, where it leads on to acceptance; else None."""
        d = self._g.dfa
        lo, hi = d.offsets[state], d.offsets[state + 1]
        # (an int32 needle: a Python int makes numpy cast the state's whole int32 slice first, ~20x slower)
        i = lo + np.searchsorted(d.tokens[lo:hi], np.int32(token_id))
        if i >= hi or d.tokens[i] != token_id or d.dist[d.nexts[i]] == _INF:
            return None
        return int(d.nexts[i])

    def mask_after(self, tokens: list[int]) -> np.ndarray | None:
        state = self._state
        for token in tokens:
            state = self._next(state, token)
            if state is None:
                return None
        return self._g.row(state).view(np.uint32).copy()

    def is_terminated(self) -> bool:
        d, s = self._g.dfa, self._state
        return bool(d.final[s]) and not bool((d.dist[d.nexts[d.offsets[s]:d.offsets[s + 1]]] < _INF).any())

    def can_end(self) -> bool:
        return bool(self._g.dfa.final[self._state])

    def min_tokens_to_end(self) -> int | None:
        dist = int(self._g.dfa.dist[self._state])
        return None if dist >= _INF else dist

    @property
    def state(self) -> int:
        return self._state
