"""The llguidance backend: JSON schema / regex -> llguidance grammar -> LLMatcher per sequence.

Context-free and compiled in milliseconds, so it serves what a DFA cannot express (recursion, any JSON object)
and every first request. Never blocks on a model; never touches HTTP.

Budget rule: llguidance exposes no distance-to-accept, so the exact rule (#9) is not available here. What it
does: once the document can end and `tokens_left <= close_margin`, only EOS is allowed, so a complete document is
never extended into one that cannot close.
"""

from __future__ import annotations

import json
import re

import llguidance
import llguidance.hf
import numpy as np
import torch

from constrain.grammar import ConstraintError, Grammar, Matcher
from constrain.support import pointers_of
from constrain.vocabulary import Vocabulary

# Formats JSON Schema defines; any other name is an annotation every validator ignores, so skipping it loses nothing.
STANDARD_FORMATS = frozenset({
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
    "relative-json-pointer", "regex",
})
_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[(.*?)\]')
_UNKNOWN_FORMAT = re.compile(r"Unknown format: (\S+)")


def build_lltokenizer(tokenizer, vocab: Vocabulary) -> llguidance.LLTokenizer:
    """~0.5-1 s for a 152k vocabulary: build once per tokenizer."""
    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab.logits_width, eos_token=sorted(vocab.eos_token_ids))


def _json_options(whitespace_pattern: str, lenient: bool) -> dict:
    # General \uXXXX escapes: json.dumps writes every non-ASCII character that way.
    return {"whitespace_pattern": whitespace_pattern, "lenient": lenient, "json_allow_general_unicode_escapes": True}


def grammar_text(kind: str, *, schema=None, regex: str | None = None, whitespace_pattern: str = "[ ]?",
                 lenient: bool = False) -> str:
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(regex)
    return llguidance.LLMatcher.grammar_from_json_schema(
        schema if schema is not None else {"type": "object"}, overrides=_json_options(whitespace_pattern, lenient))


def _warned_keywords(messages: list[str]) -> tuple[set[str], list[str]]:
    keys: set[str] = set()
    other: list[str] = []
    for msg in messages:
        m = _UNIMPLEMENTED.search(msg)
        f = _UNKNOWN_FORMAT.search(msg)
        if m:
            keys.update(json.loads("[" + m.group(1) + "]"))
        elif f:
            keys.add("format")
        else:
            other.append(msg)
    return keys, other


def _format_at(schema, pointer: str, base: str):
    node = schema
    for part in pointer[len(base):].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node.get(part) if isinstance(node, dict) else None
    return node


def compile_llg(lltok, vocab: Vocabulary, kind: str, *, schema=None, regex: str | None = None, strict: bool = False,
                whitespace_pattern: str = "[ ]?", param: str = "response_format",
                base_pointer: str = "") -> "LlgGrammar":
    """Validate and build; strict schemas with unimplemented keywords fail with the keyword's pointer."""
    text = grammar_text(kind, schema=schema, regex=regex, whitespace_pattern=whitespace_pattern)
    is_error, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(text, lltok)
    unenforced: tuple[str, ...] = ()
    if is_error:
        keys, other = _warned_keywords(msgs)
        if other or kind == "regex" or not keys:
            raise ConstraintError(f"cannot compile constraint: {'; '.join(msgs)[:500]}", param=param)
        pointers = pointers_of(schema, keys, base_pointer) or [base_pointer or "/"]
        if keys == {"format"}:
            pointers = [p for p in pointers if _format_at(schema, p, base_pointer) in STANDARD_FORMATS]
        if strict and pointers:
            raise ConstraintError(f"strict schema uses a keyword that cannot be enforced at {pointers[0]} "
                                  f"({', '.join(sorted(keys))})", param=param, pointer=pointers[0],
                                  code="unsupported_schema")
        text = grammar_text(kind, schema=schema, whitespace_pattern=whitespace_pattern, lenient=True)
        is_error, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(text, lltok)
        if is_error:
            raise ConstraintError(f"cannot compile schema: {'; '.join(msgs)[:500]}", param=param)
        unenforced = tuple(pointers)
    return LlgGrammar(lltok, text, vocab, unenforced)


class LlgGrammar(Grammar):
    backend = "llguidance"

    def __init__(self, lltok, text: str, vocab: Vocabulary, unenforced: tuple[str, ...] = (),
                 close_margin: int = 1):
        self.lltok = lltok
        self.text = text
        self.vocab = vocab
        self.unenforced = unenforced
        self.close_margin = close_margin
        self._allowed = vocab.allowed_words()
        self._eos = vocab.eos_words()
        self.nbytes = 4 * len(text) + 64 * 1024
        self._proto = llguidance.LLMatcher(lltok, text, log_level=0)  # parsed once; matchers are deep copies
        if self._proto.is_error():
            raise ConstraintError(f"cannot start matcher: {self._proto.get_error()[:300]}")

    def matcher(self) -> "LlgMatcher":
        return LlgMatcher(self)


class LlgMatcher(Matcher):
    def __init__(self, grammar: LlgGrammar):
        self._g = grammar
        self._m = grammar._proto.deep_copy()

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, tokens_left: int | None = None) -> None:
        v = bitmask[row]
        out = v.numpy()
        can_end = self._m.is_accepting()
        if can_end and tokens_left is not None and tokens_left <= self._g.close_margin:
            out[:] = self._g._eos
            return
        if self._m.is_error() or self._m.is_stopped():
            out[:] = self._g._eos if can_end else 0
            return
        self._m.unsafe_compute_mask_ptr(v.data_ptr(), v.numel() * 4)
        np.bitwise_and(out, self._g._allowed, out=out)
        if can_end:
            np.bitwise_or(out, self._g._eos, out=out)

    def accept(self, token_id: int) -> bool:
        tb = self._g.vocab.token_bytes
        if not (0 <= token_id < len(tb)) or tb[token_id] is None or self._m.is_error():
            return False
        if self._m.validate_tokens([token_id]) != 1:
            return False
        return self._m.consume_token(token_id)

    def is_terminated(self) -> bool:
        return self._m.is_stopped()

    def can_end(self) -> bool:
        return self._m.is_accepting()
