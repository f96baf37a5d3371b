"""Stop strings matched on streamed text, across token boundaries, without ever leaking a partial stop string.

Pure text in, text out: knows nothing about tokens, models or HTTP. Owned by the engine (one per choice).

Rules:
- The earliest match in the text wins (by start position; at equal starts the shorter stop
  string, which completes first).
- Text that could still be the beginning of a stop string is held back until it is known not to be one.
- A complete match is not decided while an earlier start could still grow into a match.
"""

from __future__ import annotations

from typing import Sequence


class StopMatcher:
    """Feed text deltas with `push`; emit what it returns; call `flush` at the end if no stop matched."""

    def __init__(self, stops: Sequence[str], include_stop_str_in_output: bool = False):
        self.stops = tuple(s for s in dict.fromkeys(stops) if s)
        self.include = include_stop_str_in_output
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def push(self, text_delta: str) -> tuple[str, bool]:
        """Return (text safe to emit now, stopped?). After a stop, further pushes emit nothing."""
        if self.stopped:
            return "", True
        if not self.stops:
            return text_delta, False
        buf = self._held + text_delta
        match = self._earliest_match(buf)
        hold_from = self._partial_start(buf, limit=match[0] if match else len(buf))
        if match is not None and hold_from is None:
            return self._finish(buf, match), True
        cut = hold_from if hold_from is not None else len(buf)
        self._held = buf[cut:]
        return buf[:cut], False

    def flush(self) -> str:
        """Held-back text at the end of generation. A complete match still pending is honoured."""
        if self.stopped:
            return ""
        buf, self._held = self._held, ""
        match = self._earliest_match(buf)
        if match is not None:
            return self._finish(buf, match)
        return buf

    def _finish(self, buf: str, match: tuple[int, str]) -> str:
        start, stop = match
        self.stopped, self.matched, self._held = True, stop, ""
        return buf[: start + len(stop)] if self.include else buf[:start]

    def _earliest_match(self, buf: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self.stops:
            pos = buf.find(stop)
            if pos >= 0 and (best is None or pos < best[0] or (pos == best[0] and len(stop) < len(best[1]))):
                best = (pos, stop)
        return best

    def _partial_start(self, buf: str, limit: int) -> int | None:
        """Smallest start < limit whose suffix buf[start:] is a proper prefix of some stop string."""
        longest = max(len(s) for s in self.stops)
        for start in range(max(0, len(buf) - longest + 1), min(limit, len(buf))):
            tail = buf[start:]
            if any(len(s) > len(tail) and s.startswith(tail) for s in self.stops):
                return start
        return None
