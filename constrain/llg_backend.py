"""The llguidance backend: JSON schema / regex -> llguidance grammar -> LLMatcher per sequence.

Context-free and compiled in milliseconds, so it serves what a DFA cannot express (recursion, any JSON object)
and every first request. Never blocks on a model; never touches HTTP.

Budget rule: llguidance exposes no distance-to-accept, so the matcher measures one: it walks a copy of itself
to a greedy short completion, one byte token at a time (prefer closing quotes, brackets and `0`; take forced
bytes as they come), spelled with the vocabulary's longest tokens, but for bytes the grammar forces: those take
the tokens llguidance forces for them, the only ones its mask then allows. Near the budget (the tokens left within
twice the completion plus _CLOSING_MARGIN) the engine has each sampled token vetted (`vet`): a token after which the
completion would no longer fit is replaced by the completion's next token; the mask stays the grammar's (with no
slack left it held only that token, which overrode greedy choices, logit_bias and the logprobs where another token
also fit: `[ab]` with one token left always wrote `a`, at logprob 0). So the document closes complete and valid
within max_tokens whenever the greedy completion fits at the start and, far from the budget, no single token more
than doubles what remains to write. Far from the budget the completion is re-measured every
_CLOSING_RECHECK_STEPS steps; a walk costs well under a millisecond, except a long one (~11 µs a byte, up to eight
bytes a token left: `_walk_limit`): one far out of reach is re-measured ever less often.
"""

from __future__ import annotations

import copy
import decimal
import fractions
import functools
import json
import logging
import math
import re
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import unquote, urldefrag, urljoin

import llguidance
import llguidance.hf
import numpy as np
import torch

from constrain.grammar import ConstraintError, Grammar, Matcher
from constrain.json_follower import MAX_EXPONENT_DIGITS, Frame, JsonFollower, decode_key, exponent_digits
from constrain.pattern_dialects import portable_pattern, widest_pattern, without_edge_anchors
from constrain.recursive_meets import intersected_recursive_meetings
from constrain.regex_sets import Work, pattern_examples
from constrain.support import (ANNOTATIONS, STANDARD_FORMATS, escape_pointer_part, gives_another_base, id_keyword,
                               llguidance_escape_gap, map_subschemas, node_dialects, pointer_child, pointers_of,
                               resolve_ref, schema_objects, walk, walk_with_refs)
from constrain.vocabulary import Vocabulary

log = logging.getLogger(__name__)

_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[(.*?)\]')
_UNKNOWN_FORMAT = "Unknown format: "
_ONE_OF_AS_ANY_OF = "oneOf not fully supported, falling back to anyOf"
_ONE_OF_UNSUPPORTED = "oneOf constraints are not supported"  # (the strict pass's word for the same oneOf)
_REPEATED = re.compile(r" \(\d+ times\)$")  # how llguidance ends a warning it gave more than once


# Bytes the closing walk tries, best first: closers, then the shortest JSON values, letters (a letter ends a
# pattern's alternative sooner than punctuation opens another: `Z` ends a date-time where `+` needs `00:00`), then
# anything printable, a space last (JSON never needs one: `{"x": 3}` for `{"x":3}` under `minimum: 3` was a token
# more than the shortest answer, which then did not fit the budget it was measured against).
_CLOSING_PREFERENCE = (b'}]",0:ntf[{1' + bytes(range(ord("a"), ord("z") + 1)) + bytes(range(ord("A"), ord("Z") + 1))
                       + bytes(range(0x21, 0x7F)) + b" "
                       + bytes(range(0x80, 0x100)) + bytes(range(0x20)))
# A walk longer than this gives up: no forcing (the grammar may not close at all). The bytes a completion may
# take grow with the tokens left (`_walk_limit`): a real schema whose shortest document is 2,479 bytes (656 Qwen2
# tokens, JSONSchemaBench Github_ultra o90698) was never steered to one, and ran to max_tokens 2,000 (QA realschemas
# F1); long key names spell 4-6.4 bytes a token. A walk costs ~11-16 us a byte (a failed one to the cap: ~0.25 s,
# retried ever less often).
_CLOSING_MAX_BYTES = 2048
_CLOSING_BYTES_A_TOKEN = 8
_CLOSING_MAX_BYTES_CAP = 16384
_CLOSING_RECHECK_STEPS = 8  # far from the budget, re-measure the completion this often
_CLOSING_RECHECK_SHARE = 16  # or, for a long one, every 1/16th of its length (a walk costs as its bytes)
_CLOSING_MAX_BACKOFF = 256  # a walk that found no completion is retried ever less often, up to this many steps
_CLOSING_LONG = 64  # a completion of more tokens than this and twice the tokens left is retried as rarely
# The completion is measured every step from twice its length plus this many tokens before the budget runs out
# (`_near`), and sampled tokens are vetted from there on (`_near_for`), but those inside a JSON string value, number
# or literal only from _CLOSING_NEAR_FACTOR times (completion + margin): such a token seldom makes the completion
# much longer, and one that does is seen by the next step's measure.
_CLOSING_MARGIN = 8
_CLOSING_NEAR_FACTOR = 1.25
# A token holding one of these bytes can open a member, an item or a value with required parts: before any growth
# is seen with a schema, such a token is vetted as if the completion could grow by _CLOSING_GROWTH tokens at once.
_OPENERS = frozenset(b"{[,:")
_WHITESPACE = b" \t\r\n"  # (JSON's; what may stand before untagged calls under tool_choice "auto": `LEAD`)
_CLOSING_GROWTH = 32
# The follower's modes inside a JSON string value, number or literal (`_near_for`). Where completions write no key
# twice (`LlgMatcher.write_distinct_keys`), the completion measured before a token is taken as one after it only for
# a token inside one of these that holds none of _STRUCTURE: the keys written so far and the one being written stay
# as they were.
_VALUE_MODES = frozenset({"string", "number", "literal"})
_STRUCTURE = frozenset(b'"\\{}[],:')
_EXPONENT_BYTES = b"+-0123456789"  # (what may go on a number's exponent)
_NEWLINE_ESCAPES = (b"\\n", b"\\u000a", b"\\u000A")  # (how a key ends in a newline: `KeySets.closing_a_newline_key`)
_STUCK_RUN = 4  # the walk wrote the same byte this many times in a row: try the schema's string hints
# ... or this many bytes without a closer, in a cycle the run misses (`((ab)*c)+`: a picked `a`, a forced `b`)
_STUCK_CYCLE = 16
_MAX_HINTS = 32
_HINT_STARTS = 64  # a top-level regex's closing tries the tails of a hint that start within its first 64 bytes
_MAX_HINT_BYTES = 256  # (a regex's longer example would make a completion too long for the rule to steer to)
_CHECKS_PER_WALK = 256  # questions a closing walk puts to the checks (~0.1-0.5 ms each; a repeat is free)
_MAX_KEY_NAMES = 256  # required names a closing walk tries where it writes a key (`required_names`)
_MEMBER_BYTES = 5  # bytes a required member takes beyond its name, at the least: `"":0,` (`required_names`)
# Function names a completion through each name walks once a first such walk on the grammar has ranked them all
# (`LlgMatcher._calls_after_tag`): one walk a function, ~1 ms each, ran at each measure while a name is ahead
_NAMES_WALKED = 4
# of which a JSON value of XML tool calls gives its closing walks as endings, shortest first (each is tried at every
# step of a walk: ~2 us each)
_MAX_JSON_KEY_ENDINGS = 16
_NUMBER_TAIL_MAX = 24  # bytes a number's tail is searched to (`_number_tail`)
_NUMBER_TAIL_COMPARED = 6  # a first run longer than this is not compared with a second (an enum's shorter value)
_MAX_FILL = 64  # bytes of filler a string is tried with (`_filler_tail`)
_FORCED_PROBES = 16  # first bytes of a string compared by the bytes they force (`_least_forced`)
_OPEN_PROBES = 4  # of those, bytes that force no end looked into one byte further
# Strings that llguidance's own formats accept (the walk's greedy bytes never write an `@` or a `:`).
_FORMAT_EXAMPLES = {"email": "a@a.aa", "idn-email": "a@a.aa", "uri": "a:a", "iri": "a:a", "ipv4": "0.0.0.0",
                    "ipv6": "::", "uuid": "ffffffff-ffff-ffff-ffff-ffffffffffff", "duration": "P1D",
                    "date": "2000-01-01", "time": "00:00:00Z", "date-time": "2000-01-01T00:00:00Z"}


class KeySets(JsonFollower):
    """Follows the output with the keys written so far in each open object, so that a closing walk can avoid
    writing a key twice in one object (which would parse as one property), and a key ending in a newline where
    such keys are refused (`newline_keys_refused`, constrain/distinct_keys.py)."""

    newline_keys_refused = False

    def _frame(self, is_array: bool) -> "_KeyedFrame":
        return _KeyedFrame(is_array)

    def _key_ends(self) -> None:
        self.stack[-1].keys.add(self.stack[-1].key)

    def closing_repeats_a_key(self) -> bool:
        """A quote now would end a key that its object already has."""
        return self.mode == "key" and not self.escaped and decode_key(bytes(self.buf)) in self.stack[-1].keys

    def closing_a_newline_key(self) -> bool:
        """A quote now would end a key that ends in a newline, where such keys are refused."""
        return self.newline_keys_refused and self.mode == "key" and not self.escaped \
            and self.buf.endswith(_NEWLINE_ESCAPES) and decode_key(bytes(self.buf)).endswith("\n")

    def copy(self) -> "KeySets":
        c = KeySets()
        c.mode, c.escaped, c.buf = self.mode, self.escaped, bytearray(self.buf)
        c.newline_keys_refused = self.newline_keys_refused
        c.calls = self.calls.copy() if self.calls is not None else None
        c.stack = [_KeyedFrame(f.is_array, f.key, f.index, set(f.keys)) for f in self.stack]
        return c


@dataclass
class _KeyedFrame(Frame):
    keys: set[str] = field(default_factory=set)  # objects: the keys written so far


def string_hints(schema: Any) -> tuple[bytes, ...]:
    """Short strings that the schema's `pattern`s and `patternProperties` names (one per top-level alternative) and
    llguidance's formats accept, as a JSON string holds them (escaped), for closing walks stuck inside such a string
    or key (a pattern that must find `[a-f0-9]{24}`, an `@`). Computed with the compile: ~0.02 ms at the median,
    ~0.5 ms at p90 and ~3 ms at p99 over all MaskBench schemas (before names were taken too)."""
    patterns: dict[str, None] = {}
    found: dict[bytes, None] = {}
    for _, key, node in walk_with_refs(schema):
        if key == "pattern" and isinstance(node["pattern"], str):
            patterns[node["pattern"]] = None
        elif key == "patternProperties" and isinstance(node[key], dict):  # (keys: `propertyNames` rewritten)
            patterns.update((name, None) for name in node[key] if isinstance(name, str))
        elif key == "format" and isinstance(node["format"], str) and node["format"] in _FORMAT_EXAMPLES:
            found[_FORMAT_EXAMPLES[node["format"]].encode()] = None
    work = Work.for_example()  # (one budget for all: a schema's patterns cannot make this slow)
    for pattern in patterns:
        for example in pattern_examples(pattern, work) if len(found) < _MAX_HINTS else ():
            if example:
                found[json.dumps(example, ensure_ascii=False)[1:-1].encode()] = None  # (as a JSON string holds it)
    return tuple(found)[:_MAX_HINTS]


def integer_divisors(schema: Any) -> tuple[int, ...]:
    """The schema's whole `multipleOf`s above 1, for closing walks inside an integer that may not end as it is
    (`_multiple_tail`)."""
    found: dict[int, None] = {}
    for _, key, node in walk_with_refs(schema):
        value = node.get("multipleOf") if key == "multipleOf" else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 1 \
                and float(value).is_integer():
            found[int(value)] = None
    return tuple(found)[:_MAX_HINTS]


_INTEGER = re.compile(rb"-?[1-9][0-9]*")


def _multiple_tail(walk: "llguidance.LLMatcher", divisors: tuple[int, ...], number: bytes,
                   byte_tokens: dict[int, int], closers: frozenset[int]) -> list[int] | None:
    """Digits after which the integer being written (`number`) is a multiple of one of `divisors`, where it may
    not end as it is. The walk's first choice, a `0`, never gets there under a divisor prime to 10 (`multipleOf:
    101` ran 200 tokens of digits to max_tokens) and takes ten of them under 1024; a number a·10^k + d is a multiple
    of m for d = -a·10^k mod m, which has k digits once 10^k >= m."""
    if not _INTEGER.fullmatch(number) or any(walk.validate_tokens([c]) == 1 for c in closers):
        return None
    magnitude = int(number.lstrip(b"-"))
    for m in divisors:  # (the schema's: only one whose multiple may end the number here will do)
        for k in range(1, len(str(m)) + 1):
            d = -magnitude * 10 ** k % m
            if d < 10 ** k:
                tail = [byte_tokens[b] for b in str(d).zfill(k).encode()]
                if walk.validate_tokens(tail) == len(tail) and _ends_after(walk, tail, closers):
                    return tail
    return None


def _number_tail(walk: "llguidance.LLMatcher", tables: _WalkBytes, written: bytes) -> list[int] | None:
    """The bytes that finish the number being begun (or written) where no one byte may end it: the shorter of two
    greedy runs, one taking the largest digit that fits, the other the first, each ending at the first digit after
    which the number may end. The first digit alone wrote `100` under `minimum: 42`, a token more than `90` (the
    largest finishes any range in its fewest digits, but alone writes `2000` where `enum: [100, 2000]` takes
    `100`): the completion overestimated, and answers that fitted the budget were cut. `written`: the number's
    bytes so far; neither run ends it as `-0` (which checks on the number refuse where they refuse 0,
    `_closing_pick`). None where neither ends within _NUMBER_TAIL_MAX bytes."""
    minus = tables.byte_tokens.get(ord("-"))
    best = None
    for digits in (b"9876543210", b"0123456789"):  # (the largest first: the fewest digits of any one range)
        if best is not None and len(best) > _NUMBER_TAIL_COMPARED:
            break  # (each step of a run asks ~75 questions: 3 ms a number under `minimum: 1e15`, for a digit at most)
        order = [tables.byte_tokens[b] for b in digits if b in tables.byte_tokens]
        run: list[int] = []
        while len(run) < _NUMBER_TAIL_MAX and (best is None or len(run) + 1 < len(best)):  # (only a shorter one)
            fitting = [t for t in tables.number_order if walk.validate_tokens([*run, t]) == len(run) + 1]
            signed = run[-1:] == [minus] or (not run and written == b"-")
            ending = next((t for t in fitting if t in tables.digits and not (signed and t == tables.zero)
                           and _ends_after(walk, [*run, t], tables.closers, tables.eos)), None)
            if ending is not None:
                best = [*run, ending]
                break
            step = next((t for t in order if t in fitting), fitting[0] if fitting else None)
            if step is None:
                break
            run.append(step)
    return best


def _filler_tail(walk: "llguidance.LLMatcher", tables: _WalkBytes) -> list[int] | None:
    """In a string whose closing quote does not fit yet: the fewest of one filler byte after which it does, and
    the quote; None where none gets there in _MAX_FILL bytes. The walk's preferred bytes filled `minLength: 10`
    with `}}}}]]]],""` (11 tokens where `{"s":"xxxxxxxxxx"}` takes 6), and a string that must not be empty with a
    whole hint of the schema's, whichever string that came from (`ffffffff-ffff-...` of another property's
    uuid): the completion overestimated, and answers that fitted the budget were cut (QA budget F1)."""
    quote = tables.quote
    for filler in tables.fillers:
        if walk.validate_tokens([filler, filler]) != 2:  # (no copy for a filler that does not fit twice)
            continue
        probe = walk.deep_copy()
        for k in range(1, _MAX_FILL + 1):
            if not probe.consume_token(filler):
                break
            if probe.validate_tokens([quote]) == 1:
                return [filler] * k + [quote]
    return None


def _ends_after(walk: "llguidance.LLMatcher", tail: list[int], closers: frozenset[int],
                eos: int | None = None) -> bool:
    """Whether the number may end after `tail`: a closer follows it, or (a number at the root) the output ends,
    which the matcher's `eos` token tells without a copy of it."""
    if any(walk.validate_tokens([*tail, c]) == len(tail) + 1 for c in closers):
        return True
    if eos is not None:
        return walk.validate_tokens([*tail, eos]) == len(tail) + 1
    probe = walk.deep_copy()
    return probe.consume_tokens(tail) and probe.is_accepting()


def required_names(schema: Any) -> tuple[bytes, ...]:
    """The names the schema's objects require, as a JSON string holds them (escaped): a closing walk that must
    write a key writes the first of these the grammar takes there, not the first letters that fit (which spell the
    first declared property, often an optional one: `"attendees": []` before the required `"end_date"`). Those of
    the shortest `required` list first (its names' bytes, and a few a member for its quotes, colon, value and
    comma), then the shortest: where `anyOf`/`oneOf` branches require different keys, the first name the walk
    writes picks the branch, and the shortest name alone picked `{"a":"","bb":"","cc":"","dd":0}` (11 tokens)
    where `{"xyz":0}` closes in 5 (QA budget F7)."""
    names: dict[str, int] = {}  # name -> the fewest bytes of a `required` list that holds it
    for _, key, node in walk_with_refs(schema):
        if key == "required" and isinstance(node["required"], list):
            required = [n for n in node["required"] if isinstance(n, str)]
            size = sum(len(n) + _MEMBER_BYTES for n in required)
            names.update((n, min(size, names.get(n, size))) for n in required)
    spelled = sorted(((size, json.dumps(n, ensure_ascii=False)[1:-1].encode()) for n, size in names.items()),
                     key=lambda pair: (pair[0], len(pair[1])))
    return tuple(name for _, name in spelled[:_MAX_KEY_NAMES])


@dataclass(frozen=True)
class _WalkBytes:
    """A vocabulary's byte tokens as the closing walk uses them: made once per vocabulary (~23 us a walk, a third
    of a short walk's time, when made each time)."""

    byte_tokens: dict[int, int]
    order: tuple[int, ...]  # byte tokens in _CLOSING_PREFERENCE order
    closers: frozenset[int]
    quote: int | None
    letter: int | None
    null_byte: int | None
    zero: int | None
    number_bytes: frozenset[int]  # the bytes a JSON number is written with
    number_order: tuple[int, ...]  # those in _CLOSING_PREFERENCE order
    digits: frozenset[int]  # (the bytes a number may end with)
    fillers: tuple[int, ...]  # bytes that fill a string in few tokens (`_filler_tail`)
    eos: int | None  # an end-of-sequence token the matcher takes where the output may end


_WALK_BYTES: "weakref.WeakKeyDictionary[Vocabulary, _WalkBytes]" = weakref.WeakKeyDictionary()


def _walk_bytes(vocab: Vocabulary) -> _WalkBytes:
    found = _WALK_BYTES.get(vocab)
    if found is None:
        byte_tokens = vocab.byte_tokens()
        found = _WalkBytes(byte_tokens=byte_tokens,
                           order=tuple(byte_tokens[b] for b in dict.fromkeys(_CLOSING_PREFERENCE) if b in byte_tokens),
                           closers=frozenset(byte_tokens[b] for b in b'}]",:' if b in byte_tokens),
                           quote=byte_tokens.get(ord('"')), letter=byte_tokens.get(ord("q")),
                           null_byte=byte_tokens.get(ord("n")), zero=byte_tokens.get(ord("0")),
                           number_bytes=frozenset(byte_tokens[b] for b in b"-0123456789.eE+" if b in byte_tokens),
                           number_order=tuple(byte_tokens[b] for b in dict.fromkeys(_CLOSING_PREFERENCE)
                                              if b in b"-0123456789.eE+" and b in byte_tokens),
                           digits=frozenset(byte_tokens[b] for b in b"0123456789" if b in byte_tokens),
                           eos=min(vocab.eos_token_ids) if vocab.eos_token_ids else None,
                           fillers=_fillers(vocab, byte_tokens))
        _WALK_BYTES[vocab] = found  # (two threads may both make it: the same value)
    return found


def _fillers(vocab: Vocabulary, byte_tokens: dict[int, int]) -> tuple[int, ...]:
    """The byte whose runs the vocabulary spells in the longest tokens (`-` in Qwen2's and GPT-2's: 16 a token;
    no whitespace: a string of blanks reads as an empty one), then `a`: a string's filler (`_filler_tail`)."""
    ids = vocab.ids_by_bytes()

    def run(b: int) -> int:
        k = 1
        while k < 64 and bytes([b]) * (k + 1) in ids:
            k += 1
        return k

    printable = [b for b in range(0x21, 0x7F) if b not in b'"\\' and b in byte_tokens]
    best = max(printable, key=lambda b: (run(b), b == ord("a")), default=None)
    chosen = dict.fromkeys(b for b in (best, ord("a")) if b is not None and b in byte_tokens)
    return tuple(byte_tokens[b] for b in chosen)


def closing_tokens(matcher: "llguidance.LLMatcher", vocab: Vocabulary, keys: KeySets | None = None,
                   hints: tuple[bytes, ...] = (), distinct_keys: bool = False,
                   key_names: tuple[bytes, ...] = (), endings: tuple[bytes, ...] = (),
                   divisors: tuple[int, ...] = (), refuses: "Callable[[bytes, bool], bool] | None" = None,
                   values: tuple[bytes, ...] = (), max_bytes: int = _CLOSING_MAX_BYTES) -> list[int] | None:
    """Tokens of a short completion from `matcher`'s state to an accepting one (`_walked_closing`), or None. For
    output that is not JSON (no `keys`: a top-level regex or choice), a hint's tail that ends the output is taken
    where it is shorter: the walk follows the alternative its preferred bytes begin (`\\d{20}|N/A` wrote twenty
    digits, cut at max_tokens 5, where `N/A` fitted). A completion the matcher does not take as spelled (an added
    token in text, which llguidance takes for a special one) is spelled with ordinary tokens."""
    walked = _walked_closing(matcher, vocab, keys, hints, distinct_keys, key_names, endings, divisors,
                             refuses=refuses, values=values, max_bytes=max_bytes)
    if walked is not None and matcher.validate_tokens(walked) != len(walked):  # (an added token it does not take)
        walked = _walked_closing(matcher, vocab, keys, hints, distinct_keys, key_names, endings, divisors,
                                 ordinary=True, refuses=refuses, values=values, max_bytes=max_bytes)
    walked = _as_forced(matcher, vocab, walked) if walked is not None else None
    if keys is None and hints:
        ending = _ending_hint(matcher, vocab, hints)
        ending = _as_forced(matcher, vocab, ending) if ending is not None else None
        if ending is not None and (walked is None or len(ending) < len(walked)):
            return ending
    return walked


