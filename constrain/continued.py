"""A constraint on an answer that continues text already written (a prefill: the assistant message a chat request
leaves open with `continue_final_message`). The prefill and the continuation together are the document, so each
matcher starts where the prefill leaves the grammar: a prefill `{"city": "` with a JSON schema is continued into
a valid document, never followed by a second one.
"""

from __future__ import annotations

import codecs

from constrain.grammar import ConstraintError, Grammar, Matcher
from constrain.vocabulary import Vocabulary

_UTF8 = codecs.getincrementaldecoder("utf-8")


class ContinuedGrammar(Grammar):
    """`inner` with its matchers advanced through `prefill` (spelled in this vocabulary's tokens). Raises
    ConstraintError (`param`) when the grammar does not take the prefill: no continuation could be valid."""

    def __init__(self, inner: Grammar, vocab: Vocabulary, prefill: str, param: str):
        self.inner = inner
        self.backend = inner.backend
        self.unenforced = inner.unenforced
        self.call_tag = inner.call_tag
        self.tokens = vocab.spell(prefill.encode("utf-8")) or []
        if prefill and not self.tokens:
            raise ConstraintError("the assistant message to continue cannot be spelled in this model's tokens",
                                  param="messages")
        probe = inner.matcher()
        for i, token in enumerate(self.tokens):
            if probe.is_terminated() or not probe.accept(token):
                written = _UTF8("replace").decode(b"".join(vocab.token_bytes[t] for t in self.tokens[:i]))
                # (up to the last whole character: a token may end inside one)
                where = f"after {written!r}" if written else "at its start"
                raise ConstraintError(
                    f"the assistant message to continue (continue_final_message), {prefill!r}, does not fit the "
                    f"`{param}` constraint {where}: no continuation of it could be valid", param="messages")

    def matcher(self, lane: int = 0) -> Matcher:
        m = self.inner.matcher(lane)
        for token in self.tokens:
            m.accept(token)
        return m
