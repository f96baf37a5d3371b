"""Streams one choice's output as OpenAI streams tool calls: an id-and-name delta per call, then argument pieces.

The model writes one of constrain's tool-call formats (constrain/tools.py): a JSON array of `{"name": ...,
"arguments": {...}}` (also after Mistral's `[TOOL_CALLS]` or Granite's `<|tool_call|>`, when the text keeps
special tokens: the characters before the first call's brace are skipped), ("hermes") each such object between
`<tool_call>` tags, or ("llama3_json") one object with "parameters" for "arguments", or ("mistral_args") each call
as `[TOOL_CALLS]name[ARGS]{...}`, after any text, or ("harmony") gpt-oss's tags around the name, then the
arguments, or ("qwen3_coder", "glm45", "glm47") each call in tags with a tag per argument, its value raw text or
JSON (constrain/xml_calls.py), whose arguments are streamed as the JSON object they make. This reads it character
by character and emits OpenAI `tool_calls` deltas as soon as they are known. Output whose first character other
than whitespace does not open calls (tool_choice "auto" answering in text) streams as content, that whitespace
included; in the hermes format, so does the text before the first tag, less the whitespace that ends it, as in the
whole answer (`ParsedCalls.content`). Protocol shaping only: the grammar guarantees the format, so this never
validates.
"""

from __future__ import annotations

import json

from constrain.tools import (HERMES_CLOSE, HERMES_OPEN, LEAD_TAGS, NAME_THEN_ARGS, XML_FORMATS, ParsedCalls, ToolCall,
                             arguments_key, new_call_id, text_may_not_start)
from constrain.xml_calls import SHAPES, ValueForm, XmlShape, function_forms

_WS = " \t\r\n"


class _CallScanner:
    """Scans one call object `{"name": "...", "<args_key>": {...}}` (entered after its opening brace)."""

    def __init__(self, args_key: str):
        self.args_key = args_key
        self.name: str | None = None
        self.key: str | None = None  # the key whose value comes next
        self.state = "key"  # key | colon | value | string | args | after
        self.raw = ""  # the current string token, or the arguments text so far
        self.escaped = False
        self.depth = 0  # brace/bracket depth inside the arguments value
        self.in_string = False
        self.args_done = False

    def feed(self, ch: str) -> tuple[str | None, bool]:
        """(argument text to emit, call object closed)."""
        if self.state == "args":
            return self._args(ch), False
        if self.state == "string":
            self.raw += ch
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                text = json.loads(self.raw)
                if self.key is None:
                    self.key, self.state = text, "colon"
                else:
                    if self.key == "name":
                        self.name = text
                    self.key, self.state = None, "after"
            return None, False
        if ch in _WS:
            return None, False
        if self.state in ("key", "after"):
            if ch == "}":
                return None, True
            if ch == '"':
                self.raw, self.state = ch, "string"
            return None, False  # "," between members
        if self.state == "colon":
            if ch == ":":
                self.state = "value"
            return None, False
        if self.state == "value":
            if self.key == self.args_key and ch == "{":
                self.state, self.depth, self.in_string = "args", 1, False
                return ch, False
            if ch == '"':
                self.raw, self.state = ch, "string"
            return None, False
        return None, False

    def _args(self, ch: str) -> str:
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
        elif ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            if self.depth == 0:
                self.key, self.state, self.args_done = None, "after", True
        return ch