def _as_forced(matcher: "llguidance.LLMatcher", vocab: Vocabulary, ids: list[int]) -> list[int]:
    """`ids`, a completion from `matcher`'s state, as llguidance lets it be written: where its grammar forces bytes,
    the mask holds only the tokens llguidance forces, the tokenizer's own for them read after the token before
    (`","` `_` `id` where the walk spelled `","` `_id`: one token more, and half the answers to a schema with a
    required `_id` ended one token short of their `}`). Those are taken, and the rest spelled again from where
    they end; `ids` as they are where the two do not line up."""
    walk = matcher.deep_copy()
    out, rest = [], list(ids)
    while rest:
        forced = walk.compute_ff_tokens()
        if forced:
            rest = _after_bytes(rest, b"".join(vocab.token_bytes[t] or b"" for t in forced), vocab)
            if rest is None or not walk.consume_tokens(forced):
                return ids
            out += forced
        elif walk.consume_token(rest[0]):
            out.append(rest.pop(0))
        else:
            return ids
    return out


def _after_bytes(ids: list[int], data: bytes, vocab: Vocabulary) -> list[int] | None:
    """`ids` less the tokens that spell `data` from their start, a token that `data` ends inside spelled again
    from there; None where `ids` do not begin with `data`."""
    for i, t in enumerate(ids):
        if not data:
            return ids[i:]
        piece = vocab.token_bytes[t] or b""
        if data.startswith(piece):
            data = data[len(piece):]
        elif piece.startswith(data):
            tail = vocab.spell(piece[len(data):], ordinary=True)
            return tail + ids[i + 1:] if tail is not None else None
        else:
            return None
    return [] if not data else None


def _ending_hint(matcher: "llguidance.LLMatcher", vocab: Vocabulary, hints: tuple[bytes, ...]) -> list[int] | None:
    """The fewest tokens of a hint's tail (the longest that fits, tried within its first _HINT_STARTS bytes) after
    which `matcher` may end; None where none does."""
    byte_tokens, best = _walk_bytes(vocab).byte_tokens, None
    for hint in hints:
        for start_at in range(min(len(hint), _HINT_STARTS)):
            tail = hint[start_at:]
            ids = [byte_tokens.get(b) for b in tail]
            if None in ids or matcher.validate_tokens(ids) != len(ids):
                continue
            probe = matcher.deep_copy()
            if probe.consume_tokens(ids) and probe.is_accepting():
                spelled = vocab.spell(tail)
                if spelled is not None and matcher.validate_tokens(spelled) != len(spelled):
                    spelled = vocab.spell(tail, ordinary=True)
                if spelled is not None and (best is None or len(spelled) < len(best)):
                    best = spelled
                break
    return best


def _walk_limit(tokens_left: int) -> int:
    """The bytes a completion is walked with `tokens_left` tokens left: what they may spell, within bounds."""
    return max(_CLOSING_MAX_BYTES, min(_CLOSING_MAX_BYTES_CAP, _CLOSING_BYTES_A_TOKEN * tokens_left))


def _walked_closing(matcher: "llguidance.LLMatcher", vocab: Vocabulary, keys: KeySets | None = None,
                    hints: tuple[bytes, ...] = (), distinct_keys: bool = False,
                    key_names: tuple[bytes, ...] = (), endings: tuple[bytes, ...] = (),
                    divisors: tuple[int, ...] = (), ordinary: bool = False,
                    refuses: "Callable[[bytes, bool], bool] | None" = None,
                    values: tuple[bytes, ...] = (), max_bytes: int = _CLOSING_MAX_BYTES) -> list[int] | None:
    """The shorter of two walks (`_walk_once`), one with the shortcuts that commit to a value (a string's filler, a
    number's fewest digits, a string's least forced first byte) and, where it took one, one without: a value short
    by itself may make the rest longer (`"ping"` of an enum whose `if`/`then` then requires another property, 8
    tokens where `"get_weather"` closed in 6; QA review F1), and the walk never goes back on a choice."""
    args = (matcher, vocab, keys, hints, distinct_keys, key_names, endings, divisors, ordinary, refuses, values,
            max_bytes)
    took = [False]
    out = _walk_once(*args, shortcuts=took)
    if took[0]:
        plain = _walk_once(*args, shortcuts=None)
        if plain is not None and (out is None or len(plain) < len(out)):
            return plain
    return out


def _walk_once(matcher: "llguidance.LLMatcher", vocab: Vocabulary, keys: KeySets | None, hints: tuple[bytes, ...],
               distinct_keys: bool, key_names: tuple[bytes, ...], endings: tuple[bytes, ...],
               divisors: tuple[int, ...], ordinary: bool, refuses: "Callable[[bytes, bool], bool] | None",
               values: tuple[bytes, ...], max_bytes: int, shortcuts: list[bool] | None) -> list[int] | None:
    """Tokens of a short completion from `matcher`'s state to an accepting one, or None when the walk finds
    none (in `max_bytes`). The walk goes byte by byte on a copy; the bytes are then spelled with the vocabulary's
    longest tokens. Greedy, not minimal: it may overestimate, which only makes forcing start earlier. `keys`
    follows the JSON output so far (at the same state): inside a string, a quote that fits ends it (`}` there is
    only a character), and with `distinct_keys` it writes no key twice in one object: `""`, then `"q"`, `"qq"`... With
    `hints` (`string_hints`), a walk that keeps writing one byte tries to finish the string with a hint, or with
    a hint's tail, after which a closing quote fits. Failing that, it stops writing that byte where another fits
    (`0.000...` under `exclusiveMinimum: 0` goes on with a 1), until it next writes a closer. With `key_names`
    (`required_names`) and `keys`, a key being written is finished as one of those names where the grammar
    takes it. `endings` are byte strings that end a part of the output (a tag after a value that is not JSON): at
    each step the first that the grammar takes whole, but not twice in a row (text inside a value then), is written,
    and forced bytes stop where one may begin. Special tokens the grammar forces, and those in
    `endings`, are written `\\xff[id]`, as llguidance writes forced bytes; they stay themselves in the result. With
    `divisors` (`integer_divisors`) and `keys`, an integer that may not end as it is gets the digits that make it a
    multiple of one (`_multiple_tail`). With `refuses` (the checks applied while decoding, constrain/checked.py),
    no byte is written that finishes a value they refuse, nor a hint, name or multiple that does, and the walk
    does not end where they say the output cannot: `exclusiveMinimum: 0, maximum: 0.5` wrote `0`, `contains`
    wrote `[]`, `uniqueItems` wrote `""` twice, each refused, and the answer ran to max_tokens. A check judges
    the whole text from the walk's start (bytes, and whether the output ends after them); a walk that asks more
    than _CHECKS_PER_WALK times finds none. Once they refused something, a value begins as one of `values` (JSON
    texts of the checked keywords' const and enum values) where the grammar takes it: `contains: {"const": 7}`
    needs a 7, which the greedy walk never writes. With `shortcuts` (and no `refuses`: the checks judge objects
    a shortcut's value may make longer), it takes `_filler_tail`, `_number_tail` and `_least_forced`, and notes in
    `shortcuts[0]` that it took one."""
    tables = _walk_bytes(vocab)
    shortcuts = shortcuts if refuses is None else None
    byte_tokens, closers, quote = tables.byte_tokens, tables.closers, tables.quote
    # each ending's tokens, and whether it is a JSON key (`"name":`, tried only where a key may begin: after `{` or `,`)
    ending_tokens = [(ids, e[:1] == b'"') for e in endings if (ids := _forced_ids(e, byte_tokens))]
    key_endings = [e for e in endings if e[:1] == b'"']
    endings = tuple(e for e in endings if e[:1] != b'"')  # (the others, whose beginnings forced bytes stop before)
    # bytes of the endings' text that begin none (nor whitespace): a value the endings are text inside takes some
    # of them; where an ending begins a part (between a call's parameters) the grammar takes none
    firsts = {e[0] for e in endings if e}
    probes = [byte_tokens[b] for b in sorted({b for e in endings for b in _SPECIAL_MARK.sub(b"", e)[1:]})
              if b not in firsts and b not in _WHITESPACE and b in byte_tokens]
    specials = {int(i) for data in endings for i in _SPECIAL_MARK.findall(data)}  # (kept as they are)
    walk = matcher.deep_copy()
    keys = keys.copy() if keys is not None else None
    out: list[int] = []
    text = bytearray()  # the bytes written, special tokens left out: what `refuses` judges
    run, last = 0, None  # how many times in a row the walk picked `last`
    try_at = _STUCK_RUN  # the run at which hints are tried next (doubling after a miss)
    written, cycle_at = 0, _STUCK_CYCLE  # bytes since a closer or a hint; likewise
    avoid: set[int] = set()  # bytes the walk got stuck writing: others first, until it writes a closer
    asked, refusals = [0], [0]  # questions put to `refuses`, and how many it said yes to
    closes_refused = [False]  # it refused a `]` or `}` (or the end): members may change its verdict
    verdicts: dict[tuple[int, bytes, bool], bool] = {}  # its answers, by where and what was asked
    hinted = False  # the hints were tried in the string being written (where its quote did not fit yet)
    value_tokens = [(ids, v in CONTAINER_VALUES) for v in values if (ids := _forced_ids(v, byte_tokens))]

    def refused(data: bytes, ends: bool = False) -> bool:
        """Whether `refuses` refuses the text written followed by `data` (and then the end, with `ends`)."""
        if refuses is None or (not ends and not _MAY_FINISH.intersection(data)):
            return False
        key = (len(text), data, ends)  # (the same question at the same place: a quote asked twice)
        if key not in verdicts:
            asked[0] += 1
            if asked[0] > _CHECKS_PER_WALK:
                raise _WalkGaveUp
            verdicts[key] = refuses(bytes(text) + data, ends)
            refusals[0] += verdicts[key]
            closes_refused[0] |= verdicts[key] and (ends or not _CLOSERS.isdisjoint(data))
        return verdicts[key]

    def wrote(ids: list[int]) -> None:
        """`ids` were consumed by the walk: on `out`, `text` and `keys`."""
        data = b"".join(vocab.token_bytes[t] or b"" for t in ids)
        out.extend(ids)
        text.extend(data)
        if keys is not None:
            keys.feed(data)

    def take(tail: list[int]) -> bool:
        """Writes `tail` (a hint's, a multiple's or a name's bytes), unless `refuses` refuses it; whether it did."""
        if refused(b"".join(vocab.token_bytes[t] for t in tail)):
            return False
        walk.consume_tokens(tail)
        wrote(tail)
        return True

    try:
        while not walk.is_accepting() or refused(b"", ends=True):
            if len(out) >= max_bytes or walk.is_error() or walk.is_stopped():
                return None
            # (one the grammar takes twice in a row, where it also takes some other byte of the endings' text, is
            # text inside a value there, not its end: inside a JSON string, where tags are not tokens of their own,
            # the walk wrote `</arg_value>` until it ran out of bytes. A required parameter's opening is taken
            # twice where its value is a raw string, which may begin as it does, and the walk then wrote the
            # first name that fits, an optional one's: 53 tokens where 18 fit)
            at_key = not text or text[-1:] in (b"{", b",")
            ending = next((e for e, key in ending_tokens if (at_key or not key)
                           and walk.validate_tokens(e) == len(e)
                           and not (walk.validate_tokens(e + e) == 2 * len(e)
                                    and any(walk.validate_tokens([t]) == 1 for t in probes))), None)
            if ending is not None:  # (before forced bytes, which may be its beginning: `<` of `</function>`)
                walk.consume_tokens(ending)
                wrote(ending)
                run, last = 0, None
                continue
            forced = walk.compute_ff_bytes()
            for e in endings:  # (forced bytes may run past an ending, into what one after it would replace)
                at = forced.find(e)
                forced = forced[:at + len(e)] if at >= 0 else forced
            # (nor into an ending's beginning: they stop before it, and the ending is tried whole from there. The
            # `<parameter=` forced before a required parameter's name was written, and the name was then the
            # first that fits: an optional `date_range` before the required `keywords`, a call of 56 tokens
            # where 22 fit, and calls that fitted the budget were refused or cut: QA xmlreal F1)
            cut = min((k for e in endings for k in range(max(1, len(forced) - len(e) + 1), len(forced))
                       if e.startswith(forced[k:])), default=len(forced))
            quote_at = forced.rfind(b'"')  # (a key's forced `"`, as after `{` where a key must come: the walk
            # then wrote the first name that fits, an optional one's; it stops before it, for a key ending)
            if quote_at > 0 and any(e.startswith(forced[quote_at:]) for e in key_endings):
                cut = min(cut, quote_at)
            forced = forced[:cut]
            if forced:
                ids = _forced_ids(forced, byte_tokens)
                if ids is None or refused(_SPECIAL_MARK.sub(b"", forced)) or not walk.consume_tokens(ids):
                    return None
                specials.update(int(i) for i in _SPECIAL_MARK.findall(forced))
                wrote(ids)
                run, written = 0, written + len(ids)
                continue
            if divisors and keys is not None and keys.mode == "number":
                tail = _multiple_tail(walk, divisors, bytes(keys.buf), byte_tokens, closers)
                if tail and take(tail):
                    run, last = 0, None
                    continue
            stuck = run >= try_at or written >= cycle_at
            in_text = keys is not None and keys.mode in ("string", "key") and not keys.escaped
            # (the shortcuts below commit to a value; where checks judge finished objects, `if`/`then`, `not`, they
            # refused what the greedy bytes would not have led to, and no completion was found: QA review F1)
            opening = in_text and keys.mode == "string" and not keys.buf and quote is not None \
                and shortcuts is not None and walk.validate_tokens([quote]) != 1
            if opening and (filler := _filler_tail(walk, tables)) and take(filler):
                run, last, shortcuts[0] = 0, None, True
                continue
            first_try = bool(hints) and in_text and not hinted and quote is not None \
                and walk.validate_tokens([quote]) != 1
            hinted = in_text and (hinted or first_try)
            if stuck or first_try or (hints and _quote_refused(walk, keys, tables, refused)):
                tail = _hint_tail(walk, hints, byte_tokens, quote, ends=keys is None,
                                  endings=[e for e, _ in ending_tokens]) if hints else None
                try_at = try_at * 2 if run >= try_at else try_at  # (each trigger that fired waits twice as long)
                cycle_at = cycle_at * 2 if written >= cycle_at else cycle_at
                if tail and take(tail):
                    run, last, try_at, written, cycle_at = 0, None, _STUCK_RUN, 0, _STUCK_CYCLE
                    continue
                if stuck:
                    avoid.add(last)
            if key_names and keys is not None and keys.mode == "key" and not keys.escaped:
                name = _required_name_tail(walk, key_names, keys, byte_tokens, quote)
                if name and take(name):
                    run, last = 0, None
                    continue
            if refusals[0] and value_tokens and keys is not None and keys.mode == "value" and any(
                    walk.validate_tokens(ids) == len(ids) and take(ids) for ids, container in value_tokens
                    if closes_refused[0] or not container):
                run, last = 0, None
                continue
            in_string = keys is not None and keys.mode in ("string", "key") and not keys.escaped
            pick = _closing_pick(walk, keys, distinct_keys, tables, avoid, in_string, vocab.token_bytes,
                                 refused if refuses is not None else None, shortcuts)
            if pick is None:
                return None
            if pick in tables.number_bytes and not divisors and shortcuts is not None and keys is not None \
                    and keys.mode in ("value", "number") and not _ends_after(walk, [pick], closers, tables.eos):
                tail = _number_tail(walk, tables, bytes(keys.buf) if keys.mode == "number" else b"")
                if tail and take(tail):
                    run, last, shortcuts[0] = 0, None, True
                    continue
            walk.consume_token(pick)
            wrote([pick])
            written = 0 if pick in closers else written + 1
            if pick in closers and not in_string:
                avoid.clear()
            run, last = (run + 1, pick) if pick == last else (1, pick)
            try_at = try_at if run > 1 else _STUCK_RUN
    except _WalkGaveUp:
        return None
    return _spelled(vocab, out, specials, ordinary)


def _quote_refused(walk: "llguidance.LLMatcher", keys: KeySets | None, tables: _WalkBytes, refused) -> bool:
    """Inside a string, the grammar takes a closing quote that the checks refuse: a hint then, rather than bytes
    first (`}}}}a@a.aa`, an e-mail address written twice under `uniqueItems`: 4 tokens longer, and the third try
    at an item)."""
    return keys is not None and keys.mode in ("string", "key") and not keys.escaped and tables.quote is not None \
        and walk.validate_tokens([tables.quote]) == 1 and refused(b'"')


# llguidance's parser limits, but for the items of one Earley row: an object of N optional properties makes rows
# of ~4N items, and llguidance's 2,000 failed every answer to a schema of 500 or more of them in its first key
# ("Current row has 4007 items; max is 2000", a 400 after a 200 when streamed). A step's items stay bounded by
# `step_max_items` (50,000).
_ROW_ITEMS = 50_000

# The lexer's work per token (llguidance's `step_lexer_fuel`), raised a level for a grammar each time an output
# runs out of it on a lexer of its own (`LlgGrammar.raise_fuel`). llguidance's 200,000 gave up on the first mask
# of `multipleOf: 4096, minimum: 4096, maximum: 1073741824` and after the `-` of `multipleOf: 8721,
# exclusiveMinimum: -100000, exclusiveMaximum: -10000` (a 200, then constraint_too_complex mid-output): 2,000,000
# takes both (~30 ms for that mask, once: the states it builds are kept). A step that needs more than the last
# level still gives up: 10,000,000 took some more, but spent ~650 ms of the engine's step on each output that
# gives up there.
_STEP_FUEL = (200_000, 2_000_000)


# The lexer's work on a grammar's initial configuration (llguidance's `initial_lexer_fuel`, 1,000,000): a real-world
# address schema (JSONSchemaBench Github_easy o35866: a `oneOf` of four countries' states, one `not` of their
# names) needs 2,000,000 ("initial lexer configuration (grammar) too big", a 400 strict or not). It also bounds the
# expressions a lexer builds on a step: `a{1000000}` gives up after 0.85 s at this level (0.37 s at the default),
# and at 5,000,000 it went on at ~0.5 s a token.
_INITIAL_FUEL = 2_000_000


def _limits(step_fuel: int = _STEP_FUEL[0]) -> "llguidance.LLParserLimits":
    """llguidance's limits for our grammars: the same where they are checked and where they are parsed."""
    return llguidance.LLParserLimits(max_items_in_row=_ROW_ITEMS, step_lexer_fuel=step_fuel,
                                     initial_lexer_fuel=_INITIAL_FUEL)


def _new_parse(lltok, text: str, step_fuel: int = _STEP_FUEL[0]) -> "llguidance.LLMatcher":
    """A matcher of grammar `text` from its start (a parse that copies are made of)."""
    return llguidance.LLMatcher(lltok, text, log_level=0, limits=_limits(step_fuel))


class _WalkGaveUp(Exception):
    """A closing walk asked its checks more than _CHECKS_PER_WALK questions: it finds no completion."""


# Bytes after which a check may find a value finished (a string's quote, a number's or a literal's delimiter or
# last letter, a container's bracket, a key's colon, a member's comma): only text ending in one is put to it.
_MAY_FINISH = frozenset(b'"}],: \t\n\rel')
_CLOSERS = frozenset(b"]}")
# Values a walk writes only once its checks refused a close (or the end): where they refused a finished scalar, the
# greedy value is as good and shorter (`"p0":""`, not `"p0":[]`: 30 tokens where `[]` made 37)
CONTAINER_VALUES = (b"[]", b"{}")


def _closing_pick(walk: "llguidance.LLMatcher", keys: KeySets | None, distinct_keys: bool, tables: _WalkBytes,
                  avoid: set[int], in_string: bool, token_bytes: list[bytes | None],
                  refused: Callable[[bytes], bool] | None, shortcuts: list[bool] | None = None) -> int | None:
    """The next byte token of a closing walk (`_preferred_pick`), or None. With `refused`, not one after which
    it refuses the byte and the bytes the grammar then forces (an `a` that forces `lpha"` of an item already
    written, under uniqueItems), and a negative number's first digit is not `0` where another fits: `-0` is 0,
    and where a check refuses numbers (`oneOf: [integer, number >= 0]` refused `-0` and every `-0.x`) the walk
    wrote zeros until it gave up, and the budget rule then steered away from the `-`. Nor a number's digit after
    which every delimiter the grammar takes is refused, where another fits: the second item of `[0,` under
    `uniqueItems` was `0`, then `0.0`, `0.00`... until the walk gave up, and no array of two numbers or more had a
    completion (QA budgetsweep2 F3); such a digit is taken only where no other byte is, and the fraction's point
    before an exponent (every integer is a multiple of 0.5: the walk wrote `-1e+0000...` until it gave up)."""
    repeats = keys is not None and ((distinct_keys and keys.closing_repeats_a_key()) or keys.closing_a_newline_key())
    skip: set[int] = set()  # refused here
    not_zero = refused is not None and keys is not None and keys.mode == "number" and keys.buf == b"-"
    unended = None  # the first digit skipped for its refused ends (or exponent put off): where nothing else fits
    ends_refused = False  # the number being written may not end here: a delimiter was refused
    exponent = (tables.byte_tokens.get(0x65), tables.byte_tokens.get(0x45))
    while True:
        pick = _preferred_pick(walk, keys, repeats, tables, avoid, in_string,
                               skip | {tables.zero} if not_zero else skip, shortcuts)
        if pick is None and not_zero:
            not_zero = False  # (only `-0.` leads on: `exclusiveMaximum: 0, minimum: -0.5`)
            continue
        if pick is None or refused is None:
            return unended if pick is None else pick
        if (unended is not None or ends_refused) and pick in exponent:
            unended = pick if unended is None else unended
            skip.add(pick)  # (a fraction first: `-1.1` under `not: {multipleOf: 0.5}`, where `-1e+0000...` ran on)
            continue
        probe = walk.deep_copy()
        probe.consume_token(pick)
        data = token_bytes[pick] + _SPECIAL_MARK.sub(b"", probe.compute_ff_bytes())
        if not refused(data):
            if not _number_ends_refused(probe, keys, pick, data, tables, token_bytes, refused):
                return pick
            unended = pick if unended is None else unended
        elif pick in tables.closers and keys is not None and keys.mode == "number":
            ends_refused = True
        skip.add(pick)


def _number_ends_refused(probe: "llguidance.LLMatcher", keys: KeySets | None, pick: int, data: bytes,
                         tables: _WalkBytes, token_bytes: list[bytes | None], refused: Callable[..., bool]) -> bool:
    """`pick` is a number's byte (`data` with what the grammar forces after it, at `probe`) after which the
    grammar takes a delimiter, or ends the output (a number at the root), and the checks refuse each: the number as
    it stands is refused."""
    if pick not in tables.number_bytes or keys is None or keys.mode not in ("value", "number"):
        return False
    ends = [c for c in tables.closers if probe.validate_tokens([c]) == 1]
    closed = probe.is_accepting()  # (a number at the root: the output's end ends it)
    return bool(ends or closed) and all(refused(data + token_bytes[c]) for c in ends) \
        and (not closed or refused(data, True))


