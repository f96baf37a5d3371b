"""Following JSON output byte by byte, for the checks applied while decoding (constrain/unique_items.py,
constrain/late_keywords.py): the lexical state and the open containers. A subclass says what each container
carries and what happens when a value begins and ends. Output that is not JSON (free text under tool_choice
"auto") switches the follower off. Tool calls written between tags (`<tool_call>\n{...}\n</tool_call>`, see
constrain/tools.py) are followed as the items of one array, the call schema's root: only the JSON between the
tags is fed. Never imports HTTP or model code.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

WS = frozenset(b" \t\n\r")
QUOTE, BACKSLASH, COMMA_BYTE = ord('"'), ord("\\"), ord(",")
NUMBER_START = frozenset(b"-0123456789")
NUMBER_CHARS = frozenset(b"0123456789+-.eE")
LITERALS = {b"true": True, b"false": False, b"null": None}

# A number's exponent has at most this many significant digits (|e| <= 99): neither backend's number lexeme
# bounds it, and a random model wrote `-5E81779` and `8e+7992` in 8 of 30 answers under `{"type": "number"}`, valid
# JSON that JavaScript and Python read as infinity (the Node SDK's zod parse failed). So bounded, a number leaves
# a double's range only with an integer part over 200 digits (or underflows to 0 past 220 leading zeros).
MAX_EXPONENT_DIGITS = 2


def exponent_digits(number: bytes) -> int | None:
    """The significant digits of the exponent of `number` (a number's text so far); None before its exponent."""
    at = max(number.rfind(b"e"), number.rfind(b"E"))
    return None if at < 0 else len(number[at + 1:].lstrip(b"+-").lstrip(b"0"))


@dataclass
class Frame:
    """An open container and the member being written in it."""

    is_array: bool
    key: str = ""  # objects
    index: int = 0  # arrays


@dataclass
class TaggedCalls:
    """Where the output stands among tagged calls: outside a call (text before it, its closing tag, what comes
    between calls), watching for the tag that opens the next, or inside one's JSON."""

    tag: bytes  # the opening tag
    inside: bool = False
    opened: int = 0  # calls opened so far
    tail: bytes = b""  # the last bytes written outside a call (a tag may come in pieces)

    def opens(self, c: int) -> bool:
        """Byte `c`, written outside a call, completes the opening tag."""
        self.tail = (self.tail + bytes((c,)))[-len(self.tag):]
        if self.tail != self.tag:
            return False
        self.inside, self.opened, self.tail = True, self.opened + 1, b""
        return True

    def copy(self) -> "TaggedCalls":
        return dataclasses.replace(self)


class JsonFollower:
    """The lexical state (`mode`: value | string | key | number | literal | after | member | colon | off), what
    is written of the current string, key, number or literal (`buf`), and the open containers (`stack`).
    Hooks: `_value_begins` (a value's first byte, before the follower acts on it), `_frame` (the frame of a
    container that opens), `_value_ends` (a value was finished; for a number, by the byte just fed, which is
    not part of it), `_key_ends`, `_comma`. With `call_tag`, the output is tool calls written between tags
    (`TaggedCalls`): each call's JSON is followed as an item of one array, opened by the first tag (the closing
    bracket is never written)."""

    def __init__(self, call_tag: bytes | None = None) -> None:
        self.stack: list[Frame] = []
        self.mode = "value"
        self.buf = bytearray()
        self.escaped = False
        self.calls = TaggedCalls(call_tag) if call_tag else None

    @property
    def in_json(self) -> bool:
        """The output stands in JSON: always, unless calls are tagged and it stands outside one."""
        return self.calls is None or self.calls.inside

    def feed(self, data: bytes) -> None:
        calls = self.calls
        for c in data:
            if calls is not None and not calls.inside:
                if calls.opens(c):
                    self._byte(ord("[") if calls.opened == 1 else COMMA_BYTE)
                continue
            if self.mode == "off":
                return
            self._byte(c)
            if calls is not None and self.mode == "after" and len(self.stack) == 1:
                calls.inside = False  # the call's object closed: its closing tag and the next call's come

    # ---- hooks --------------------------------------------------------------------------------------------------
    def _value_begins(self, c: int) -> None:
        """A value begins with byte `c` (a container, string, number or literal) where `stack` stands."""

    def _frame(self, is_array: bool) -> Frame:
        return Frame(is_array)

    def _value_ends(self, kind: str) -> None:
        """A value of `kind` (string | number | literal | container) was finished; `buf` holds a scalar's text
        (a string's without its quotes, still escaped) and a container is already off the stack."""

    def _key_ends(self) -> None:
        """An object's key was finished: `buf` holds it (without its quotes, still escaped)."""

    def _comma(self) -> None:
        """A comma was written in the open container, whose `index` now counts the member to come."""

    # ---- the lexer ----------------------------------------------------------------------------------------------
    def _byte(self, c: int) -> None:
        mode = self.mode
        if mode == "number":
            if c in NUMBER_CHARS:
                self.buf.append(c)
                return
            self.mode = mode = "after"
            self._value_ends("number")
        if mode in ("string", "key"):
            if self.escaped:
                self.escaped = False
            elif c == BACKSLASH:
                self.escaped = True
            elif c == QUOTE:
                if mode == "key":
                    self.stack[-1].key = decode_key(bytes(self.buf))
                    self.mode = "colon"
                    self._key_ends()
                else:
                    self.mode = "after"
                    self._value_ends("string")
                return
            self.buf.append(c)
        elif mode == "literal":
            self.buf.append(c)
            if bytes(self.buf) in LITERALS:
                self.mode = "after"
                self._value_ends("literal")
            elif not any(word.startswith(self.buf) for word in LITERALS):
                self.mode = "off"
        elif c in WS:
            return
        elif mode == "value":
            if c == ord("]") and self.stack and self.stack[-1].is_array:
                self._close()
            else:
                self._begin(c)
        elif mode == "after":
            if not self.stack:
                self.mode = "off"
            elif c == COMMA_BYTE:
                top = self.stack[-1]
                top.index += 1
                self.mode = "value" if top.is_array else "member"
                self._comma()
            elif c in b"]}":
                self._close()
            else:
                self.mode = "off"
        elif mode == "member":
            if c == QUOTE:
                self.mode, self.buf, self.escaped = "key", bytearray(), False
            elif c == ord("}"):
                self._close()
            else:
                self.mode = "off"
        elif mode == "colon":
            self.mode = "value" if c == ord(":") else "off"

    def _begin(self, c: int) -> None:
        if c != QUOTE and c not in NUMBER_START and c not in b"tfn[{":
            self.mode = "off"
            return
        self._value_begins(c)
        if c == QUOTE:
            self.mode, self.buf, self.escaped = "string", bytearray(), False
        elif c in NUMBER_START:
            self.mode, self.buf = "number", bytearray([c])
        elif c in b"tfn":
            self.mode, self.buf = "literal", bytearray([c])
        else:
            is_array = c == ord("[")
            self.stack.append(self._frame(is_array))
            self.mode = "value" if is_array else "member"

    def _close(self) -> None:
        self.stack.pop()
        self.mode = "after"
        self._value_ends("container")


def decode_key(raw: bytes) -> str:
    """A key's text (between the quotes, still escaped) as a string; "" when it is not a JSON string."""
    try:
        return json.loads(b'"' + raw + b'"')
    except ValueError:
        return ""
