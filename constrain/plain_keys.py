"""Object keys written without `\\uXXXX` escapes, where a key's spelling decides which schema its value gets.

llguidance tells keys apart as they are spelled. In an object that takes keys besides its declared names or
patterns, `{"\\u0061": "x"}` is not the declared `a` to it but another key, so its value is checked against the
other keys' schema (and `{"a": 1, "\\u0061": "x"}` parses as `{"a": "x"}`). JSON spells a key's characters with
`\\u` escapes only by choice: `"` and `\\` have their short escapes, and every other character can be written as
itself. So where such an object may appear, a matcher wrapper refuses the tokens that would write a `\\u` escape
inside a key. A key is then spelled one way, the way llguidance compares it, and every document that can still be
written parses to what the grammar checked. (`\\/` needs nothing: llguidance refuses it in keys.)

What this costs a client: a key holding a control character other than \\b \\f \\n \\r \\t (JSON writes those only
as `\\u00XX`) cannot be written in such a schema; a non-ASCII key is written as its UTF-8 bytes, as models write
it. Objects that do not name keys, and closed objects (`additionalProperties: false`, OpenAI's strict shape), are
not affected and pay nothing. Never imports HTTP or model code.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from constrain.checked import NO_IDS, CheckedGrammar, CheckedMatcher, allowed_among, per_vocabulary
from constrain.grammar import Grammar, Matcher
from constrain.json_follower import Frame, JsonFollower
from constrain.rewrite import refs_in, targeted, types_of
from constrain.support import NAMED_SUBSCHEMAS, VALUE_KEYWORDS, escape_pointer_part
from constrain.vocabulary import Vocabulary

# Keywords through which a key's name selects what applies to its value, or counts.
_NAMING = frozenset({"properties", "patternProperties", "required", "propertyNames", "dependencies",
                     "dependentRequired", "dependentSchemas"})
_MAX_STATES = 4096  # lexical states whose refused tokens are kept per vocabulary
_U = ord("u")


def keys_need_plain_spelling(schema: Any) -> bool:
    """Some object of `schema` names keys and takes others too (its `additionalProperties` is not false), so a
    key spelled with an escape could pass as another key. Looks at every object but values (`const`, `enum`,
    `default`, ...), those no `$ref` reaches and unknown keywords' included: at worst a schema pays for a check it
    does not need."""
    return open_object_at(schema) is not None


_MERGED = ("allOf", "anyOf", "oneOf")  # (llguidance merges their members into the object around them)


def open_object_at(schema: Any) -> str | None:
    """The JSON Pointer of the first object `keys_need_plain_spelling` finds, or None. A member of `allOf`, `anyOf`
    or `oneOf` of a closed object is not one: llguidance merges it into that object, which takes no other keys
    (escaped spellings refused); nor is an object one of whose `allOf` members is closed, or its other members.
    The rewrite writes `dependentRequired`, `minProperties` and `not: {required}` as such members
    (`{"properties": {"a": false}}`), and a closed object holding them was refused in the XML tool-call formats
    with advice to declare the `additionalProperties: false` it declared (QA toolfmt2 F3).
    Values (`const`, `enum`, `default`, `examples`) are not schemas, and are not looked into, unless a local `$ref`
    points at or into one: what it names there is a schema (`{"$ref": "#/$defs/h/default"}` let `{"\\u0061": "s"}`
    through as another key than the declared `a` of an open object held in a `default`)."""
    refs = refs_in(schema)  # (those inside values too: at worst a value is looked into for nothing)
    stack: list[tuple[Any, str, bool]] = [(schema, "", False)]
    while stack:
        node, at, closed = stack.pop()
        if isinstance(node, dict):
            # (an `allOf` member that is closed closes what llguidance merges it with: the node and its members,
            # as where a key's value is held to a closed object and a schema that only requires its keys, the
            # XML tool formats' `allOf` of a key's schemas, which was named open)
            shut = closed or node.get("additionalProperties") is False or \
                (isinstance(node.get("allOf"), list) and any(isinstance(m, dict) and m.get("additionalProperties")
                                                            is False for m in node["allOf"]))
            if not shut and any(k in node for k in _NAMING) and _takes_objects(node):
                return at
            for k, v in node.items():
                part = f"{at}/{escape_pointer_part(k)}"
                if k in VALUE_KEYWORDS and not targeted(part, refs):
                    continue  # (values, not schemas: a `default` object was refused in XML formats)
                if k in NAMED_SUBSCHEMAS and isinstance(v, dict):  # (names there, not keywords: a property `enum`)
                    stack.extend((sub, f"{part}/{escape_pointer_part(name)}", False) for name, sub in v.items())
                elif k in _MERGED and shut and isinstance(v, list):
                    stack.extend((m, f"{part}/{i}", True) for i, m in enumerate(v))
                else:
                    stack.append((v, part, False))
        elif isinstance(node, list):
            stack.extend((v, f"{at}/{i}", False) for i, v in enumerate(node))
    return None


def _takes_objects(node: dict) -> bool:
    """`node`'s `type` (if any) lets objects through: beside `type: string` a `properties` names nothing any value
    holds (the rewrite drops such keywords, but keeps one a `$ref` points into: a string parameter was refused in the
    XML tool-call formats as an object open to other keys)."""
    types = types_of(node["type"]) if "type" in node else None
    return types is None or "object" in types


class _KeyFollower(JsonFollower):
    """The JSON follower, noting when a `\\u` escape is written inside a key."""

    def __init__(self, call_tag: bytes | None = None) -> None:
        super().__init__(call_tag)
        self.escaped_key = False

    def _byte(self, c: int) -> None:
        if c == _U and self.escaped and self.mode == "key":
            self.escaped_key = True
        super()._byte(c)

    def state(self) -> tuple:
        """What decides whether a token writes a key escape from here: the lexical mode, a pending backslash, the
        open containers' kinds (a token may close some and open a key), a literal's letters so far."""
        literal = bytes(self.buf) if self.mode == "literal" else b""
        return self.mode, self.escaped, tuple(f.is_array for f in self.stack), literal

    @classmethod
    def at(cls, state: tuple) -> "_KeyFollower":
        """A follower at `state`, for what a token writes from there: inside one JSON value (between tagged calls
        no token is looked at)."""
        mode, escaped, kinds, literal = state
        f = cls()
        f.mode, f.escaped, f.stack, f.buf = mode, escaped, [Frame(k) for k in kinds], bytearray(literal)
        return f


def writes_key_escape(state: tuple, data: bytes) -> bool:
    """Writing `data` from the lexical `state` (`_KeyFollower.state`) puts a `\\u` escape inside a key."""
    f = _KeyFollower.at(state)
    f.feed(data)
    return f.escaped_key


class KeyEscapeTokens:
    """The tokens that can write a key escape (those holding `\\u`, and after a pending backslash those starting
    with `u`), and, per lexical state met, those of them that do: a state costs one pass over the suspects the
    first time, a lookup after that."""

    def __init__(self, vocab: Vocabulary):
        self.token_bytes = vocab.token_bytes
        holding = [t for t, b in enumerate(vocab.token_bytes) if b and b"\\u" in b]
        starting = [t for t, b in enumerate(vocab.token_bytes) if b and b[:1] == b"u"]
        self.holding = np.array(holding, dtype=np.int64)
        self.after_backslash = np.array(sorted(set(holding) | set(starting)), dtype=np.int64)
        self._refused: dict[tuple, np.ndarray] = {}
        self._lock = threading.Lock()

    def refused(self, state: tuple) -> np.ndarray:
        """The ids of the tokens that write a key escape from `state`."""
        ids = self._refused.get(state)
        if ids is None:
            mode, escaped = state[0], state[1]
            suspects = self.after_backslash if mode == "key" and escaped else self.holding
            ids = np.array([t for t in suspects.tolist() if writes_key_escape(state, self.token_bytes[t])],
                           dtype=np.int64)
            with self._lock:
                if len(self._refused) >= _MAX_STATES:
                    self._refused.clear()
                self._refused[state] = ids
        return ids


def key_escape_tokens(vocab: Vocabulary) -> KeyEscapeTokens:
    """Built once per vocabulary (~0.1 s for 152k tokens)."""
    return per_vocabulary(KeyEscapeTokens, vocab)


class PlainKeysGrammar(CheckedGrammar):
    """A backend grammar whose matchers also refuse `\\u` escapes inside keys."""

    def __init__(self, inner: Grammar, vocab: Vocabulary):
        super().__init__(inner)
        self.tokens = key_escape_tokens(vocab)

    def matcher(self, lane: int = 0) -> "PlainKeysMatcher":
        return PlainKeysMatcher(self.inner.matcher(lane), self.tokens, self.call_tag)


class PlainKeysMatcher(CheckedMatcher):
    dead_end = "every token the output constraint allows here would write a \\u escape inside an object key " \
               "(keys are written without them where a key's spelling selects its schema)"

    def __init__(self, inner: Matcher, tokens: KeyEscapeTokens, call_tag: bytes | None = None):
        super().__init__(inner, tokens.token_bytes)
        self.tokens = tokens
        self.follower = _KeyFollower(call_tag)
        self._candidates = NO_IDS  # this step's: the tokens that write a key escape from here

    def _active(self) -> bool:
        """Some token could write a key escape from here (outside keys, next to none can: the step costs a lookup)."""
        f = self.follower
        self._candidates = self.tokens.refused(f.state()) if f.mode != "off" and f.in_json else NO_IDS
        return len(self._candidates) > 0

    def _refused(self, words: np.ndarray) -> np.ndarray:
        return allowed_among(words, self._candidates)

    def _refuses(self, data: bytes) -> bool:
        return writes_key_escape(self.follower.state(), data)

    def _feed(self, data: bytes) -> None:
        self.follower.feed(data)