def _preferred_pick(walk: "llguidance.LLMatcher", keys: KeySets | None, repeats: bool, tables: _WalkBytes,
                    avoid: set[int], in_string: bool, skip: set[int],
                    shortcuts: list[bool] | None = None) -> int | None:
    """Inside a string (known from `keys`, else guessed: both a letter and '"' fit), the closing quote rather than
    more of it, unless that would repeat a key (`repeats`); else the first of the preferred bytes that fits and is
    not avoided (`avoid` is emptied where every byte that fits is); with `shortcuts`, a string's first byte as
    `_least_forced` has it (noted there where it is another). None of `skip`."""
    quote, letter, null_byte = tables.quote, tables.letter, tables.null_byte

    def fits(t: int | None) -> bool:
        return t is not None and t not in skip and walk.validate_tokens([t]) == 1

    if in_string and not repeats and fits(quote):
        return quote
    if (keys is None or keys.mode == "off") and fits(letter) and fits(quote):
        return quote
    if repeats and fits(letter):
        return letter
    pick = first = None
    for t in tables.order:
        if t in skip or (repeats and t == quote) or walk.validate_tokens([t]) != 1:
            continue
        first = t if first is None else first
        if t not in avoid:
            pick = t
            break
    if pick is None:  # every byte that fits is avoided: avoiding them helps no more (and rescans cost)
        pick = first
        avoid.clear()
    if pick == quote and fits(null_byte) and walk.validate_tokens([quote, quote]) != 2:
        pick = null_byte  # `null` where a string cannot be empty (`format: date` asks for 10 more bytes)
    if shortcuts is not None and in_string and pick is not None and pick != quote and keys is not None \
            and keys.mode == "string" and not keys.buf:
        least = _least_forced(walk, pick, tables, skip)
        shortcuts[0] = shortcuts[0] or least != pick
        pick = least
    if pick in tables.number_bytes and keys is not None and keys.mode in ("value", "number") \
            and not any(walk.validate_tokens([pick, c]) == 2 for c in tables.closers):
        # A number's byte after which it may end, where one fits: `1` under `exclusiveMinimum: 0` and `3` under
        # `minimum: 3`, where the first that fits (`0`, `1`) goes on longer: the completion overestimated by a
        # token or more, and answers that fit were cut at the budget (QA numbers F1).
        pick = next((t for t in tables.order if t in tables.number_bytes and t not in avoid and fits(t)
                     and any(walk.validate_tokens([t, c]) == 2 for c in tables.closers)), pick)
    return pick


def _least_forced(walk: "llguidance.LLMatcher", pick: int, tables: _WalkBytes, skip: set[int]) -> int:
    """A string's first byte: `pick`, or where that forces more of the string, the byte among the first
    _FORCED_PROBES that fit after which the grammar forces the rest of the string in fewer bytes than the least
    `pick` may take. `a` of `enum: ["alpha beta gamma delta", "z"]` forced the rest of it where `z` ends at once,
    and `g` of `get_weather` a call of its arguments where `ping` had none (QA budget F2): the completion
    overestimated, and answers that fitted the budget were cut. A byte that leaves several values open is looked
    into one byte further (_OPEN_PROBES of them), and taken only where a value it leads to ends sooner: `u` of
    `["go", "update", "unpublish_edition"]` forced nothing, and led to the longest (QA budgetsweep F1); `p` of
    `["tools/call", "ping", "prompts/get"]` leads to `ping` (QA budgetsweep2 F1)."""
    backslash, quote = tables.byte_tokens.get(0x5C), tables.quote
    looked = [0]  # open bytes looked into

    def to_quote(state: "llguidance.LLMatcher", t: int, escaped: bool, deeper: bool) -> tuple[int, bool]:
        """The bytes `t` and what it forces take to the string's closing quote from `state` (after a backslash
        where `escaped`), and whether they are known to reach it (if not: the least they may take)."""
        probe = state.deep_copy()
        probe.consume_token(t)
        forced = probe.compute_ff_bytes()
        escaped = t == backslash and not escaped
        end = _closing_quote(forced, escaped)
        if end is not None:
            return 1 + end + 1, True
        if not deeper or looked[0] >= _OPEN_PROBES:
            return 1 + len(forced) + 2, False
        looked[0] += 1
        escaped = _escaped_after(forced, escaped)
        best = 1 if not escaped and probe.validate_tokens([quote]) == 1 else None
        for u in _fitting(probe, tables, skip=(quote,)):
            n, ends = to_quote(probe, u, escaped, False)
            best = n if ends and (best is None or n < best) else best
        return (1 + len(forced) + best, True) if best is not None else (1 + len(forced) + 2, False)

    least, exact = to_quote(walk, pick, False, True)
    if least <= 3 or (not exact and least <= 4):  # (nothing ends sooner than a byte and its quote)
        return pick
    for t in _fitting(walk, tables, skip=(pick, quote, *skip)):
        if least <= 2:
            break
        n, ends = to_quote(walk, t, False, True)
        if ends and n < least:
            pick, least = t, n
    return pick


def _fitting(walk: "llguidance.LLMatcher", tables: _WalkBytes, skip=()) -> list[int]:
    """The first _FORCED_PROBES byte tokens, in the walk's order, that `walk` takes next (none of `skip`)."""
    out = []
    for t in tables.order:
        if len(out) >= _FORCED_PROBES:
            break
        if t not in skip and walk.validate_tokens([t]) == 1:
            out.append(t)
    return out


def _escaped_after(data: bytes, escaped: bool) -> bool:
    """Whether a string's next byte after `data` (begun after a backslash where `escaped`) is escaped."""
    for b in data:
        escaped = b == 0x5C and not escaped
    return escaped


def _closing_quote(data: bytes, escaped: bool = False) -> int | None:
    """Where the string being written ends in `data` (bytes that go on inside it, after a backslash where
    `escaped`): its first quote not escaped. (An enum value `"\\\\"` was read as never ending, and not taken.)"""
    for i, b in enumerate(data):
        if b == 0x22 and not escaped:
            return i
        escaped = b == 0x5C and not escaped
    return None


# How llguidance writes a special token among forced bytes (0xFF is never a byte of UTF-8 text).
_SPECIAL_MARK = re.compile(rb"\xff\[(\d+)\]")


def _forced_ids(data: bytes, byte_tokens: dict[int, int]) -> list[int] | None:
    """The byte tokens of `data`, and the ids of the special tokens marked in it (`\\xff[id]`); None where a byte
    has no token."""
    out, pos = [], 0
    for m in [*_SPECIAL_MARK.finditer(data), None]:
        for b in data[pos:m.start() if m else len(data)]:
            if b not in byte_tokens:
                return None
            out.append(byte_tokens[b])
        if m:
            out.append(int(m.group(1)))
            pos = m.end()
    return out


def _spelled(vocab: Vocabulary, ids: list[int], specials: set[int], ordinary: bool = False) -> list[int] | None:
    """`ids` with each run of ordinary tokens spelled with the vocabulary's longest tokens (few tokens, as a model
    writes them); special tokens (`specials`, and those without bytes) kept: a special tag a grammar may write
    has its text for bytes, which the grammar does not take spelled. `ordinary`: the runs with no added token
    (`Vocabulary.spell`)."""
    out, run = [], bytearray()
    for t in [*ids, None]:
        data = vocab.token_bytes[t] if t is not None and t not in specials else None
        if data is not None:
            run += data
            continue
        spelled = vocab.spell(bytes(run), ordinary) if run else []
        if spelled is None:
            return None
        out += spelled + ([t] if t is not None else [])
        run.clear()
    return out


def _required_name_tail(walk: "llguidance.LLMatcher", names: tuple[bytes, ...], keys: KeySets,
                        byte_tokens: dict[int, int], quote: int | None) -> list[int] | None:
    """The byte tokens that finish the key being written as the first of `names` it begins, that its object does
    not have yet and that the grammar takes, closing quote included; or None."""
    if quote is None:
        return None
    written = bytes(keys.buf)
    fits: dict[int, bool] = {}  # next byte -> whether the grammar takes it (most names are ruled out by it)
    for name in names:
        if not name.startswith(written) or decode_key(name) in keys.stack[-1].keys \
                or any(b not in byte_tokens for b in name[len(written):]):
            continue
        ids = [byte_tokens[b] for b in name[len(written):]] + [quote]
        if ids[0] not in fits:
            fits[ids[0]] = walk.validate_tokens(ids[:1]) == 1
        if fits[ids[0]] and walk.validate_tokens(ids) == len(ids):
            return ids
    return None


def _hint_tail(walk: "llguidance.LLMatcher", hints: tuple[bytes, ...], byte_tokens: dict[int, int],
               quote: int | None, ends: bool = False, endings: list[list[int]] = ()) -> list[int] | None:
    """The byte tokens of a hint, or else of its longest tail, after which `walk` takes a closing quote (every
    hint whole first, then every hint less its first byte...), or one of `endings` (the tokens that close a raw
    value of the XML call formats), or, with `ends` (output that is not JSON: a top-level regex), after which it
    may end; or None."""
    for start_at in range(max(map(len, hints))):
        for hint in hints:
            tail = hint[start_at:]
            if not tail or any(b not in byte_tokens for b in tail):
                continue
            ids = [byte_tokens[b] for b in tail]
            if quote is not None and walk.validate_tokens(ids + [quote]) == len(ids) + 1:
                return ids
            if any(walk.validate_tokens(ids + e) == len(ids) + len(e) for e in endings):
                return ids
            if ends and walk.validate_tokens(ids) == len(ids):
                probe = walk.deep_copy()
                if probe.consume_tokens(ids) and probe.is_accepting():
                    return ids
    return None


def regex_hints(regex: str) -> tuple[bytes, ...]:
    """Shortest strings the whole of a top-level `regex` matches (one per top-level alternative), for closing walks
    stuck in one of its loops: `[a-z]+!` ends with the `!` of its example `a!`, where the walk's preferred bytes
    (letters) would write the alphabet first."""
    examples = pattern_examples(f"^(?:{without_edge_anchors(regex)})$", Work.for_example())
    return tuple(e.encode() for e in examples if 0 < len(e.encode()) <= _MAX_HINT_BYTES)[:_MAX_HINTS]


def build_lltokenizer(tokenizer, vocab: Vocabulary) -> llguidance.LLTokenizer:
    """~0.5-1 s for a 152k vocabulary: build once per tokenizer. As `llguidance.hf.from_tokenizer` builds it, less
    any Unicode normalisation (`_without_unicode_normalisation`)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # (a slow tokenizer: llguidance's own message)
        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab.logits_width,
                                            eos_token=sorted(vocab.eos_token_ids))
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    spec = json.loads(backend.to_str())
    spec["normalizer"] = _without_unicode_normalisation(spec.get("normalizer"))
    return llguidance.LLTokenizer(json.dumps(spec), n_vocab=vocab.logits_width, eos_token=sorted(vocab.eos_token_ids))


_UNICODE_FORMS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})


def _without_unicode_normalisation(normalizer: dict | None) -> dict | None:
    """llguidance tokenizes the bytes a grammar forces with the tokenizer: under Qwen2's NFC normaliser (which
    transformers adds at load) a const "e\u0301" (e and a combining accent) became the token "é", which the mask
    then allowed alone and the grammar refused: the answer failed mid-output. Forced bytes are the client's exact
    text, so the Unicode forms are taken out; other normalisers (SentencePiece's space to '▁') stay."""
    if not isinstance(normalizer, dict) or normalizer.get("type") in _UNICODE_FORMS:
        return None
    if normalizer.get("type") == "Sequence":
        kept = [n for n in normalizer.get("normalizers", []) if _without_unicode_normalisation(n) is not None]
        return {**normalizer, "normalizers": kept} if kept else None
    return normalizer


def _json_options(whitespace_pattern: str, lenient: bool) -> dict:
    # General \uXXXX escapes: json.dumps writes every non-ASCII character that way.
    return {"whitespace_pattern": whitespace_pattern, "lenient": lenient, "json_allow_general_unicode_escapes": True}


def grammar_text(kind: str, *, schema=None, regex: str | None = None, whitespace_pattern: str = "[ ]?",
                 lenient: bool = False, write_out_meetings: bool = False) -> str:
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(regex)
    # (as JSON text: handed Python objects, llguidance took no integer past 64 bits anywhere, a `default` or an
    # `x-` keyword that asserts nothing included: "Value is not JSON serializable", a 400 without a pointer)
    return llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(llguidance_json(schema, write_out_meetings) if schema is not None else {"type": "object"}),
        overrides=_json_options(whitespace_pattern, lenient))


# Inside a JSON string, llguidance 1.9.1 lets the escapes \" and \\ through a negated class that excludes '"' or
# '\' but holds the control characters: `[^"]` accepts a quote. Such a class also refusing the control
# characters (which JSON must escape, and which no answer needs there) is spelled correctly.
_QUOTE_OR_BACKSLASH = re.compile(r'"|\\\\|\\x(?:22|5[cC])|\\u00(?:22|5[cC])')


def _quote_safe(pattern: str) -> str:
    """Each negated class `[^...]` naming '"' or '\\' also names \\x00-\\x1f."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if ch == "[" and pattern.startswith("[^", i) and i + 2 < n and pattern[i + 2] != "]":
            j = i + 2
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            body = pattern[i + 2:j]
            if j < n and _QUOTE_OR_BACKSLASH.search(body):
                body = "\\" + body if body.startswith("-") else body
                out.append(f"[^\\x00-\\x1f{body}]")
                i = j + 1
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def llguidance_json(schema, write_out_meetings: bool = False):
    """The schema handed to llguidance: `llguidance_schema`'s, and with `write_out_meetings` (where llguidance
    refused that because a recursive definition meets other keywords: `checked_grammar_text`), each such place
    written out (constrain/recursive_meets.py). Only then: a schema llguidance compiles is handed on as it was."""
    schema = llguidance_schema(schema)
    return intersected_recursive_meetings(schema, spell=_quote_safe) if write_out_meetings else schema


# What llguidance says of a recursive definition meeting other keywords: it is still compiling it, or (a copy the
# rewrites made meeting the definition again) its intersection recursed until its stack limit
_RECURSIVE_MEETINGS = ("circular references with sibling keys are not supported",
                       "Schema intersection stack level exceeded")


def llguidance_schema(schema):
    """`schema` as llguidance compiles it: every `pattern` (and the names' patterns of objects that take no other
    keys) spelled as every regex dialect reads it (`pattern_dialects`), every `pattern` and `patternProperties`
    regex made safe from the quoting bug above, each `pattern` llguidance cannot read (`unreadable_pattern`) left
    out, which `checked_grammar_text` names, numeric bounds past 2**53 narrowed (`_narrowed_bounds`), hostnames
    held to 253 characters, and then the numbers llguidance's ranges refuse added back (`_add_bound_prefixes`). A
    copy where one changes; the input is never modified. First, every `$ref` below a nested `$id` is written as the
    URI it resolves to (`_refs_resolved_in_resources`), and the keywords that read each other are put side by side
    (`_read_together`)."""
    schema = _read_together(_refs_resolved_in_resources(schema))
    text = json.dumps(schema)
    narrowed = _narrowed_bounds(schema)
    if "[^" not in text and '"pattern' not in text and not narrowed and "imum" not in text \
            and '"hostname"' not in text and '"multipleOf"' not in text:
        return schema
    schema = copy.deepcopy(schema)
    uncompiled = _uncompiled_nodes(schema)
    undecided = undecided_lengths(schema, uncompiled)  # (named by `_inexact_keywords`, or refused under strict)
    for _, key, node in list(walk_with_refs(schema)):
        if key in _LENGTHS and (id(node), key) in undecided:
            node.pop(key, None)  # (a subschema the rewrites share, a recursive definition's copy, is met twice)
    for ptr, key, node in list(walk(schema)):
        value = node.get(key)
        if ptr in narrowed:
            node[key] = narrowed[ptr]
        elif key == "format" and value == "hostname" and id(node) not in uncompiled \
                and (id(node), "maxLength") not in undecided:
            # llguidance's hostname holds labels of at most 63 characters but no limit on the whole: RFC 1034's
            # 253 (a 300-character name passed).
            most = node.get("maxLength")
            node["maxLength"] = min(most, _HOSTNAME_MOST) if isinstance(most, int) and not isinstance(most, bool) \
                else _HOSTNAME_MOST
        elif key == "multipleOf" and id(node) not in uncompiled and _unreadable_multiple_at(node, key):
            del node[key]  # (named by `_inexact_keywords`, or refused under strict)
        elif key == "pattern" and isinstance(value, str):
            if id(node) not in uncompiled and unreadable_pattern(value):
                del node[key]
            else:
                node[key] = _quote_safe(portable_pattern(value))
        elif key == "patternProperties" and isinstance(value, dict):
            # Narrowing a name's pattern to what every regex dialect reads only refuses names where no other
            # key is taken. Where other keys may hold anything, widening it to what any dialect reads gives a
            # name some dialect matches the pattern's schema, as that dialect asks (`{"é": ""}` under `^\w+$`:
            # llguidance's ASCII `\w` let any value through, Python's asks for the pattern's schema). Elsewhere
            # (other keys under a schema of their own) either would move some names to the wrong schema.
            other = node.get("additionalProperties", True)
            if other is False:
                spell = portable_pattern
            elif other in (True, {}) and node.get("unevaluatedProperties", True) in (True, {}):
                spell = widest_pattern
            else:
                spell = str
            node[key] = {_quote_safe(spell(k)): v for k, v in value.items()}
    _exclusive_ends_as_inclusive(schema, uncompiled)
    _few_multiples_as_enum(schema, uncompiled)
    _multiples_beside_values(schema, uncompiled)  # (before the prefixes: a member's enum decided with its step)
    _add_bound_prefixes(schema, uncompiled)  # (last: it moves nodes, and so the pointers above)
    return schema


# llguidance compiles a schema object's keywords in their order, cut into chunks at each in-place applicator (`$ref`,
# `allOf`, `anyOf`, `oneOf`, `enum`, `const`), and reads a keyword beside the others of its own chunk only (it lends
# `additionalProperties` the names of `properties`, and `items` the length of `prefixItems`, no more). Cut apart,
# `additionalProperties: false` refused the names `patternProperties` takes, an array `items` let any item through
# under `additionalItems: false`, and draft 4's `exclusiveMinimum: true` left `minimum` inclusive. These keywords
# are each written together, where the first of them stands.
_IN_PLACE_APPLICATORS = frozenset({"$ref", "allOf", "anyOf", "oneOf", "enum", "const"})
_READ_TOGETHER = (frozenset({"patternProperties", "additionalProperties"}),
                  frozenset({"prefixItems", "items", "additionalItems"}),
                  frozenset({"minimum", "exclusiveMinimum"}), frozenset({"maximum", "exclusiveMaximum"}),
                  frozenset({"contains", "minContains", "maxContains"}))


def _read_together(schema):
    """`schema`, or a copy where no in-place applicator stands between keywords that read each other
    (`_READ_TOGETHER`): only their order changes, so every pointer still names the same place."""
    def order(node: dict) -> list[str]:
        keys = list(node)
        out: dict[str, None] = {}
        for key in keys:
            group = next((g for g in _READ_TOGETHER if key in g), frozenset({key}))
            out.update(dict.fromkeys(k for k in keys if k in group))
        return list(out)

    def parted(node: dict) -> bool:
        return not _IN_PLACE_APPLICATORS.isdisjoint(node) and order(node) != list(node)

    if not any(parted(node) for node in schema_objects(schema)):
        return schema
    schema = copy.deepcopy(schema)
    for node in schema_objects(schema):
        if parted(node):
            ordered = [(key, node[key]) for key in order(node)]
            node.clear()
            node.update(ordered)
    return schema


def _refs_resolved_in_resources(schema):
    """A copy of `schema` where each `$ref` below a nested `$id` that moves its base is the URI it resolves to
    (`"#/$defs/a"` under `"$id": "z.json"` as `"z.json#/$defs/a"`; `schema` itself where there is none). A
    reference means the same wherever it is then, which llguidance 1.x needs: it read the `$ref`s of a subschema
    reached through a pointer into a resource (`{"$ref": "#/properties/z/properties/a"}`, z holding the `$id`)
    against the root's base, so the root's `#/$defs/a` held the answer, not z's (invalid answers accepted)."""
    if not any(gives_another_base(ptr, key, node) for ptr, key, node in walk(schema)):
        return schema
    return _resolved_below(schema, id_keyword(schema.get("$schema")), None, top=True)


def _resolved_below(node, id_key: str, base: str | None, top: bool = False):
    """A copy of `node` whose `$ref`s are resolved against `base` (None: the root's resource, whose references
    llguidance reads right) and the `$id`s (draft 4: `id`) inside it."""
    if not isinstance(node, dict):
        return node
    value = node.get(id_key)
    if not top and isinstance(value, str) and not value.startswith("#"):
        base = urldefrag(urljoin(base or "", value)).url
    node = map_subschemas(node, lambda sub: _resolved_below(sub, id_key, base))
    ref = node.get("$ref")
    if base is not None and isinstance(ref, str):
        node["$ref"] = base + ref if ref.startswith("#") else urljoin(base, ref)
    return node


_SAFE_DIGITS = decimal.Context(prec=15)  # decimals of at most 15 significant digits are distinct doubles, in order
_SAFE_END_RANGE = (1e-15, 2 ** 53)  # |end| where `inward_end` has a bound llguidance builds a range for
_INTEGER_SPACED = 1e15  # from here up, 15-digit decimals are 10 apart: the nearest integer inside stands for an end


def _exclusive_ends_as_inclusive(schema, uncompiled: set[int]) -> None:
    """`exclusiveMaximum: b` (`exclusiveMinimum`) of a number that may have a fraction becomes `maximum` at the
    largest decimal of 15 significant digits below b (the smallest above), in place. llguidance compares the
    decimal an answer spells, and parsers read the nearest double: `0.99999999999999999` is below 1, and Python
    and JavaScript read 1.0, which `exclusiveMaximum: 1` refuses. A decimal up to that neighbour reads as a double
    up to the neighbour's, which is below b's (15 digits: distinct doubles). What it costs: the numbers of 16 or
    more digits between the neighbour and b (`0.9999999999999999`, which reads below 1) are not written. Inclusive
    ends need nothing (reading rounds monotonically, so a decimal within one reads within it), and integers are
    read exactly. From 1e15 up to 2**53 the end becomes the nearest integer inside (`exclusiveMaximum: 1e15` is
    `maximum: 999999999999999`; integers are exact doubles there, and 15-digit decimals, 10 apart, would lose the
    integers between). An end of 0 becomes ±1e-15 (the numbers between are never written): reading rounds nothing
    to 0 there, but llguidance misreads an interval whose excluded end is an integer with the other end less than 1 away
    (`late_keywords.misread_bounds`), and it forms such intervals itself, intersecting the members of two `anyOf`s:
    `allOf: [{not: {const: 1}}, {not: {const: 0}}]` took `0` (QA review14 F1), and with 1e15 and 1e15 + 0.5
    (review15 F1). Left alone: ends below 1e-15 and from 2**53 up (doubles there are integers 2 or more apart)."""
    for _, key, node in list(walk_with_refs(schema)):  # (a `$ref` may name a subschema no keyword holds: `#/x/y`)
        if key not in ("exclusiveMinimum", "exclusiveMaximum") or id(node) in uncompiled:
            continue
        types = node.get("type", "number")
        if "number" not in (types if isinstance(types, list) else [types]):
            continue
        bound = moved_end(node, key)
        if bound is not None:
            end_as_inclusive(node, key, bound)


