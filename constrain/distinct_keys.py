"""No key twice in one JSON object, enforced while decoding.

JSON Schema says nothing of repeated keys, and neither backend stops them where an object is open to undeclared
keys (`additionalProperties`, `patternProperties`, JSON mode): in a sweep, 4 of 16 answers under
`dict[str, int]`-like schemas wrote `{"art": -8, "art": -21, ...}`, which parses (the last value wins), so a
value is lost without a word, and strict parsers refuse it. A matcher wrapper follows the output, remembers each
open object's keys and clears the mask bits of the tokens that would close a key the object already has. Where
nothing else is left (every name a pattern admits is used and a comma was written), the repeat is allowed rather
than the answer failing: a repeated key is legal JSON. The same wrapper writes no key ending in a newline where a
names' pattern holds a `$` (`newline_names_refused`), on which the regex dialects' `$` disagree, and no number
whose exponent has more than two significant digits (`MAX_EXPONENT_DIGITS`), as outlines' number pattern
(constrain/outlines_backend.py). Never imports HTTP or model code.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import numpy as np
import torch

from constrain.checked import (NO_IDS, CheckedGrammar, CheckedMatcher, allowed_among, backend_matcher, clear_ids,
                               per_vocabulary)
from constrain.grammar import Grammar, Matcher
from constrain.json_follower import (BACKSLASH, COMMA_BYTE, MAX_EXPONENT_DIGITS, QUOTE, WS, Frame, JsonFollower,
                                    decode_key, exponent_digits)
from constrain.unique_items import ItemState, TokenIndex, item_events, token_index
from constrain.vocabulary import Vocabulary


@dataclass
class _Object(Frame):
    keys: set[str] = field(default_factory=set)  # (objects only)


class KeyTracker(JsonFollower):
    """Follows the JSON output with the keys written so far in each open object."""

    def _frame(self, is_array: bool) -> _Object:
        return _Object(is_array)

    def _key_ends(self) -> None:
        self.stack[-1].keys.add(self.stack[-1].key)

    def object_keys(self) -> set[str] | None:
        """The keys of the object being written, when the output stands where a key of it may close next."""
        if self.mode not in ("key", "member", "after") or not self.stack or not self.in_json:
            return None
        top = self.stack[-1]
        return None if top.is_array or not top.keys else top.keys


def closes_a_repeated_key(tracker: KeyTracker, data: bytes) -> bool:
    """Writing `data` next closes a key its object already has (looked at up to the first key it closes)."""
    keys = tracker.object_keys()
    return keys is not None and _key_closed_by(tracker, data) in keys


def closes_a_newline_name(tracker: KeyTracker, data: bytes) -> bool:
    """Writing `data` next closes an object's key that ends with a newline (looked at up to the first key it
    closes): Python's `$` matches before it, ECMA-262's and llguidance's do not (`newline_names_refused`)."""
    top = tracker.stack[-1] if tracker.stack else None
    if not tracker.in_json or top is None or top.is_array or tracker.mode not in ("key", "member", "after"):
        return False
    key = _key_closed_by(tracker, data)
    return key is not None and key.endswith("\n")


def _key_closed_by(tracker: KeyTracker, data: bytes) -> str | None:
    """The key that writing `data` next closes (the first), where the output stands in or before a key of an
    object (`tracker.mode` key, member or after a value); None where it closes none."""
    mode, buf, escaped = tracker.mode, bytearray(tracker.buf), tracker.escaped
    for c in data:
        if mode == "key":
            if escaped:
                escaped = False
            elif c == BACKSLASH:
                escaped = True
            elif c == QUOTE:
                return decode_key(bytes(buf))
            buf.append(c)
        elif c in WS:
            continue
        elif mode == "after" and c == COMMA_BYTE:
            mode = "member"
        elif mode == "member" and c == QUOTE:
            mode, buf, escaped = "key", bytearray(), False
        else:
            return None
    return None


_LONG_EXPONENT = re.compile(rb"[eE][+-]?0*[1-9][0-9]{%d}" % MAX_EXPONENT_DIGITS)


