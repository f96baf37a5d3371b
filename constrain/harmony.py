"""The harmony format of gpt-oss: every message the model writes opens with a header of special tokens and text,
and the answer is one of them.

The prompt ends with `<|start|>assistant` (the template's generation prompt). The model then writes, in order:
- any number of reasoning messages: `<|channel|>analysis<|message|>TEXT<|end|><|start|>assistant`, and where tools
  are offered, preambles (`<|channel|>commentary<|message|>TEXT<|end|>...`), which come back as reasoning too;
- then the answer: `<|channel|>final<|message|>ANSWER` ended by `<|return|>`, or one tool call,
  `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGUMENTS` ended by `<|call|>` (both EOS
  ids of gpt-oss).

`HarmonyGrammar` keeps the output in that shape and applies the request's constraint where it belongs: `answer`
(the response_format, regex or choice grammar; None: free text) to the final message, each function's grammar to
the arguments of a call to it. The headers are fixed token sequences (special tokens and text between them),
followed token by token; the answer's and the arguments' grammars are ordinary compiled grammars, so every check
and the budget rule apply to them as without harmony. Near the budget the reasoning ends (`<|end|>`) once only
the shortest way to an answer still fits, and a header's tokens are allowed only while their answer fits.

Each accepted token gets a role (`Matcher.token_role`) that tells the engine where its text goes: the
reasoning ("reasoning"), the answer ("answer"), or nowhere (a header's tokens: "tag", or "reasoning_tag" where they
count as reasoning). At a call's header's last token ("call_header") the answer's text begins with the header as
`call_text` spells it, so the call reads back as constrain/tools.py's "harmony" calls: the whole answer is then
that text and the arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import numpy as np
import torch

from constrain.grammar import ConstraintError, Grammar, Matcher, backend_of_parts
from constrain.vocabulary import Vocabulary, ids_to_words

START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                                                          "<|constrain|>", "<|return|>", "<|call|>")
SPECIALS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
CALL_PREFIX = "commentary to=functions."  # (after <|channel|>): the function's name, then " <|constrain|>json"
CALL_OPEN = CHANNEL + CALL_PREFIX  # where a call begins in the answer's text (special tokens kept)
ARGS_OPEN = " " + CONSTRAIN + "json" + MESSAGE  # between the name and the arguments

Item = Union[int, bytes]  # a special token's id, or text


@dataclass(frozen=True)
class HarmonyTokens:
    """The special tokens' ids and the rows built from them, once per vocabulary."""

    ids: dict[str, int]
    text_row: np.ndarray  # every ordinary token (no special token, no EOS)
    free_answer_row: np.ndarray  # the final message without a constraint: ordinary tokens and EOS
    by_bytes: dict[bytes, tuple[int, ...]] = field(repr=False)  # bytes -> every ordinary token spelling them

    @classmethod
    def for_tokenizer(cls, tokenizer, vocab: Vocabulary) -> "HarmonyTokens":
        ids = harmony_token_ids(tokenizer)
        if ids is None:
            raise ConstraintError("the harmony format needs " + ", ".join(SPECIALS) + " to be tokens of the model's "
                                  "vocabulary, and they are not")
        by_bytes: dict[bytes, list[int]] = {}
        for tid, data in enumerate(vocab.token_bytes):
            if data is not None:
                by_bytes.setdefault(data, []).append(tid)
        text_row = vocab.allowed_words()
        return cls(ids=ids, text_row=text_row, free_answer_row=text_row | vocab.eos_words(),
                   by_bytes={k: tuple(v) for k, v in by_bytes.items()})


def harmony_token_ids(tokenizer) -> dict[str, int] | None:
    """Each of SPECIALS -> its id, where each is one token of `tokenizer`'s vocabulary; else None."""
    out = {}
    for tag in SPECIALS:
        ids = tokenizer.encode(tag, add_special_tokens=False)
        if len(ids) != 1:
            return None
        out[tag] = ids[0]
    return out


_ANALYSIS, _FINAL, _CALL = "analysis", "final", "call"
_BUDGET_MARGIN = 16  # tokens: within this of a header's costliest path, its masks are made for the budget left
_HEADER, _REASONING, _ANSWER, _ARGS = "header", "reasoning", "answer", "args"


@dataclass(frozen=True)
class _Header:
    """A header the model may write: its items, and what follows it (`kind`, and the function for a call)."""

    items: tuple[Item, ...]
    kind: str
    name: str | None = None