def moved_end(node: dict, key: str) -> float | None:
    """The inclusive bound `_exclusive_ends_as_inclusive` gives the exclusive end `key` of `node`, or None where it
    leaves that end alone: `inward_end` has none, or it would reach the node's other end (`(1e15, 1e15 + 1)` would
    hold no number, where llguidance reads it right as it is)."""
    upper = key == "exclusiveMaximum"
    inclusive = "maximum" if upper else "minimum"
    end = node.get(inclusive) if node.get(key) is True else node.get(key)  # (draft 4: a flag beside the end)
    if isinstance(end, bool) or not isinstance(end, (int, float)):
        return None
    bound = inward_end(end, upper)
    if bound is None:
        return None
    others = _bounds(node, _LOWER_BOUNDS if upper else _UPPER_BOUNDS)
    return bound if all(bound > v if upper else bound < v for v in others) else None


def inward_end(end: float, upper: bool) -> float | None:
    """The inclusive bound that stands for the exclusive `end` of an interval (its upper one if `upper`): the
    nearest decimal of 15 significant digits inside (`_exclusive_ends_as_inclusive`), from 1e15 up the nearest
    integer inside; for 0, ±1e-15 (the numbers between are never written). None where `end` is too small or too
    large for that."""
    if end == 0:
        return -_SAFE_END_RANGE[0] if upper else _SAFE_END_RANGE[0]
    if not _SAFE_END_RANGE[0] <= abs(end) < _SAFE_END_RANGE[1]:
        return None
    if abs(end) >= _INTEGER_SPACED:
        return float(math.ceil(end) - 1 if upper else math.floor(end) + 1)
    exact = decimal.Decimal(repr(end)) if isinstance(end, float) else decimal.Decimal(end)
    return float(exact.next_minus(_SAFE_DIGITS) if upper else exact.next_plus(_SAFE_DIGITS))


def end_as_inclusive(node: dict, key: str, bound: float) -> None:
    """The exclusive bound `key` of `node` made the inclusive `bound` (the tighter of it and an inclusive one the
    node has beside it), in place. Draft 4's `exclusiveMinimum: true` beside `minimum` is a flag: `minimum` moves."""
    inclusive = "minimum" if key == "exclusiveMinimum" else "maximum"
    other = node.get(inclusive)
    if node.get(key) is not True and isinstance(other, (int, float)) and not isinstance(other, bool):
        bound = min(bound, other) if key == "exclusiveMaximum" else max(bound, other)
    del node[key]
    node[inclusive] = bound


_HOSTNAME_MOST = 253  # characters of a hostname (RFC 1034)
_NARROW_TO = 2 ** 53  # numeric bounds past ±this are narrowed to it (`_narrowed_bounds`)
_UPPER_BOUNDS, _LOWER_BOUNDS = ("maximum", "exclusiveMaximum"), ("minimum", "exclusiveMinimum")


def _narrowed_bounds(schema, base_pointer: str = "") -> dict[str, int]:
    """Pointer -> the bound llguidance compiles in its place, for each `maximum`/`exclusiveMaximum` above 2**53
    and each `minimum`/`exclusiveMinimum` below -2**53 (int64 and uint64 limits, as schemas generated from typed
    code write them). llguidance reads a schema's numbers as doubles (exact to 2**53) and builds no range past
    about 1e18, so such a schema was refused (`maximum: 18446744073709551615`) or compiled inexactly. Narrowed,
    it is enforced: every answer is within the client's bounds; the numbers past ±2**53 are never written.
    Nothing is narrowed where the node's other end lies past 2**53 too (the range would be empty), where llguidance
    compiles a `oneOf` (narrowing one branch may make an overlap look disjoint) or under keywords it never reads."""
    if not isinstance(schema, dict):
        return {}
    uncompiled = _uncompiled_nodes(schema)
    if any(key == "oneOf" and id(node) not in uncompiled for _, key, node in walk(schema)):
        return {}
    out: dict[str, int] = {}
    for ptr, key, node in walk(schema, base_pointer):
        value = node[key]
        if id(node) in uncompiled or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key in _UPPER_BOUNDS and value > _NARROW_TO and all(v < _NARROW_TO for v in _bounds(node, _LOWER_BOUNDS)):
            out[ptr] = _NARROW_TO
        elif key in _LOWER_BOUNDS and value < -_NARROW_TO \
                and all(v > -_NARROW_TO for v in _bounds(node, _UPPER_BOUNDS)):
            out[ptr] = -_NARROW_TO
    return out


def _bounds(node: dict, keys: tuple[str, ...]) -> list:
    return [node[k] for k in keys if isinstance(node.get(k), (int, float)) and not isinstance(node[k], bool)]


_PLAIN_NUMBER_KEYWORDS = frozenset({"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})


# The most multiples an integer range may hold to be written as their enum (`_few_multiples_as_enum`).
_FEW_MULTIPLES = 100


def _few_multiples_as_enum(schema, uncompiled: set[int]) -> None:
    """An integer node holding a whole `multipleOf` and bounds on both sides, and nothing else, whose range holds
    at most _FEW_MULTIPLES multiples, becomes `enum` of them, in place. llguidance's lexer crosses the divisor's
    remainders with the range's digits, and ran out of work per token on large divisors: `multipleOf: 123457`
    between 10000 and 1000000 (8 multiples) needed 25 times its default on the first mask, past `_STEP_FUEL`'s
    last level; their enum costs ~0.1 ms. A divisor llguidance cannot read at all is written so too, where it
    would otherwise be left out (`_unreadable_multiple_at`)."""
    for _, key, node in list(walk(schema)):
        if key != "multipleOf" or id(node) in uncompiled:
            continue
        multiples = _few_multiples(node)
        if multiples is not None:
            for k in set(node) & (_PLAIN_NUMBER_KEYWORDS - {"type"} | {"multipleOf"}):
                del node[k]
            node["enum"] = multiples


def _few_multiples(node: dict) -> list[int] | None:
    """The multiples an integer node of a whole `multipleOf`, bounds on both sides and nothing else takes, where
    they are at most _FEW_MULTIPLES (`_few_multiples_as_enum`); else None."""
    if node.get("type") not in ("integer", ["integer"]) or set(node) - _PLAIN_NUMBER_KEYWORDS - {"multipleOf"} \
            - ANNOTATIONS:
        return None
    step = _step(node["multipleOf"])
    bounds = {k: node[k] for k in _PLAIN_NUMBER_KEYWORDS - {"type"} if k in node}
    if step is None or step.denominator != 1 \
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in bounds.values()):
        return None
    indices = _multiple_indices(bounds, node["multipleOf"])
    if indices is None or not 0 < indices[1] - indices[0] + 1 <= _FEW_MULTIPLES:
        return None
    return [int(i * step) for i in range(indices[0], indices[1] + 1)]


def _multiple_indices(bounds: dict, step: int | float) -> tuple[int, int] | None:
    """(first, last): the multiples of `step` within `bounds` (finite numbers) are i * step for i from first to
    last, decided in decimal (as the schema spells them, not in binary floats); None without a bound on each
    side, or with one that is not finite."""
    if not all(math.isfinite(v) for v in bounds.values()):
        return None
    exact = fractions.Fraction(repr(step))
    ends = {k: fractions.Fraction(repr(v)) / exact for k, v in bounds.items()}
    firsts = [math.ceil(e) if k == "minimum" else math.floor(e) + 1 for k, e in ends.items() if k in _LOWER_BOUNDS]
    lasts = [math.floor(e) if k == "maximum" else math.ceil(e) - 1 for k, e in ends.items() if k in _UPPER_BOUNDS]
    return (max(firsts), min(lasts)) if firsts and lasts else None


def _add_bound_prefixes(schema, uncompiled: set[int]) -> None:
    """llguidance 1.9's number ranges refuse the numbers that are a shorter decimal prefix of the bound on the
    side that caps their magnitude: under `maximum: 0.99` it refuses 0.9, under `maximum: 2.635` 2.6 and 2.63,
    under `minimum: -1.97` -1.9 (characterised on random bounds: those, and forms with trailing zeros or -0,
    which no answer needs, are all it refuses, and it accepts nothing out of range); with a `multipleOf`, the same
    (0.1 under `maximum: 0.15, multipleOf: 0.1`, which left only numbers up to 0). So are the multiples of a range
    where llguidance, dividing binary floats, finds none (`_multiples_it_misses`). A node holding only a type,
    bounds and a `multipleOf` becomes `anyOf: [itself, {enum: those of the prefixes it accepts, and those
    multiples}]` (decided in decimal), in place."""
    targets = [node for _, key, node in walk(schema) if key == "type" or key in _PLAIN_NUMBER_KEYWORDS]
    done: set[int] = set()
    for node in targets:
        if id(node) in done or id(node) in uncompiled:
            continue
        done.add(id(node))
        if set(node) - _PLAIN_NUMBER_KEYWORDS - {"multipleOf"} - ANNOTATIONS or not ({"number"} & _numeric_types(node)):
            continue
        bounds = {k: node[k] for k in _PLAIN_NUMBER_KEYWORDS - {"type"} if k in node}
        step = node.get("multipleOf")
        if not bounds or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in bounds.values()) \
                or (step is not None and (isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0)):
            continue
        prefixes = [p for v in bounds.values() for p in _decimal_prefixes(v) if _within(p, bounds)
                    and (step is None or p % decimal.Decimal(repr(step)) == 0)]
        if step is not None:
            prefixes += _multiples_it_misses(node, bounds, step)
        if prefixes:
            inner = dict(node)
            node.clear()
            node["anyOf"] = [inner, {"enum": sorted({float(p) for p in prefixes})}]


def _multiples_it_misses(node: dict, bounds: dict, step: int | float) -> list[decimal.Decimal]:
    """The multiples of `step` within `bounds` where llguidance finds the range holds none: it asks in binary
    floats (0.3 / 0.1 is 2.9999999999999996), and refused the schema `minimum: 0.25, maximum: 0.3, multipleOf: 0.1`
    ("range [0.30000000000000004, 0.2] does not contain a multiple of 0.1"), or left out the member holding it.
    Its floats miss a multiple by at most one at each end: only a range of at most two is asked about."""
    indices = _multiple_indices(bounds, step)
    if indices is None:
        return []
    first, last = indices
    exact = decimal.Decimal(repr(step))
    with decimal.localcontext(decimal.Context(prec=60)):
        multiples = [i * exact for i in range(first, last + 1)] if last - first < 2 else []
    if not multiples or not _range_refused(json.dumps({**node, "type": "number"}, sort_keys=True)):
        return []
    return [m for m in multiples if _within(m, bounds)]


@functools.lru_cache(maxsize=4096)
def _range_refused(node: str) -> bool:
    """llguidance finds the number schema `node` (JSON) holds no value (with another type beside, it leaves the
    numbers out silently)."""
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.loads(node))
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    return bool(is_error) and any("does not contain a multiple" in m for m in messages)


def _multiples_beside_values(schema, uncompiled: set[int]) -> None:
    """llguidance reads a `const`/`enum` number as the range from it to itself, and decides whether a range holds a
    multiple in binary floats: 0.3 / 0.1 is 2.9999999999999996, so a `multipleOf: 0.1` that met `const: 0.3`
    through the members it sits beside (`anyOf: [{const: 0.3}, {const: 0.35}], multipleOf: 0.1`) refused 0.3,
    and where no member was left the schema ("range [0.4, 0.30000000000000004] does not contain a multiple of
    0.1"); so it did the numbers a member's bound begins with, added back as an `enum` (`_add_bound_prefixes`).
    A node's `multipleOf` (its own and its `allOf` members') beside members holding numbers goes into those members
    (an `allOf` member holding a `const`/`enum`, else the `anyOf`/`oneOf` members, else one `allOf` member), down
    to the `const`/`enum` that then keep only their multiples, decided in decimal as the product reads them
    (`rewrite._exact_multiple_of`). The same instances: `m` and `anyOf: [a, b]` is `anyOf: [m and a, m and b]`,
    and so for `oneOf`; `m` and `allOf: [a, b]` is `allOf: [m and a, b]`. Left alone where a `$ref` names a
    member (it would take the `multipleOf` too). In place; a member that changes is a copy (the rewrites share
    subschemas)."""
    refs = [unquote(node[key]) for _, key, node in walk(schema) if key == "$ref" and isinstance(node[key], str)]
    for ptr, key, node in list(walk_with_refs(schema)):
        if key in ("multipleOf", "allOf") and id(node) not in uncompiled:
            _multiple_into_members(node, ptr.rsplit("/", 1)[0], refs)


def _step(value) -> fractions.Fraction | None:
    """A `multipleOf` as the decimal it spells; None where it is none (llguidance refuses it, or it is left out)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        return None
    return fractions.Fraction(repr(value))


def _holds_numbers(member) -> bool:
    """`member` names `const`/`enum` numbers, a bound a shorter decimal begins or both ends of a range, itself or
    through the members of its `anyOf`/`oneOf`/`allOf`."""
    if not isinstance(member, dict) or "$ref" in member:
        return False
    values = [member["const"]] if "const" in member else member["enum"] if isinstance(member.get("enum"), list) \
        else [member[k] for k in _LOWER_BOUNDS + _UPPER_BOUNDS if k in member]
    if any(isinstance(v, (int, float)) and not isinstance(v, bool) and ("const" in member or "enum" in member
                                                                          or _decimal_prefixes(v)) for v in values):
        return True
    if any(k in member for k in _LOWER_BOUNDS) and any(k in member for k in _UPPER_BOUNDS):
        return True  # (a range where llguidance may find no multiple: `_multiples_it_misses`)
    return any(isinstance(member.get(k), list) and any(_holds_numbers(m) for m in member[k])
               for k in ("anyOf", "oneOf", "allOf"))


def _multiple_into_members(node: dict, ptr: str, refs: list[str]) -> None:
    """`node`'s `multipleOf`s (its own and its `allOf` members') moved into its members that hold numbers
    (`_multiples_beside_values`), or its own `const`/`enum` kept to their multiples; in place."""
    step = _step(node.get("multipleOf"))
    if "multipleOf" in node and step is None:
        return
    if "const" in node or isinstance(node.get("enum"), list):
        if step is not None:
            values = [node.pop("const")] if "const" in node else node["enum"]
            del node["multipleOf"]
            node["enum"] = [v for v in values if not isinstance(v, (int, float)) or isinstance(v, bool)
                            or _is_multiple(v, step)]
        return
    joined = node["allOf"] if isinstance(node.get("allOf"), list) else []
    valued = [i for i, m in enumerate(joined) if isinstance(m, dict) and "$ref" not in m and _holds_numbers(
        {k: m[k] for k in ("const", "enum") if k in m})]
    lists = [k for k in ("anyOf", "oneOf") if isinstance(node.get(k), list) and any(map(_holds_numbers, node[k]))]
    holding = valued[:1] or ([] if lists else [i for i, m in enumerate(joined) if _holds_numbers(m)][:1])
    lists = [] if valued else lists  # (into one place: its values meet the other members without a multipleOf)
    moved = [i for i, m in enumerate(joined) if isinstance(m, dict) and "$ref" not in m and i not in holding
             and _step(m.get("multipleOf")) is not None]
    if not (lists or holding) or (step is None and not moved) \
            or any(r.startswith(f"#{ptr}/{k}/") for r in refs for k in lists + ["allOf"]):
        return
    for i in moved:
        step = _least_common_multiple(step, _step(joined[i]["multipleOf"]))
    if step is None or _step_number(step) is None:
        return
    node.pop("multipleOf", None)
    for k in lists:
        node[k] = [_with_multiple(m, step, f"{ptr}/{k}/{i}", refs) for i, m in enumerate(node[k])]
    if joined:  # (a member's `multipleOf` moved: the member less it in its place, as its index may be a pointer)
        node["allOf"] = [_with_multiple(m, step, f"{ptr}/allOf/{i}", refs) if i in holding
                         else _less_multiple(m, node) if i in moved else m
                         for i, m in enumerate(joined)]


def _less_multiple(member: dict, node: dict) -> dict:
    """An `allOf` member of `node` whose `multipleOf` moved: without it, and `{}` where all it has left are bounds
    `node` holds alike (`bounds_on_members` copies them into members). Left as bounds, each such member took an
    enum of the numbers its bounds begin with (`_add_bound_prefixes`), and llguidance, multiplying out the `anyOf`s,
    found four of them too large a grammar (Handwritten/num4, which compiled before)."""
    rest = {k: v for k, v in member.items() if k != "multipleOf"}
    alike = all(k in _LOWER_BOUNDS + _UPPER_BOUNDS and not isinstance(v, bool) and k in node and node[k] == v
                for k, v in rest.items())
    return {} if alike else rest


def _with_multiple(member, step: fractions.Fraction, ptr: str, refs: list[str]):
    """`member` and `multipleOf: step`: a copy, its own values decided, its members given it."""
    if not isinstance(member, dict):
        return {"multipleOf": _step_number(step)} if member is True else member
    joined = _least_common_multiple(step, _step(member.get("multipleOf")))
    if "$ref" in member or ("multipleOf" in member and _step(member["multipleOf"]) is None) \
            or _step_number(joined) is None:
        return {"allOf": [member, {"multipleOf": _step_number(step)}]}  # (as llguidance read it before)
    out = {**member, "multipleOf": _step_number(joined)}
    _multiple_into_members(out, ptr, refs)
    return out


def _is_multiple(value: int | float, step: fractions.Fraction) -> bool:
    """`value`, as the decimal it spells, is a multiple of `step`."""
    try:
        return (fractions.Fraction(repr(value)) / step).denominator == 1
    except (ValueError, OverflowError):  # (inf: a number past the doubles)
        return False


def _least_common_multiple(a: fractions.Fraction | None, b: fractions.Fraction | None) -> fractions.Fraction | None:
    """The least positive number that is a multiple of both (either where the other is None)."""
    if a is None or b is None:
        return a if b is None else b
    return fractions.Fraction(math.lcm(a.numerator, b.numerator), math.gcd(a.denominator, b.denominator))


def _step_number(step: fractions.Fraction) -> int | float | None:
    """`step` as the schema number that spells it exactly; None where no double's shortest spelling does."""
    if step.denominator == 1:
        return step.numerator if step.numerator <= _EXACT_FLOAT_INT else None
    number = float(decimal.Decimal(step.numerator) / decimal.Decimal(step.denominator))
    return number if fractions.Fraction(repr(number)) == step else None


def _numeric_types(node: dict) -> set[str]:
    t = node.get("type", ["number"])
    return {"number", "integer"} & set([t] if isinstance(t, str) else t if isinstance(t, list) else [])


def _decimal_prefixes(bound: int | float) -> list[decimal.Decimal]:
    """The shorter decimals the bound's digits begin with, each ending in a digit other than 0 (2.635: 2.6, 2.63)."""
    text = format(decimal.Decimal(repr(bound)), "f")
    if "." not in text:
        return []
    whole, fraction = text.split(".")
    return [decimal.Decimal(f"{whole}.{fraction[:j]}") for j in range(1, len(fraction)) if fraction[j - 1] != "0"]


def _within(value: decimal.Decimal, bounds: dict) -> bool:
    checks = {"minimum": lambda b: value >= b, "maximum": lambda b: value <= b,
              "exclusiveMinimum": lambda b: value > b, "exclusiveMaximum": lambda b: value < b}
    return all(checks[k](decimal.Decimal(repr(v))) for k, v in bounds.items())


# Keywords llguidance does not implement: it never reads the subschemas under them (the late checks, rewrites, or
# the unenforced list deal with the keyword itself).
_NOT_COMPILED = frozenset({"not", "if", "then", "else", "contains", "dependentSchemas", "dependencies",
                           "propertyNames", "unevaluatedProperties", "unevaluatedItems"})


def _uncompiled_nodes(schema) -> set[int]:
    """id() of every schema object under a keyword of `_NOT_COMPILED`."""
    hidden: set[int] = set()
    for _, key, node in walk(schema):
        if key in _NOT_COMPILED:
            value = node[key]
            parts = value.values() if key in ("dependentSchemas", "dependencies") and isinstance(value, dict) \
                else [value]
            for part in parts:
                hidden.update(id(n) for _, _, n in walk(part))
    return hidden


@functools.lru_cache(maxsize=4096)
def unreadable_pattern(pattern: str) -> str | None:
    """llguidance's reason for refusing a `pattern` that JSON Schema allows (a backreference, a lookbehind, a
    lookahead past the start, `\\b`), or None where it reads it. (An invalid regex never gets here: the schema
    check refuses it first.) Read as it is compiled: in its portable spelling."""
    grammar = llguidance.LLMatcher.grammar_from_json_schema({"type": "string", "pattern": portable_pattern(pattern)})
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    return " ".join(messages[-1].split()) if is_error and messages else None


def undecided_lengths(root: dict, uncompiled: set[int]) -> set[tuple[int, str]]:
    """(id() of the subschema, keyword) of each length bound in `root` that llguidance cannot meet with the patterns
    and formats a string meets beside it (`_meeting`): it proves that patterns and a length bound have some string
    in common within a fixed budget (10,000 states), which an RFC 1123 name
    `^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\\.)+[a-z0-9][a-z0-9-]{0,61}[a-z0-9]$` beside `maxLength: 253` runs
    past ("Unable to determine if regex is empty": a 400, strict or not, where the pattern alone compiles), and so
    did `pattern: "@example\\.com$"` beside `format: email` and `maxLength: 100`. `format: hostname` holds at most
    253 characters (its `maxLength` as `llguidance_schema` writes it). They are left out of what it compiles
    (`llguidance_schema`): named unenforced, or under strict a 400 naming them (`_inexact_keywords`). Keyed by
    object, not pointer, so that both callers read the same answer whatever root and pointers each walks."""
    text = json.dumps(root)
    if '"pattern"' not in text or ("Length" not in text and '"hostname"' not in text):
        return set()
    nodes = list(walk_with_refs(root))
    if not any(key == "pattern" and isinstance(node[key], str) for _, key, node in nodes) or not any(
            (key in _LENGTHS and isinstance(node[key], int)) or (key == "format" and node[key] == "hostname")
            for _, key, node in nodes):
        return set()
    target = _ref_targets(root)
    undecided: set[tuple[int, str]] = set()
    reads = [0]  # (subschemas read for all sites together: `_MEETING_READS`)
    sites, asked = [], set()  # (once a subschema: `walk_with_refs` yields it for each keyword, and where shared)
    for _, _, node in nodes:
        if id(node) not in asked and id(node) not in uncompiled and not _MEETING_KEYS.isdisjoint(node):
            asked.add(id(node))
            sites.append((node, 0))
    merged_seen: set[tuple[int, ...]] = set()
    while sites:
        node, depth = sites.pop()
        # (past the budget, a length or hostname of the node's own is still met with its allOf members' and its
        # references' patterns, as before branches were: 300 properties naming a union spent the budget first,
        # and the RFC 1123 name beside its own maxLength was a 400 pointing at one of them)
        sets = _meeting(node, target, reads) if reads[0] < _MEETING_READS else \
            _meeting(node, target, [0], branches=False) if node.get("format") == "hostname" \
            or any(key in node for key in _LENGTHS) else ()
        for holders in sets:
            undecided |= _undecided_among(holders, uncompiled)
            for merged in _merged_properties(holders) if depth < _MERGES_DEEP else ():
                members = tuple(id(m) for m in merged["allOf"])
                if members not in merged_seen:
                    merged_seen.add(members)
                    sites.append((merged, depth + 1))
    return undecided