class _ExponentDigits:
    """Per vocabulary: the tokens that may go on an exponent (digits first, or a sign and digits), with the digits
    each adds (`run`) and how many of them come after leading zeros (`significant`); and the tokens that write an
    exponent too long by themselves (`whole`: none in GPT-2's, Qwen2's or Phi-3's vocabulary, where digits and
    letters are separate tokens; checked one by one)."""

    def __init__(self, vocab: Vocabulary):
        ids, run, significant = [], [], []
        for tid, data in enumerate(vocab.token_bytes):
            digits = re.match(rb"[+-]?([0-9]*)", data or b"")[1]
            if digits:
                ids.append(tid)
                run.append(len(digits))
                significant.append(len(digits.lstrip(b"0")))
        self.ids, self.run, self.significant = np.array(ids, dtype=np.int64), np.array(run), np.array(significant)
        self.whole = np.array([tid for tid, data in enumerate(vocab.token_bytes)
                               if data and _LONG_EXPONENT.search(data)], dtype=np.int64)

    def lengthening(self, digits: int) -> np.ndarray:
        """The tokens after which an exponent that has `digits` significant digits has too many."""
        over = self.run + digits if digits else self.significant
        return self.ids[over > MAX_EXPONENT_DIGITS]


def exponent_index(vocab: Vocabulary) -> _ExponentDigits:
    return per_vocabulary(_ExponentDigits, vocab)


def writes_a_long_exponent(tracker: JsonFollower, data: bytes) -> bool:
    """Writing `data` next gives a number an exponent of more than `MAX_EXPONENT_DIGITS` significant digits."""
    fork = copy.deepcopy(tracker)
    for c in data:
        fork.feed(bytes((c,)))
        if fork.mode == "number" and (exponent_digits(bytes(fork.buf)) or 0) > MAX_EXPONENT_DIGITS:
            return True
    return False


class _NewlineQuotes(list):
    """Per vocabulary: the tokens that write a newline's escape (`\\n`, `\\u000a`) and then a quote, which may
    close a key ending in a newline whatever was written before them."""

    def __init__(self, vocab: Vocabulary):
        super().__init__(tid for tid, data in enumerate(vocab.token_bytes)
                         if data and any(e in data for e in (b'\\n"', b'\\u000a"', b'\\u000A"')))
        self.ids = np.array(self, dtype=np.int64)


def newline_names_refused(schema) -> bool:
    """Whether some names' pattern of `schema` holds a `$` (`patternProperties`, `propertyNames`): then no key is
    written that ends with a newline. Python's `$` matches before a final newline, ECMA-262's and llguidance's do
    not, so `{"7\\n": "x"}` under `patternProperties: {"^\\d+$": {"type": "integer"}}` in an object open to other
    keys passed the grammar (and ajv) but not jsonschema. No reading then tells such a name apart."""
    from constrain.support import walk

    if not isinstance(schema, dict):
        return False
    for _, key, node in walk(schema):
        if key == "patternProperties" and isinstance(node[key], dict) and any("$" in p for p in node[key]):
            return True
        if key == "propertyNames" and isinstance(node[key], dict) and "$" in str(node[key].get("pattern", "")):
            return True
    return False


class _CommaKeys(dict):
    """Per vocabulary: the tokens that write a comma, then a whole key (`,"a"`, `, "a":`), by the key (as
    `unique_items.item_events` reads a string: ("s", its characters in UTF-8))."""

    def __init__(self, vocab: Vocabulary):
        super().__init__()
        found: dict[tuple, list[int]] = {}
        for tid, data in enumerate(vocab.token_bytes):
            rest = (data or b"").lstrip(b" \t\n\r")
            if not rest.startswith(b","):
                continue
            events, _ = item_events(ItemState(), rest[1:])
            if events and isinstance(events[0], tuple):
                found.setdefault(events[0], []).append(tid)
        self.update({k: np.array(v, dtype=np.int64) for k, v in found.items()})


def comma_key_index(vocab: Vocabulary) -> _CommaKeys:
    return per_vocabulary(_CommaKeys, vocab)


class DistinctKeysGrammar(CheckedGrammar):
    """A JSON grammar whose matchers write no key twice in one object (nor a key ending in a newline where that is
    refused, nor a number with a long exponent)."""

    def __init__(self, inner: Grammar, vocab: Vocabulary, names_restricted: bool = False,
                 newline_names: bool = False):
        super().__init__(inner)
        self.vocab = vocab
        self.names_restricted = names_restricted  # (some object's names are restricted: the lookahead is needed)
        self.newline_names = newline_names  # (no key ends with a newline: `newline_names_refused`)
        self.index = token_index(vocab)  # (built here, on a compile thread, not by the engine's first step)
        comma_key_index(vocab)
        exponent_index(vocab)
        if newline_names:
            per_vocabulary(_NewlineQuotes, vocab)

    def matcher(self, lane: int = 0) -> "DistinctKeysMatcher":
        return DistinctKeysMatcher(self.inner.matcher(lane), KeyTracker(self.call_tag), self.index, self.vocab,
                                   self.names_restricted, self.newline_names)


