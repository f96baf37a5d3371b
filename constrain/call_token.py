"""Tool calls opened by a token of their own: the "mistral" format of constrain/tools.py (`[TOOL_CALLS]`, then a
JSON array of calls), and Llama 3's `<|python_tag|>`, which may come before its call.

That token is one of the vocabulary's special tokens, which no compiled grammar writes, so `CallTokenGrammar`
puts it in front of one: the first token is the call token, then the calls' grammar runs from its start. The
first token may instead begin another grammar's output, which then runs: free text under tool_choice "auto"
(mistral), or all the answer may be without the token (Llama 3: the call, or under "auto" the call or text). Either inner grammar is
an ordinary compiled one (cached, checked, with the budget rule); this only chooses between them at the first
token, and leaves the call token room: it is allowed only while the token and the shortest calls still fit.

The calls' first token may also come with a space before it: Mistral 7B v0.3's template writes `[TOOL_CALLS] [`,
and its SentencePiece vocabulary spells that `▁[`, the token the model learned to write there. Such a token is
taken as the token without the space (the space is no part of the JSON; the parsers strip it).
"""

from __future__ import annotations

import numpy as np
import torch

from constrain.grammar import Grammar, Matcher, backend_of_parts
from constrain.vocabulary import Vocabulary, ids_to_words

_START, _CALLS, _TEXT = "start", "calls", "text"
_SPACED: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # vocabulary fingerprint -> `spaced_tokens`


def spaced_tokens(vocab: Vocabulary) -> tuple[np.ndarray, np.ndarray]:
    """(ids of the tokens that are a space and then another token's bytes, the ids of those other tokens):
    SentencePiece's `▁[` and `[`. Built once per vocabulary."""
    found = _SPACED.get(vocab.fingerprint)
    if found is None:
        by_bytes = vocab.ids_by_bytes()
        pairs = [(tid, by_bytes[data[1:]]) for tid, data in enumerate(vocab.token_bytes)
                 if data is not None and len(data) > 1 and data[0] == 0x20 and data[1:] in by_bytes]
        found = _SPACED[vocab.fingerprint] = (np.array([s for s, _ in pairs], dtype=np.int64),
                                               np.array([p for _, p in pairs], dtype=np.int64))
    return found


def _has(row: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Which of `ids` the int32 bitmask row allows."""
    return ((row.view(np.uint32)[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)


class CallTokenGrammar(Grammar):
    """`calls` after the token `token_id`, or `text` instead (free text, or what may be written without the
    token); without `text`, the token must come."""

    def __init__(self, calls: Grammar, text: Grammar | None, token_id: int, vocab: Vocabulary):
        self.calls = calls
        self.text = text
        self.token_id = token_id
        self.token_row = ids_to_words(np.array([token_id], dtype=np.int64), vocab.words)
        self.spaced, self.unspaced = spaced_tokens(vocab)  # (`spaced` ascending)
        self.backend = backend_of_parts(calls, text)
        self.unenforced = calls.unenforced

    def matcher(self, lane: int = 0) -> "CallTokenMatcher":
        text = self.text.matcher(lane) if self.text is not None else None
        return CallTokenMatcher(self, self.calls.matcher(lane), text)


class CallTokenMatcher(Matcher):
    def __init__(self, grammar: CallTokenGrammar, calls: Matcher, text: Matcher | None):
        self.grammar = grammar
        self.calls = calls
        self.text = text
        self.phase = _START
        self.calls_begun = False  # the calls' first token was taken (till then it may come with a space)
        self._calls_min: int | None = None  # the shortest calls, in tokens (measured once, at their start)

    def _active(self) -> Matcher:
        return self.calls if self.phase == _CALLS else self.text

    def _shortest_calls(self) -> int:
        """Tokens the calls need at least after the call token; 0 where the backend knows no completion (the
        calls may then end at the limit, as without the token)."""
        if self._calls_min is None:
            self._calls_min = self.calls.min_tokens_to_end() or 0
        return self._calls_min

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, tokens_left: int | None = None) -> None:
        out = bitmask[row].numpy()
        if self.phase != _START:
            self._active().fill_bitmask(bitmask, row, tokens_left)
            if self.phase == _CALLS and not self.calls_begun:  # each allowed first token, with a space too
                spaced = self.grammar.spaced[_has(out, self.grammar.unspaced)]
                np.bitwise_or.at(out.view(np.uint32), spaced >> 5, np.uint32(1) << (spaced & 31).astype(np.uint32))
            return
        if self.text is None:  # the calls are the only output: the token, whatever the budget
            out[:] = self.grammar.token_row
            return
        self.text.fill_bitmask(bitmask, row, tokens_left)
        if tokens_left is None or tokens_left - 1 >= self._shortest_calls():
            out |= self.grammar.token_row

    def vet(self, token_id: int, tokens_left: int | None) -> int:
        if self.phase == _START and (token_id == self.grammar.token_id or self.text is None):
            return token_id
        plain = self._unspaced(token_id)
        if plain != token_id:
            vetted = self.calls.vet(plain, tokens_left)
            return token_id if vetted == plain else vetted
        return self._active().vet(token_id, tokens_left)

    def _unspaced(self, token_id: int) -> int:
        """The calls' first token as the calls' grammar takes it: without the space it may come with."""
        if self.phase != _CALLS or self.calls_begun:
            return token_id
        spaced = self.grammar.spaced
        i = int(np.searchsorted(spaced, token_id))
        return int(self.grammar.unspaced[i]) if i < len(spaced) and spaced[i] == token_id else token_id

    def accept(self, token_id: int) -> bool:
        if self.phase == _CALLS and not self.calls_begun:
            self.calls_begun = self.calls.accept(self._unspaced(token_id))  # (calls never begin with a space)
            return self.calls_begun
        if self.phase != _START:
            return self._active().accept(token_id)
        if token_id == self.grammar.token_id:
            self.phase = _CALLS
            return True
        if self.text is None or not self.text.accept(token_id):
            return False
        self.phase = _TEXT
        return True

    def is_terminated(self) -> bool:
        return self.phase != _START and self._active().is_terminated()

    def can_end(self) -> bool:
        if self.phase == _START:  # (the empty answer, where the text may be empty)
            return self.text is not None and self.text.can_end()
        return self._active().can_end()

    def min_tokens_to_end(self) -> int | None:
        if self.phase != _START:
            return self._active().min_tokens_to_end()
        calls = 1 + self._shortest_calls()
        text = self.text.min_tokens_to_end() if self.text is not None else None
        return calls if text is None else min(calls, text)