def _merged_properties(holders: list[dict]) -> list[dict]:
    """For each property name that two or more of `holders` (subschemas one object meets) declare, an `allOf` of
    its schemas there: llguidance merges the objects and meets them (`allOf: [{properties: {h: {pattern: P}}},
    {properties: {h: {maxLength: 253}}}]`, a base model and a constraint added to it, was a 400)."""
    by_name: dict[str, list] = {}
    for holder in holders:
        if isinstance(holder.get("properties"), dict):
            for name, sub in holder["properties"].items():
                by_name.setdefault(name, []).append(sub)
    return [{"allOf": subs} for subs in by_name.values() if len(subs) > 1]


_LENGTHS = ("minLength", "maxLength")
_MEETING_KEYS = frozenset(_LENGTHS + ("pattern", "format", "allOf", "anyOf", "oneOf", "$ref"))
_MEETING_HOLDERS = 32  # subschemas one string meets that `_meeting` reads
_MEETING_CHOICES = 16  # sets of them for one subschema (one for each way through its anyOf/oneOf branches)
_MEETING_READS = 20_000  # subschemas read for one schema (past it, a node's own lengths are met without branches)
_MERGES_DEEP = 4  # objects merged within merged objects that `undecided_lengths` follows


def _ref_targets(root: dict) -> Callable[[str], Any]:
    """What a `$ref` of `root` names: a local pointer, or where a `$ref` below a nested `$id` was written as the URI
    it resolves to (`_refs_resolved_in_resources`), the subschema of that resource it names (None: not there)."""
    resources: dict[str, dict] = {}
    id_key = id_keyword(root.get("$schema"))

    def visit(node, base: str | None, top: bool = False):
        if isinstance(node, dict):
            value = node.get(id_key)
            if not top and isinstance(value, str) and not value.startswith("#"):  # (as `_resolved_below` reads it)
                try:
                    base = urldefrag(urljoin(base or "", value)).url
                except ValueError:  # (`http://[::1/z`: no resource; llguidance refuses the URI, a 400)
                    return node
                resources.setdefault(base, node)
            map_subschemas(node, lambda sub: visit(sub, base))
        return node

    visit(root, None, top=True)
    # (those URIs are relative where the root's `$id` is not written in: they read against it, and it names the root)
    own = root.get(id_key) if isinstance(root.get(id_key), str) else ""
    try:
        resources = {urljoin(own, uri): node for uri, node in resources.items()}
        resources.setdefault(urldefrag(own).url, root)
    except ValueError:  # (a root `$id` no URI parser reads: only local pointers are followed)
        resources = {}

    def target(ref: str) -> Any:
        if ref.startswith("#"):
            return resolve_ref(root, ref)
        try:
            url, fragment = urldefrag(urljoin(own, ref))
        except ValueError:  # (an `$id` of `http://[::1/z` written into its references: a ValueError was a 500)
            return None
        return resolve_ref(resources[url], "#" + fragment) if url in resources else None
    return target


def _meeting(node: dict, target: Callable[[str], Any], reads: list[int], branches: bool = True):
    """Each set of subschemas whose keywords one string of `node` meets at once: `node`, its `allOf` members, what
    its local `$ref`s name (theirs too), and of each `anyOf`/`oneOf` among them one branch (llguidance meets a
    node's length with each branch's pattern: `{anyOf: [{pattern: P}], maxLength: 253}` was a 400 without a
    pointer). `target`: what a `$ref` names (`_ref_targets`). So far as `_MEETING_HOLDERS` subschemas a set,
    `_MEETING_CHOICES` sets a node, and `_MEETING_READS` (`reads`, counted) a schema. Without `branches`, one set
    that takes no `anyOf`/`oneOf` branch."""
    work: list[tuple[list, list, list]] = [([node], [], [])]  # (to read, read, anyOf/oneOf lists not yet taken)
    made = 0
    while work and made < _MEETING_CHOICES and reads[0] < _MEETING_READS:
        queue, met, choices = work.pop()
        queue, met, choices = list(queue), list(met), list(choices)
        while queue and len(met) < _MEETING_HOLDERS:
            holder = queue.pop(0)
            if not isinstance(holder, dict) or any(holder is m for m in met):
                continue
            reads[0] += 1
            met.append(holder)
            queue += holder["allOf"] if isinstance(holder.get("allOf"), list) else []
            if isinstance(holder.get("$ref"), str):
                queue.append(target(holder["$ref"]))
            choices += [holder[k] for k in ("anyOf", "oneOf") if branches and isinstance(holder.get(k), list)
                        and holder[k]]
        if choices:
            work += [([branch], met, choices[1:]) for branch in reversed(choices[0])]
            continue
        made += 1
        yield met


def _undecided_among(holders: list[dict], uncompiled: set[int]) -> set[tuple[int, str]]:
    """The length bounds among `holders` (subschemas one string meets at once) that llguidance cannot meet with
    their patterns, formats and `enum`/`const` strings, where it meets those alone (a pattern it cannot decide by
    itself is left as it is). A pattern is written as llguidance is given it; one it cannot read is left out
    (`unreadable_pattern`)."""
    lengths = {}
    for holder in holders:
        for key in _LENGTHS:
            if isinstance(holder.get(key), int) and not isinstance(holder[key], bool):
                lengths[id(holder), key] = holder[key]
        if holder.get("format") == "hostname" and id(holder) not in uncompiled:
            most = lengths.get((id(holder), "maxLength"), _HOSTNAME_MOST)
            lengths[id(holder), "maxLength"] = min(most, _HOSTNAME_MOST)
    if not lengths or not any(isinstance(holder.get("pattern"), str) for holder in holders):
        return set()
    meeting = []
    for holder in holders:
        pattern = holder.get("pattern")
        if isinstance(pattern, str) and (id(holder) in uncompiled or unreadable_pattern(pattern) is None):
            meeting.append({"pattern": _spelled_for_llguidance(pattern)})
        if isinstance(holder.get("format"), str):
            meeting.append({"format": holder["format"]})
        # (the strings an `enum`/`const` allows: llguidance decides some meetings member by member that it cannot
        # without them, and the probe, asking about the patterns alone, left out a length it enforces there)
        meeting += [{key: holder[key]} for key in ("enum", "const") if key in holder]
    if not any("pattern" in one for one in meeting):
        return set()

    def probe(bounds) -> bool:
        least = [v for (_, key), v in bounds if key == "minLength"]
        most = [v for (_, key), v in bounds if key == "maxLength"]
        together = {"minLength": max(least)} if least else {}
        together |= {"maxLength": min(most)} if most else {}
        return _undecided(json.dumps({"type": "string", "allOf": meeting, **together}))

    if not probe(lengths.items()) or probe([]):
        return set()
    # (only the bounds that cost it: `minLength: 1` beside that name's `maxLength: 253` is decided, and was left
    # out with it, named unenforced, or under strict the 400 named it rather than the maxLength)
    kept = [item for item in lengths.items() if not probe([item])]
    if len(kept) > 1 and probe(kept):
        kept = []
    return set(lengths) - {bound for bound, _ in kept}


def _undecided_length_pointers(schema: dict, base_pointer: str, uncompiled: set[int]) -> list[str]:
    """The pointers of the length bounds `undecided_lengths` leaves out of `schema`: each `minLength`/`maxLength`,
    and a `format: hostname` whose 253 characters are left out where the client's `maxLength` does not say as
    much. Every pointer a subschema is reached at, through `$ref`s too (the bound is left out at each). Read as
    `llguidance_schema` reads it: a `$ref` below a nested `$id` as the URI it resolves to (against the root, a
    pattern its `$defs` held beside a length was never met, and the schema was a 400 without a pointer)."""
    resolved = _refs_resolved_in_resources(schema)
    if resolved is not schema:  # (the same places, other objects)
        schema, uncompiled = resolved, _uncompiled_nodes(resolved)
    undecided = undecided_lengths(schema, uncompiled)
    out: list[str] = []
    for ptr, key, node in walk_with_refs(schema, base_pointer) if undecided else ():
        most = node.get("maxLength")
        said = isinstance(most, int) and not isinstance(most, bool) and most <= _HOSTNAME_MOST
        if (key in _LENGTHS and (id(node), key) in undecided) or (
                key == "format" and node[key] == "hostname" and (id(node), "maxLength") in undecided and not said):
            out += [ptr] if ptr not in out else []
    return out


@functools.lru_cache(maxsize=4096)
def _spelled_for_llguidance(pattern: str) -> str:
    """`pattern` as `llguidance_schema` gives it to llguidance (asked again for each set of subschemas it meets)."""
    return _quote_safe(portable_pattern(pattern))


@functools.lru_cache(maxsize=4096)
def _undecided(schema: str) -> bool:
    """llguidance cannot decide whether some string meets the string schema `schema` (JSON text)."""
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    return is_error and any(_UNDECIDED_REGEX in m for m in messages)


# A `multipleOf` whose digits (less the point and trailing zeros) make more than this is one llguidance cannot read:
# it builds a state for each remainder of the divisor scaled to an integer, in seconds that grow faster than it and
# cannot be interrupted (1e5: 0.2 s, 1000003: 5.6 s on Qwen2's vocabulary, 2000006: 23 s, 12345678: 149 s, a request
# compile thread and a core held, QA parity F1; 1234567.1: 115 s, at the first mask, QA review F3).
_MAX_DIVISOR_DIGITS = 2 ** 20


@functools.lru_cache(maxsize=4096)
def unreadable_multiple(divisor: float) -> str | None:
    """llguidance's reason for refusing a `multipleOf` (0.07: "too many digits", as it reads the double; a whole
    divisor of too many remainders to compile), or None where it reads it."""
    if abs(divisor) < 2 ** 64:  # (its digits without the point or trailing zeros: 1234567.1 scales to 12345671)
        exact = decimal.Decimal(repr(divisor)).normalize()
        core = int("".join(map(str, exact.as_tuple().digits)))
        if core > _MAX_DIVISOR_DIGITS:
            return f"llguidance would build a state for each of its {core:,} remainders ({divisor})"
        if exact.adjusted() < -7 and core != 1:  # (7e-09, 3e-12: every walk wrote 5820, 9.62...; QA review2 P1)
            return f"llguidance misreads a divisor this small ({divisor}): it takes numbers that are not multiples"
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema({"type": "number", "multipleOf": divisor})
    except ValueError:  # (it takes no integer past 64 bits: "Value is not JSON serializable", a 400 without pointer)
        return f"llguidance reads no integer of more than 64 bits ({divisor})"
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    return " ".join(messages[-1].split()) if is_error and messages else None


def _unreadable_multiple_at(node: dict, key: str) -> str | None:
    """Why llguidance cannot enforce the node's `multipleOf`; None where it reads it, or where the node's few
    multiples are written as their enum instead (`_few_multiples_as_enum`), its bounds within ±2**53: past them,
    `_narrowed_bounds` may leave the range none (`multipleOf: 2**53 - 11` from `2**53 - 10` to `1e17`), the enum
    is not written, and the divisor reached llguidance (a 400 without a pointer, strict or not)."""
    value = node.get(key)
    if key != "multipleOf" or isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    reason = unreadable_multiple(value)
    within = all(abs(v) <= _NARROW_TO for v in _bounds(node, _LOWER_BOUNDS + _UPPER_BOUNDS))
    return None if reason is None or within and _few_multiples(node) is not None else reason


def _warnings(messages: list[str]) -> tuple[set[str], set[str], list[str]]:
    """(unimplemented keywords, unknown format names, anything else) from llguidance's messages."""
    keys: set[str] = set()
    formats: set[str] = set()
    other: list[str] = []
    for msg in messages:
        msg = _REPEATED.sub("", msg)
        m = _UNIMPLEMENTED.search(msg)
        if m:
            keys.update(json.loads("[" + m.group(1) + "]"))
        elif msg.startswith(_UNKNOWN_FORMAT):
            formats.add(msg[len(_UNKNOWN_FORMAT):])
        elif msg.startswith((_ONE_OF_AS_ANY_OF, _ONE_OF_UNSUPPORTED)):
            keys.add("oneOf")  # a oneOf whose branches may overlap: the lenient pass enforces it as anyOf (weaker)
        else:
            other.append(msg)
    return keys, formats, other


def _value_at(schema, pointer: str, base: str):
    """The value at `pointer` (below `base`) in `schema`; None where nothing is there."""
    node = schema
    for part in pointer[len(base):].split("/")[1:]:
        _, node = pointer_child(node, part)
    return node


def compile_llg(lltok, vocab: Vocabulary, kind: str, *, schema=None, regex: str | None = None,
                strict_under: tuple[str, ...] = (), whitespace_pattern: str = "[ ]?", param: str = "response_format",
                base_pointer: str = "", call_names: tuple[bytes, ...] = ()) -> "LlgGrammar":
    """Validate and build (see `checked_grammar_text`). `call_names`: tool calls' function names as the output
    spells them (`json_call_names`), for closing walks."""
    text, unenforced, _ = checked_grammar_text(lltok, kind, schema=schema, regex=regex, strict_under=strict_under,
                                               whitespace_pattern=whitespace_pattern, param=param,
                                               base_pointer=base_pointer)
    hints = string_hints(schema) if kind == "json" else regex_hints(regex) if kind == "regex" else ()
    return LlgGrammar(lltok, text, vocab, unenforced, hints, json_output=kind == "json",
                      key_names=required_names(schema) if kind == "json" else (),
                      divisors=integer_divisors(schema) if kind == "json" else (), call_names=call_names)


def json_call_names(names: tuple[str, ...]) -> tuple[bytes, ...]:
    """Function names as JSON calls spell them (`"name": "get_weather"`): for closing walks, which measure the
    call through each (`LlgMatcher._walk`); none for one function."""
    return tuple(json.dumps(name, ensure_ascii=False).encode() for name in names) if len(names) > 1 else ()


def checked_grammar_text(lltok, kind: str, *, schema=None, regex: str | None = None, strict_under: tuple[str, ...] = (),
                         whitespace_pattern: str = "[ ]?", param: str = "response_format",
                         base_pointer: str = "") -> tuple[str, tuple[str, ...], bool]:
    """The grammar text, the unenforced pointers, and whether the places where a recursive definition meets other
    keywords are written out (where llguidance refused the schema for one: `llguidance_json`); an unimplemented
    keyword inside a strict subschema (`ConstraintSpec.strict_under`) fails with the keyword's pointer, the others
    are accepted and named.

    llguidance stops at the first unimplemented keyword; its lenient mode lists them all (and ignores them, and
    enforces a oneOf as anyOf), so that list names the unenforced pointers. Formats JSON Schema does not define
    are annotations every validator ignores: ignoring them loses nothing, and they are never named."""
    imprecise = _inexact_keywords(schema, base_pointer, param, strict_under) if kind == "json" else []
    ignored = set().union(*keywords_ignored_in_draft(schema).values()) if kind == "json" else set()
    text, is_error, msgs, written_out = _validated_text(lltok, kind, schema, regex, whitespace_pattern, False, False)
    unenforced: tuple[str, ...] = tuple(imprecise)
    if is_error or ignored:
        keys, formats, other = _warnings(msgs) if is_error else (set(), set(), [])
        if is_error and (other or kind == "regex" or not (keys or formats)):
            code = "schema_too_large" if "schema too large" in msgs else "invalid_constraint"  # (its whole message)
            said = "; ".join(msgs)[:500]
            if _UNDECIDED_REGEX in said:  # (its message is the joined regexes, thousands of characters of them)
                said = (f"{_UNDECIDED_REGEX}: the patterns that meet in one string (`pattern`s, `format`s, "
                        "`enum`/`const` strings, and the complements a `not` of them is written as) are too "
                        "complex for llguidance to decide whether some string matches them all; simplify them")
            if code == "schema_too_large":  # (llguidance names no limit: which one, in words a client can act on)
                said += (" (llguidance's limit on the grammar it builds: the schema's subschemas, as `allOf` and "
                         "the `anyOf`/`oneOf` alternatives it multiplies out, make too many; split the schema or "
                         "flatten its combinations)")
            raise _refusal(f"cannot compile constraint: {said}", msgs, schema, base_pointer, param, code)
        text, lenient_error, lenient_msgs, written_out = _validated_text(lltok, kind, schema, regex,
                                                                         whitespace_pattern, True, written_out)
        if not lenient_error:
            keys, formats, other = _warnings(lenient_msgs)
            if other:  # an approximation we cannot name: never compile weaker than asked without saying so
                raise _refusal(f"cannot compile schema: {'; '.join(other)[:500]}", other, schema, base_pointer, param)
        keys |= ignored
        keys.discard("format")
        pointers = sorted(set(pointers_of(schema, keys, base_pointer)))
        if keys and not pointers:
            pointers = [base_pointer]  # (the root's: "")
        pointers += [p for p in pointers_of(schema, {"format"}, base_pointer)
                     if _value_at(schema, p, base_pointer) in formats & STANDARD_FORMATS]
        refused = [p for p in pointers if any(p == s or p.startswith(s + "/") for s in strict_under)]
        if refused:
            what = ", ".join(sorted(keys | ({"format"} if formats & STANDARD_FORMATS else set())))
            raise ConstraintError(f"strict schema uses a keyword that cannot be enforced at {refused[0] or 'the root'} "
                                  f"({what})",
                                  param=param, pointer=refused[0], code="unsupported_schema")
        if lenient_error:
            raise _refusal(f"cannot compile schema: {'; '.join(lenient_msgs)[:500]}", lenient_msgs, schema,
                           base_pointer, param)
        unenforced = tuple(sorted(set(pointers) | set(imprecise)))
    return text, unenforced, written_out


def _validated_text(lltok, kind: str, schema, regex: str | None, whitespace_pattern: str, lenient: bool,
                    written_out: bool) -> tuple[str, bool, list[str], bool]:
    """(grammar text, is_error, llguidance's messages, written_out): where llguidance refuses the schema for a
    recursive definition meeting other keywords (before it names an unimplemented keyword, or in lenient mode
    after), it is asked again with those places written out (`llguidance_json`); `written_out` says so."""
    text = grammar_text(kind, schema=schema, regex=regex, whitespace_pattern=whitespace_pattern, lenient=lenient,
                        write_out_meetings=written_out)
    is_error, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(text, lltok, limits=_limits())
    if is_error and kind == "json" and not written_out \
            and any(said in m for m in msgs for said in _RECURSIVE_MEETINGS):
        met = grammar_text(kind, schema=schema, whitespace_pattern=whitespace_pattern, lenient=lenient,
                           write_out_meetings=True)
        if met != text:
            is_error, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(met, lltok, limits=_limits())
            return met, is_error, msgs, True
    return text, is_error, msgs, written_out


_UNDECIDED_REGEX = "Unable to determine if regex is empty"

# Keywords llguidance leaves out without a word (no "Unimplemented keys") in a subschema read in a draft that does
# not define them (the nearest `$schema` above, its own included: a function's draft-04 parameters too). The product
# enforces them as the later draft does where they are left (constrain/rewrite.py `as_read_where_unasserted` dropped
# the others): the late checks, which read them so (`validator_class`'s `later_keywords`), or the unenforced list.
# Unnamed, draft 4's `contains: {"enum": [2]}` let `[]` through, strict, and named nothing (QA typedrop F6), and
# draft 7's `prefixItems: [{"type": "integer"}]` took `["a"]`.
_NOT_BEFORE_2019 = frozenset({"prefixItems", "unevaluatedProperties", "unevaluatedItems"})
_IGNORED_IN_DRAFT = (("draft-04", _NOT_BEFORE_2019 | {"contains", "minContains", "maxContains", "propertyNames", "if",
                                                      "then", "else"}),
                     ("draft-06", _NOT_BEFORE_2019 | {"if", "then", "else"}),
                     ("draft-07", _NOT_BEFORE_2019),
                     ("2019-09", frozenset({"prefixItems"})))


def keywords_ignored_in_draft(schema: Any) -> dict[int, frozenset[str]]:
    """id() of each subschema of `schema` that holds keywords of `_IGNORED_IN_DRAFT` where its draft leaves
    llguidance to ignore them -> those keywords."""
    dialects = node_dialects(schema)
    out: dict[int, frozenset[str]] = {}
    for node in schema_objects(schema):
        dialect = dialects[id(node)] or ""
        ignored = frozenset(key for draft, keys in _IGNORED_IN_DRAFT if draft in dialect for key in keys & node.keys())
        if ignored:
            out[id(node)] = ignored
    return out


# llguidance's refusals of keywords that meet (a `$ref` beside other keywords, objects an `allOf` joins), which
# name no keyword: the keyword where they meet (`_refusal`).
_MEETING_REFUSALS = (
    (re.compile(r"circular references with sibling keys are not supported: \S*?#(\S*)"), "$ref"),  # (`#`: the root)
    (re.compile(r"patternProperty regexes /(.*)/ and /(.*)/ are (?:not )?disjoint"), "patternProperties"),
    (re.compile(rf"Schema intersection stack level exceeded|{_UNDECIDED_REGEX}"), "allOf"),
)


def _refusal(message: str, msgs, schema, base_pointer: str, param: str,
             code: str = "invalid_constraint") -> ConstraintError:
    """llguidance's refusal, with the JSON Pointer of the keyword it stumbled on where its message names none
    but says which kind (`_MEETING_REFUSALS`), told in the message too: the `$ref` to the target it names that
    has siblings; the `patternProperties` holding both regexes it names, or the innermost `allOf` joining the
    objects that hold them; else the outermost such keyword."""
    text = "; ".join(msgs)
    pointer = None
    for found, keyword in _MEETING_REFUSALS if isinstance(schema, (dict, bool)) else ():
        match = found.search(text)
        if match is None:
            continue
        if keyword == "$ref":
            target = unquote(match.group(1))
            places = [ptr for ptr, key, node in walk(schema, base_pointer) if key == "$ref"
                      and isinstance(node[key], str) and unquote(node[key]) == "#" + target]
            places = [p for p in places if _has_siblings(schema, p, base_pointer)] or places
        else:
            places = [ptr for ptr, key, _ in walk(schema, base_pointer) if key == keyword]
            if keyword == "patternProperties":  # (llguidance writes a regex's "/" as "\/" between its slashes)
                first, second = (match.group(i).replace("\\/", "/") for i in (1, 2))
                places = _holders_of(schema, base_pointer, first, second) or places
            else:
                places = _meeting_all_of(schema, base_pointer, text) or places
        if places:
            pointer = min(places, key=lambda p: (p.count("/"), p))
            message = f"{message} (at {pointer})"
        break
    if pointer is None and "Unsatisfiable schema" in text and isinstance(schema, dict):
        pointer = _crossed_bounds(schema, base_pointer, text) or _unsatisfiable_property(schema, base_pointer, text)
        message = f"{message} (at {pointer})" if pointer is not None else message
    return ConstraintError(message, param=param, pointer=pointer, code=code)


