"""A backend's grammar with a check applied while decoding: what the backend's grammar does not express
(`uniqueItems`, a `oneOf` with overlapping branches, `not`, ...) is enforced by a matcher wrapper that follows the
output and clears the mask bits of the tokens the check refuses. The checks are in constrain/unique_items.py and
constrain/late_keywords.py; this holds what they share. Never imports HTTP or model code.
"""

from __future__ import annotations

import abc
import threading
import weakref

import numpy as np
import torch

from constrain.grammar import ConstraintError, Grammar, Matcher
from constrain.vocabulary import Vocabulary

_PER_VOCABULARY: dict[tuple[type, str], object] = {}
_PER_VOCABULARY_LOCK = threading.Lock()


def per_vocabulary(cls: type, vocab: Vocabulary):
    """`cls(vocab)`, built once per vocabulary and kept: the token tables a check looks tokens up in."""
    with _PER_VOCABULARY_LOCK:
        key = (cls, vocab.fingerprint)
        if key not in _PER_VOCABULARY:
            _PER_VOCABULARY[key] = cls(vocab)
        return _PER_VOCABULARY[key]


class CheckedGrammar(Grammar):
    """`inner` (compiled from the schema less what the check enforces), handing out checked matchers."""

    def __init__(self, inner: Grammar):
        self.inner = inner
        self.backend = inner.backend
        self.unenforced = inner.unenforced
        self.call_tag = inner.call_tag

    @property
    def nbytes(self) -> int:
        return getattr(self.inner, "nbytes", 0)  # (it may grow: an llguidance grammar's lanes)

    def __getattr__(self, name: str):
        """Any other attribute is the inner grammar's (an outlines automaton, ...): a check adds to a grammar and
        hides nothing of it. (Called only where normal lookup fails.)"""
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class CheckedMatcher(Matcher):
    """The inner matcher's mask less the tokens `_ban` clears. When the backend's budget rule (near max_tokens)
    left only refused tokens, the plain mask is used instead: the answer may then run to the limit, never end
    refused. When even that leaves nothing, the output ends with a ConstraintError saying why."""

    dead_end: str  # the message of that error

    def __init__(self, inner: Matcher, token_bytes: list[bytes | None], values: tuple[bytes, ...] = ()):
        self.inner = inner
        self.token_bytes = token_bytes
        self._refused_here: np.ndarray | None = None  # the ids the last mask cleared at this state (None: no mask)
        self._fed = 0  # the output's tokens fed so far: the state `_ahead` was forked at
        self._ahead: tuple[int, bytes, object] | None = None  # (`refuses_ahead`)
        base = backend_matcher(inner)
        if self.judges_walks and hasattr(base, "check_walks_with"):
            judge = weakref.WeakMethod(self.refuses_ahead)  # (the backend's matcher holds this one's: no cycle)
            base.check_walks_with(lambda data, ends: (method := judge()) is not None and method(data, ends), values)

    def __getattr__(self, name: str):
        """Any other attribute is the inner matcher's (its automaton state, ...). (Called only where normal
        lookup fails.)"""
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @abc.abstractmethod
    def _active(self) -> bool:
        """Whether any token may be refused at this point of the output (else the inner mask stands)."""

    @abc.abstractmethod
    def _refused(self, words: np.ndarray) -> np.ndarray:
        """The allowed tokens (ids) the check refuses here; `words` is the mask row, as uint32."""

    @abc.abstractmethod
    def _refuses(self, data: bytes) -> bool:
        """Whether writing `data` next is refused."""

    @abc.abstractmethod
    def _feed(self, data: bytes) -> None:
        """The output went on with `data`."""

    judges_walks = False  # whether the check says what it refuses of a text ahead (`_fork`, `_refused_after`)

    def _fork(self):
        """A copy of the check's follower at this point of the output, to feed text ahead on."""
        raise NotImplementedError

    def _refused_after(self, fork, ends: bool) -> bool:
        """Whether the text `fork` was fed is refused, and with `ends` the output ending after it."""
        raise NotImplementedError

    def refuses_ahead(self, data: bytes, ends: bool) -> bool:
        """Whether the check refuses `data` written from here, and with `ends` the output ending after it: asked
        by the backend's budget completions (`LlgMatcher.check_walks_with`), which otherwise wrote what the check
        refuses (`[]` under `contains`, `""` twice under `uniqueItems`), and the answer ran to max_tokens. A walk
        asks of a text a byte longer each time: the follower after the last text not refused is kept (`_ahead`)
        and the next question feeds only the bytes past it."""
        kept = self._ahead
        if kept is not None and kept[0] == self._fed and data.startswith(kept[1]):
            fork, rest = kept[2].fork(), data[len(kept[1]):]
        else:
            fork, rest = self._fork(), data
        fork.feed(rest)
        if self._refused_after(fork, ends):
            return True
        self._ahead = (self._fed, data, fork)
        return False

    # A check whose refusals give way where nothing else is left (the distinct-keys check: a repeated key is legal
    # JSON) gives way too where a check around it would otherwise be left with nothing (`_given_way`).
    yields = False
    giving_way = False  # (set on such a check for one fill)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, tokens_left: int | None = None) -> None:
        self.inner.fill_bitmask(bitmask, row, tokens_left)
        self._refused_here = NO_IDS
        if not self._active():
            return
        words = bitmask[row].numpy().view(np.uint32)
        if self._ban(words):
            return
        self.inner.fill_bitmask(bitmask, row, None)
        if not words.any() or self._ban(words) or self._given_way(bitmask, row, words):
            return
        raise ConstraintError(self.dead_end, code="constraint_too_complex")

    def _given_way(self, bitmask: torch.Tensor, row: int, words: np.ndarray) -> bool:
        """The inner mask filled again with the checks under this one that may give way doing so, then this
        check's refusals: whether any token is left (`0e15` under `not: {multipleOf: 8}`, where the number may only
        go on with an exponent's third digit, which the distinct-keys check refuses while it may end: it cannot)."""
        yielding = []
        inner = self.inner
        while isinstance(inner, CheckedMatcher):
            if inner.yields:
                yielding.append(inner)
            inner = inner.inner
        if not yielding:
            return False
        for check in yielding:
            check.giving_way = True
        try:
            self.inner.fill_bitmask(bitmask, row, None)
        finally:
            for check in yielding:
                check.giving_way = False
        return bool(words.any()) and self._ban(words)

    def _ban(self, words: np.ndarray) -> bool:
        """Clears the refused tokens' bits; whether any allowed token is left."""
        self._refused_here = self._refused(words)
        clear_ids(words, self._refused_here)
        return bool(words.any())

    def vet(self, token_id: int, tokens_left: int | None) -> int:
        """The budget rule's replacement token is not taken when the check refuses it (the sampled token was
        allowed under this step's mask), nor an EOS id that would end the output where the check says it cannot
        end (the backend's grammar is complete there, the client's schema not: `{"not": {"multipleOf": 8}}`
        ended at 8)."""
        vetted = self.inner.vet(token_id, tokens_left)
        if vetted == token_id:
            return vetted
        data = self.token_bytes[vetted]
        if data is None and not self.can_end():
            return token_id
        if data is not None and self._active() and self._refuses(data):
            return token_id
        return vetted

    def accept(self, token_id: int) -> bool:
        """False for a token the check refuses here, as the mask does: judged by the ids the last mask at this
        state cleared (the engine fills one every step), else by filling one."""
        if self._refused_here is None:
            scratch = torch.zeros((1, (len(self.token_bytes) + 31) // 32), dtype=torch.int32)
            self.fill_bitmask(scratch, 0)
        refused, self._refused_here = self._refused_here, None
        if (len(refused) and token_id in refused) or not self.inner.accept(token_id):  # (`in` costs ~5 us)
            return False
        data = self.token_bytes[token_id]
        if data:
            self._feed(data)
            self._fed += 1
        return True

    def is_terminated(self) -> bool:
        return self.inner.is_terminated()

    def can_end(self) -> bool:
        return self.inner.can_end()

    def min_tokens_to_end(self) -> int | None:
        return self.inner.min_tokens_to_end()


NO_IDS = np.zeros(0, dtype=np.int64)  # no token (ids are int64, as the mask helpers take them)


def wrapped(grammar: Grammar, cls: type) -> Grammar | None:
    """The grammar of class `cls` among `grammar` and the grammars it wraps (checks applied while decoding)."""
    while grammar is not None and not isinstance(grammar, cls):
        grammar = getattr(grammar, "inner", None)
    return grammar


def backend_matcher(matcher: Matcher) -> Matcher:
    """The backend's own matcher under the checks wrapping it."""
    while isinstance(matcher, CheckedMatcher):
        matcher = matcher.inner
    return matcher


def clear_ids(words: np.ndarray, ids: np.ndarray) -> None:
    """Clears the bits of `ids` in the mask row `words` (uint32), in place."""
    if len(ids):
        np.bitwise_and.at(words, ids >> 5, ~(np.uint32(1) << (ids & 31).astype(np.uint32)))


def allowed_among(words: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The ids among `ids` whose bits are set in the mask row `words` (uint32)."""
    return ids[((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)]


def allowed_ids(words: np.ndarray) -> np.ndarray:
    """Every id whose bit is set in the mask row `words`."""
    return np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")).astype(np.int64)