class ToolCallStream:
    """Feed text deltas of one choice; get OpenAI delta dicts back (`{"content": ...}` or `{"tool_calls": ...}`).
    """

    def __init__(self, tool_format: str = "json_array", forms: dict[str, dict[str, ValueForm]] | None = None,
                 object_answer: bool = False, calls_only: bool = False):
        """`forms`: for the XML formats (qwen3_coder, glm45, glm47), how each function's parameter values are
        written (`constrain.xml_calls.function_forms`). `object_answer`: a response_format's answer may come
        instead of calls, so a `{` opens the answer (content), not a call (calls are then an array).
        `calls_only`: the output is calls and nothing else (tool_choice "required" or a named function)."""
        self.calls_only = calls_only
        self.hermes = tool_format == "hermes"
        self.xml = _XmlCalls(forms or {}, SHAPES[tool_format]) if tool_format in SHAPES else None
        self.args_calls = NAME_THEN_ARGS.get(tool_format)  # (mistral_args, harmony: the tags around the name)
        self.between = ""  # mistral_args: what follows a call's arguments (the next call's tag, in pieces)
        # The special token the calls may begin with (mistral, llama3_json), in the text when the request keeps
        # special tokens: held while the text may still be its beginning, then dropped; None once decided.
        self.lead_tag = LEAD_TAGS.get(tool_format)
        self.lead_held = ""
        # what opens calls ("{" also opens the first call, but where it opens an answer)
        self.openers = "[" if object_answer else text_may_not_start(tool_format)
        self.args_key = arguments_key(tool_format)
        self.mode: str | None = None  # None until the first visible character, then "content" or "calls"
        self.pending_ws = ""
        self.held = ""  # hermes content not sent yet: trailing whitespace, and what may be the tag beginning
        self.call: _CallScanner | None = None
        self.calls = 0  # calls opened so far
        self.announced = False  # current call's id/name delta sent
        self.held_args = ""  # argument text seen before the name (not expected, but possible)

    @property
    def made_calls(self) -> bool:
        return self.mode == "calls" and self.calls > 0

    def feed(self, text: str) -> list[dict]:
        if self.xml is not None:
            return self._feed_xml_calls(text)
        if self.hermes:
            return self._feed_hermes(text)
        if self.args_calls is not None:
            return self._feed_args_calls(text)
        if self.lead_tag is not None:
            text = self._past_lead_tag(text)
            if text is None:
                return []
        deltas: list[dict] = []
        content = ""
        for ch in text:
            if self.mode is None:
                if ch in _WS:
                    self.pending_ws += ch
                    continue
                if ch in self.openers:
                    self.mode = "calls"
                    if ch == "{":
                        self._open_call()
                    continue
                self.mode, content = "content", self.pending_ws
            if self.mode == "content":
                content += ch
                continue
            self._feed_call(ch, deltas)
        if content:
            deltas.insert(0, {"content": content})
        return self._merge(deltas)

    def finish(self) -> list[dict]:
        """What is still held when the output ends: the end of a text answer. Where the output is calls only, what
        is held is the beginning of a call's tag that max_tokens cut (`<tool_call` became the answer's content)."""
        rest = self.pending_ws if self.mode is None else self.held if self.mode == "content" else ""
        rest = "" if self.calls_only else self.lead_held + rest
        self.pending_ws = self.held = self.lead_held = ""
        return [{"content": rest}] if rest else []

    def _past_lead_tag(self, text: str) -> str | None:
        """The text, less the lead tag where it begins with one; None while it may still be the tag's beginning."""
        tag, self.lead_held = self.lead_tag, self.lead_held + text
        body = self.lead_held.lstrip(_WS)
        if len(body) < len(tag) and tag.startswith(body):
            return None
        text, self.lead_held, self.lead_tag = self.lead_held, "", None
        return body[len(tag):] if body.startswith(tag) else text

    def _feed_hermes(self, text: str) -> list[dict]:
        deltas: list[dict] = []
        if self.mode != "calls":
            text = self._content_until(HERMES_OPEN, text, deltas)
            if text is None:
                return deltas
        for ch in text:
            self._feed_call(ch, deltas)
        return self._merge(deltas)

    def _content_until(self, tag: str, text: str, deltas: list[dict]) -> str | None:
        """Text before the first call's `tag` is content: sent, less what may begin the tag and the whitespace
        before it (dropped if the tag comes). What follows the tag, once it came; else None."""
        self.mode, self.held = "content", self.held + text
        at = self.held.find(tag)
        if at < 0:
            partial = max((n for n in range(1, len(tag)) if self.held.endswith(tag[:n])), default=0)
            cut = len(self.held[:len(self.held) - partial].rstrip())
            content, self.held = self.held[:cut], self.held[cut:]
            if content:
                deltas.append({"content": content})
            return None
        content, rest, self.held = self.held[:at].rstrip(), self.held[at + len(tag):], ""
        self.mode = "calls"
        if content:
            deltas.append({"content": content})
        return rest

    def _feed_args_calls(self, text: str) -> list[dict]:
        """`[TOOL_CALLS]name[ARGS]{...}` per call (or the tags of harmony's calls): the name is announced at
        `[ARGS]`, then the arguments stream as written until their object closes."""
        call_tag, args_tag = self.args_calls
        deltas: list[dict] = []
        if self.mode != "calls":
            text = self._content_until(call_tag, text, deltas)
            if text is None:
                return deltas
            self.between = call_tag
        for ch in text:
            if self.call is not None:  # inside the arguments
                piece = self.call._args(ch)
                deltas.append({"tool_calls": [{"index": self.calls - 1, "function": {"arguments": piece}}]})
                if self.call.args_done:
                    self.call, self.between = None, ""
                continue
            self.between += ch
            if self.between.startswith(call_tag) and self.between.endswith(args_tag):
                name = self.between[len(call_tag):-len(args_tag)]
                self._open_call()
                self.call.state = "args"  # (entered before the object's opening brace: depth 0)
                deltas.append({"tool_calls": [{"index": self.calls - 1, "id": new_call_id(), "type": "function",
                                               "function": {"name": name, "arguments": ""}}]})
        return self._merge(deltas)

    def _feed_xml_calls(self, text: str) -> list[dict]:
        deltas: list[dict] = []
        if self.mode != "calls":
            text = self._content_until(HERMES_OPEN, text, deltas)
            if text is None:
                return deltas
            text = HERMES_OPEN + text  # (the scanner reads each call from its tag)
        for name, piece in self.xml.feed(text):
            if name is not None:
                self.calls += 1
                deltas.append({"tool_calls": [{"index": self.calls - 1, "id": new_call_id(), "type": "function",
                                               "function": {"name": name, "arguments": ""}}]})
            if piece:
                deltas.append({"tool_calls": [{"index": self.calls - 1, "function": {"arguments": piece}}]})
        return self._merge(deltas)

    def _open_call(self) -> None:
        self.call = _CallScanner(self.args_key)
        self.announced = False
        self.held_args = ""
        self.calls += 1

    def _feed_call(self, ch: str, deltas: list[dict]) -> None:
        if self.call is None:
            if ch == "{":
                self._open_call()
            return  # "[", "]", "," and whitespace between calls
        piece, closed = self.call.feed(ch)
        index = self.calls - 1
        if not self.announced and self.call.name is not None:
            self.announced = True
            deltas.append({"tool_calls": [{"index": index, "id": new_call_id(), "type": "function",
                                           "function": {"name": self.call.name, "arguments": ""}}]})
            if self.held_args:
                deltas.append({"tool_calls": [{"index": index, "function": {"arguments": self.held_args}}]})
                self.held_args = ""
        if piece:
            if self.announced:
                deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            else:
                self.held_args += piece
        if closed:
            self.call = None

    @staticmethod
    def _merge(deltas: list[dict]) -> list[dict]:
        """Join consecutive argument pieces of the same call into one delta."""
        out: list[dict] = []
        for d in deltas:
            prev = out[-1] if out else None
            if (prev and "tool_calls" in d and "tool_calls" in prev and "id" not in d["tool_calls"][0]
                    and prev["tool_calls"][0]["index"] == d["tool_calls"][0]["index"]
                    and set(prev["tool_calls"][0]) == {"index", "function"}):
                prev["tool_calls"][0]["function"]["arguments"] += d["tool_calls"][0]["function"]["arguments"]
            else:
                out.append(d)
        return out