# llguidance's words for a pair of bounds no value meets ("minimum (5) is greater than maximum (3)"), and the pairs
_GREATER = re.compile(r"(\w+) \([^)]*\) is greater than (\w+) \(")
_REQUIRED_UNSATISFIABLE = re.compile(r"required property '([^']*)' is unsatisfiable")
_BOUND_PAIRS = (("minimum", "maximum"), ("exclusiveMinimum", "maximum"), ("minimum", "exclusiveMaximum"),
                ("exclusiveMinimum", "exclusiveMaximum"), ("minLength", "maxLength"), ("minItems", "maxItems"),
                ("minProperties", "maxProperties"), ("minContains", "maxContains"))


def _crossed_bounds(schema: dict, base_pointer: str, text: str) -> str | None:
    """The pointer of the lower bound of a pair that no value meets, for llguidance's "Unsatisfiable schema",
    which names the keywords but not where they are (or, for a required property, only its name): a 400 that
    said `minimum (5) is greater than maximum (3)` with no pointer. The pair llguidance names first, then one
    under the required property it names (not an optional one's, nor an unused definition's: QA review2 F3), then
    the outermost."""
    named = _GREATER.search(text)
    required = _REQUIRED_UNSATISFIABLE.search(text)
    under = f"/properties/{escape_pointer_part(required.group(1))}/" if required else None
    found = []
    for ptr, key, node in walk(schema, base_pointer):
        for low, high in _BOUND_PAIRS:
            a, b = node.get(low) if key == low else None, node.get(high)
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
                continue
            if a > b or (a == b and (low.startswith("exclusive") or high.startswith("exclusive"))):
                found.append((named is None or named.groups() != (low, high),
                              under is not None and under not in ptr, ptr.count("/"), ptr))
    return min(found)[-1] if found else None


def _unsatisfiable_property(schema: dict, base_pointer: str, text: str) -> str | None:
    """For llguidance's "required property 'a' is unsatisfiable" (an `allOf` of types that share none, an `enum`
    beside a `const` it lacks), the pointer of `a`'s declaration beside the one `required` that lists it and
    declares it (None where there are more, or none: `a` may fall to `additionalProperties` instead): the 400
    named no place."""
    required = _REQUIRED_UNSATISFIABLE.search(text)
    if required is None:
        return None
    name = required.group(1)
    places = [f"{ptr.rsplit('/', 1)[0]}/properties/{escape_pointer_part(name)}"
              for ptr, key, node in walk(schema, base_pointer)
              if key == "required" and isinstance(node[key], list) and name in node[key]
              and isinstance(node.get("properties"), dict) and name in node["properties"]]
    return places[0] if len(places) == 1 else None


def _has_siblings(schema, ref_pointer: str, base_pointer: str) -> bool:
    """The `$ref` at `ref_pointer` meets other keywords: beside it, or as a member of an `allOf` with others."""
    holder = _value_at(schema, ref_pointer.rsplit("/", 1)[0], base_pointer)
    if isinstance(holder, dict) and set(holder) - ANNOTATIONS - {"$ref"}:
        return True
    parent = ref_pointer.rsplit("/", 3)
    return len(parent) == 4 and parent[1] == "allOf"


def _meeting_all_of(schema, base_pointer: str, text: str) -> list[str]:
    """The `allOf` where llguidance's intersection failed: under the definition its message says it was compiling,
    the innermost `allOf` above every `pattern` it names (as `llguidance_schema` spells them), else the outermost
    there; [] where there is none."""
    within = re.search(r"while processing json-schema:///#(/\S*)", text)
    under = base_pointer + (unquote(within.group(1)) if within else "")
    named = {r.replace("\\/", "/") for r in re.findall(r"Regex /(.*?)/\)", text)}
    patterns = [ptr for ptr, key, node in walk(llguidance_schema(schema), base_pointer)
                if key == "pattern" and node[key] in named and ptr.startswith(under + "/")]
    joins = [ptr for ptr, key, _ in walk(schema, base_pointer) if key == "allOf" and ptr.startswith(under + "/")]
    above = [j for j in joins if patterns and all(p.startswith(j + "/") for p in patterns)]
    if above:
        return [max(above, key=lambda p: p.count("/"))]
    return [min(joins, key=lambda p: (p.count("/"), p))] if joins else []


def _holders_of(schema, base_pointer: str, first: str, second: str) -> list[str]:
    """Where llguidance met two names' patterns, as it spelled them (`llguidance_schema`): the `patternProperties`
    holding both, else the innermost `allOf` above one holding each; [] where they are not found."""
    holding: dict[str, set[str]] = {first: set(), second: set()}
    for ptr, key, node in walk(llguidance_schema(schema), base_pointer):
        if key == "patternProperties" and isinstance(node[key], dict):
            for regex in (first, second):
                if regex in node[key]:
                    holding[regex].add(ptr)
    together = sorted(holding[first] & holding[second])
    if together or not (holding[first] and holding[second]):
        return together
    joins = [ptr for ptr, key, _ in walk(schema, base_pointer) if key == "allOf"
             and any(a.startswith(ptr + "/") for a in holding[first])
             and any(b.startswith(ptr + "/") for b in holding[second])]
    return [max(joins, key=lambda p: p.count("/"))] if joins else []


_EXACT_FLOAT_INT = 2 ** 53  # llguidance reads a schema's numbers as 64-bit floats: integers above this round
_NO_RANGE_PAST = 10 ** 18  # nor builds a number range whose end (not narrowed: `_narrowed_bounds`) is past this
_NUMERIC_KEYWORDS = ("const", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def _inexact_keywords(schema, base_pointer: str, param: str, strict_under: tuple[str, ...]) -> list[str]:
    """Pointers of keywords llguidance compiles without a warning but not exactly: unenforced, or under `strict` a
    400 naming the keyword. An integer past 2**53 (`const: 9007199254740993` was enforced 9007199254740992; past
    64 bits llguidance cannot read it at all, nor a bound past 1e18 that is not narrowed: always a 400), a
    `pattern` whose class holds every control character but not both '"' and '\\'
    (`support.llguidance_escape_gap`), and a `pattern` or `multipleOf` llguidance cannot read at all
    (`unreadable_pattern`, `unreadable_multiple`). So is a `const` or `enum` number written with a fraction or an
    exponent that is an integer past 2**53 (`2.5e+30`): llguidance writes it out in full (31 digits), which JSON
    parsers that keep integers exact (Python's) read as an integer other than the double the schema holds, and
    `1.5e+300` takes 301 digits."""
    def numbers(value):
        if isinstance(value, bool):
            return
        if isinstance(value, (int, float)):
            yield value
        elif isinstance(value, list):
            for v in value:
                yield from numbers(v)
        elif isinstance(value, dict):
            for v in value.values():
                yield from numbers(v)

    found = []
    uncompiled = _uncompiled_nodes(schema)
    narrowed = _narrowed_bounds(schema, base_pointer)
    for ptr in _undecided_length_pointers(schema, base_pointer, uncompiled):  # (`llguidance_schema` leaves them out)
        if any(ptr == s or ptr.startswith(s + "/") for s in strict_under):  # (one pointer in the message: the
            # client's terms replace it, for tools too)
            bound = "the hostname format's 253 characters" if ptr.endswith("/format") \
                else f"the {ptr.rsplit('/', 1)[1]}"
            raise ConstraintError(f"{bound} at {ptr} cannot be enforced beside the patterns and formats its strings "
                                  "must match there (its own, its allOf members', what its $ref names, an "
                                  "anyOf/oneOf branch's, the same property's where allOf merges objects): "
                                  "llguidance cannot decide within its budget whether some string meets them all",
                                  param=param, pointer=ptr, code="unsupported_schema")
        found.append(ptr)
    for ptr, key, node in walk(schema, base_pointer):
        strict = any(ptr == s or ptr.startswith(s + "/") for s in strict_under)
        reason = unreadable_pattern(node[key]) if key == "pattern" and isinstance(node[key], str) \
            and id(node) not in uncompiled else None
        if key == "patternProperties" and isinstance(node[key], dict) and id(node) not in uncompiled:
            for name in node[key]:
                unreadable = unreadable_pattern(name)
                if unreadable is not None:  # (a name's pattern cannot be left out: it decides a key's schema)
                    raise ConstraintError(f"the name pattern at {ptr}/{escape_pointer_part(name)} cannot be enforced: "
                                          f"{unreadable}", param=param, pointer=f"{ptr}/{escape_pointer_part(name)}",
                                          code="unsupported_schema")
        if reason is not None:  # (left out of what llguidance compiles: `llguidance_schema`)
            if strict:
                raise ConstraintError(f"the pattern at {ptr} cannot be enforced: {reason}", param=param,
                                      pointer=ptr, code="unsupported_schema")
            found.append(ptr)
        multiple = _unreadable_multiple_at(node, key) if id(node) not in uncompiled else None
        if multiple is not None:  # (left out of what llguidance compiles: `llguidance_schema`)
            if strict:
                raise ConstraintError(f"the multipleOf at {ptr} cannot be enforced: {multiple}", param=param,
                                      pointer=ptr, code="unsupported_schema")
            found.append(ptr)
            continue
        if key == "pattern" and isinstance(node[key], str) and llguidance_escape_gap(node[key]):
            if strict:
                raise ConstraintError(f"the pattern at {ptr} cannot be enforced exactly: a class holding every "
                                      "control character (or all but \\n) but not both '\"' and '\\' lets "
                                      "llguidance take the escapes \\\" and \\\\ for such characters",
                                      param=param, pointer=ptr,
                                      code="unsupported_schema")
            found.append(ptr)
        if key not in _NUMERIC_KEYWORDS or ptr in narrowed:
            continue
        value = node[key]
        bound = key in _UPPER_BOUNDS + _LOWER_BOUNDS
        if bound and isinstance(value, float) and abs(value) >= _NO_RANGE_PAST and id(node) not in uncompiled:
            raise ConstraintError(f"the bound {value!r} at {ptr} cannot be enforced (llguidance builds no number "
                                  f"range with an end past ±1e18 on that side)", param=param, pointer=ptr,
                                  code="unsupported_schema")
        widest = max((i for i in numbers(value) if isinstance(i, int)), key=abs, default=0)
        largest = abs(widest)
        unreadable = _NO_RANGE_PAST if bound and id(node) not in uncompiled else 2 ** 63
        if largest >= unreadable:  # (`strict` or not)
            why = ("builds no number range with an end past ±1e18 on that side" if unreadable == _NO_RANGE_PAST
                   else "reads no integer past 64 bits")
            raise ConstraintError(f"the integer {widest} at {ptr} cannot be enforced (llguidance {why})",
                                  param=param, pointer=ptr, code="unsupported_schema")
        if largest > _EXACT_FLOAT_INT and strict:
            raise ConstraintError(f"the integer {widest} at {ptr} cannot be enforced exactly (llguidance reads "
                                  f"numbers as 64-bit floats, exact up to 2**53)", param=param, pointer=ptr,
                                  code="unsupported_schema")
        spelled = [v for v in numbers(value) if isinstance(v, float) and math.isfinite(v) and v.is_integer()
                   and abs(v) > _EXACT_FLOAT_INT] if key in ("const", "enum") else []
        if spelled and strict:
            raise ConstraintError(f"the number {spelled[0]!r} at {ptr} cannot be enforced exactly (llguidance writes "
                                  f"it out in full, an integer other than the 64-bit float {spelled[0]!r} to "
                                  f"parsers that keep integers exact)", param=param, pointer=ptr,
                                  code="unsupported_schema")
        if largest > _EXACT_FLOAT_INT or spelled:
            found.append(ptr)
    return found


def compile_calls_or_text(lltok, vocab: Vocabulary, schema, *, strict_under: tuple[str, ...],
                          whitespace_pattern: str, not_first: str, not_leading: str | None = None,
                          call_names: tuple[bytes, ...] = ()) -> "LlgGrammar":
    """tool_choice "auto": tool calls (the call schema), free text whose first character other than whitespace
    is not one of `not_first` (those that open calls) nor begins the tag `not_leading` (the special token calls
    may open with: spelled in ordinary tokens it decodes alike, and the text was read back as calls, QA toolfmt
    F1), or nothing. Either may start with whitespace: a
    SentencePiece model's words are tokens that begin with a space ("▁The", "▁["), and a model that opened its
    calls with "▁[" was pushed into text (the parsers read calls after whitespace). The calls alone get the support
    check of `checked_grammar_text` (a strict refusal with the keyword's pointer, else the unenforced pointers),
    then join the text alternative in one grammar with the same JSON options."""
    _, unenforced, written_out = checked_grammar_text(lltok, "json", schema=schema, strict_under=strict_under,
                                                      whitespace_pattern=whitespace_pattern, param="tools")
    options = _json_options(whitespace_pattern, lenient=bool(unenforced))
    first = "".join("\\" + c for c in not_first)
    leading = f" & ~/[ \\t\\r\\n]*{re.escape(not_leading)}[\\s\\S]*/" if not_leading else ""
    lark = ('start: calls | text | ""\n'  # (or nothing: see tools.ANY_TEXT)
            "calls: LEAD? json\n"
            "LEAD: /[ \\t\\r\\n]{1,4}/\n"
            f"json: %json {json.dumps({**llguidance_json(schema, written_out), 'x-guidance': options})}\n"
            "text: TEXT\n"
            f"TEXT: /[ \\t\\r\\n]+|[ \\t\\r\\n]*[^{first} \\t\\r\\n][\\s\\S]*/{leading}\n")
    text = llguidance.LLMatcher.grammar_from_lark(lark)
    is_error, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(text, lltok, limits=_limits())
    if is_error:
        raise ConstraintError(f"cannot compile tools: {'; '.join(msgs)[:500]}", param="tools")
    return LlgGrammar(lltok, text, vocab, unenforced, string_hints(schema), json_output=True,
                      key_names=required_names(schema), divisors=integer_divisors(schema),
                      call_openers=not_first.encode(), call_names=call_names)


def compile_hermes_calls(lltok, vocab: Vocabulary, schema, *, strict_under: tuple[str, ...],
                         whitespace_pattern: str, free_text: bool) -> "LlgGrammar":
    """Tool calls in the hermes format (constrain/tools.py): each `<tool_call>\\n{call}\\n</tool_call>`, one or
    (unless the call schema says `maxItems: 1`) more separated by newlines. With `free_text` (tool_choice "auto")
    also text holding no `<tool_call>`, or such text then calls: text ends where the tag's token comes, so that
    form needs the tag to be one token of the vocabulary (Qwen's, Hermes'). A tag that is a token may also be
    spelled out. The support check is `compile_calls_or_text`'s, on the call schema."""
    from constrain.tools import HERMES_CLOSE, HERMES_OPEN, call_item_schema

    _, unenforced, written_out = checked_grammar_text(lltok, "json", schema=schema, strict_under=strict_under,
                                                      whitespace_pattern=whitespace_pattern, param="tools")
    options = _json_options(whitespace_pattern, lenient=bool(unenforced))
    item = llguidance_json(call_item_schema(schema), written_out)
    open_token = _tag_token(lltok, HERMES_OPEN)
    calls = "call" if schema.get("maxItems") == 1 else 'call ("\\n" call)*'
    starts = ["calls"]
    if free_text:  # (or nothing: see tools.ANY_TEXT)
        starts += ["TEXT", "TEXT calls", '""'] if open_token is not None else ["TEXT", '""']
    lark = (f"start: {' | '.join(starts)}\n"
            f"calls: {calls}\n"
            'call: open "\\n" item "\\n" close\n'
            f"open: {_tag_rule(HERMES_OPEN, open_token)}\n"
            f"close: {_tag_rule(HERMES_CLOSE, _tag_token(lltok, HERMES_CLOSE))}\n"
            f"item: %json {json.dumps({**item, 'x-guidance': options})}\n"
            f"TEXT: /[\\s\\S]+/ & ~/[\\s\\S]*{HERMES_OPEN}[\\s\\S]*/\n")
    text = llguidance.LLMatcher.grammar_from_lark(lark)
    is_error, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(text, lltok, limits=_limits())
    if is_error:
        raise ConstraintError(f"cannot compile tools: {'; '.join(msgs)[:500]}", param="tools")
    variants = schema["items"].get("anyOf", [schema["items"]])
    names = tuple(json.dumps(v["properties"]["name"]["const"], ensure_ascii=False).encode() for v in variants)
    return LlgGrammar(lltok, text, vocab, unenforced, string_hints(schema), json_output=True,
                      key_names=required_names(schema), call_tag=HERMES_OPEN.encode(), call_names=names,
                      divisors=integer_divisors(schema), call_close=HERMES_CLOSE.encode())


def _in_call_schema(found, i: int, params: dict, pointers: tuple[str, ...]):
    """A pointer (or a ConstraintError's) found checking the `parts_document` of the parameter held to the schemas
    at `pointers` (checked with the first as its base), where the call schema has it: a keyword of the parameters'
    own `$defs`, copied beside the value, is named there (it was named at the `$ref` to it: QA toolfmt2 F5), one
    of the k-th schema's below it."""
    from constrain.xml_calls import document_pointer

    if isinstance(found, ConstraintError):
        moved = _in_call_schema(found.pointer, i, params, pointers) if found.pointer else found.pointer
        if moved == found.pointer:
            return found
        return ConstraintError(found.message.replace(found.pointer, moved), param=found.param, pointer=moved,
                               code=found.code)
    base = pointers[0]
    return document_pointer(i, params, pointers, found[len(base):]) if found.startswith(base + "/") else found


def compile_xml_calls(lltok, vocab: Vocabulary, spec, *, whitespace_pattern: str) -> "LlgGrammar":
    """Tool calls in the shape of `spec.tool_format` (constrain/xml_calls.py: qwen3_coder, glm45, glm47): each
    call in `<tool_call>` tags, its function's name, then its parameters in declared order (the required ones
    always), each key and value between the shape's tags; calls separated as the shape says, one only where the
    call schema says `maxItems: 1`. Under tool_choice "auto" also text, or text then calls where `<tool_call>` is
    one token (as in `compile_hermes_calls`). A tag that is a token of the vocabulary is written as that token
    (GLM's are special tokens); a raw value is one lexeme, with its closing text where that is no token. A JSON
    value gets the support check of `checked_grammar_text` (strict refusals with the keyword's pointer in the call
    schema, else unenforced pointers), and so do the keywords only the JSON checks enforce (keys without
    escapes)."""
    from constrain.plain_keys import open_object_at
    from constrain.tools import HERMES_CLOSE, HERMES_OPEN, function_schema
    from constrain.xml_calls import (SHAPES, Variant, check_functions, document_pointer, object_variants,
                                     parts_document, parts_form)

    shape = SHAPES[spec.tool_format]
    tokens = {tag: _tag_token(lltok, tag) for tag in shape.tags}
    tokens = {tag: token for tag, token in tokens.items() if token is not None}

    def text(piece: str) -> str:
        """`piece` as a Lark sequence: its tags that are tokens as those tokens, the rest as strings."""
        out, rest = [], piece
        while rest:
            at = min(((rest.find(tag), tag) for tag in tokens if tag in rest), default=(len(rest), ""))
            if at[0]:
                out.append(json.dumps(rest[:at[0]]))
            if at[1]:
                out.append(f"<[{tokens[at[1]]}]>")
            rest = rest[at[0] + len(at[1]):]
        return " ".join(out)

    unenforced = check_functions(spec)
    rules, functions, hints, required_keys = [], [], [], []
    json_keys: list[bytes] = []  # the names a JSON value's objects require (`required_names`), escaped
    closing_token = next((tag for tag in tokens if shape.after_value.startswith(tag)), None)
    for i, name in enumerate(spec.tool_names):
        if any(c in name for c in "<>\n"):
            raise ConstraintError(f"tools[{i}]: the function name {name!r} cannot be written in the "
                                  f"{spec.tool_format} tool-call format of this model's chat template", param="tools")
        params = function_schema(spec, i)
        found = object_variants(params)
        if found is not None:  # (a union of objects: one argument list per variant)
            variants = found[0]
        else:
            props = params.get("properties", {}) if isinstance(params, dict) else {}
            variants = [Variant(tuple((key, (schema,), (f"/properties/{escape_pointer_part(key)}",)) for key, schema
                                      in (props.items() if isinstance(props, dict) else ())),
                                frozenset(params.get("required", ())) if isinstance(params, dict) else frozenset())]
        written: dict[tuple[str, ...], str | ConstraintError] = {}  # pointers -> its rule, or why it cannot be

        def parameter(key: str, schemas: tuple[Any, ...], ats: tuple[str, ...], j: int) -> str | ConstraintError:
            nonlocal unenforced, hints
            pointers = tuple(f"/$defs/tool{i}{at}" for at in ats)
            pointer = pointers[0]
            form = parts_form(schemas, params)
            if set(pointers) & set(unenforced) or False in schemas or form is None:
                return ConstraintError(f"tools[{i}]: the required parameter {key!r} cannot be written in the "
                                       f"{spec.tool_format} tool-call format of this model's chat template",
                                       param="tools", pointer=pointer, code="unsupported_schema")
            opening = text(shape.before_key + key + shape.between)
            # (a value none of whose allowed strings can be written raw failed the answer midway, a 400
            # `constraint_too_complex` after the call had begun)
            if form.raw and not form.writable(shape.value_close):
                return ConstraintError(f"tools[{i}]: every value of the required parameter {key!r} holds "
                                       f"{shape.value_close!r}, which ends a value in the {spec.tool_format} "
                                       "tool-call format of this model's chat template", param="tools",
                                       pointer=pointer, code="unsupported_schema")
            if form.raw:  # (a raw value is the string a JSON string would hold, unescaped)
                hints += tuple(h for schema in schemas for h in string_hints(schema) if b"\\" not in h)
            if form.raw and closing_token is None:  # (the closing text in the lexeme: a token may span both)
                rules.append(f"p{i}_{j}: {opening} P{i}_{j}\n"
                             f"P{i}_{j}: {form.lexeme(shape.value_close)} {json.dumps(shape.after_value)}")
            elif form.raw:  # (the closing tag's token ends the lexeme)
                rules.append(f"p{i}_{j}: {opening} P{i}_{j} {text(shape.after_value)}\n"
                             f"P{i}_{j}: {form.lexeme(shape.value_close)}")
            else:
                value = parts_document(params, key, ats)
                if value is None:
                    error = ConstraintError(f"tools[{i}]: the parameter {key!r} refers to its function's schema "
                                            f"beyond its own, which holds a nested $id: the {spec.tool_format} "
                                            "tool-call format cannot follow such a reference", param="tools",
                                            pointer=pointer, code="unsupported_schema")
                    if any(pointer.startswith(s + "/") for s in spec.strict_under):
                        raise error
                    unenforced += (pointer,)
                    return error
                try:
                    _, bad, written_out = checked_grammar_text(lltok, "json", schema=value,
                                                               strict_under=spec.strict_under,
                                                               whitespace_pattern=whitespace_pattern, param="tools",
                                                               base_pointer=pointer)
                except ConstraintError as exc:
                    raise _in_call_schema(exc, i, params, pointers) from None
                bad = tuple(_in_call_schema(p, i, params, pointers) for p in bad)
                inner = open_object_at(value)
                if inner is not None:  # (named where it is, not at the parameter: QA toolfmt2 F3)
                    place = document_pointer(i, params, pointers, inner)
                    if any(pointer.startswith(s + "/") for s in spec.strict_under):
                        raise ConstraintError(f"strict schema uses an object at {place} whose keys the "
                                              f"{spec.tool_format} tool-call format cannot keep from being written "
                                              "with escapes (declare additionalProperties: false there)",
                                              param="tools", pointer=place, code="unsupported_schema")
                    bad += (place,)
                unenforced += bad
                options = _json_options(whitespace_pattern, lenient=bool(bad))
                value_json = json.dumps({**llguidance_json(value, written_out), 'x-guidance': options})
                rules.append(f"p{i}_{j}: {opening} v{i}_{j} {text(shape.after_value)}\n"
                             f"v{i}_{j}: %json {value_json}")
                hints += string_hints(value)
                json_keys.extend(required_names(value))
            return f"p{i}_{j}"

        lists, refused = [], None
        for variant in variants:
            body = []
            for key, schemas, ats in variant.props:
                if ats not in written:
                    written[ats] = parameter(key, schemas, ats, len(written))
                rule = written[ats]
                if isinstance(rule, ConstraintError):
                    if key in variant.required:  # (no call of this variant can be written)
                        refused = refused or rule
                        break
                    continue  # (an optional one is left out: the only way a call can hold it)
                body.append(rule if key in variant.required else f"{rule}?")
            else:
                lists.append(" ".join(body) or '""')
                required_keys += [shape.before_key + key + shape.between for key, _, _ in variant.props
                                  if key in variant.required]
        if not lists:
            raise refused
        body = [text(name + shape.after_name), f"({' | '.join(lists)})" if len(lists) > 1 else lists[0]]
        functions.append(f"f{i}")
        rules.append(f"f{i}: {' '.join(body)}")
    open_token = _tag_token(lltok, HERMES_OPEN)
    starts = ["calls"]
    if spec.tool_choice == "auto":  # (or nothing: see tools.ANY_TEXT)
        starts += ["TEXT", "TEXT calls", '""'] if open_token is not None else ["TEXT", '""']
    calls = "call" if spec.schema.get("maxItems") == 1 else f"call ({text(shape.separator)} call)*"
    lark = "\n".join([
        f"start: {' | '.join(starts)}",
        f"calls: {calls}",
        f"call: open {text(shape.before_name)} ({' | '.join(functions)}) {text(shape.before_close)} close",
        f"open: {_tag_rule(HERMES_OPEN, open_token)}",
        f"close: {_tag_rule(HERMES_CLOSE, _tag_token(lltok, HERMES_CLOSE))}",
        *rules,
        f"TEXT: /[\\s\\S]+/ & ~/[\\s\\S]*{HERMES_OPEN}[\\s\\S]*/",
    ]) + "\n"
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    is_error, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, lltok, limits=_limits())
    if is_error:
        raise ConstraintError(f"cannot compile tools: {'; '.join(msgs)[:500]}", param="tools")

    close_token = _tag_token(lltok, HERMES_CLOSE)
    ending_tokens = {**tokens, **({HERMES_CLOSE: close_token} if close_token is not None else {})}

    def forced(piece: str) -> bytes:
        """`piece` as llguidance writes forced bytes: a tag that is a token as `\\xff[id]`."""
        out = piece.encode()
        for tag, token in ending_tokens.items():
            out = out.replace(tag.encode(), b"\xff[%d]" % token)
        return out

    # A closing walk ends a value, or the call once its required parameters are written, else writes the next
    # required parameter (not the optional ones it would come to first); a value that cannot be empty is `null`
    # where it may be (its first byte that fits would begin `0001-01-01` under `format: date`: 10 tokens).
    # Inside a JSON value, a key a closing walk writes is a required one, with its colon (no string value is that):
    # the first that fits spelled the first declared property, an optional one, `{"base":0,"height":0,"radius":0,
    # "side":0}` where `{"side":0}` fits, 11 tokens more, and calls that fitted the budget were cut (QA budgetfuzz)
    endings = (forced(shape.after_value), forced(shape.before_close + HERMES_CLOSE),
               *dict.fromkeys(forced(opening) for opening in required_keys), forced("null" + shape.after_value),
               *list(dict.fromkeys(b'"' + name + b'":' for name in sorted(json_keys, key=len)))[:_MAX_JSON_KEY_ENDINGS])
    return LlgGrammar(lltok, grammar, vocab, tuple(dict.fromkeys(unenforced)), tuple(dict.fromkeys(hints)),
                      endings=endings, call_tag=HERMES_OPEN.encode(), call_close=HERMES_CLOSE.encode(),
                      call_names=tuple(forced(name + shape.after_name) for name in spec.tool_names))