class DistinctKeysMatcher(CheckedMatcher):
    dead_end = "no key may follow here but one the object already has"  # (not raised: see fill_bitmask)
    yields = True  # (its refusals are of legal JSON: a check around it that is left with nothing may have them)

    def __init__(self, inner: Matcher, tracker: KeyTracker, index: TokenIndex, vocab: Vocabulary,
                 names_restricted: bool = False, newline_names: bool = False):
        super().__init__(inner, index.token_bytes)
        self.tracker = tracker
        self.index = index
        self.vocab = vocab
        self.names_restricted = names_restricted
        self.newline_quotes = per_vocabulary(_NewlineQuotes, vocab).ids if newline_names else None
        base = backend_matcher(inner)
        if newline_names and hasattr(base, "refuse_newline_keys"):
            base.refuse_newline_keys()
        self.exponents = exponent_index(vocab)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, tokens_left: int | None = None) -> None:
        """The inner mask less the tokens that close a repeated key, and those after which the grammar allows
        nothing else (`_leading_to_a_repeat`), and those that close a key ending in a newline (where refused), and
        those that make an exponent too long; unless that leaves nothing, where they are allowed in turn (the
        lookahead, the newline, the exponent, then the repeat: legal JSON) rather than the
        output failing; and all of them where a check around this one is left with nothing (`giving_way`)."""
        self.inner.fill_bitmask(bitmask, row, tokens_left)
        self._refused_here = NO_IDS
        repeats, newlines, exponents = self._repeats_active(), self._newlines_active(), self._exponents_active()
        if self.giving_way or not (repeats or newlines or exponents):
            return
        words = bitmask[row].numpy().view(np.uint32)
        closing = self._refused(words) if repeats else NO_IDS
        leading = self._leading_to_a_repeat(words, closing) if repeats else NO_IDS
        ending = self._closing_newline_names(words) if newlines else NO_IDS
        long = self._lengthening_exponents(words) if exponents else NO_IDS
        for refused in (np.concatenate([closing, leading, ending, long]), np.concatenate([closing, ending, long]),
                        np.concatenate([closing, long]), closing):
            if not len(refused):
                return
            kept = words.copy()
            clear_ids(kept, refused)
            if kept.any():
                words[:] = kept
                self._refused_here = refused
                return

    def _active(self) -> bool:
        return self._repeats_active() or self._newlines_active() or self._exponents_active()

    def _repeats_active(self) -> bool:
        return self.tracker.object_keys() is not None

    def _newlines_active(self) -> bool:
        t = self.tracker
        return self.newline_quotes is not None and t.in_json and t.mode in ("key", "member", "after") \
            and bool(t.stack) and not t.stack[-1].is_array

    def _exponents_active(self) -> bool:
        t = self.tracker
        return t.in_json and ((t.mode == "number" and exponent_digits(bytes(t.buf)) is not None)
                              or len(self.exponents.whole) > 0)

    def _lengthening_exponents(self, words: np.ndarray) -> np.ndarray:
        """The allowed tokens after which a number's exponent has more than `MAX_EXPONENT_DIGITS` significant
        digits: those that go on the exponent being written with too many (`_ExponentDigits`), and those that
        write one whole."""
        t, table = self.tracker, self.exponents
        digits = exponent_digits(bytes(t.buf)) if t.mode == "number" else None
        going_on = allowed_among(words, table.lengthening(digits)) if digits is not None else NO_IDS
        whole = [tid for tid in allowed_among(words, table.whole).tolist()
                 if writes_a_long_exponent(t, self.index.token_bytes[tid])]
        return np.concatenate([going_on, np.array(whole, dtype=np.int64)])

    def _closing_newline_names(self, words: np.ndarray) -> np.ndarray:
        """The allowed tokens that close a key ending in a newline: those that write a newline's escape and then a
        quote; inside a key that ends in a newline, those that begin with its closing quote; while an escape is
        under way, every token holding a quote (all checked one by one)."""
        t = self.tracker
        suspects = [self.newline_quotes]
        if t.mode == "key":
            written = bytes(t.buf)
            if t.escaped or b"\\u" in written[-5:]:
                suspects.append(self.index.quote_all)
            elif decode_key(written).endswith("\n"):
                suspects.append(self.index.quote_pre.get(b"", NO_IDS))
        allowed = allowed_among(words, np.unique(np.concatenate(suspects)))
        return np.array([tid for tid in allowed.tolist() if closes_a_newline_name(t, self.index.token_bytes[tid])],
                        dtype=np.int64)

    def _leading_to_a_repeat(self, words: np.ndarray, closing: np.ndarray) -> np.ndarray:
        """The allowed tokens that write the rest of a key the object already has (after `"` or `,"` where the key
        is to begin), after which the grammar forces the quote that closes it: a pattern's keys of one length
        (`^[a-z]{3}$`: after `{"agh":0,"ag`, an `h` left `"` alone, and the repeat was taken rather than no
        token). Only where the grammar restricts names (`names_restricted`: elsewhere a key may always go on), and
        by the bytes the backend forces after the token, not by a mask after it (which cost 0.3 s a step at 200
        keys of a `dict[str, int]`)."""
        if not self.names_restricted:
            return NO_IDS
        t = self.tracker
        keys = [k.encode("utf-8", "surrogatepass") for k in t.object_keys()]
        if t.mode == "key":
            written = bytes(t.buf)
            if t.escaped or b"\\" in written:
                return NO_IDS
            heads, leads = [k[len(written):] for k in keys if k.startswith(written)], (b"",)
        else:
            heads, leads = keys, ((b'"', b' "') if t.mode == "member" else (b',"', b', "'))
        by_bytes, refused = self.vocab.ids_by_bytes(), set(closing.tolist())
        base, leading = backend_matcher(self.inner), []
        for head in heads:
            for lead in leads:
                tid = by_bytes.get(lead + head) if head else None
                if tid is None or tid in refused or not allowed_among(words, np.array([tid])).size:
                    continue
                forced = base.forced_after([tid])
                if forced is not None and forced.startswith(b'"'):
                    leading.append(tid)
        return np.array(leading, dtype=np.int64)

    def _refused(self, words: np.ndarray) -> np.ndarray:
        """Tokens are looked up by the key they would close (`TokenIndex`, `_CommaKeys`); only those that hold
        an escaped quote are run through `closes_a_repeated_key`."""
        t, ix = self.tracker, self.index
        keys = [k.encode("utf-8", "surrogatepass") for k in t.object_keys()]
        fast: list[np.ndarray] = []
        if t.mode == "key":
            written = bytes(t.buf)
            if t.escaped or b"\\" in written:
                suspects = ix.quote_all
            else:
                fast = [ix.quote_pre[k[len(written):]] for k in keys
                        if k.startswith(written) and k[len(written):] in ix.quote_pre]
                suspects = ix.quote_other
        elif t.mode == "member":
            fast = [ix.start[("s", k)] for k in keys if ("s", k) in ix.start]
            suspects = ix.quote_other
        else:  # after a value: a comma, then a key
            comma_keys = comma_key_index(self.vocab)
            fast = [comma_keys[("s", k)] for k in keys if ("s", k) in comma_keys]
            suspects = NO_IDS
        slow = [tid for tid in allowed_among(words, suspects).tolist()
                if self._closes_a_refused_key(ix.token_bytes[tid])]
        fast = [allowed_among(words, ids) for ids in fast]
        return np.concatenate([*fast, np.array(slow, dtype=np.int64)])

    def _refuses(self, data: bytes) -> bool:
        return self._closes_a_refused_key(data) or writes_a_long_exponent(self.tracker, data)

    def _closes_a_refused_key(self, data: bytes) -> bool:
        return closes_a_repeated_key(self.tracker, data) or (
            self.newline_quotes is not None and closes_a_newline_name(self.tracker, data))

    def _feed(self, data: bytes) -> None:
        self.tracker.feed(data)


def names_restricted(schema) -> bool:
    """Whether some object of `schema` restricts its names by a pattern (`patternProperties`, `propertyNames`),
    where a key may have no way on but its closing quote; an open object's key may always go on."""
    from constrain.support import walk

    return isinstance(schema, dict) and any(key in ("patternProperties", "propertyNames")
                                            for _, key, _ in walk(schema))