class _XmlCalls:
    """The calls of an XML format (constrain/xml_calls.py) from the first `<tool_call>` on: yields (the name of a call
    that begins, or None; a piece of its arguments as JSON). A raw value streams as a JSON string as it comes,
    less what may begin its closing text (and, where it may be null, while it may still be `null`); a JSON value
    as written, up to its closing text outside its strings."""

    def __init__(self, forms: dict[str, dict[str, ValueForm]], shape: XmlShape):
        self.forms = forms
        self.shape = shape
        self.buffer = ""
        self.state = "between"  # between calls | params (of a call) | value (of a parameter)
        self.function: dict[str, ValueForm] = {}
        self.params = 0  # parameters of the current call so far
        self.form: ValueForm | None = None
        self.value_sent = 0  # characters of the current value sent
        self.scanned = 0  # JSON value: characters of the buffer scanned (outside strings up to there)
        self.in_string = self.escaped = False

    def feed(self, text: str):
        shape = self.shape
        self.buffer += text
        while True:
            if self.state == "between":
                at = self.buffer.find(HERMES_OPEN + shape.before_name)
                start = at + len(HERMES_OPEN + shape.before_name)
                ends = [e for e in (self.buffer.find(shape.after_name + shape.before_key, start),
                                    self.buffer.find(shape.after_name + shape.before_close + HERMES_CLOSE, start))
                        if e >= 0] if at >= 0 else []
                if not ends:
                    return
                name = self.buffer[start:min(ends)]
                self.buffer, self.state = self.buffer[min(ends) + len(shape.after_name):], "params"
                self.function, self.params = self.forms.get(name, {}), 0
                yield name, None
            elif self.state == "params":
                if self.buffer.startswith(shape.before_close + HERMES_CLOSE):
                    self.buffer = self.buffer[len(shape.before_close + HERMES_CLOSE):]
                    self.state = "between"
                    yield None, "}" if self.params else "{}"
                    continue
                end = self.buffer.find(shape.between) if self.buffer.startswith(shape.before_key) else -1
                if end < 0:
                    return
                key = self.buffer[len(shape.before_key):end]
                self.buffer, self.state = self.buffer[end + len(shape.between):], "value"
                self.form, self.value_sent = self.function.get(key, ValueForm(raw=False)), 0
                self.scanned, self.in_string, self.escaped = 0, False, False
                self.params += 1
                yield None, ("{" if self.params == 1 else ", ") + json.dumps(key, ensure_ascii=False) + ": "
            else:
                piece = self._value()
                if piece:
                    yield None, piece
                if self.state == "value":
                    return

    def _value(self) -> str:
        """What of the value in the buffer can be sent (all of it, closed, once its closing text came)."""
        close = self.shape.after_value
        at = self.buffer.find(close) if self.form.raw else self._json_end()
        done = at >= 0
        if not done:
            at = len(self.buffer) - max((n for n in range(1, len(close)) if self.buffer.endswith(close[:n])),
                                        default=0)
        text = self.buffer[:at]
        raw, nullable = self.form.raw, self.form.nullable
        if raw and nullable and self.value_sent == 0 and "null".startswith(text):
            if not done:  # (may still be the null)
                return ""
            if text == "null":
                self.buffer, self.state = self.buffer[at + len(close):], "params"
                return "null"
        self.buffer = self.buffer[at + len(close):] if done else self.buffer[at:]
        self.scanned = max(0, self.scanned - at)
        if done:
            self.state = "params"
        if not raw:
            return text
        piece = ('"' if self.value_sent == 0 else "") + json.dumps(text, ensure_ascii=False)[1:-1]
        self.value_sent += len(text) + (self.value_sent == 0)
        return piece + ('"' if done else "")

    def _json_end(self) -> int:
        """Where the closing text begins outside the JSON value's strings, or -1."""
        close = self.shape.after_value
        while self.scanned < len(self.buffer):
            i, ch = self.scanned, self.buffer[self.scanned]
            if not self.in_string and self.buffer.startswith(close, i):
                return i
            if not self.in_string and close.startswith(self.buffer[i:]):
                return -1  # (may be its beginning: wait for more)
            if self.in_string:
                self.in_string = self.escaped or ch != '"'
                self.escaped = not self.escaped and ch == "\\"
            else:
                self.in_string = ch == '"'
            self.scanned += 1
        return -1


