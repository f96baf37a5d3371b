"""Which waiting requests join the running batch at the next step boundary.

A thread-safe waiting queue and one decision function; returns data, calls nothing. Limits: rows (a request
needs `n` rows) and padded prefill tokens (a single request larger than the budget is still admitted alone, so
nothing starves). First come, first served: a request that does not fit blocks those behind it.
"""

from __future__ import annotations

import threading
from collections import deque

from engine.sequence import RequestState


class Scheduler:
    def __init__(self, max_batch_size: int, max_prefill_tokens: int):
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self._waiting: deque[RequestState] = deque()
        self._lock = threading.Lock()
        self.wakeup = threading.Event()

    def submit(self, state: RequestState) -> None:
        with self._lock:
            self._waiting.append(state)
        self.wakeup.set()

    def depth(self) -> int:
        return len(self._waiting)

    def drain(self) -> list[RequestState]:
        with self._lock:
            items, self._waiting = list(self._waiting), deque()
        return items

    def remove_cancelled(self) -> list[RequestState]:
        with self._lock:
            gone = [s for s in self._waiting if s.cancelled]
            self._waiting = deque(s for s in self._waiting if not s.cancelled)
        return gone

    def admit(self, running_rows: int) -> list[RequestState]:
        """Pop the requests that join now: rows fit, and the padded prefill stays within the token budget."""
        admitted: list[RequestState] = []
        rows, longest = running_rows, 0
        with self._lock:
            while self._waiting:
                state = self._waiting[0]
                n = state.request.params.n
                length = max(longest, len(state.request.prompt_ids))
                if rows + n > self.max_batch_size and n <= self.max_batch_size:
                    break  # (a request that can never fit is let through, to be refused, not to block the queue)
                if admitted and length * (len(admitted) + 1) > self.max_prefill_tokens:
                    break
                admitted.append(self._waiting.popleft())
                rows, longest = rows + n, length
        return admitted