class HarmonyGrammar(Grammar):
    """`answer`: the final message's grammar (None: free text); `final`: the final message is allowed (False:
    the output must be a call, tool_choice "required" or a named function); `arguments`: function name -> the
    grammar of its arguments (no tools: empty)."""

    def __init__(self, answer: Grammar | None, arguments: dict[str, Grammar], final: bool, tokens: HarmonyTokens,
                 vocab: Vocabulary, unenforced: tuple[str, ...] = ()):
        if not final and not arguments:
            raise ValueError("a harmony output needs a final message or a call")
        self.answer = answer
        self.arguments = arguments
        self.tokens = tokens
        self.vocab = vocab
        self.backend = backend_of_parts(answer, *arguments.values()) or "harmony"
        # with calls, `unenforced` names their arguments' keywords and `answer_unenforced` the answer's (as
        # constrain/either.py); a final message alone has the answer's
        answer_unenforced = answer.unenforced if answer is not None else ()
        self.unenforced = unenforced if arguments else answer_unenforced
        self.answer_unenforced = answer_unenforced if arguments else ()
        t = tokens.ids
        answers = [_Header((t[CHANNEL], b"final", t[MESSAGE]), _FINAL)] if final else []
        answers += [_Header((t[CHANNEL], (CALL_PREFIX + name + " ").encode(), t[CONSTRAIN], b"json", t[MESSAGE]),
                            _CALL, name) for name in arguments]
        # reasoning: analysis messages, and with tools the preambles gpt-oss may write before a call (a commentary
        # message without a recipient), which come back as reasoning too
        reasoning = [_Header((t[CHANNEL], b"analysis", t[MESSAGE]), _ANALYSIS)]
        if arguments:
            reasoning.append(_Header((t[CHANNEL], b"commentary", t[MESSAGE]), _ANALYSIS))
        self.first = (*reasoning, *answers)
        # after a reasoning message: its end, the next message's start, then any first header
        self.after_reasoning = tuple(_Header((t[END], t[START], b"assistant", *h.items), h.kind, h.name)
                                     for h in self.first)
        self._rows: dict[tuple, np.ndarray] = {}
        self._item_costs: dict[Item, int] = {}
        self._inner_min: dict[str | None, int] = {}

    def matcher(self, lane: int = 0) -> "HarmonyMatcher":
        return HarmonyMatcher(self, lane)

    # ---- costs, for the budget rule -----------------------------------------------------------------------
    def item_cost(self, item: Item) -> int:
        """Tokens an item takes: a special token one, text as the vocabulary spells it."""
        if isinstance(item, int):
            return 1
        if item not in self._item_costs:
            self._item_costs[item] = len(self.vocab.spell(item) or item)
        return self._item_costs[item]

    def inner_min(self, header: _Header) -> int:
        """Tokens the shortest answer after `header` takes (0 where its backend knows none)."""
        if header.kind == _ANALYSIS:  # (an empty reasoning message, then the cheapest answer)
            return min(self.rest_cost(h, 0, 0) for h in self.after_reasoning if h.kind != _ANALYSIS)
        key = header.name if header.kind == _CALL else None
        if key not in self._inner_min:
            g = self.arguments[header.name] if header.kind == _CALL else self.answer
            self._inner_min[key] = (g.matcher().min_tokens_to_end() or 0) if g is not None else 0
        return self._inner_min[key]

    def rest_cost(self, header: _Header, item: int, offset: int) -> int:
        """Tokens that finish `header` from its `item`th item, `offset` bytes in, and the shortest answer after."""
        rest = header.items[item:]
        cost = sum(self.item_cost(i) for i in rest[1:])
        if rest:
            first = rest[0]
            cost += self.item_cost(first if isinstance(first, int) or not offset else first[offset:])
        return cost + self.inner_min(header)

    def reasoning_exit_cost(self) -> int:
        return min(self.rest_cost(h, 0, 0) for h in self.after_reasoning)


# Where the headers still possible stand: each header, the item it reached, and bytes into it (a text item). Each
# its own: one header's text may be another's prefix ("commentary" before `<|message|>`, or before " to=...").
_Place = tuple[tuple[_Header, int, int], ...]


def _start(headers: tuple[_Header, ...], item: int = 0) -> _Place:
    return tuple((h, item, 0) for h in headers)