def takes_nothing(grammar: "LlgGrammar") -> bool:
    """Whether no output satisfies `grammar`: its parser is in error from the start, not for its lexer's limits (a
    regex of an empty class, `[^\\s\\S]`, or one that needs such a class, `a[^\\s\\S]`)."""
    m = grammar.matcher()
    m._write_mask(m._m, torch.zeros(len(grammar._allowed), dtype=torch.int32))
    return m._m.is_error() and _lexer_limit(m._m) is None


def _tag_token(lltok, tag: str) -> int | None:
    """The id of the vocabulary's token for `tag`, when it has one (an added token, which llguidance matches by
    id, not by its text), else None."""
    ids = lltok.tokenize_str(tag)
    return ids[0] if len(ids) == 1 and lltok.is_special_token(ids[0]) else None


def _tag_rule(tag: str, token: int | None) -> str:
    return f"<[{token}]> | {json.dumps(tag)}" if token is not None else json.dumps(tag)


# SentencePiece tokenizers write a space as '▁' (U+2581) before they look a piece up, so the text "▁x" and the text
# " x" both become the piece "▁x", which spells " x". llguidance turns bytes a grammar forces into the tokenizer's
# own tokens, and forced as such a piece, a '▁' was refused by the grammar that had forced it (a 500 mid-output).
# A grammar that may force the character, as itself or escaped, is built without forcing: the mask then allows
# every token that spells the bytes (for '▁', its three UTF-8 bytes). Other grammars keep it.
_SPACE_MARKER = re.compile(r"\u2581|\\+(?:u\{?0*2581\}?|x\{0*2581\}|U\{?0*2581\}?)", re.IGNORECASE)
_NO_FORCING = '%llguidance {"no_forcing": true}\n'


def forcing_safe(text: str) -> str:
    """`text` (a lark grammar, or llguidance's JSON form of one grammar) as it is, or without byte forcing where it
    may force '▁' (see _SPACE_MARKER)."""
    return without_forcing(text) if _SPACE_MARKER.search(text) else text


def without_forcing(text: str) -> str:
    """`text` (as in `forcing_safe`) with llguidance's byte forcing turned off."""
    if not text.lstrip().startswith("{"):
        return text if text.startswith(_NO_FORCING) else _NO_FORCING + text
    top = json.loads(text)
    grammar = top["grammars"][0]
    lark = grammar.get("lark_grammar") or f"start: %json {json.dumps(grammar['json_schema'])}"
    if not lark.startswith(_NO_FORCING):
        lark = _NO_FORCING + lark
    top["grammars"][0] = {"name": grammar.get("name") or "start", "lark_grammar": lark}
    return json.dumps(top)


# Parses of grammars' further lanes (LlgGrammar.fresh_copy). llguidance parses without the interpreter's lock, so the
# engine thread goes on while a large grammar is parsed (~1 ms for most schemas, 40-160 ms for the largest seen).
_LANE_PARSER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="structgen-llg-lane")


class LlgGrammar(Grammar):
    backend = "llguidance"

    def __init__(self, lltok, text: str, vocab: Vocabulary, unenforced: tuple[str, ...] = (),
                 hints: tuple[bytes, ...] = (), json_output: bool = False, key_names: tuple[bytes, ...] = (),
                 call_tag: bytes | None = None, endings: tuple[bytes, ...] = (), call_names: tuple[bytes, ...] = (),
                 divisors: tuple[int, ...] = (), call_openers: bytes = b"", call_close: bytes | None = None):
        self.lltok = lltok
        # the text that closes a tagged call, where a newline after it begins another (`LlgMatcher._ends_in`)
        self.call_close = call_close
        # the characters that open the calls at the output's start, where free text may stand instead (tool_choice
        # "auto" of untagged calls: `compile_calls_or_text`): such a token there is vetted as a tag is (`vet`)
        self.call_openers = call_openers
        self.divisors = divisors  # the schema's whole multipleOfs, for closing walks (`integer_divisors`)
        self.call_names = call_names  # each function's name as the output spells it after `call_tag` (`vet`)
        self.endings = endings  # byte strings that end parts of the output, for closing walks (`closing_tokens`)
        self.call_tag = call_tag
        self.json_output = json_output  # the output is JSON (free text under tool_choice "auto" switches it off)
        self.hints = hints  # strings the schema's patterns and formats accept, for closing walks (`string_hints`)
        self.key_names = key_names  # names the schema requires, for closing walks (`required_names`)
        # The most a completion's length grew from one measure to the next, over this grammar's matchers so far
        # (one `,{"` can open an item that needs 40 more tokens): vetting starts that much earlier.
        self.closing_growth = 0
        # `call_names` by the length of the call through each, shortest first, from the first walk through them all
        # (`LlgMatcher._calls_after_tag`); None before it. Their spread is then in `closing_growth`.
        self.names_by_call: tuple[bytes, ...] | None = None
        self.text = forcing_safe(text)
        self.forcing = self.text == text  # llguidance may force bytes as tokens (see `stop_forcing`)
        self.vocab = vocab
        self.unenforced = unenforced
        self._allowed = vocab.allowed_words()
        self._eos = vocab.eos_words()
        # the size of one parse (`nbytes`), as measured on 40 real-world schemas (malloc's bytes in use per
        # grammar: 50-300 KB below 3,000 characters of grammar, 1.25 MB at 60,000): within 2x of all of them, where
        # 4 bytes a character and 64 KB counted a third of it and the cache held thrice its bound (QA)
        self._parse_bytes = 32 * len(text) + 160 * 1024
        self._proto_lock = threading.Lock()
        # lane -> (its parse, the generation of that parse's lexer). Matchers are deep copies of their lane's parse
        # and share its lexer: its states built once, its limits counted once, and its lock held by each mask, so
        # the rows of one lane are filled one at a time (Grammar.matcher). Lane 0 is parsed here (a grammar
        # llguidance cannot start fails its compile), the others in the background from their first matcher on.
        self.step_fuel = _STEP_FUEL[0]  # the lexer's work per token in parses from now on (`raise_fuel`)
        self._lanes: dict[int, tuple[llguidance.LLMatcher, int]] = {0: (self._parse(), 0)}
        self._parsing: set[int] = set()

    @property
    def nbytes(self) -> int:
        """The size the grammar cache counts: one parse per lane parsed so far (up to one per mask thread)."""
        return self._parse_bytes * len(self._lanes)

    def _parse(self) -> "llguidance.LLMatcher":
        proto = _new_parse(self.lltok, self.text, self.step_fuel)
        if proto.is_error():  # (its lexer's limits at the start: `multipleOf: 1000000007` ran out of fuel)
            raise ConstraintError(f"llguidance cannot start this constraint: {proto.get_error()[:300]}",
                                  code="constraint_too_complex")
        return proto

    def fresh_copy(self, lane: int = 0) -> tuple["llguidance.LLMatcher", int, int, bool]:
        """A copy of `lane`'s parse, the lane whose parse it is, the generation of the lexer it shares with the
        other copies of that parse (the lexer's states are built once for all of them, and so is its limit on how
        many it may build), and whether that parse forces bytes (`stop_forcing`). A lane not parsed yet is parsed
        in the background (`_parse_lane`); until then its matchers copy lane 0's parse (correct, but their masks
        wait for lane 0's lexer), and they move to the lane's own at their first fill after it came."""
        with self._proto_lock:
            if lane not in self._lanes:
                if lane not in self._parsing:
                    self._parsing.add(lane)
                    _LANE_PARSER.submit(self._parse_lane, lane, self.text)
                lane = 0
            proto, generation = self._lanes[lane]
            return proto.deep_copy(), lane, generation, self.forcing

    def private_parse(self) -> tuple["llguidance.LLMatcher", bool, int]:
        """A parse of this grammar for one output alone (its lexer shared with no other), whether it forces
        bytes (`stop_forcing`), and its lexer's work per token."""
        with self._proto_lock:
            text, forcing, fuel = self.text, self.forcing, self.step_fuel
        proto = _new_parse(self.lltok, text, fuel)
        if proto.is_error():
            raise ConstraintError(f"llguidance cannot start this constraint: {proto.get_error()[:300]}",
                                  code="constraint_too_complex")
        return proto, forcing, fuel

    def raise_fuel(self, spent: int) -> bool:
        """An output ran out of the lexer's work per token `spent` on a lexer of its own: the parses from now on
        (the lanes' as their lexers are next spent, and private ones) get the next level of `_STEP_FUEL`, once
        for all the outputs that ran out of it. False when there is no more to give."""
        with self._proto_lock:
            if self.step_fuel <= spent:
                higher = [fuel for fuel in _STEP_FUEL if fuel > spent]
                if not higher:
                    return False
                self.step_fuel = higher[0]
            return True

    def parsed(self, lane: int) -> bool:
        """Whether `lane` has a parse of its own (its first matchers copied lane 0's until it came)."""
        return lane in self._lanes

    def _parse_lane(self, lane: int, text: str) -> None:
        try:
            proto = _new_parse(self.lltok, text, self.step_fuel)
        except BaseException:  # noqa: BLE001 - the lane's matchers go on copying lane 0's parse
            log.exception("parsing a further lane of an llguidance grammar failed")
            proto = None
        with self._proto_lock:
            self._parsing.discard(lane)
            if proto is not None and not proto.is_error() and text == self.text and lane not in self._lanes:
                self._lanes[lane] = (proto, 0)

    def lexer_spent(self, lane: int, generation: int) -> None:
        """An output ran into the limit of `lane`'s lexer of `generation`: that lane is parsed anew, so that the
        copies after it get a fresh lexer (else every later output of this grammar on that lane, and a cached one
        serves many requests, would fail at its first mask). Thread-safe: the engine thread and the mask fillers
        call it."""
        with self._proto_lock:
            if self._lanes[lane][1] == generation:
                self._lanes[lane] = (self._parse(), generation + 1)

    def stop_forcing(self) -> None:
        """A matcher's mask allowed one token only, which its grammar then refused: llguidance forced bytes as the
        token the tokenizer makes of them, and in this vocabulary that token spells other bytes (a tokenizer
        normaliser at work: SentencePiece's '▁', which `forcing_safe` sees coming, was one). The grammar is parsed
        anew without forcing, for the copies after this one."""
        with self._proto_lock:
            if self.forcing:
                log.warning("llguidance forced a token the grammar refuses; this grammar now runs without forcing")
                self.text = without_forcing(self.text)
                self.forcing = False
                self._lanes = {lane: (self._parse(), generation + 1) for lane, (_, generation) in self._lanes.items()}

    def matcher(self, lane: int = 0) -> "LlgMatcher":
        return LlgMatcher(self, lane)


def _lexer_limit(matcher: "llguidance.LLMatcher") -> str | None:
    """The error of a matcher stopped by its lexer's limits (states, expressions or fuel), else None."""
    error = matcher.get_error() if matcher.is_error() else ""
    return error.split("\n", 1)[0][:200] if "lexer error" in error else None


