"""Stop strings matched on streamed text, across token boundaries, without ever leaking a partial stop string.

Pure text in, text out: knows nothing about tokens, models or HTTP. Owned by the engine (one per choice).

Rules:
- The earliest match in the text wins (by start position; at equal starts the shorter stop
  string, which completes first).
- Text that could still be the beginning of a stop string is held back until it is known not to be one.
- A complete match is not decided while an earlier start could still grow into a match.
- Tool calls are never cut (`calls`, from constrain/tools.py): stop strings are matched in the text before the
  calls begin, and a match is not decided while calls may still begin at or before it.
- Text pushed with `may_stop=False` (vLLM's `min_tokens` not reached) ends nothing: a match must end past it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from constrain.tools import CallsOpening

_WHITESPACE = " \t\r\n"


class StopMatcher:
    """Feed text deltas with `push`; emit what it returns; call `flush` at the end if no stop matched."""

    def __init__(self, stops: Sequence[str], include_stop_str_in_output: bool = False,
                 calls: "CallsOpening | None" = None):
        self.stops = tuple(s for s in dict.fromkeys(stops) if s)
        self.include = include_stop_str_in_output
        self.calls = calls
        self._held = ""
        self._held_at = 0  # where the held text begins in the whole text pushed
        self._ends_after = 0  # a match must end past this position of the whole text (`push(may_stop=False)`)
        self._first_decided = False  # the output's first character but whitespace did not open calls
        self._in_calls = False
        self.stopped = False
        self.matched: str | None = None

    def push(self, text_delta: str, may_stop: bool = True) -> tuple[str, bool]:
        """Return (text safe to emit now, stopped?). After a stop, further pushes emit nothing. With `may_stop`
        false no stop string ends in the text so far; one that begins in it and ends in later text still does."""
        if self.stopped:
            return "", True
        if not self.stops or self._in_calls:
            return text_delta, False
        buf = self._held + text_delta
        if not may_stop:
            self._ends_after = self._held_at + len(buf)
        calls_at, pending = self._calls_start(buf)
        if calls_at is not None:  # the text before the calls is final: a match in it stops, else the calls run
            match = self._earliest_match(buf[:calls_at])
            if match is not None:
                return self._finish(buf, match), True
            self._in_calls, self._held = True, ""
            return buf, False
        match = self._earliest_match(buf)
        limit = match[0] if match else len(buf)
        hold_from = _proper_prefix_start(buf, self.stops, limit)  # a stop string may begin there
        if pending is not None and pending <= limit:  # calls may still begin there, before the match
            hold_from = pending if hold_from is None else min(hold_from, pending)
        if match is not None and hold_from is None:
            return self._finish(buf, match), True
        cut = hold_from if hold_from is not None else len(buf)
        self._held = buf[cut:]
        self._held_at += cut
        return buf[:cut], False

    def flush(self) -> str:
        """Held-back text at the end of generation. A complete match still pending is honoured."""
        if self.stopped:
            return ""
        buf, self._held = self._held, ""
        calls_at, _ = self._calls_start(buf)  # (nothing is pending any more: a partial tag is text)
        match = self._earliest_match(buf[:calls_at] if calls_at is not None else buf)
        if match is not None:
            return self._finish(buf, match)
        return buf

    def _finish(self, buf: str, match: tuple[int, str]) -> str:
        start, stop = match
        self.stopped, self.matched, self._held = True, stop, ""
        return buf[: start + len(stop)] if self.include else buf[:start]

    def _earliest_match(self, buf: str) -> tuple[int, str] | None:
        """The earliest match in `buf` (the held text onwards) that ends past `_ends_after`."""
        best: tuple[int, str] | None = None
        ends_after = self._ends_after - self._held_at
        for stop in self.stops:
            pos = buf.find(stop, max(0, ends_after - len(stop) + 1))
            if pos >= 0 and (best is None or pos < best[0] or (pos == best[0] and len(stop) < len(best[1]))):
                best = (pos, stop)
        return best

    def _calls_start(self, buf: str) -> tuple[int | None, int | None]:
        """(where calls begin in `buf`, or None; where they may still begin, undecided, or None). `buf` is the
        held text and the new delta: while the output's start is undecided, all of it is held, so it begins at
        the output's start."""
        calls = self.calls
        if calls is None:
            return None, None
        if calls.always:
            return 0, None
        if not self._first_decided and (calls.first or calls.first_tags):
            rest = buf.lstrip(_WHITESPACE)
            if not rest:
                return None, 0
            if rest[0] in calls.first or rest.startswith(calls.first_tags):
                return 0, None
            if any(tag.startswith(rest) for tag in calls.first_tags):
                return None, 0
            self._first_decided = True
        found = [pos for pos in (buf.find(tag) for tag in calls.tags) if pos >= 0]
        if found:
            return min(found), None
        return None, _proper_prefix_start(buf, calls.tags, len(buf))


def _proper_prefix_start(buf: str, strings: tuple[str, ...], limit: int) -> int | None:
    """Smallest start < limit whose suffix buf[start:] is a proper prefix of one of `strings`."""
    if not strings:
        return None
    longest = max(len(s) for s in strings)
    for start in range(max(0, len(buf) - longest + 1), min(limit, len(buf))):
        tail = buf[start:]
        if any(len(s) > len(tail) and s.startswith(tail) for s in strings):
            return start
    return None
