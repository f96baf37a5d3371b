"""Token ids -> text, incrementally, one choice at a time; and each token's own text and bytes for logprobs.

Never emits half a UTF-8 character: a token whose bytes end inside a character is held until a later token
completes it, or shows that it never will (the choice's end likewise). Decoding uses a short window of preceding
tokens so SentencePiece leading spaces come out right. No tensor work here.
"""

from __future__ import annotations

import codecs
from functools import lru_cache

from constrain.vocabulary import is_byte_level, piece_bytes

_CONTEXT_TOKENS = 5
_MAX_WINDOW = 64  # tokens one decode reads at most: past that many writing nothing, the window moves on anyway
_UTF8 = codecs.getincrementaldecoder("utf-8")


class IncrementalDetokenizer:
    """vLLM-style offsets: decode ids[prefix:] and ids[prefix:read], emit the difference when it is whole."""

    def __init__(self, tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True,
                 texts: "TokenTexts | None" = None, spelled_start: bool = False):
        """`spelled_start`: where the output is the first text (the prompt's window writes none), it begins as its
        tokens spell it, a SentencePiece piece's `▁` a space; otherwise as the tokenizer decodes a text, which drops
        that `▁` as its dummy prefix. A constrained output needs the first: its grammar read the `▁` as the space
        it allowed (`regex: " x"` came out "x", which the regex refuses)."""
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.spelled_start = spelled_start
        self.texts = texts or TokenTexts(tokenizer)
        start = max(0, len(prompt_ids) - _CONTEXT_TOKENS)
        while start > 0 and len(prompt_ids) - start < _CONTEXT_TOKENS + 3 and self._continues(prompt_ids[start]):
            start -= 1  # (a window begun inside a character decodes its first bytes as U+FFFD: Phi-3's byte tokens)
        self.ids = list(prompt_ids[start:])
        self.prefix = 0
        self.read = len(self.ids)
        self.stem = self._before_unfinished()  # (`_finished_placeholder`; None once the output has written)

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

    def _before_unfinished(self) -> str | None:
        """The text of the prompt's window before a character it ends inside (its tokens hold only that character's
        first bytes), where it does: Phi-3 decodes a run of byte tokens that ends unfinished as U+FFFD throughout."""
        decoder = _UTF8("replace")
        decoder.decode(b"".join(self._bytes(t) for t in self.ids))
        pending = len(decoder.getstate()[0])
        j = len(self.ids)
        while pending > 0 and j > 0:
            j -= 1
            pending -= len(self._bytes(self.ids[j]))
        if j == len(self.ids) or pending != 0:
            return None
        return self.tokenizer.decode(self.ids[:j], skip_special_tokens=self.skip)

    def _delta(self, final: bool) -> str:
        text = self._next_text(final)
        if text:
            self.stem = None
        return text

    def _next_text(self, final: bool) -> str:
        if self.read >= len(self.ids):
            return ""
        before = self.tokenizer.decode(self.ids[self.prefix:self.read], skip_special_tokens=self.skip)
        after = self.tokenizer.decode(self.ids[self.prefix:], skip_special_tokens=self.skip)
        begun = _finished_placeholder(before, after, self.stem if self.prefix == 0 else None)
        if begun is not None and (final or not after.endswith("\ufffd")):
            # A character the prompt began (token ids cut inside it) is finished: its placeholder gives way to it,
            # which the output writes (by length, the token wrote nothing, and the character was lost). The window
            # keeps its start, which a character does not straddle (the text read so far ends inside one).
            self.read = len(self.ids)
            return after[begun:]
        if not final and len(after) <= len(before):
            if self.spelled_start and not before and (own := self._own(len(self.ids))) and own.isspace():
                # (a lone `▁` as the window's first text, which a SentencePiece decode drops: see `_past`)
                self.prefix, self.read = self.read, len(self.ids)
                return own
            # The token wrote nothing (e.g. a skipped special token): it is read, but the window still begins on
            # written text. Begun on the skipped token, a SentencePiece decode dropped the next word's space as a
            # text's first ("назна<s> communes" came out "назнаcommunes"; after a U+FFFD too).
            self.read = len(self.ids)
            if self.read - self.prefix > _MAX_WINDOW:
                self.prefix = self.read
            return ""
        if not final and after.endswith("\ufffd"):
            settled = self._settled()  # (the held tokens whose characters are known)
            if settled == 0:
                return ""
            if settled < len(self.ids) - self.read:
                upto = self.read + settled
                text = self.tokenizer.decode(self.ids[self.prefix:upto], skip_special_tokens=self.skip)
                begun = _finished_placeholder(before, text, self.stem if self.prefix == 0 else None)
                delta = text[begun:] if begun is not None else self._past(before, text, upto)
                self.prefix, self.read = (self.prefix if begun is not None else self.read), upto
                return delta
        delta = self._past(before, after, len(self.ids))
        self.prefix, self.read = self.read, len(self.ids)
        return delta

    def _past(self, before: str, text: str, upto: int) -> str:
        """The text of the tokens read up to `upto`, from the window's decodes with and without them. SentencePiece's
        byte fallback decodes a run of byte tokens as one, and a run that is not UTF-8 as U+FFFD throughout: a
        stray byte after 😀's four byte tokens turned the 😀 already written into four U+FFFD (the stream wrote 😀
        then five U+FFFD for one byte), and a 😀 after it came out as four more. Where the decode rewrote what was
        written, or writes U+FFFD, the tokens' own bytes say what they add, decoded as UTF-8 is (mid-text, where a
        `▁` is a space; a byte-level BPE's decode is that decode already)."""
        if text.startswith(before) and "\ufffd" not in text[len(before):]:
            delta = text[len(before):]
            if self.spelled_start and not before:  # (the window's first text: `spelled_start`)
                own = self._own(upto)
                if len(delta) < len(own) and own.endswith(delta) and own[:len(own) - len(delta)].isspace():
                    return own
            return delta
        return self._own(upto)

    def _own(self, upto: int) -> str:
        """The text the tokens read up to `upto` add by their own bytes, decoded as UTF-8 is."""
        return b"".join(self._bytes(t) for t in self.ids[self.read:upto]).decode("utf-8", errors="replace")

    def _settled(self) -> int:
        """How many of the held tokens spell only characters known now: the most that end where no character is
        left unfinished, or where the one left unfinished cannot go on with the bytes after it (`b' \\xe9'`
        repeated: each lead byte meets a space, and its U+FFFD is final). A valid character split across tokens
        keeps its tokens held until it is whole, so no character is lost to U+FFFD."""
        held = [self._bytes(t) for t in self.ids[self.read:]]
        decoder, settled = _UTF8("replace"), 0
        decoder.decode(b"".join(self._bytes(t) for t in self.ids[self.prefix:self.read]))  # (a character the
        # prompt began, cut inside it, goes on in the held tokens: SentencePiece's byte tokens each read alone)
        for k, data in enumerate(held, start=1):
            decoder.decode(data)
            pending = decoder.getstate()[0]
            if not pending or _cannot_go_on(pending, b"".join(held[k:])[:3]):
                settled = k
        return settled

    def _continues(self, token_id: int) -> bool:
        """The token's bytes begin inside a character (a UTF-8 continuation byte)."""
        data = self._bytes(token_id)
        return bool(data) and 0x80 <= data[0] < 0xC0

    def _bytes(self, token_id: int) -> bytes:
        """The bytes the token adds to the text (none for a special token the output skips)."""
        if self.skip and token_id in self.texts.special_ids:
            return b""
        return self.texts.get(token_id)[1]


