"""Token ids -> text, incrementally, one choice at a time; and each token's own text and bytes for logprobs.

Never emits half a UTF-8 character: a delta that ends in U+FFFD is held until the next token completes it (or
the choice ends). Decoding uses a short window of preceding tokens so SentencePiece leading spaces come out
right. No tensor work here.
"""

from __future__ import annotations

from functools import lru_cache

from constrain.vocabulary import is_byte_level, piece_bytes

_CONTEXT_TOKENS = 5
_MAX_WINDOW = 64  # tokens one decode reads at most: past that many writing nothing, the window moves on anyway
# Bytes that spell no character (a run of continuation bytes) are held at most this many tokens, and go out as
# decoded where the decode ends in 4 U+FFFD or more. Both are needed: a valid character's bytes decode as up to 4
# U+FFFD where SentencePiece's byte fallback meets bytes of another before it, and valid text sampled as byte-level
# tokens each ending inside a character holds many tokens, ending in one U+FFFD.
_MAX_HELD = 8
_NO_CHARACTER = "\ufffd" * 4


class IncrementalDetokenizer:
    """vLLM-style offsets: decode ids[prefix:] and ids[prefix:read], emit the difference when it is whole."""

    def __init__(self, tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.prefix = 0
        self.read = len(self.ids)

    @property
    def holding(self) -> bool:
        """Tokens are read whose text is not out yet (the bytes of a character split across tokens)."""
        return self.read < len(self.ids)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        return self._delta(final=False)

    def flush(self) -> str:
        """Whatever is still held back at the end (an incomplete character comes out as U+FFFD)."""
        return self._delta(final=True)

    def _delta(self, final: bool) -> str:
        if self.read >= len(self.ids):
            return ""
        before = self.tokenizer.decode(self.ids[self.prefix:self.read], skip_special_tokens=self.skip)
        after = self.tokenizer.decode(self.ids[self.prefix:], skip_special_tokens=self.skip)
        no_character = len(self.ids) - self.read > _MAX_HELD and after.endswith(_NO_CHARACTER)
        if not final and ((after.endswith("\ufffd") and not no_character) or len(after) <= len(before)):
            if len(after) <= len(before) and not after.endswith("\ufffd"):
                # The token wrote nothing (e.g. a skipped special token): it is read, but the window still begins
                # on written text. Begun on the skipped token, a SentencePiece decode dropped the next word's space
                # as a text's first ("назна<s> communes" came out "назнаcommunes").
                self.read = len(self.ids)
                if self.read - self.prefix > _MAX_WINDOW:
                    self.prefix = self.read
            return ""
        delta = after[len(before):]
        self.prefix, self.read = self.read, len(self.ids)
        return delta


class TokenTexts:
    """Each token's own bytes (byte-level BPE or SentencePiece pieces) and text, cached, for TokenLogprob."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.added = {int(i): t.content for i, t in tokenizer.added_tokens_decoder.items()}
        self.byte_level = is_byte_level(tokenizer)
        self.get = lru_cache(maxsize=65536)(self._compute)

    def _compute(self, token_id: int) -> tuple[str, bytes]:
        if token_id in self.added:
            data = self.added[token_id].encode("utf-8")
        else:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            data = b"" if piece is None else piece_bytes(piece, self.byte_level) or piece.encode("utf-8")
        return data.decode("utf-8", errors="replace"), data
