"""An output of one of two grammars: tool calls, or an answer under the request's response_format (tools and
response_format together under tool_choice "auto", constrain/spec.py).

Both matchers run side by side while both could still produce the output: the mask is the union of theirs, and a
token goes to each one that takes it, so the first token that only one takes decides (a `[` or a tag opens calls,
a `{` the answer). Each keeps its own checks and budget rule; near the budget, only those whose shortest output
still fits add to the mask. The union's EOS is allowed exactly when one of them may end.
"""

from __future__ import annotations

import numpy as np
import torch

from constrain.grammar import Grammar, Matcher, backend_of_parts


class EitherGrammar(Grammar):
    """`calls` or `answer`. Its `unenforced` are the calls'; `answer_unenforced` the answer's (pointers in the
    response_format's schema)."""

    def __init__(self, calls: Grammar, answer: Grammar):
        self.calls = calls
        self.answer = answer
        self.backend = backend_of_parts(calls, answer)
        self.unenforced = calls.unenforced
        self.answer_unenforced = answer.unenforced

    def matcher(self, lane: int = 0) -> "EitherMatcher":
        return EitherMatcher([self.calls.matcher(lane), self.answer.matcher(lane)])


class EitherMatcher(Matcher):
    def __init__(self, matchers: list[Matcher]):
        self.alive = matchers
        self._rows: list[np.ndarray] = []  # each live matcher's row of the last mask (for `vet`)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, tokens_left: int | None = None) -> None:
        out = bitmask[row].numpy()
        rows = []
        fitting = self._fitting(tokens_left)
        for m in self.alive:
            m.fill_bitmask(bitmask, row, tokens_left)
            rows.append(out.copy() if m in fitting else np.zeros_like(out))
        self._rows = rows
        if len(rows) > 1:
            np.bitwise_or.reduce(np.stack(rows), axis=0, out=out)

    def _fitting(self, tokens_left: int | None) -> list[Matcher]:
        """The matchers that may go on: near the budget, those whose output still fits in the tokens left (a
        backend that knows no distance counts as fitting), or all where none does (each then steers itself)."""
        if tokens_left is None or len(self.alive) == 1:
            return self.alive
        fits = [m for m in self.alive if (n := m.min_tokens_to_end()) is None or n <= tokens_left]
        return fits or self.alive

    def _allows(self, i: int, token_id: int) -> bool:
        if i >= len(self._rows):
            return True
        return bool((int(self._rows[i][token_id >> 5]) >> (token_id & 31)) & 1)

    def vet(self, token_id: int, tokens_left: int | None) -> int:
        """The first matcher whose mask allowed the token vets it."""
        for i, m in enumerate(self.alive):
            if self._allows(i, token_id):
                return m.vet(token_id, tokens_left)
        return token_id

    def accept(self, token_id: int) -> bool:
        took = [m for m in self.alive if m.accept(token_id)]
        if not took:
            return False
        self.alive = took
        self._rows = []
        return True

    def is_terminated(self) -> bool:
        return all(m.is_terminated() for m in self.alive)

    def can_end(self) -> bool:
        return any(m.can_end() for m in self.alive)

    def min_tokens_to_end(self) -> int | None:
        known = [n for n in (m.min_tokens_to_end() for m in self.alive) if n is not None]
        return min(known) if known else None
