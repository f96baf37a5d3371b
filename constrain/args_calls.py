"""Tool calls written `[TOOL_CALLS]name[ARGS]{arguments}`, one after another (the "mistral_args" format of
constrain/tools.py: Mistral Small 3.2, Magistral, Devstral, Ministral 3).

Both tags are special tokens of the vocabulary, which no compiled grammar writes, and the arguments' schema
depends on the name written before them, so `ArgsCallsGrammar` drives ordinary compiled grammars in turn: the
function names (a choice), then the arguments of the function named (each function's parameters compiled as a
JSON schema, so every check and the budget rule apply to them as to a response_format), and under tool_choice
"auto" free text, which calls may follow. It writes the tags' bits itself:
- `[TOOL_CALLS]` first (required), or once the text may end (auto), or after a call's arguments when more calls
  may follow; each time only while a whole shortest call still fits in the tokens left;
- `[ARGS]` once the name is complete.
Near the budget a name's tokens are allowed only while that name, `[ARGS]` and its function's shortest arguments
still fit, so calls end complete whenever max_tokens holds the shortest call (the budget rule of constrain/).
"""

from __future__ import annotations

import numpy as np
import torch

from constrain.grammar import Grammar, Matcher, backend_of_parts
from constrain.vocabulary import Vocabulary, ids_to_words

_START, _TEXT, _NAME, _ARGS = "start", "text", "name", "args"


class ArgsCallsGrammar(Grammar):
    """`names`: the function names; `arguments`: name -> the grammar of its arguments; `text`: free text (tool_choice
    "auto"), or None; `many`: more than one call may be written; `unenforced`: the arguments' unenforced pointers,
    told in terms of the call schema."""

    def __init__(self, names: Grammar, arguments: dict[str, Grammar], text: Grammar | None, call_id: int,
                 args_id: int, vocab: Vocabulary, many: bool, unenforced: tuple[str, ...] = ()):
        self.names = names
        self.arguments = arguments
        self.text = text
        self.call_id, self.args_id = call_id, args_id
        self.many = many
        self.vocab = vocab
        self.call_row = ids_to_words(np.array([call_id], dtype=np.int64), vocab.words)
        self.args_row = ids_to_words(np.array([args_id], dtype=np.int64), vocab.words)
        self.not_eos = ~vocab.eos_words()
        self.backend = backend_of_parts(names, *arguments.values(), text)
        self.unenforced = unenforced
        self._shortest_args: dict[str, int] | None = None
        self._shortest_call: int | None = None

    def shortest_call(self) -> int:
        """Tokens a whole shortest call takes: `[TOOL_CALLS]`, a name, `[ARGS]` and its shortest arguments."""
        if self._shortest_call is None:
            self._shortest_call = 1 + self.rest_of_call(b"")
        return self._shortest_call

    def shortest_args(self) -> dict[str, int]:
        """Function name -> tokens of its shortest arguments (0 where the backend knows none). Measured once."""
        if self._shortest_args is None:
            self._shortest_args = {name: g.matcher().min_tokens_to_end() or 0 for name, g in self.arguments.items()}
        return self._shortest_args

    def rest_of_call(self, written: bytes) -> int | None:
        """The fewest tokens that finish a call whose name begins with `written`: the rest of the name (as the
        vocabulary spells it), `[ARGS]` and the shortest arguments; None when no name begins so."""
        costs = []
        for name, args in self.shortest_args().items():
            rest = name.encode()
            if rest.startswith(written):
                rest = rest[len(written):]
                costs.append(len(self.vocab.spell(rest) or rest) + 1 + args)
        return min(costs) if costs else None

    def matcher(self, lane: int = 0) -> "ArgsCallsMatcher":
        return ArgsCallsMatcher(self, lane)


