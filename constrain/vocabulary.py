"""The model's vocabulary as bytes: what each token id writes, which ids may never be sampled, how wide masks are.

Built once per tokenizer; its `fingerprint` keys the compile caches. Never imports model code.

Decisions:
- ByteLevel BPE tokens (GPT-2, Qwen2) are mapped back to bytes through the inverse GPT-2 byte<->unicode table;
  SentencePiece tokens (Llama, Phi-3) map `▁` to a space and `<0xXX>` to that byte.
- None (never allowed) for: every id in `added_tokens_decoder` marked special (but those named in
  `writable_special`, tags a grammar writes as text: `<tool_call>` where a fine-tune made it special), every
  EOS/stop id, tokens that write no bytes, ids past the tokenizer's vocabulary (padded logits), and non-special
  added tokens named `[PADnnnn]`: the Qwen2 tokenizer carries 290 such GGUF padding artefacts that no training
  text contains, so letting a grammar pick one would only spell "[PAD151646]" by accident. Other non-special added
  tokens write their content as UTF-8.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

_PAD_ARTEFACT = re.compile(r"^\[PAD\d+\]$")
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def unsampled_ids(tokenizer, logits_width: int) -> tuple[int, ...]:
    """The ids that are no token of the model's text, which a row free of any constraint is never to sample either:
    those past the tokenizer's vocabulary (padded logits) and the `[PADnnnn]` artefacts (a random model, the
    built-in one, wrote `[PAD151697]` in its answers), added tokens or, as Phi-3's 53, pieces of the vocabulary
    itself."""
    special = set(tokenizer.all_special_ids)
    artefacts = [int(i) for piece, i in tokenizer.get_vocab().items()
                 if _PAD_ARTEFACT.match(piece) and int(i) < logits_width and int(i) not in special]
    return tuple(sorted(artefacts)) + tuple(range(len(tokenizer), logits_width))


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 onwards."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_UNICODE_TO_BYTE = _gpt2_unicode_to_byte()


def _bytelevel_bytes(token: str) -> bytes | None:
    try:
        return bytes(_UNICODE_TO_BYTE[ch] for ch in token)
    except KeyError:
        return None  # not a byte-level string (should not happen for model tokens)


def _sentencepiece_bytes(token: str) -> bytes:
    m = _BYTE_FALLBACK.match(token)
    if m:
        return bytes([int(m.group(1), 16)])
    return token.replace("▁", " ").encode("utf-8")


def piece_bytes(piece: str, byte_level: bool) -> bytes | None:
    """The bytes a tokenizer piece stands for: byte-level BPE through the inverse GPT-2 table, else SentencePiece
    (`▁` is a space, `<0xXX>` a byte). The one place token text becomes bytes (masks and logprobs agree)."""
    return _bytelevel_bytes(piece) if byte_level else _sentencepiece_bytes(piece)


def is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    spec = json.loads(backend.to_str())
    return "ByteLevel" in json.dumps(spec.get("decoder")) or "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))


@dataclass(eq=False)
class Vocabulary:
    """Bytes per token id (None = never allowed), the EOS ids, and the logits width masks are sized to."""

    token_bytes: list[bytes | None]
    eos_token_ids: frozenset[int]
    logits_width: int
    fingerprint: str
    # added tokens kept with their text for bytes (not special, or special and writable): `spell` writes with others
    added_ids: frozenset[int] = frozenset()
    _allowed_words: np.ndarray | None = field(default=None, repr=False)
    _byte_tokens: dict[int, int] | None = field(default=None, repr=False)
    _ids_by_bytes: dict[bytes, int] | None = field(default=None, repr=False)
    _spelling: dict[bytes, int] | None = field(default=None, repr=False)  # (`spell`'s: ids_by_bytes less added_ids)

    @classmethod
    def from_tokenizer(cls, tokenizer, logits_width: int, eos_token_ids: Iterable[int],
                       writable_special: Iterable[str] = ()) -> "Vocabulary":
        eos = frozenset(int(i) for i in eos_token_ids)
        if tokenizer.eos_token_id is not None and not eos:
            eos = frozenset([int(tokenizer.eos_token_id)])
        if not eos:
            raise ValueError("a vocabulary needs at least one EOS token id")
        size = len(tokenizer)
        if logits_width < size:
            raise ValueError(f"logits width {logits_width} is smaller than the tokenizer's {size} tokens")
        added = {int(i): t for i, t in tokenizer.added_tokens_decoder.items()}
        writable = frozenset(writable_special)
        byte_level = is_byte_level(tokenizer)
        pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
        out: list[bytes | None] = [None] * logits_width
        kept_added: set[int] = set()
        for tid, piece in enumerate(pieces):
            if tid in eos or piece is None:
                continue
            tok = added.get(tid)
            if tok is not None:
                if (tok.special and tok.content not in writable) or _PAD_ARTEFACT.match(tok.content):
                    continue
                data = tok.content.encode("utf-8")
                kept_added.add(tid)
            elif _PAD_ARTEFACT.match(piece):  # (a piece of the vocabulary itself: Phi-3's `[PAD32011]`...)
                continue
            else:
                data = piece_bytes(piece, byte_level)
            out[tid] = data or None
        h = hashlib.sha256()
        h.update(json.dumps([logits_width, sorted(eos)]).encode())
        for b in out:
            h.update(b"\x00N" if b is None else len(b).to_bytes(2, "little") + b)
        return cls(token_bytes=out, eos_token_ids=eos, logits_width=logits_width, fingerprint=h.hexdigest()[:24],
                   added_ids=frozenset(kept_added))

    @property
    def words(self) -> int:
        """int32 words per bitmask row."""
        return (self.logits_width + 31) // 32

    def allowed_words(self) -> np.ndarray:
        """One bitmask row (int32) with the bit of every token that may ever be sampled (EOS excluded)."""
        if self._allowed_words is None:
            ids = np.array([i for i, b in enumerate(self.token_bytes) if b is not None], dtype=np.int64)
            self._allowed_words = ids_to_words(ids, self.words)
        return self._allowed_words

    def byte_tokens(self) -> dict[int, int]:
        """byte value -> the id of a token that is exactly that byte (byte-level BPE and byte fallback have
        all 256), so any byte string can be spelled token by token."""
        if self._byte_tokens is None:
            table: dict[int, int] = {}
            for tid, data in enumerate(self.token_bytes):
                if data is not None and len(data) == 1:
                    table.setdefault(data[0], tid)
            self._byte_tokens = table
        return self._byte_tokens

    def ids_by_bytes(self) -> dict[bytes, int]:
        """bytes -> the first token id spelling exactly them."""
        if self._ids_by_bytes is None:
            table: dict[bytes, int] = {}
            for tid, piece in enumerate(self.token_bytes):
                if piece is not None:
                    table.setdefault(piece, tid)
            self._ids_by_bytes = table
        return self._ids_by_bytes

    def spell(self, data: bytes, ordinary: bool = False) -> list[int] | None:
        """Token ids whose bytes concatenate to `data`, longest match first (few tokens, not always fewest);
        None if some byte has no token. `ordinary`: with no added token (llguidance takes every added token for a
        special one, which a grammar writes only where it writes that tag: Phi-3's `</s>`, not special to
        transformers, was the budget rule's spelling of "</s>" in a string, a token the mask refused)."""
        if ordinary and self._spelling is None:
            self._spelling = {}
            for tid, piece in enumerate(self.token_bytes):
                if piece is not None and tid not in self.added_ids:
                    self._spelling.setdefault(piece, tid)
        table, longest = self._spelling if ordinary else self.ids_by_bytes(), 32
        out: list[int] = []
        i = 0
        while i < len(data):
            for end in range(min(len(data), i + longest), i, -1):
                tid = table.get(data[i:end])
                if tid is not None:
                    out.append(tid)
                    i = end
                    break
            else:
                return None
        return out

    def eos_words(self) -> np.ndarray:
        return ids_to_words(np.array(sorted(self.eos_token_ids), dtype=np.int64), self.words)


def ids_to_words(ids: np.ndarray, words: int) -> np.ndarray:
    """Pack token ids into one int32 bitmask row (bit i of word w = token 32*w+i: little-endian bytes, each packed
    low bit first; packing the flat array is ~3x faster than row by row)."""
    bits = np.zeros(words * 32, dtype=bool)
    if len(ids):
        bits[ids] = True
    return np.packbits(bits, bitorder="little").view(np.int32)