def tool_stream_for(spec) -> ToolCallStream:
    """The stream of one choice's output under the tools constraint `spec` (its format, XML value forms, and
    whether a response_format's answer may come instead of calls)."""
    tool_format = getattr(spec, "tool_format", "json_array")
    forms = function_forms(spec) if tool_format in XML_FORMATS else None
    return ToolCallStream(tool_format, forms, object_answer=getattr(spec, "answer", None) is not None,
                          calls_only=getattr(spec, "tool_choice", "auto") != "auto")


def answer_calls(parsed: ParsedCalls | None, text: str, spec, finish_reason: str | None) -> ParsedCalls | None:
    """The calls an answer reports: those `parsed` from its text, else for an output max_tokens cut what its stream
    said (`as_streamed`). One rule for the whole answer and a stream's last chunk."""
    return parsed or (as_streamed(text, spec) if finish_reason == "length" else None)


def as_streamed(text: str, spec) -> ParsedCalls:
    """The answer a stream of `text` assembles to: its content, and its calls as far as they were written (for an
    output max_tokens cut, which the parser cannot read: the whole answer then says what the stream said, as
    OpenAI's cut calls keep the arguments written so far). `complete` is False."""
    stream = tool_stream_for(spec)
    content, calls = "", {}
    for delta in stream.feed(text) + stream.finish():
        content += delta.get("content") or ""
        for d in delta.get("tool_calls") or ():
            slot = calls.setdefault(d["index"], {"id": None, "name": "", "arguments": ""})
            slot["id"] = slot["id"] or d.get("id")
            slot["name"] += (d.get("function") or {}).get("name") or ""
            slot["arguments"] += (d.get("function") or {}).get("arguments") or ""
    return ParsedCalls([ToolCall(c["name"], c["arguments"], c["id"] or new_call_id()) for c in calls.values()],
                       content or None, complete=False)