class ArgsCallsMatcher(Matcher):
    def __init__(self, grammar: ArgsCallsGrammar, lane: int = 0):
        self.g = grammar
        self.lane = lane  # (the grammar's lane of this matcher's own, and of the names' and arguments')
        self.phase = _START
        self.text = grammar.text.matcher(lane) if grammar.text is not None else None
        self.name: Matcher | None = None
        self.name_bytes = bytearray()
        self.args: Matcher | None = None

    def _room(self, tokens_left: int | None, needed: int) -> bool:
        return tokens_left is None or tokens_left >= needed

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, tokens_left: int | None = None) -> None:
        out = bitmask[row].numpy()
        g = self.g
        if self.phase in (_START, _TEXT):
            if self.text is None:
                out[:] = g.call_row  # the calls are the only output: the tag, whatever the budget
                return
            self.text.fill_bitmask(bitmask, row, tokens_left)
            if (self.phase == _START or self.text.can_end()) and self._room(tokens_left, g.shortest_call()):
                out |= g.call_row
        elif self.phase == _NAME:
            self.name.fill_bitmask(bitmask, row)
            out &= g.not_eos  # (the name ends with [ARGS], not the output)
            if tokens_left is not None:
                self._keep_names_that_fit(out, tokens_left)
            if self.name.can_end():
                out |= g.args_row
        else:
            self.args.fill_bitmask(bitmask, row, tokens_left)
            if g.many and self.args.can_end() and self._room(tokens_left, g.shortest_call()):
                out |= g.call_row

    def _keep_names_that_fit(self, out: np.ndarray, tokens_left: int) -> None:
        """Clear the bit of each name token after which no call fits in the tokens left (this one included).
        Where none fits (max_tokens below the shortest call), those leading to the shortest calls stay: the
        output then ends at the limit."""
        ids = np.flatnonzero(np.unpackbits(out.view(np.uint8), bitorder="little")).tolist()
        rests = [self.g.rest_of_call(bytes(self.name_bytes) + (self.g.vocab.token_bytes[t] or b"")) for t in ids]
        known = [r for r in rests if r is not None]
        limit = max(tokens_left - 1, min(known)) if known else -1
        words = out.view(np.uint32)
        for tid, rest in zip(ids, rests):
            if rest is None or rest > limit:
                words[tid >> 5] &= np.uint32(~(1 << (tid & 31)) & 0xFFFFFFFF)

    def vet(self, token_id: int, tokens_left: int | None) -> int:
        g = self.g
        if token_id in (g.call_id, g.args_id) or self.phase == _NAME:  # (the mask keeps names that fit)
            return token_id
        inner = self.args if self.phase == _ARGS else self.text
        return inner.vet(token_id, tokens_left) if inner is not None else token_id

    def accept(self, token_id: int) -> bool:
        g = self.g
        if token_id == g.call_id:
            ok = (self.phase == _START or (self.phase == _TEXT and self.text.can_end())
                  or (self.phase == _ARGS and g.many and self.args.can_end()))
            if ok:
                self.phase, self.name, self.args = _NAME, g.names.matcher(self.lane), None
                self.name_bytes.clear()
            return ok
        if token_id == g.args_id:
            if self.phase != _NAME or not self.name.can_end():
                return False
            grammar = g.arguments.get(self.name_bytes.decode("utf-8", "replace"))
            if grammar is None:
                return False
            self.phase, self.args = _ARGS, grammar.matcher(self.lane)
            return True
        if self.phase == _NAME:
            if not self.name.accept(token_id):
                return False
            self.name_bytes += g.vocab.token_bytes[token_id] or b""
            return True
        if self.phase == _ARGS:
            return self.args.accept(token_id)
        if self.text is None or not self.text.accept(token_id):
            return False
        self.phase = _TEXT
        return True

    def is_terminated(self) -> bool:
        return self.phase == _ARGS and not self.g.many and self.args.is_terminated()

    def can_end(self) -> bool:
        if self.phase == _ARGS:
            return self.args.can_end()
        return self.phase in (_START, _TEXT) and self.text is not None and self.text.can_end()

    def min_tokens_to_end(self) -> int | None:
        if self.phase == _ARGS:
            return self.args.min_tokens_to_end()
        if self.phase == _NAME:
            return self.g.rest_of_call(bytes(self.name_bytes))
        if self.phase == _TEXT:
            return self.text.min_tokens_to_end()
        text = self.text.min_tokens_to_end() if self.text is not None else None
        return self.g.shortest_call() if text is None else min(text, self.g.shortest_call())
