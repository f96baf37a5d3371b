"""Which waiting requests join the running batch at the next step boundary.

A thread-safe waiting queue and one decision function; returns data, calls nothing. Limits: rows (a request
needs `n` rows) and padded prefill tokens per step. A prompt longer than that budget, and a prompt whose logprobs
are asked for (its every position's logits are scored), is prefilled over several steps, a chunk per step, while
the running rows go on decoding (`prefilled_in_chunks`); one such prompt at a time: the next waits for its turn
while shorter ones pass it. So one long prompt no longer stops every stream for the seconds its prefill takes.

Prompts take turns by the client request they are one of (`GenerationRequest.group`): requests wait in a ring, in
the order they came; the first one's next prompt joins, and a request with more prompts waiting goes to the back of
the ring. So a prompt sent beside a completions request of thousands waits for a turn, not for all of them (it
waited 35 s behind 64 prompts x n 4); between requests of one prompt each that is first come, first served. A
request whose rows do not fit blocks those behind it.
"""

from __future__ import annotations

import threading
from collections import deque

from engine.sequence import RequestState


class Scheduler:
    def __init__(self, max_batch_size: int, max_prefill_tokens: int):
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self._waiting: dict[str, deque[RequestState]] = {}  # by group: the ring, front first
        self._lock = threading.Lock()
        self._closed = False  # the engine takes no more requests (`close`)
        self.wakeup = threading.Event()

    @staticmethod
    def _group(state: RequestState) -> str:
        return state.request.group or state.request.request_id

    def submit(self, state: RequestState) -> bool:
        """Queue `state`; False when the scheduler is closed (the engine stopped: nobody would serve it)."""
        with self._lock:
            if self._closed:
                return False
            self._waiting.setdefault(self._group(state), deque()).append(state)
        self.wakeup.set()
        return True

    def close(self) -> list[RequestState]:
        """Take no more requests; returns those waiting (the engine ends them)."""
        with self._lock:
            self._closed = True
        return self.drain()

    def open(self) -> None:
        with self._lock:
            self._closed = False

    def depth(self) -> int:
        with self._lock:
            return sum(len(queue) for queue in self._waiting.values())

    def drain(self) -> list[RequestState]:
        with self._lock:
            items = [state for queue in self._waiting.values() for state in queue]
            self._waiting = {}
        return items

    def remove_cancelled(self) -> list[RequestState]:
        with self._lock:
            gone = [s for queue in self._waiting.values() for s in queue if s.cancelled]
            if not gone:
                return gone
            kept = {group: deque(s for s in queue if not s.cancelled) for group, queue in self._waiting.items()}
            self._waiting = {group: queue for group, queue in kept.items() if queue}
        return gone

    def prefilled_in_chunks(self, state: RequestState) -> bool:
        """Whether this prompt is prefilled over several steps (see the module) rather than in one."""
        return (state.request.params.prompt_logprobs is not None
                or len(state.request.prompt_ids) > self.max_prefill_tokens)

    def admit(self, running_rows: int, chunking: bool) -> list[RequestState]:
        """Pop the requests that join now, in turn (see the module): rows fit, the prompts prefilled whole stay
        within the padded token budget, and at most one prompt prefilled in chunks is in progress (`chunking`: one
        already is)."""
        admitted: list[RequestState] = []
        rows, longest, whole = running_rows, 0, 0
        passed: set[str] = set()  # requests whose next prompt waits for the chunked prefill in progress
        with self._lock:
            while len(self._waiting) > len(passed):
                group = next(g for g in self._waiting if g not in passed)
                state = self._waiting[group][0]
                n, in_chunks = state.request.params.n, self.prefilled_in_chunks(state)
                if in_chunks and chunking:  # (before the rows: it waits for its turn, not for rows)
                    passed.add(group)
                    continue
                if rows + n > self.max_batch_size and n <= self.max_batch_size:
                    break  # (a request that can never fit is let through, to be refused, not to block the queue)
                if in_chunks:
                    chunking = True
                else:
                    length = max(longest, len(state.request.prompt_ids))
                    if length * (whole + 1) > self.max_prefill_tokens:
                        break
                    longest, whole = length, whole + 1
                queue = self._waiting.pop(group)
                admitted.append(queue.popleft())
                if queue:  # (its next prompt waits behind the requests already waiting)
                    self._waiting[group] = queue
                rows += n
        return admitted
