"""A reasoning block (`<think>...</think>`, Magistral's `[THINK]...[/THINK]`) before a constrained answer, for
models that think first (Qwen3, QwQ, DeepSeek-R1 and their distills, Magistral, Ministral 3).

The model writes free text inside the block; the client's constraint applies to the answer after it.
`ReasoningGrammar` wraps any compiled grammar, so the engine drives it through the same four methods:
- before the block, when the prompt left opening it to the model: the open tag as the first token, or the
  answer at once;
- inside: any ordinary token but EOS, until the close tag. When the tokens left would only just hold the close
  tag and the shortest answer, the close tag is the only token allowed, so the budget rule (#9) still holds: an
  answer ends complete whenever max_tokens leaves room for the shortest one after the tag;
- after the close tag: up to `GAP_TOKENS` whitespace-only tokens (templates write "\\n\\n" there), then the inner
  grammar from its start.
Token ids and masks only: the engine splits the text into reasoning and content (engine/sequence.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from constrain.grammar import Grammar, Matcher
from constrain.vocabulary import Vocabulary, ids_to_words

GAP_TOKENS = 2  # whitespace-only tokens allowed between the close tag and the answer

_BEFORE, _INSIDE, _GAP, _ANSWER = "before", "inside", "gap", "answer"
_WHITESPACE = frozenset(b" \t\r\n")


@dataclass(frozen=True)
class ReasoningTokens:
    """The tags' ids and the mask rows the matcher ORs in, built once per vocabulary."""

    open_id: int
    close_id: int
    inside_row: np.ndarray  # int32 words: every ordinary token and the close tag (no EOS, no special token)
    close_row: np.ndarray  # the close tag alone
    open_row: np.ndarray  # the open tag alone
    whitespace_ids: frozenset[int]
    whitespace_row: np.ndarray

    @classmethod
    def for_vocab(cls, vocab: Vocabulary, open_id: int, close_id: int) -> "ReasoningTokens":
        def row(ids) -> np.ndarray:
            return ids_to_words(np.array(sorted(ids), dtype=np.int64), vocab.words)

        whitespace = frozenset(i for i, data in enumerate(vocab.token_bytes)
                               if data and _WHITESPACE.issuperset(data))
        return cls(open_id=open_id, close_id=close_id, inside_row=vocab.allowed_words() | row([close_id]),
                   close_row=row([close_id]), open_row=row([open_id]), whitespace_ids=whitespace,
                   whitespace_row=row(whitespace))


class ReasoningGrammar(Grammar):
    """`inner` with a reasoning block before it. `opened`: the prompt already wrote the open tag."""

    def __init__(self, inner: Grammar, tokens: ReasoningTokens, opened: bool):
        self.inner = inner
        self.tokens = tokens
        self.opened = opened
        self.backend = inner.backend
        self.unenforced = inner.unenforced
        self.answer_unenforced = inner.answer_unenforced
        self.call_tag = inner.call_tag

    def matcher(self, lane: int = 0) -> "ReasoningMatcher":
        return ReasoningMatcher(self.inner.matcher(lane), self.tokens, self.opened)


class ReasoningMatcher(Matcher):
    def __init__(self, inner: Matcher, tokens: ReasoningTokens, opened: bool):
        self.inner = inner
        self.tokens = tokens
        self.phase = _INSIDE if opened else _BEFORE
        self.gap = 0
        self._answer_tokens: int | None = None  # the inner grammar's shortest answer (measured once, at its start)

    def _answer_min(self) -> int:
        """Tokens the answer needs at least (its inner matcher has not moved yet). A backend that knows no
        completion counts 0: the answer may then end at the limit, as it would without a reasoning block."""
        if self._answer_tokens is None:
            self._answer_tokens = self.inner.min_tokens_to_end() or 0
        return self._answer_tokens

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, tokens_left: int | None = None) -> None:
        out = bitmask[row].numpy()
        t = self.tokens
        if self.phase == _INSIDE:
            # The close tag alone once only the tag and the shortest answer still fit.
            forced = tokens_left is not None and tokens_left <= 1 + self._answer_min()
            out[:] = t.close_row if forced else t.inside_row
            return
        self.inner.fill_bitmask(bitmask, row, tokens_left)
        if self.phase == _ANSWER:
            return
        # before: the open tag, if the close tag and the shortest answer still fit after it; gap: whitespace while
        # this matcher takes it, if the answer does
        room = tokens_left is None or tokens_left - 1 >= self._answer_min() + (1 if self.phase == _BEFORE else 0)
        if room and (self.phase == _BEFORE or self._takes_whitespace):
            out |= t.open_row if self.phase == _BEFORE else t.whitespace_row

    def vet(self, token_id: int, tokens_left: int | None) -> int:
        if self.phase == _INSIDE or self._takes_itself(token_id):
            return token_id
        return self.inner.vet(token_id, tokens_left)

    @property
    def _takes_whitespace(self) -> bool:
        """After the close tag, up to GAP_TOKENS whitespace tokens are this matcher's (the mask offers them only
        then: offered past it, `accept` handed the next to the answer's grammar, which refused it)."""
        return self.phase == _GAP and self.gap < GAP_TOKENS

    def _takes_itself(self, token_id: int) -> bool:
        """The token is the open tag before the block or a gap token: this matcher's, not the answer's."""
        if self.phase == _BEFORE:
            return token_id == self.tokens.open_id
        return self._takes_whitespace and token_id in self.tokens.whitespace_ids

    def accept(self, token_id: int) -> bool:
        if self.phase == _INSIDE:
            if token_id == self.tokens.close_id:
                self.phase = _GAP
                return True
            return bool((int(self.tokens.inside_row[token_id >> 5]) >> (token_id & 31)) & 1)
        if self._takes_itself(token_id):
            if self.phase == _BEFORE:
                self.phase = _INSIDE
            else:
                self.gap += 1
            return True
        if not self.inner.accept(token_id):
            return False
        self.phase = _ANSWER
        return True

    @property
    def answer_begun(self) -> bool:
        return self.phase == _ANSWER

    def is_terminated(self) -> bool:
        return self.phase in (_GAP, _ANSWER) and self.inner.is_terminated()

    def can_end(self) -> bool:
        return self.phase in (_GAP, _ANSWER) and self.inner.can_end()

    def min_tokens_to_end(self) -> int | None:
        if self.phase == _INSIDE:
            return 1 + self._answer_min()
        return self.inner.min_tokens_to_end()