def _finished_placeholder(before: str, after: str, stem: str | None = None) -> int | None:
    """Where in `after` a character begins that took the place of the U+FFFD ending `before` (one, or one per byte
    as SentencePiece's byte tokens decode, or `stem`'s whole run of them), the text before them unchanged; None
    where nothing did so."""
    if stem is not None and not after.startswith(before) and after.startswith(stem) \
            and after[len(stem):len(stem) + 1] not in ("", "\ufffd"):
        return len(stem)
    for held in range(1, 5):  # (a character's first bytes: at most 3, each its own U+FFFD at most)
        if not before.endswith("\ufffd" * held):
            return None
        stem = len(before) - held
        if after.startswith(before[:stem]) and after[stem:stem + 1] not in ("", "\ufffd"):
            return stem
    return None


def _cannot_go_on(pending: bytes, following: bytes) -> bool:
    """Whether the unfinished character `pending` can never be finished, `following` being the bytes after it."""
    if not following:
        return False
    try:
        _UTF8("strict").decode(pending + following)
    except UnicodeDecodeError as exc:
        return exc.start == 0
    return False


class TokenTexts:
    """Each token's own bytes (byte-level BPE or SentencePiece pieces) and text, cached, for TokenLogprob."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.added = {int(i): t.content for i, t in tokenizer.added_tokens_decoder.items()}
        self.special_ids = frozenset(int(i) for i, t in tokenizer.added_tokens_decoder.items() if t.special)
        self.byte_level = is_byte_level(tokenizer)
        self.get = lru_cache(maxsize=65536)(self._compute)

    def _compute(self, token_id: int) -> tuple[str, bytes]:
        if token_id in self.added:
            data = self.added[token_id].encode("utf-8")
        else:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            data = b"" if piece is None else piece_bytes(piece, self.byte_level) or piece.encode("utf-8")
        return data.decode("utf-8", errors="replace"), data