class LlgMatcher(Matcher):
    def __init__(self, grammar: LlgGrammar, lane: int = 0):
        self._g = grammar
        # The lane asked for; `_parsed_lane`: the lane whose parse (and lexer) `_m` copies, lane 0's until the lane's
        # own parse comes (LlgGrammar.fresh_copy), then the lane's (at the next fill, on the lane's mask thread).
        self._lane = lane
        self._m, self._parsed_lane, self._lexer_generation, self._forcing = grammar.fresh_copy(lane)
        self._private = False  # `_m` is a parse of its own (`_on_fresh_lexer`), not a copy of its lane's
        self._fuel = _STEP_FUEL[0]  # the lexer's work per token in that parse of its own
        self._consumed: list[int] = []  # the output's tokens, to replay on a fresh lexer (`_on_fresh_lexer`)
        self._closing: list[int] | None = None  # a completion from the current state, when known this step
        # `_closing` was carried over from an earlier state (`_still_completes`), not walked from this one: a valid
        # completion, maybe longer than a walk from here would find (steering walks afresh before giving up).
        self._closing_kept = False
        # (the completion before the last token, its bytes, the follower's mode before it): for the next fill
        self._before_last: tuple[list[int], bytes, str | None] | None = None
        self._closing_len: int | None = None  # its length when last measured (a hint once stale)
        # (the token vet passed, the completion after it, whether that completion was carried over)
        self._vetted: tuple[int, list[int] | None, bool] | None = None
        self._measure_every = _CLOSING_RECHECK_STEPS
        self._since_measure = _CLOSING_RECHECK_STEPS  # measure on the first fill
        self._walk_max_bytes = _CLOSING_MAX_BYTES  # how far completions are walked (`_walk_limit`)
        # JSON output: the lexical state and keys so far, for completions (`closing_tokens`); fed lazily, from
        # `_unfed`, when a completion is measured.
        self._keys: KeySets | None = KeySets(grammar.call_tag) if grammar.json_output else None
        self._unfed = bytearray()
        self._distinct_keys = False
        self._walk_checks: list[Callable[[bytes, bool], bool]] = []  # (`check_walks_with`)
        self._values: tuple[bytes, ...] = ()  # the checks' (`check_walks_with`)
        self._through_names: list[list[int]] | None = None  # the last `_walk`'s completions through each name

    def write_distinct_keys(self) -> None:
        """Budget completions write no key twice in one object. For checks that judge the parsed value
        (constrain/late_keywords.py): `{"": 1, "": 2}` parses as one property."""
        self._distinct_keys = True

    def refuse_newline_keys(self) -> None:
        """Budget completions close no key that ends in a newline: the distinct-keys check refuses such keys where
        a names' pattern holds a `$` (`newline_names_refused`). The walk wrote `"ba\\n"` to meet `^.{1,3}$: false`
        (`.` takes no newline), the check refused the completion's quote where the rule offered it, and the answer
        was cut at max_tokens (QA budget)."""
        if self._keys is not None:
            self._keys.newline_keys_refused = True

    def check_walks_with(self, refuses: Callable[[bytes, bool], bool], values: tuple[bytes, ...] = ()) -> None:
        """Budget completions write nothing `refuses` refuses: a check applied while decoding
        (constrain/checked.py), asked whether the text from the output's state, then the end, would be refused.
        `values`: JSON texts the check's keywords name (`_walked_closing`)."""
        self._walk_checks.append(refuses)
        self._values = tuple(dict.fromkeys(self._values + values))[:_MAX_HINTS]

    def _walk_refuses(self, prefix: bytes = b"") -> Callable[[bytes, bool], bool] | None:
        """The checks' verdict on a completion walked after `prefix` (the bytes of a probed token), or None
        without checks."""
        if not self._walk_checks:
            return None
        return lambda data, ends: any(refuses(prefix + data, ends) for refuses in self._walk_checks)

    def _followed(self) -> KeySets | None:
        """The follower of the output so far."""
        if self._unfed and self._keys is not None:
            self._keys.feed(bytes(self._unfed))
            self._unfed.clear()
        return self._keys

    def _near(self, tokens_left: int, allowance: int = 0, factor: float = 2) -> bool:
        """Close enough to the budget that a token may no longer leave room for the completion (`allowance`:
        growth to allow for beyond what was seen; `factor`: on the completion's length, see _CLOSING_MARGIN)."""
        return self._closing_len is not None and \
            tokens_left <= factor * (self._closing_len + _CLOSING_MARGIN) + max(self._g.closing_growth, allowance)

    def _measure(self, matcher: "llguidance.LLMatcher", keys: KeySets | None,
                 tokens_left: int | None = None, prefix: bytes = b"") -> list[int] | None:
        """A completion from `matcher` (the state now, or after a probed token of bytes `prefix`); notes how much it
        grew. With
        `tokens_left`, a long completion (`_CLOSING_LONG`) more than twice that long counts as none found: it
        costs milliseconds to walk, and the budget rule can seldom steer to it (the output ends at the limit)."""
        closing = self._walk(matcher, keys, prefix)
        if closing is not None and self._closing_len is not None:
            self._g.closing_growth = max(self._g.closing_growth, len(closing) - self._closing_len)
        if closing is not None and tokens_left is not None and len(closing) > max(2 * tokens_left, _CLOSING_LONG):
            closing = None
        self._since_measure = 0
        # A walk that found nothing is not repeated every step: a failed walk is the expensive one (it runs to
        # `_walk_limit`), and so is a long one (`[a-z ]{600}` with 64 tokens left: ~10 ms, measured twice a
        # step with the sampled token's probe, before). A short completion that does not fit is measured every
        # step: a sampled token may bring one back in reach (a random walk under `contains` did, 3 times in 12).
        self._measure_every = (max(_CLOSING_RECHECK_STEPS, len(closing) // _CLOSING_RECHECK_SHARE)
                               if closing is not None else min(2 * self._measure_every, _CLOSING_MAX_BACKOFF))
        return closing

    def _walk(self, matcher: "llguidance.LLMatcher", keys: KeySets | None, prefix: bytes = b"",
              names: bool = True) -> list[int] | None:
        """A completion from `matcher` (`closing_tokens`; `prefix`, `keys`: as in `_measure`). Where it writes a
        function's name (`LlgGrammar.call_names`: the output has not written one yet) and there are several, the
        shortest of those through each name (`_calls_after_tag`, one walk a function): the walk writes the first
        name that fits, and calls cut at the limit were begun where the shortest function's fitted (QA budgetfuzz
        F4: 41 tokens measured where a call of 18 fits). `names` False: the walk alone (a walk through one name)."""
        closing = closing_tokens(matcher, self._g.vocab, keys, self._g.hints, self._distinct_keys, self._g.key_names,
                                 self._g.endings, self._g.divisors, self._walk_refuses(prefix), self._values,
                                 self._walk_max_bytes)
        self._through_names = None
        if not names or len(self._g.call_names) < 2 or closing is None:
            return closing
        calls = [c for c in self._calls_after_tag(matcher, keys, closing, prefix) if c is not None]
        self._through_names = calls or None
        return min([closing, *calls], key=len)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, tokens_left: int | None = None) -> None:
        v = bitmask[row]
        out = v.numpy()
        if _lexer_limit(self._m):  # (a probe of this matcher's lexer ran into its limit)
            self._on_fresh_lexer()
        self._raise_if_gave_up()
        if self._parsed_lane != self._lane and self._g.parsed(self._lane) and not self._m.is_stopped() \
                and not self._private:
            self._replayed()  # its lane's own parse came: its masks no longer wait for lane 0's lexer
        if tokens_left is not None and not self._m.is_stopped():
            self._walk_max_bytes = _walk_limit(tokens_left)
            self._since_measure += 1
            if self._closing is None and (self._near(tokens_left) or self._since_measure >= self._measure_every):
                kept = self._still_completes(self._m, *self._before_last) if self._before_last else None
                if kept is not None:
                    self._closing, self._closing_kept, self._since_measure = kept, True, 0
                else:
                    self._closing = self._measure(self._m, self._followed(), tokens_left)
                    self._closing_kept = False
                self._closing_len = len(self._closing) if self._closing is not None else None
        self._write_mask(self._m, v)
        while _lexer_limit(self._m) and self._retried_on_fresh_lexer():
            self._write_mask(self._m, v)
        if self._forcing and self._forced_a_refused_token(out):  # (this copy's parse forces; the grammar's may not)
            self._g.stop_forcing()
            self._replayed()
            self._write_mask(self._m, v)
        self._raise_if_gave_up()

    def _forced_a_refused_token(self, out: np.ndarray) -> bool:
        """The mask `out` allows a single token though the output cannot end here, and the grammar refuses that
        token, or allows none: what llguidance's forcing does where a token's bytes differ from those it forced
        (see `LlgGrammar.stop_forcing`), or where the tokenizer makes a special token of them, which no output
        writes (`<s>` in HTML under a Phi-3 tokenizer, `choice: ["<|im_end|>"]`: without forcing, ordinary tokens
        spell the text). Costs a scan of the row (~2 us on 152k tokens)."""
        if self._m.is_accepting() or self._m.is_stopped() or self._m.is_error():
            return False
        if not out.any():
            return True
        if np.count_nonzero(out) != 1:
            return False
        words = np.flatnonzero(out)
        word = int(out[words[0]]) & 0xFFFFFFFF
        if word & (word - 1):
            return False
        return self._m.validate_tokens([int(words[0]) * 32 + word.bit_length() - 1]) != 1

    def _on_fresh_lexer(self) -> None:
        """This matcher's lexer ran into its limit (here or in a copy): its lane is parsed anew for the matchers to
        come (`LlgGrammar.lexer_spent`), and this one goes on with the output so far replayed on a parse of its
        own, whose lexer no other output spends: a limit met again is then this output's. (On the lane's new
        parse, the output that spent the first lexer spent the second too, and the others under way gave up with
        it: 8 requests of 12 that succeed alone were 400s beside such outputs.)"""
        self._g.lexer_spent(self._parsed_lane, self._lexer_generation)
        self._m, self._forcing, self._fuel = self._g.private_parse()
        self._lexer_generation, self._private = -1, True  # (-1: `lexer_spent` leaves the lane's parse be)
        if self._consumed:
            self._m.consume_tokens(self._consumed)
            self._raise_if_gave_up()

    def _retried_on_fresh_lexer(self) -> bool:
        """The lexer ran into its limit as this output asked it for a mask or a token: the output goes on with a
        fresh one where that can help, a parse of its own where the lexer was its lane's (which other outputs
        spend too), else one with more work per token (`LlgGrammar.raise_fuel`). False where neither is left:
        this output itself needs more than the last level, and gives up."""
        if self._private and not self._g.raise_fuel(self._fuel):
            return False
        self._on_fresh_lexer()
        return True

    @property
    def parse_lane(self) -> int:
        """The lane whose parse this matcher copies, and whose lexer (and its lock) it shares."""
        return self._parsed_lane

    def _replayed(self) -> None:
        """This matcher on a fresh copy of its grammar's current parse, with the output so far replayed."""
        self._m, self._parsed_lane, self._lexer_generation, self._forcing = self._g.fresh_copy(self._lane)
        self._private = False
        if self._consumed:
            self._m.consume_tokens(self._consumed)
            self._raise_if_gave_up()

    def _write_mask(self, matcher: "llguidance.LLMatcher", v: torch.Tensor) -> None:
        """`matcher`'s mask into the int32 row `v`: the tokens it allows, and EOS where the output may end."""
        out = v.numpy()
        can_end = matcher.is_accepting()
        if matcher.is_stopped():
            out[:] = self._g._eos if can_end else 0
            return
        matcher.unsafe_compute_mask_ptr(v.data_ptr(), v.numel() * 4)
        np.bitwise_and(out, self._g._allowed, out=out)
        if can_end:
            np.bitwise_or(out, self._g._eos, out=out)

    def _raise_if_gave_up(self) -> None:
        """A matcher in error gave up on the constraint (accept never consumes a refused token): llguidance's
        per-token work limit, e.g. a long `maxLength` intersected with a pattern. That ends this output, with a
        message that says so, instead of an empty mask (which would read as a logit_bias conflict)."""
        if self._m.is_error():
            if _lexer_limit(self._m):  # (this output's own: the lexer is left fresh for the others)
                self._g.lexer_spent(self._parsed_lane, self._lexer_generation)
            reason = self._m.get_error().split("\n", 1)[0][:200]
            raise ConstraintError(f"the output constraint is too complex to follow at this point of the output "
                                  f"(llguidance: {reason}); a simpler pattern or smaller length bounds avoid this",
                                  code="constraint_too_complex")

    def vet(self, token_id: int, tokens_left: int | None) -> int:
        """Near the budget: the sampled token if the output can still be completed after it within the tokens
        left, else the next token of the completion measured from here (which fits, by the same rule one step
        earlier), or an EOS id where the output is complete here (another tagged call would not fit). A token that
        may open something (`_OPENERS`) is vetted earlier: it may make the completion grow at once by more than
        any growth seen so far. A token that opens a tagged call (`LlgGrammar.call_tag`), or a newline where the
        output may end (which begins a further call), is vetted at any distance: the completion grows from nothing
        to a whole call, and a call begun with too few tokens left was cut (seen on a GPU: `{"path": "..."` with
        finish_reason length). It is kept where any function's call fits (`_calls_after_tag`)."""
        self._vetted = None
        if tokens_left is None:
            return token_id
        data = self._g.vocab.token_bytes[token_id] or b""
        # (a newline where the output may end is how a further call begins, after a call or after free text)
        # (or a token that ends with the tag's beginning: the grammar takes the tag spelled as text too, and in
        # glm47, with no newline between calls, `<` after a call or `><` at its end began one 53 tokens long with
        # 24 left, cut at the limit)
        tag = self._g.call_tag
        opens_call = tag is not None and (tag in data or (b"\n" in data and self._m.is_accepting())
                                          or any(data.endswith(tag[:k]) for k in range(1, len(tag)))
                                          or self._ends_in(data))
        # (untagged calls under "auto": a `{` where only whitespace was written opens a whole call where the answer
        # could end; it was vetted only from 2 x 8 + 32 tokens before the limit, and a call of 50 was cut)
        opens_call = opens_call or self._opens_untagged_call(data)
        if not opens_call and not self._near_for(data, tokens_left):
            return token_id
        learn = opens_call and self._g.names_by_call is None and len(self._g.call_names) > 1
        if self._closing and token_id == self._closing[0] and len(self._closing) <= tokens_left and not learn:
            self._vetted = (token_id, self._closing[1:], self._closing_kept)  # the completion's next token
            return token_id
        probe = self._m.deep_copy()
        if not probe.consume_token(token_id):
            return token_id  # not allowed at all: accept refuses it
        before = self._followed()
        keys = before.copy() if before is not None else None
        if keys is not None:
            keys.feed(data)
        after = self._still_completes(probe, self._closing, data, before.mode if before is not None else None, data,
                                     keys)
        kept = after is not None
        through = None
        if not kept:
            after = self._measure(probe, keys, prefix=data)
            through = self._through_names  # (the calls through each name, where it measured them: `_walk`)
        if opens_call and after is not None and (len(after) > tokens_left - 1 or learn):
            # The walk writes the function it comes to first, which may be the longest: the shortest through
            # each function's name (the call is then steered to it near the limit).
            # (`learn`: the first such walk on a grammar learns the calls' spread, `_calls_after_tag`)
            calls = through if through is not None else \
                [c for c in self._calls_after_tag(probe, keys, after, data) if c is not None]
            if len(after) > tokens_left - 1:
                after = min(calls, key=len, default=after)
        if after is not None and len(after) <= tokens_left - 1:
            self._vetted = (token_id, after, kept)
            return token_id
        if opens_call and after is None:  # (no completion found: the call goes on, as any token far from the limit)
            return token_id
        here, kept = self._closing, self._closing_kept
        if here is None or (kept and len(here) > tokens_left):  # (a walk from here may find a shorter one)
            walked = self._walk(self._m, self._followed())
            if here is None or (walked is not None and len(walked) < len(here)):
                here, kept = walked, False
        if here and len(here) <= tokens_left:
            self._vetted = (here[0], here[1:], kept)
            return here[0]
        if here == [] and self._g.vocab.eos_token_ids:
            return min(self._g.vocab.eos_token_ids)  # complete here, and the token would leave it incomplete
        return token_id  # no completion fits either way: the output ends at the limit

    def _ends_in(self, data: bytes) -> bool:
        """A token of bytes `data` closes a call (`LlgGrammar.call_close`, spelled as text) and goes on with a
        newline, which begins another: the output may end before that newline (`</tool_call` then `>\n` was
        kept with 5 tokens left, and the second call it began was cut at the limit)."""
        close, eos = self._g.call_close, self._g.lltok.eos_token
        if not close or eos is None:
            return False
        at = data.find(b"\n", 1)
        while at > 0:
            head = data[:at]
            if close.endswith(head) or head.endswith(close):
                ids = self._g.vocab.spell(head, ordinary=True)
                if ids and self._m.validate_tokens(ids + [eos]) == len(ids) + 1:
                    return True
            at = data.find(b"\n", at + 1)
        return False

    def _opens_untagged_call(self, data: bytes) -> bool:
        """A token of bytes `data` opens the calls (`LlgGrammar.call_openers`) at the output's start, after
        whitespace at most, where the output may end instead."""
        first = data.lstrip(_WHITESPACE)[:1]
        tb = self._g.vocab.token_bytes
        return bool(first) and first in self._g.call_openers and self._m.is_accepting() \
            and all(not (tb[t] or b"").strip(_WHITESPACE) for t in self._consumed)

    def _still_completes(self, after: "llguidance.LLMatcher", closing: list[int] | None, data: bytes,
                         mode: str | None, prefix: bytes = b"", keys: KeySets | None = None) -> list[int] | None:
        """`closing`, a completion measured before a token of bytes `data`, when it also completes the output
        after that token (`after`: the matcher there), else None: one check by llguidance (the completion and an
        EOS validated, ~3 us) where a walk costs 60-150 us, and inside a string or a number most tokens leave the
        completion as it was. Else, for a token that wrote the completion's first bytes, the rest of it. Where
        completions write no key twice, only for a token inside a value that leaves the keys as they were
        (_VALUE_MODES, _STRUCTURE; `mode`: the follower's before the token, None if not known). Never one that
        makes a number's exponent too long (`_lengthens_an_exponent`; `keys`: the follower after the token, else
        the output's)."""
        eos = self._g.lltok.eos_token
        if not closing or eos is None:
            return None
        if self._distinct_keys and (mode not in _VALUE_MODES or _STRUCTURE.intersection(data)):
            return None
        if self._lengthens_an_exponent(keys, closing) or self._in_a_newline_checked_key(keys):
            return None
        if after.validate_tokens(closing + [eos]) == len(closing) + 1:
            refuses = self._walk_refuses(prefix)  # (it completes the grammar: the checks may still refuse it)
            if refuses is None or not refuses(b"".join(self._g.vocab.token_bytes[t] or b"" for t in closing), True):
                # (where the token leaves bytes forced, as a space before a required key's `"`, the completion
                # begins with the tokens llguidance forces: `"` `__` `v`, not the `"_` `_v` spelled before it)
                return _as_forced(after, self._g.vocab, closing) if after.compute_ff_tokens() else closing
        # The token wrote the completion's first bytes (`"` of `"]}`, `,` of `,""]}`): the rest of it, spelled anew.
        token_bytes = self._g.vocab.token_bytes
        if not data or any(token_bytes[t] is None for t in closing):
            return None
        spelled = b"".join(token_bytes[t] for t in closing)
        if not spelled.startswith(data):
            return None
        rest = self._g.vocab.spell(spelled[len(data):]) if len(spelled) > len(data) else []
        if rest is None or after.validate_tokens(rest + [eos]) != len(rest) + 1:
            return None
        return _as_forced(after, self._g.vocab, rest)

    def _in_a_newline_checked_key(self, keys: KeySets | None) -> bool:
        """Inside a key where keys ending in a newline are refused (`refuse_newline_keys`; `keys`: the follower
        after the token, else the output's): a completion carried over may close the key after a newline the token
        wrote, so one is walked instead."""
        if self._keys is None or not self._keys.newline_keys_refused:
            return False
        keys = keys if keys is not None else self._followed()
        return keys is not None and keys.mode == "key"

    def _lengthens_an_exponent(self, keys: KeySets | None, closing: list[int]) -> bool:
        """`closing`, from inside a number's exponent (`keys`: the follower there, else the output's), goes on with
        digits that give it more than MAX_EXPONENT_DIGITS significant ones: llguidance's number lexeme takes them,
        the distinct-keys check refuses them (constrain/distinct_keys.py). A completion `0}` measured after `-5e`
        was carried on past `-5e51`; the engine's vet then offered its `0`, the check refused it, the sampled token
        stood (`,` with two tokens left), and the answer was cut at max_tokens where `}` fitted (QA budget F5)."""
        head = self._g.vocab.token_bytes[closing[0]] or b""
        if not head or head[:1] not in _EXPONENT_BYTES:  # (most completions: a closer, a quote)
            return False
        keys = keys if keys is not None else self._followed()
        if keys is None or keys.mode != "number" or exponent_digits(bytes(keys.buf)) is None:
            return False
        spelled = b"".join(self._g.vocab.token_bytes[t] or b"" for t in closing)
        run = len(spelled) - len(spelled.lstrip(_EXPONENT_BYTES))
        return (exponent_digits(bytes(keys.buf) + spelled[:run]) or 0) > MAX_EXPONENT_DIGITS

    def _near_for(self, data: bytes, tokens_left: int) -> bool:
        """Whether a sampled token of bytes `data` is vetted (`_near`, by what it may do to the completion): one that
        may open a member, an item or a value (`_OPENERS`), or that writes a key's name, which picks the member's
        value (`"c` -> `"created_at"`, whose date-time needs 24 more tokens), from twice the completion plus growth
        of _CLOSING_GROWTH; one inside a JSON string value, number or literal, which seldom makes the completion
        much longer, from _CLOSING_NEAR_FACTOR times; any other from twice."""
        if not self._near(tokens_left, _CLOSING_GROWTH):  # (the widest of the three: far from it, none is vetted)
            return False
        if _OPENERS.intersection(data):
            return True
        keys = self._followed()
        mode = keys.mode if keys is not None else None
        if mode in ("key", "member"):
            return True
        if mode in _VALUE_MODES:
            return self._near(tokens_left, factor=_CLOSING_NEAR_FACTOR)
        return self._near(tokens_left)

    def _calls_after_tag(self, probe: "llguidance.LLMatcher", keys: KeySets | None,
                         walked: list[int] | None, prefix: bytes) -> list[list[int] | None]:
        """From `probe` (after a token of bytes `prefix`), anywhere before a call's name is written (just after its
        tag, before it, or where a JSON call's `"name":` is ahead): a completion through each function's name
        (`LlgGrammar.call_names`), written where the completion `walked` from there writes the first name it comes
        to; None for a name that cannot come there. The first such walk on a grammar goes through every name and
        ranks them (`LlgGrammar.names_by_call`); later ones through the `_NAMES_WALKED` shortest only (each name
        costs a walk: 50 functions cost ~50 ms a measure, on the engine thread). It also learns how far the calls
        differ in length, as growth: a name's token picks its function, and a long function's name, written where
        the tag was kept for a short one's call, was not vetted from so far (a 54-token call begun with 30 left was
        cut at the limit, QA budgetfuzz)."""
        vocab = self._g.vocab
        spelled = b"".join(b"\xff[%d]" % t if vocab.token_bytes[t] is None else vocab.token_bytes[t]
                           for t in walked or ())
        at = min((i for i in (spelled.find(name) for name in self._g.call_names) if i >= 0), default=-1)
        if at < 0:
            return []
        byte_tokens = vocab.byte_tokens()
        ranked = self._g.names_by_call
        names = self._g.call_names if ranked is None else ranked[:_NAMES_WALKED]
        found: list[list[int] | None] = []
        for name in names:
            ids = _forced_ids(spelled[:at] + name, byte_tokens)
            walk = probe.deep_copy()
            if ids is None or not walk.consume_tokens(ids):
                found.append(None)
                continue
            head_text = _SPECIAL_MARK.sub(b"", spelled[:at] + name)
            follower = keys.copy() if keys is not None else None
            if follower is not None:
                follower.feed(head_text)
            specials = {int(i) for i in _SPECIAL_MARK.findall(spelled[:at] + name)}
            head = _spelled(vocab, ids, specials)
            rest = self._walk(walk, follower, prefix + head_text, names=False)
            call = head + rest if head is not None and rest is not None else None
            # (spelled as one: a token across the name's end, `uments","`, where the head ends at its `"`)
            joined = _spelled(vocab, ids + rest, specials | vocab.added_ids.intersection(rest)) if call else None
            eos = self._g.lltok.eos_token
            if joined is not None and len(joined) < len(call) and eos is not None \
                    and probe.validate_tokens(joined + [eos]) == len(joined) + 1:
                call = joined
            found.append(call)
        if ranked is None and any(c is not None for c in found):
            by_length = sorted((len(c), i) for i, c in enumerate(found) if c is not None)
            self._g.closing_growth = max(self._g.closing_growth, by_length[-1][0] - by_length[0][0])
            self._g.names_by_call = tuple(names[i] for _, i in by_length) + \
                tuple(name for name, c in zip(names, found) if c is None)
        return found

    def forced_after(self, tokens: list[int]) -> bytes | None:
        """The bytes the grammar forces after `tokens` (b"" where it leaves a choice), on a copy of the matcher;
        None where it refuses the tokens. A few microseconds, where a mask after them costs a mask."""
        probe = self._m.deep_copy()
        if not probe.consume_tokens(tokens) or probe.is_error():
            return None
        return probe.compute_ff_bytes()

    def mask_after(self, tokens: list[int]) -> np.ndarray | None:
        """The mask row (uint32 words, EOS included where the output may end) after `tokens`, on a copy of the
        matcher: a check's lookahead. None when the grammar refuses the tokens or gives up after them; a
        ConstraintError when it gives up for the lexer's limits (`_lexer_spent_by`)."""
        row = torch.zeros(len(self._g._allowed), dtype=torch.int32)
        while True:
            probe = self._m.deep_copy()
            if probe.consume_tokens(tokens):
                self._write_mask(probe, row)
            limit = _lexer_limit(probe)
            if not limit:
                return None if probe.is_error() else row.numpy().view(np.uint32)
            if not self._retried_on_fresh_lexer():
                self._on_fresh_lexer()  # (this matcher's own lexer, spent by the probe: a fresh one for its output)
                raise ConstraintError(f"llguidance: {limit}", code="constraint_too_complex")

    def _lexer_spent_by(self, token_id: int) -> bool:
        """Whether `token_id` is refused for the lexer's limits, not by the grammar (on a copy). The copy shares
        this matcher's lexer and has spent it too: this matcher goes on with a fresh one
        (`_retried_on_fresh_lexer`), or gives up where none is left."""
        probe = self._m.deep_copy()
        probe.consume_token(token_id)
        if _lexer_limit(probe) is None:
            return False
        if not self._retried_on_fresh_lexer():  # (its own lexer at the last level: the output gives up on it)
            self._m = probe
            self._raise_if_gave_up()
        return True

    def accept(self, token_id: int) -> bool:
        tb = self._g.vocab.token_bytes
        vetted, self._vetted = self._vetted, None
        if not (0 <= token_id < len(tb)) or tb[token_id] is None or self._m.is_error():
            return False
        while self._m.validate_tokens([token_id]) != 1:
            if not self._lexer_spent_by(token_id):
                return False  # refused by the grammar
        carried = vetted is not None and vetted[0] == token_id
        mode = self._keys.mode if self._keys is not None and not self._unfed else None
        self._before_last = (self._closing, tb[token_id], mode) if self._closing and not carried else None
        self._closing, self._closing_kept = (vetted[1], vetted[2]) if carried else (None, False)
        if self._closing is not None:
            self._closing_len = len(self._closing)
        if self._keys is not None:
            self._unfed += tb[token_id]
        if not self._m.consume_token(token_id) and not (_lexer_limit(self._m)
                                                        and self._consumed_on_fresh_lexer(token_id)):
            # (a token the check passed that the lexer cannot take: its limit, e.g. `a{1000000}`, gives up here)
            self._raise_if_gave_up()
            return False
        self._consumed.append(token_id)
        return True

    def _consumed_on_fresh_lexer(self, token_id: int) -> bool:
        """The lexer this matcher shares met its limit as it took `token_id` (validated on the lexer's states so
        far): the token again on a fresh parse (`_retried_on_fresh_lexer`). Whether one took it."""
        while self._retried_on_fresh_lexer():
            if self._m.consume_token(token_id):
                return True
            if not _lexer_limit(self._m):
                return False
        return False

    def is_terminated(self) -> bool:
        return self._m.is_stopped()

    def can_end(self) -> bool:
        return self._m.is_accepting()

    def min_tokens_to_end(self) -> int | None:
        if self._m.is_stopped():
            return 0
        if self._closing is None or self._closing_kept:  # (kept for this state's fills, as a fill's own measure is)
            walked = self._measure(self._m, self._followed())
            if self._closing is None or (walked is not None and len(walked) < len(self._closing)):
                self._closing = walked
            self._closing_kept = False  # (a walk from here finds none shorter: once is enough)
            self._closing_len = len(self._closing) if self._closing is not None else None
        return None if self._closing is None else len(self._closing)