class HarmonyMatcher(Matcher):
    def __init__(self, grammar: HarmonyGrammar, lane: int = 0):
        self.g = grammar
        self.lane = lane  # (the answer's and the arguments' matchers are made on it)
        self.phase = _HEADER
        self.place: _Place = _start(grammar.first)
        self.inner: Matcher | None = None  # the answer's or the arguments' matcher
        self.token_role = "tag"  # the last accepted token's (see the module's docstring)
        self.in_reasoning = False  # the header being written follows a reasoning message (its tags count there)
        self.call_text = ""  # a call's header, as its answer's text begins

    # ---- headers -----------------------------------------------------------------------------------------
    def _header_tokens(self, tokens_left: int | None) -> list[int]:
        """The tokens that may come next in the current header, less those after which no answer fits (or, where
        none fits, those that lead to the shortest)."""
        g = self.g
        costs: dict[int, int] = {}
        for h, at, offset in self.place:
            item = h.items[at]
            if isinstance(item, int):
                costs[item] = min(costs.get(item, 1 << 30), g.rest_cost(h, at + 1, 0))
                continue
            rest = item[offset:]
            for end in range(1, len(rest) + 1):
                cost = g.rest_cost(h, at, offset + end) if end < len(rest) else g.rest_cost(h, at + 1, 0)
                for tid in g.tokens.by_bytes.get(rest[:end], ()):
                    costs[tid] = min(costs.get(tid, 1 << 30), cost)
        if tokens_left is None:
            return sorted(costs)
        limit = max(tokens_left - 1, min(costs.values()))
        return sorted(t for t, c in costs.items() if c <= limit)

    def _header_row(self, tokens_left: int | None) -> np.ndarray:
        """The header's row; cached per place while the budget is far (a token's spelling may cost more than the
        rest of the header does spelled at once: hence the margin)."""
        near = tokens_left is not None and tokens_left <= self._header_max() + _BUDGET_MARGIN
        row = None if near else self.g._rows.get(self.place)
        if row is None:
            ids = self._header_tokens(tokens_left if near else None)
            row = ids_to_words(np.array(ids, dtype=np.int64), self.g.vocab.words)
            if not near and len(self.g._rows) < 4096:
                self.g._rows[self.place] = row
        return row

    def _header_min(self) -> int:
        return min(self.g.rest_cost(h, at, offset) for h, at, offset in self.place)

    def _header_max(self) -> int:
        return max(self.g.rest_cost(h, at, offset) for h, at, offset in self.place)

    def _advance_header(self, token_id: int) -> bool:
        data = self.g.vocab.token_bytes[token_id] if self._ordinary(token_id) else None
        moved = []
        for h, at, offset in self.place:
            item = h.items[at]
            if isinstance(item, int):
                if item == token_id:
                    moved.append((h, at + 1, 0))
            elif data and item.startswith(data, offset):
                end = offset + len(data)
                moved.append((h, at + 1, 0) if end == len(item) else (h, at, end))
        if not moved:
            return False
        self.place = tuple(moved)
        self.token_role = "reasoning_tag" if self.in_reasoning else "tag"
        done = [h for h, at, _ in moved if at == len(h.items)]
        if done:
            self._enter(done[0])
        return True

    def _enter(self, header: _Header) -> None:
        g = self.g
        if header.kind == _ANALYSIS:
            self.phase, self.in_reasoning = _REASONING, True
            self.token_role = "reasoning_tag"
            return
        self.in_reasoning = False
        if header.kind == _CALL:
            self.phase, self.inner = _ARGS, g.arguments[header.name].matcher(self.lane)
            self.token_role, self.call_text = "call_header", CALL_OPEN + header.name + ARGS_OPEN
        else:
            self.phase = _ANSWER
            self.inner = g.answer.matcher(self.lane) if g.answer is not None else None
            self.token_role = "tag"

    # ---- the Matcher interface ---------------------------------------------------------------------------
    def fill_bitmask(self, bitmask: torch.Tensor, row: int, tokens_left: int | None = None) -> None:
        out = bitmask[row].numpy()
        g = self.g
        if self.phase == _HEADER:
            out[:] = self._header_row(tokens_left)
        elif self.phase == _REASONING:
            end = g.tokens.ids[END]
            if tokens_left is not None and tokens_left <= g.reasoning_exit_cost():
                out[:] = 0  # only the way out still fits
            else:
                out[:] = g.tokens.text_row
            out[end >> 5] |= np.array([1 << (end & 31)], dtype=np.uint32).view(np.int32)[0]
        elif self.inner is None:
            out[:] = g.tokens.free_answer_row
        else:
            self.inner.fill_bitmask(bitmask, row, tokens_left)

    def vet(self, token_id: int, tokens_left: int | None) -> int:
        if self.phase in (_ANSWER, _ARGS) and self.inner is not None:
            return self.inner.vet(token_id, tokens_left)
        return token_id

    def accept(self, token_id: int) -> bool:
        if self.phase == _HEADER:
            return self._advance_header(token_id)
        if self.phase == _REASONING:
            if token_id == self.g.tokens.ids[END]:
                self.phase, self.place = _HEADER, _start(self.g.after_reasoning, 1)
                self.token_role = "reasoning_tag"
                return True
            if not self._ordinary(token_id):
                return False
            self.token_role = "reasoning"
            return True
        ok = self._ordinary(token_id) if self.inner is None else self.inner.accept(token_id)
        if ok:
            self.token_role = "answer"
        return ok

    def _ordinary(self, token_id: int) -> bool:
        data = self.g.vocab.token_bytes
        return 0 <= token_id < len(data) and data[token_id] is not None

    def is_terminated(self) -> bool:
        return self.phase in (_ANSWER, _ARGS) and self.inner is not None and self.inner.is_terminated()

    def can_end(self) -> bool:
        if self.phase in (_ANSWER, _ARGS):
            return self.inner is None or self.inner.can_end()
        return False

    def min_tokens_to_end(self) -> int | None:
        if self.phase == _HEADER:
            return self._header_min()
        if self.phase == _REASONING:
            return self.g.reasoning_exit_cost()
        if self.inner is None:
            return 0
        return self.inner.min_tokens_to_end()
