"""The engine: one thread owns the model and runs the continuous-batching loop; asyncio callers stream events.

Each step: cancelled rows leave -> newcomers are admitted -> running rows decode one token, newcomers are
prefilled (n > 1: prefilled once, rows forked), and a long or scored prompt advances by one chunk (it joins after
its last) -> grammar bitmasks are filled on the CPU (while the device works, when a core is free for it; on a GPU
host by several threads, each filling the rows of its lanes) -> one
sampling pipeline for the whole batch (engine/sampler.py) -> grammars vet the sampled tokens (budget rule), per-row
bookkeeping and events -> finished rows are dropped from the cache. Knows nothing about HTTP; never blocks the event
loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import AsyncIterator

import torch
from transformers import DynamicCache

from constrain.grammar import ConstraintError
from constrain.stops import StopMatcher
from constrain.vocabulary import unsampled_ids
from engine.detokenizer import IncrementalDetokenizer, TokenTexts
from engine.kv_batch import KVBatch
from engine.model_loader import LoadedModel
from engine.model_runner import ModelRunner
from engine.sampler import SamplingBatch, StepOutput, allows_other_than, sample_step, unmask_empty_rows
from engine.scheduler import Scheduler
from engine.sequence import RequestState, Sequence
from engine.types import ErrorCode, GenerationRequest, TokenEvent, TokenLogprob, Usage

log = logging.getLogger(__name__)

MAX_TOP_LOGPROBS = 20
_FLOAT32_TINY = torch.finfo(torch.float32).tiny
# Prompt-logprob requests are prefilled this many positions a step: the logits of a chunk (positions x
# vocabulary, ~155 MB at 152k) exist at once, never the whole prompt's, and scoring them (~0.25 s on 2 CPU cores)
# holds the running rows up for one chunk's time, not the whole prompt's.
PROMPT_LOGPROB_CHUNK = 256


class Engine:
    def __init__(self, loaded: LoadedModel, *, max_batch_size: int = 16, max_prefill_tokens: int = 4096,
                 overlap_fill: bool | None = None, mask_threads: int | None = None):
        """`overlap_fill`: fill grammar rows on other threads during the forward (None: when a core is free
        for it, see `_a_core_is_free_for_fills`). `mask_threads`: how many threads fill them (None:
        `default_mask_threads`)."""
        self.loaded = loaded
        self.overlap_fill = overlap_fill
        self.device = loaded.device
        self.mask_threads = max(1, mask_threads) if mask_threads is not None else default_mask_threads(self.device)
        # Each new row's matcher is made on the next lane, round robin; a lane's rows are filled by one thread,
        # lanes by different threads at once (their matchers share nothing: Grammar.matcher).
        self._next_lane = 0
        self.width = loaded.logits_width
        self.words = (self.width + 31) // 32
        self.vocab_rows = loaded.model.get_input_embeddings().num_embeddings
        self.runner = ModelRunner(loaded)
        self.texts = TokenTexts(loaded.tokenizer)
        self._unsampled_on_device = torch.tensor(unsampled_ids(loaded.tokenizer, self.width), dtype=torch.long,
                                                 device=self.device)  # (banned in rows free of a constraint)
        self.scheduler = Scheduler(max_batch_size, max_prefill_tokens)
        self.max_batch_size = max_batch_size
        self._shared_generator = torch.Generator(device=self.device)
        self._shared_generator.seed()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.failure: str | None = None  # why the engine thread stopped, when a failure stopped it (`alive`)
        self._states: dict[str, list[RequestState]] = {}
        self._states_lock = threading.Lock()
        self._bitmask_host: torch.Tensor | None = None
        self._admitted: list[RequestState] = []
        self._chunked: ChunkedPrefill | None = None  # the prompt being prefilled over several steps
        self._outbox: dict[asyncio.AbstractEventLoop, list] = {}
        self._filler = ThreadPoolExecutor(max_workers=self.mask_threads, thread_name_prefix="structgen-bitmask")
        self._fills: list[Future] = []  # this step's row fills on the mask threads
        self._fill_during_forward = True  # `overlap_fill` as decided on the engine thread (see `_loop`)
        self._reset_batch()
        self._steps = 0
        self._tokens_generated = 0
        self._requests_finished = 0
        self._prefill_tokens = 0
        self._prefill_chunks = 0  # chunks of prompts prefilled over several steps
        # Seconds the engine thread spent in each part of its steps (see `_step`); /metrics and bench/ read them.
        self._step_seconds = dict.fromkeys(STEP_PHASES, 0.0)

    # ---- asyncio side -------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._stopping = False
            self.failure = None
            self.scheduler.open()
            self._thread = threading.Thread(target=self._run, name="structgen-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Have the engine thread stop after its step, without waiting: running and waiting requests end with
        finish_reason "error" (code `unavailable`), and new ones are refused."""
        self._stopping = True
        self.scheduler.wakeup.set()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the engine thread and wait for it (`stop`)."""
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._filler.shutdown(wait=False)

    @property
    def alive(self) -> bool:
        """Whether requests can run: the engine thread is started and neither stopping nor stopped by a failure
        (`failure` then says which)."""
        return (self._thread is not None and self._thread.is_alive() and not self._stopping
                and self.failure is None)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Events of all `params.n` choices; stopping iteration early cancels the request's rows."""
        state = RequestState(request=request, queue=asyncio.Queue(), loop=asyncio.get_running_loop(),
                             open_choices=request.params.n)
        with self._states_lock:
            self._states.setdefault(request.request_id, []).append(state)
        done = False
        try:
            if not (self.alive and self.scheduler.submit(state)):
                for index in range(request.params.n):
                    yield self._unavailable_event(index, len(request.prompt_ids))
                done = True
                return
            while True:
                event = await state.queue.get()
                if event is None:
                    done = True
                    return
                yield event
        finally:
            if not done:
                state.cancelled = True
                self.scheduler.wakeup.set()
            with self._states_lock:
                states = self._states.get(request.request_id, [])
                if state in states:
                    states.remove(state)
                if not states:
                    self._states.pop(request.request_id, None)

    def cancel(self, request_id: str) -> None:
        """Cancel a request's choices at the next step boundary; its stream ends with finish_reason "error"."""
        with self._states_lock:
            for state in self._states.get(request_id, []):
                state.cancelled = True
        self.scheduler.wakeup.set()

    def stats(self) -> dict:
        chunked = self._chunked  # (a prompt prefilled over several steps still waits to join)
        return {"batch_size": len(self.seqs), "queue_depth": self.scheduler.depth() + (chunked is not None),
                "steps": self._steps, "tokens_generated": self._tokens_generated,
                "requests_finished": self._requests_finished, "prefill_tokens": self._prefill_tokens,
                "prefill_chunks": self._prefill_chunks, "max_batch_size": self.max_batch_size,
                "mask_threads": self.mask_threads, "alive": int(self.alive),
                "step_seconds": dict(self._step_seconds)}

    # ---- engine thread ------------------------------------------------------------------------------------

    def _reset_batch(self) -> None:
        self.seqs: list[Sequence] = []
        self.kv: KVBatch | None = None
        self.last_tokens: torch.Tensor | None = None
        self.counts: torch.Tensor | None = None  # float [B, V] output token counts (penalties)
        self.prompt_mask: torch.Tensor | None = None  # bool [B, V] tokens seen in the prompt
        self._sampling: SamplingBatch | None = None

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - (what `recoverable` lets through) the thread ends, logged
            self.failure = f"{type(exc).__name__}: {exc}"[:200]
            log.critical("the engine thread stopped; requests are refused until the server is restarted",
                         exc_info=True)
        finally:
            self._end_all()

    def _loop(self) -> None:
        if self.device.type == "cpu":
            torch.set_num_threads(self._engine_cpu_threads())
        self._fill_during_forward = (self._a_core_is_free_for_fills() if self.overlap_fill is None
                                     else self.overlap_fill)
        while not self._stopping:
            if not self.seqs and self._chunked is None and self.scheduler.depth() == 0:
                self.scheduler.wakeup.wait(0.5)
                self.scheduler.wakeup.clear()
                continue
            try:
                self.step()
            except BaseException as exc:  # a failed forward must not kill the server: fail the batch, go on
                if not recoverable(exc):
                    raise
                log.exception("engine step failed")
                message = f"internal engine error: {type(exc).__name__}"
                for seq in self.seqs:
                    if seq.finished is None:
                        self._emit(seq, seq.finish_with_error(message, "internal"))
                joined = {id(seq.state) for seq in self.seqs}
                for state in self._admitted + ([self._chunked.state] if self._chunked else []):
                    if id(state) not in joined and state.open_choices > 0:
                        self._fail_request(state, message, "internal")
                self._chunked = None
                self._reset_batch()
                self._flush()

    def _end_all(self) -> None:
        """The engine thread's last act, at shutdown or after a failure it cannot go on from: every running,
        admitted and waiting request ends with an error, and no request is taken any more (`Scheduler.close`), so
        that none waits for an engine that is gone (a server would wait for them before it could stop)."""
        message, code = self.unavailable()
        ended = set()
        for seq in self.seqs:
            if seq.finished is None:
                self._emit(seq, seq.finish_with_error(message, code))
            ended.add(id(seq.state))
        self._reset_batch()
        chunked, self._chunked = ([self._chunked.state] if self._chunked is not None else []), None
        for state in self._admitted + chunked + self.scheduler.close():
            if id(state) not in ended and state.open_choices > 0:
                ended.add(id(state))
                self._fail_request(state, message, code)
        self._flush()

    @property
    def stopped(self) -> bool:
        """Whether the engine is stopping or stopped (`stop`, or a failure): a request made now cannot run."""
        return self._stopping or self.failure is not None

    def unavailable(self) -> tuple[str, ErrorCode]:
        """The error of a request the engine cannot serve: shutting down, or stopped by a failure."""
        if self.failure is not None:
            return f"the engine stopped after a failure ({self.failure}); the server must be restarted", "engine_failed"
        return "the server is shutting down", "unavailable"

    def _unavailable_event(self, index: int, prompt_tokens: int) -> TokenEvent:
        message, code = self.unavailable()
        return TokenEvent(index=index, text="", finish_reason="error", error=message, error_code=code,
                          usage=Usage(prompt_tokens, 0))

    def _engine_cpu_threads(self) -> int:
        """Intra-op threads for the engine thread on CPU. The model was loaded on the main thread, which keeps
        its own OpenMP team; a second multi-threaded team here busy-waits against it, and measured 3-4x slower
        (65 vs 22 tok/s, 1 request, built-in model, 2 cores) unless OMP_WAIT_POLICY=passive was set before
        torch started. So: 1 thread unless the wait policy is passive."""
        if os.environ.get("OMP_WAIT_POLICY", "").lower() == "passive":
            return torch.get_num_threads()
        return 1

    def _a_core_is_free_for_fills(self) -> bool:
        """Fill grammar rows on the mask threads while the forward runs only when a core is free for it: on a
        GPU (the forward runs on the device), or on a CPU whose cores the forward's threads do not all use.
        Otherwise the two threads fight over the cores and the GIL: measured on 2 cores, 1 constrained row,
        the hand-off made each step ~0.5 ms slower than filling on the engine thread after the forward."""
        if self.device.type != "cpu":
            return True
        return torch.get_num_threads() < _usable_cores()

    def step(self) -> None:
        """One step boundary plus one token for every row. Called only from the engine thread."""
        try:
            self._step()
        finally:
            wait(self._fills)  # (a step that failed leaves no fill running into the next step's buffer)
            self._fills = []
            self._flush()

    @torch.inference_mode()
    def _step(self) -> None:
        clock = _PhaseClock(self._step_seconds)
        self._drop_cancelled()
        reserved = self._chunked.state.request.params.n if self._chunked else 0
        newcomers = self._admitted = self.scheduler.admit(len(self.seqs) + reserved, self._chunked is not None)
        running = self.seqs
        # Grammar rows of the running batch are filled on the mask threads while this thread runs the forward
        # (when a core is free for it), else after the forward.
        if self._fill_during_forward and _constrained(running):
            self._fills = self._submit_fills(running, 0)
        clock.lap("schedule")
        running_logits = self.runner.decode(self.kv, self.last_tokens) if running else None
        clock.lap("forward")
        new_seqs, new_kv, new_logits = self._prefill(newcomers)  # (and the chunked prompt's next chunk)
        if new_seqs:
            self._join(new_seqs, new_kv)
        clock.lap("prefill")
        if not self.seqs:
            return
        parts = [x for x in (running_logits, new_logits) if x is not None]
        logits = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        bitmask, empty = self._bitmask(running, new_seqs)
        clock.lap("mask")
        batch = self._sampling_batch()
        out = sample_step(logits, batch, bitmask, self.counts, self.prompt_mask, self._shared_generator, empty,
                          self._ends_banned(bitmask))
        clock.lap("sample")
        self._steps += 1
        self._postprocess(out)
        clock.lap("postprocess")

    # ---- joining and leaving ------------------------------------------------------------------------------

    def _prefill(self, states: list[RequestState]) -> tuple[list[Sequence], KVBatch | None, torch.Tensor | None]:
        """Prefill the newcomers whose prompts fit in one step as one mini-batch; start the one prefilled in
        chunks (Scheduler.prefilled_in_chunks) and advance it by a chunk. Fork n rows of each prompt prefilled."""
        whole = [s for s in states if not self.scheduler.prefilled_in_chunks(s) and self._admissible(s)]
        for state in states:
            if self.scheduler.prefilled_in_chunks(state) and self._admissible(state):
                self._chunked = ChunkedPrefill(state)
        prefilled: list[tuple[list[RequestState], KVBatch, torch.Tensor]] = []
        if whole:
            try:
                kv, logits = self.runner.prefill([s.request.prompt_ids for s in whole])
            except BaseException as exc:  # noqa: BLE001 - e.g. the device out of memory: these prompts only
                if not recoverable(exc):
                    raise
                self._prefill_failed(whole, exc)
            else:
                self._prefill_tokens += kv.rows * kv.length
                prefilled.append((whole, kv, logits))
        if self._chunked is not None:
            try:
                done = self._advance_chunked()
            except BaseException as exc:  # noqa: BLE001 - this prompt only
                if not recoverable(exc):
                    raise  # (`_end_all` ends it, still the prompt in progress)
                state, self._chunked = self._chunked.state, None
                self._prefill_failed([state], exc)
                done = None
            if done is not None:  # (it joins this step: a failure from here on fails it with the newcomers)
                self._admitted = self._admitted + [done[0]]
                prefilled.append(([done[0]], done[1], done[2]))
        seqs: list[Sequence] = []
        kv_all: KVBatch | None = None
        logits_all: list[torch.Tensor] = []
        for group, kv, logits in prefilled:
            fork: list[int] = []
            for row, state in enumerate(group):
                try:
                    choices = [self._new_sequence(state, index) for index in range(state.request.params.n)]
                except BaseException as exc:  # e.g. a grammar whose matcher cannot start: this request only
                    if not recoverable(exc):
                        raise
                    self._fail_request(state, f"cannot start decoding: {exc}", "internal")
                    continue
                for seq in choices:
                    if seq.max_new_tokens <= 0:  # nothing to generate (e.g. echo-only scoring)
                        self._emit(seq, seq.finish_without_tokens())
                        continue
                    seqs.append(seq)
                    fork.append(row)
            if not fork:
                continue
            kv.select(fork)
            logits_all.append(logits[torch.tensor(fork, device=logits.device)])
            if kv_all is None:
                kv_all = kv
            else:
                kv_all.merge(kv)
        if not seqs:
            return [], None, None
        return seqs, kv_all, torch.cat(logits_all, dim=0)

    def _prefill_failed(self, states: list[RequestState], exc: BaseException) -> None:
        """A prefill forward failed (a long prompt that runs the device out of memory, say): its prompts end with
        an error, and the running rows, whose cache it never touched, go on. (A failed decode forward, or one
        while rows join, still fails the whole batch: `_loop`.)"""
        log.error("prefill failed for %s", ", ".join(s.request.request_id for s in states), exc_info=exc)
        for state in states:
            if state.open_choices > 0:
                self._fail_request(state, f"internal engine error prefilling the prompt "
                                          f"({len(state.request.prompt_ids)} tokens): {type(exc).__name__}",
                                   "internal")

    def _advance_chunked(self) -> tuple[RequestState, KVBatch, torch.Tensor] | None:
        """Prefill the next chunk of the prompt in progress, scoring its positions when prompt logprobs are asked
        for; once the last chunk is in, the prompt's KV and last logits [1, V] (and it is no longer in progress)."""
        job, state = self._chunked, self._chunked.state
        prompt, scoring = state.request.prompt_ids, state.request.params.prompt_logprobs is not None
        start = job.done
        end = min(len(prompt), start + (PROMPT_LOGPROB_CHUNK if scoring else self.scheduler.max_prefill_tokens))
        logits = self.runner.prefill_chunk(job.cache, prompt, start, end, all_logits=scoring)
        if scoring:
            job.prompt_logprobs.extend(self._prompt_logprobs(state, start, logits))
        job.done = end
        self._prefill_tokens += end - start
        self._prefill_chunks += 1
        if end < len(prompt):
            return None
        self._chunked = None
        if scoring:
            state.prompt_logprobs = tuple(job.prompt_logprobs)
        mask = torch.ones((1, len(prompt)), dtype=torch.long, device=self.device)
        positions = torch.tensor([len(prompt)], dtype=torch.long, device=self.device)
        return state, KVBatch(job.cache, mask, positions), logits[-1:]

    def _admissible(self, state: RequestState) -> bool:
        n, prompt = state.request.params.n, state.request.prompt_ids
        if state.cancelled:
            self._fail_request(state, "cancelled", "cancelled")
        elif not prompt:
            self._fail_request(state, "the prompt is empty", "invalid_request")
        elif min(prompt) < 0 or max(prompt) >= self.vocab_rows:
            self._fail_request(state, f"prompt token ids must be in 0..{self.vocab_rows - 1}",
                               "invalid_request")
        elif len(prompt) > self.loaded.context_length or (len(prompt) == self.loaded.context_length
                                                           and state.request.params.max_tokens > 0):
            self._fail_request(state, f"the prompt has {len(prompt)} tokens; the model's context is "
                                      f"{self.loaded.context_length} tokens", "invalid_request")
        elif n < 1 or n > self.max_batch_size:
            self._fail_request(state, f"n={n} is outside 1..{self.max_batch_size} (the engine's batch size)",
                               "invalid_request")
        else:
            return True
        return False

    def _new_sequence(self, state: RequestState, index: int) -> Sequence:
        request, params = state.request, state.request.params
        eos = frozenset(params.stop_token_ids)
        if not params.ignore_eos or request.grammar is not None:
            eos = eos | self.loaded.eos_token_ids
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(choice_seed(params.seed, index))
        room = self.loaded.context_length - len(request.prompt_ids)
        lane, self._next_lane = self._next_lane, (self._next_lane + 1) % self.mask_threads
        return Sequence(
            state=state, index=index,
            detok=IncrementalDetokenizer(self.loaded.tokenizer, request.prompt_ids, params.skip_special_tokens,
                                        self.texts, spelled_start=request.grammar is not None),
            stops=StopMatcher(params.stop, params.include_stop_str_in_output, request.calls), eos_ids=eos,
            max_new_tokens=min(params.max_tokens, room),
            matcher=request.grammar.matcher(lane) if request.grammar is not None else None, lane=lane,
            generator=generator,
            mirostat_mu=2.0 * params.mirostat_target if params.mirostat_target is not None else 0.0,
        )

    def _join(self, new_seqs: list[Sequence], new_kv: KVBatch) -> None:
        counts = torch.zeros((len(new_seqs), self.width), device=self.device)
        prompt_mask = torch.zeros((len(new_seqs), self.width), dtype=torch.bool, device=self.device)
        for row, seq in enumerate(new_seqs):
            ids = torch.tensor(seq.state.request.prompt_ids, dtype=torch.long, device=self.device)
            prompt_mask[row, ids.clamp(0, self.width - 1)] = True
        if self.kv is None:
            self.kv, self.counts, self.prompt_mask = new_kv, counts, prompt_mask
        else:
            self.kv.merge(new_kv)
            self.counts = torch.cat([self.counts, counts])
            self.prompt_mask = torch.cat([self.prompt_mask, prompt_mask])
        self.seqs = self.seqs + new_seqs
        self._sampling = None

    def _keep_rows(self, keep: list[int]) -> None:
        """Drop every row not in `keep` from the cache and the per-row tensors."""
        if len(keep) == len(self.seqs):
            return
        if not keep:
            self._reset_batch()
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.kv.select(keep)
        self.counts, self.prompt_mask = self.counts[idx], self.prompt_mask[idx]
        self.last_tokens = self.last_tokens[idx] if self.last_tokens is not None else None
        self.seqs = [self.seqs[i] for i in keep]
        self._sampling = None

    def _drop_cancelled(self) -> None:
        for state in self.scheduler.remove_cancelled():
            self._fail_request(state, "cancelled", "cancelled")
        if self._chunked is not None and self._chunked.state.cancelled:
            self._fail_request(self._chunked.state, "cancelled", "cancelled")
            self._chunked = None
        keep = [row for row, seq in enumerate(self.seqs) if not seq.state.cancelled]
        gone = [seq for seq in self.seqs if seq.state.cancelled]
        self._keep_rows(keep)
        for seq in gone:
            self._emit(seq, seq.finish_with_error("cancelled", "cancelled"))

    def _fail_request(self, state: RequestState, message: str, code: ErrorCode) -> None:
        for index in range(state.request.params.n):
            self._post(state, TokenEvent(index=index, text="", finish_reason="error", error=message,
                                         error_code=code, usage=Usage(len(state.request.prompt_ids), 0)))
        state.open_choices = 0
        self._post(state, None)

    def _emit(self, seq: Sequence, event: TokenEvent) -> None:
        self._post(seq.state, event)
        if event.finish_reason is not None:
            seq.state.open_choices -= 1
            if seq.state.open_choices <= 0:
                self._requests_finished += 1
                self._post(seq.state, None)

    def _post(self, state: RequestState, item: TokenEvent | None) -> None:
        """Queue an event (None = the request is over) for the asyncio side; sent by `_flush`."""
        self._outbox.setdefault(state.loop, []).append((state.queue, item))

    def _flush(self) -> None:
        """Hand the step's events over with one thread-safe call per event loop (not one wake-up per token)."""
        outbox, self._outbox = self._outbox, {}
        for loop, items in outbox.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # that event loop is closed: nobody is listening any more
                pass

    # ---- one step's tensors -------------------------------------------------------------------------------

    def _bitmask(self, running: list[Sequence],
                 new_seqs: list[Sequence]) -> tuple[torch.Tensor | None, list[bool] | None]:
        """The step's packed mask on the device, one non-blocking copy, and the rows whose mask allowed nothing
        (`unmask_empty_rows`); (None, None) when no row is constrained."""
        if self._fills:  # (the running rows are being filled, since the forward began)
            todo = [(new_seqs, len(running))]
        elif _constrained(running) or _constrained(new_seqs):
            todo = [(running, 0), (new_seqs, len(running))]
        else:
            return None, None
        if self.mask_threads == 1:  # filled here: a hand-off costs more than it saves with one thread
            for fill in self._fills:
                fill.result()
            for seqs, offset in todo:
                self._fill_rows(self._host_bitmask(), list(enumerate(seqs, offset)))
        else:
            for seqs, offset in todo:
                self._fills += self._submit_fills(seqs, offset)
            for fill in self._fills:
                fill.result()
        self._fills = []
        host = self._host_bitmask()[: len(self.seqs)]
        empty = unmask_empty_rows(host, self.width)
        return host.to(self.device, non_blocking=True), empty

    def _ends_banned(self, bitmask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rows, columns) of the end tokens `min_tokens` (or `ignore_eos`: `Sequence.ends_to_ban`) bans this step in
        constrained rows (`_fill_rows` decides which), or None. Banned after the logprobs, as the bias bans them in
        rows free of a constraint: clearing them in the mask reported a token forced (logprob 0) where the model
        gave it -1.08."""
        if bitmask is None:
            return None
        pairs = [(row, token) for row, seq in enumerate(self.seqs)
                 if seq.matcher is not None and seq.ends_banned for token in seq.ends_to_ban if token < self.width]
        if not pairs:
            return None
        rows, cols = zip(*pairs)
        return (torch.tensor(rows, dtype=torch.long, device=self.device),
                torch.tensor(cols, dtype=torch.long, device=self.device))

    def _in_mask(self, row: int, token: int) -> bool:
        """Whether this step's mask row `row` (on the host, filled for this step) allows `token`."""
        if not 0 <= token < self.width:
            return False
        return bool((int(self._host_bitmask()[row, token >> 5]) >> (token & 31)) & 1)

    def _host_bitmask(self) -> torch.Tensor:
        """One pinned buffer, reused: the previous step's copy has completed by the time it is refilled. Made
        outside inference mode, so the mask threads may write into it."""
        if self._bitmask_host is None:
            with torch.inference_mode(False):
                pin = self.device.type == "cuda"
                self._bitmask_host = torch.empty((self.max_batch_size, self.words), dtype=torch.int32,
                                                 pin_memory=pin)
        return self._bitmask_host

    def _submit_fills(self, seqs: list[Sequence], offset: int) -> list[Future]:
        """Fill the mask rows of `seqs` (rows `offset`...) on the mask threads, a lane's rows on one thread."""
        bitmask = self._host_bitmask()  # (made here, once, not by two threads at once)
        lanes: dict[int, list[tuple[int, Sequence]]] = {}
        for i, seq in enumerate(seqs):
            lanes.setdefault(seq.lane, []).append((offset + i, seq))
        return [self._filler.submit(self._fill_rows, bitmask, rows) for rows in lanes.values()]

    def _fill_rows(self, bitmask: torch.Tensor, rows: list[tuple[int, Sequence]]) -> None:
        for row, seq in rows:
            seq.ends_banned = False
            if seq.matcher is None or seq.grammar_error is not None:
                bitmask[row].fill_(-1)
                continue
            try:
                seq.matcher.fill_bitmask(bitmask, row, tokens_left=seq.tokens_left)
            except BaseException as exc:  # noqa: BLE001 - a backend failure ends this choice, not the batch
                if not recoverable(exc):
                    raise
                _grammar_failed(seq, exc)
                bitmask[row].fill_(-1)
                continue
            # (`min_tokens`, `ignore_eos`: the end tokens are banned after the logprobs, `_ends_banned`; in rows
            # free of a constraint by the bias, `_build_sampling_batch`, or left out of `eos_ids`)
            ends = seq.ends_to_ban
            seq.ends_banned = bool(ends) and allows_other_than(bitmask[row], ends)

    def _sampling_batch(self) -> SamplingBatch:
        """Per-row settings as device tensors; rebuilt only when the batch's rows change (mirostat mu: each step)."""
        batch = self._sampling
        if batch is None:
            batch = self._sampling = self._build_sampling_batch()
        if batch.any_mirostat:
            batch.mirostat_mu = torch.tensor([seq.mirostat_mu for seq in self.seqs], device=self.device)
        return batch

    def _build_sampling_batch(self) -> SamplingBatch:
        params = [seq.params for seq in self.seqs]
        dev = self.device

        def floats(values):
            return torch.tensor(values, dtype=torch.float32, device=dev)

        greedy = [p.greedy for p in params]
        mirostat = [p.mirostat_target is not None and not g for p, g in zip(params, greedy)]
        # (min_p, top_k and top_p cut what mirostat's truncation leaves: it took their place, silently)
        top_k = [p.top_k if p.top_k > 0 else 0 for p in params]
        top_p = [p.top_p for p in params]
        min_p = [p.min_p for p in params]
        none = torch.zeros(0, dtype=torch.long, device=dev)
        bias_rows, bias_cols, bias_values = [none], [none], [none.float()]
        for row, seq in enumerate(self.seqs):
            cols, values = self._logit_bias(seq.state)
            if seq.matcher is None and seq.may_not_end_yet:  # (rebuilt in _postprocess once min_tokens is reached)
                ends = [token for token in sorted(seq.eos_ids) if 0 <= token < self.width]
                cols = torch.cat([cols, torch.tensor(ends, dtype=torch.long, device=dev)])
                values = torch.cat([values, torch.full((len(ends),), -math.inf, device=dev)])
            bias_rows.append(torch.full((len(cols),), row, dtype=torch.long, device=dev))
            bias_cols.append(cols)
            bias_values.append(values)
        sampled = [not g for g in greedy]
        temperature = [1.0 if g else max(p.temperature, 1e-5) for p, g in zip(params, greedy)]
        return SamplingBatch(
            temperature=floats(temperature),
            greedy=torch.tensor(greedy, device=dev),
            top_k=torch.tensor(top_k, dtype=torch.long, device=dev), top_p=floats(top_p), min_p=floats(min_p),
            # (a penalty float32 rounds to 0 made a banned token's -inf times 0 NaN, which argmax takes first)
            repetition=floats([max(p.repetition_penalty, _FLOAT32_TINY) for p in params]),
            frequency=floats([p.frequency_penalty for p in params]),
            presence=floats([p.presence_penalty for p in params]),
            bias_rows=torch.cat(bias_rows), bias_cols=torch.cat(bias_cols), bias_values=torch.cat(bias_values),
            unsampled=self._unsampled_on_device,
            mirostat=torch.tensor(mirostat, device=dev),
            mirostat_mu=floats([seq.mirostat_mu for seq in self.seqs]),
            generators=[seq.generator for seq in self.seqs],
            any_penalty=any(p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty
                            for p in params),
            any_top_k=any(k > 0 and s for k, s in zip(top_k, sampled)),
            any_top_p=any(tp < 1.0 and s for tp, s in zip(top_p, sampled)),
            any_min_p=any(mp > 0.0 and s for mp, s in zip(min_p, sampled)),
            any_mirostat=any(mirostat), any_temperature=any(t != 1.0 for t in temperature),
            all_greedy=all(greedy), any_greedy=any(greedy),
            top_logprobs=min(MAX_TOP_LOGPROBS, max((p.top_logprobs for p in params if p.logprobs), default=0)),
            want_logprobs=any(p.logprobs for p in params),
        )

    def _logit_bias(self, state: RequestState) -> tuple[torch.Tensor, torch.Tensor]:
        """A request's logit_bias as device tensors (columns, values), made once for the request: the batch's
        settings are rebuilt whenever a row joins or leaves, and walking each entry of each row then (151,640
        entries at n=15) made every other request's steps take seconds."""
        if state.logit_bias is None:
            entries = [(int(t), float(v)) for t, v in state.request.params.logit_bias.items()
                       if 0 <= int(t) < self.width]
            state.logit_bias = (torch.tensor([t for t, _ in entries], dtype=torch.long, device=self.device),
                                torch.tensor([v for _, v in entries], dtype=torch.float32, device=self.device))
        return state.logit_bias

    def _postprocess(self, out: StepOutput) -> None:
        for row, seq in enumerate(self.seqs):  # a grammar's budget rule may replace a sampled token
            token = out.tokens[row]
            if seq.matcher is not None and seq.grammar_error is None and not out.empty[row] \
                    and not seq.ends_on(token):
                try:
                    vetted = seq.matcher.vet(token, seq.tokens_left)
                except BaseException as exc:  # noqa: BLE001 - a backend failure ends this choice only
                    if not recoverable(exc):
                        raise
                    _grammar_failed(seq, exc)
                    continue
                if vetted != token and not self._in_mask(row, vetted):
                    # (a completion spelled with a token this step's mask refused, as Phi-3's `</s>` was: the
                    # request failed with a 500; the sampled token stands, and the answer may run to the limit)
                    log.warning("the budget rule's token %d is not in the grammar's mask: kept the sampled %d",
                                vetted, token)
                elif vetted != token:
                    out.replace_token(row, vetted)
                    seq.budget_ended = vetted in seq.eos_ids
        tokens = torch.tensor(out.tokens, dtype=torch.long, device=self.device)
        self.counts[torch.arange(len(out.tokens), device=self.device), tokens] += 1.0
        self.last_tokens = tokens
        keep: list[int] = []
        events: list[tuple[Sequence, TokenEvent]] = []
        for row, seq in enumerate(self.seqs):
            if seq.grammar_error is None and not out.empty[row]:
                try:
                    event = seq.take_token(out.tokens[row], self._logprob(seq, out, row), out.chosen_prob[row])
                    self._tokens_generated += 1
                except BaseException as exc:  # noqa: BLE001 - e.g. the matcher's accept raised: this choice only
                    if not recoverable(exc):
                        raise
                    _grammar_failed(seq, exc)
            if seq.grammar_error is not None:
                event = seq.finish_with_error(f"decoding this choice failed: {seq.grammar_error}",
                                              seq.grammar_error_code)
            elif out.empty[row]:
                event = seq.finish_with_error("no token is allowed here: the constraint leaves none the model may "
                                              "write", "empty_allowed_set")
            events.append((seq, event))
            if seq.finished is None:
                keep.append(row)
                if seq.matcher is None and len(seq.output_ids) == seq.params.min_tokens:
                    self._sampling = None  # its end tokens are no longer banned
        self._keep_rows(keep)  # before emitting, so a consumer that sees its last event sees its row gone
        for seq, event in events:
            self._emit(seq, event)

    def _logprob(self, seq: Sequence, out: StepOutput, row: int) -> TokenLogprob | None:
        if not seq.params.logprobs:
            return None
        token = out.tokens[row]
        text, data = self.texts.get(token)
        top: tuple = ()
        k = min(seq.params.top_logprobs, MAX_TOP_LOGPROBS)
        if k:
            top = tuple((tid, *self.texts.get(tid), lp)
                        for tid, lp in zip(out.top_ids[row][:k], out.top_logprobs[row][:k]) if lp != -math.inf)
        return TokenLogprob(token_id=token, token=text, token_bytes=data, logprob=out.logprobs[row], top=top)

    def _prompt_logprobs(self, state: RequestState, start: int, logits: torch.Tensor) -> list[TokenLogprob]:
        """Raw logprobs of the prompt tokens that positions start.. predict (position p predicts token p + 1),
        with top-k alternatives; `logits` [n, V] are those positions'."""
        prompt = state.request.prompt_ids
        count = min(logits.shape[0], len(prompt) - 1 - start)
        if count <= 0:
            return []
        k = min(int(state.request.params.prompt_logprobs or 0), MAX_TOP_LOGPROBS)
        logits = logits[:count].float()
        if self._unsampled_on_device.numel():  # (as for the output: `sample_step`; a prompt's own gets -9999.0)
            logits = logits.index_fill(1, self._unsampled_on_device, float("-inf"))
        logp = torch.log_softmax(logits, dim=-1)
        tokens = prompt[start + 1: start + 1 + count]
        targets = torch.tensor(tokens, dtype=torch.long, device=logp.device).clamp(0, logp.shape[-1] - 1)
        chosen = logp.gather(1, targets.unsqueeze(1)).squeeze(1).cpu().tolist()
        top_ids, top_lps = ([], [])
        if k:
            top = logp.topk(k, dim=-1)
            top_ids, top_lps = top.indices.cpu().tolist(), top.values.cpu().tolist()
        result = []
        for pos, token in enumerate(tokens):
            alternatives = tuple((tid, *self.texts.get(tid), lp) for tid, lp in
                                 zip(top_ids[pos], top_lps[pos])) if k else ()
            result.append(TokenLogprob(token, *self.texts.get(token), chosen[pos], alternatives))
        return result


@dataclass
class ChunkedPrefill:
    """A prompt prefilled over several steps (Scheduler.prefilled_in_chunks): its own cache, the positions done,
    and the prompt logprobs scored so far (the first prompt token has none)."""

    state: RequestState
    cache: DynamicCache = field(default_factory=DynamicCache)
    done: int = 0
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=lambda: [None])


def recoverable(exc: BaseException) -> bool:
    """Whether the engine thread goes on after `exc`, failing the request, the choice or the batch it hit: any
    Exception, and a panic in a Rust extension, which pyo3 raises as a PanicException derived from BaseException
    (llguidance, outlines-core, and rpds under jsonschema's `referencing`: one such panic, a RecursionError inside
    rpds, ended the engine thread, and every later request hung). Not KeyboardInterrupt, SystemExit or
    GeneratorExit."""
    return not isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit))


def _grammar_failed(seq: Sequence, exc: BaseException) -> None:
    if isinstance(exc, ConstraintError):  # the client's constraint is past what the backend can follow
        log.info("output constraint gave up for %s: %s", seq.state.request.request_id, exc.message)
        seq.grammar_error, seq.grammar_error_code = exc.message[:500], "constraint_too_complex"
        return
    log.exception("output constraint failed for %s", seq.state.request.request_id, exc_info=exc)
    seq.grammar_error = f"{type(exc).__name__}: {exc}"[:300]


def default_mask_threads(device: torch.device) -> int:
    """Threads that fill grammar rows: one on a CPU, where the forward needs the cores; on a GPU host one per
    two cores, at most 8 (the rest for the engine thread launching kernels, the server and the grammar builds).
    llguidance computes a mask without the interpreter's lock, ~0.6 ms a row inside a JSON string on a 152k
    vocabulary: 16 such rows on one thread take longer than a small model's forward on a GPU."""
    if device.type == "cpu":
        return 1
    return max(1, min(8, _usable_cores() // 2))


def _usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _constrained(seqs: list[Sequence]) -> bool:
    return any(seq.matcher is not None for seq in seqs)


def _deliver(items: list) -> None:
    for queue, item in items:
        queue.put_nowait(item)


# The parts of a step, in order. On a GPU the forward only queues kernels: "sample" ends with the step's one
# device-to-host copy, so it holds the time the device needs for the forward as well.
STEP_PHASES = ("schedule", "forward", "prefill", "mask", "sample", "postprocess")


class _PhaseClock:
    """Adds the time since the last lap to `totals[phase]`: where the engine thread's time goes, per phase."""

    def __init__(self, totals: dict[str, float]):
        self.totals = totals
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.totals[phase] += now - self.last
        self.last = now


_MASK64 = 2 ** 64 - 1


def choice_seed(seed: int, index: int) -> int:
    """The generator seed of choice `index` of a request seeded `seed`. Choice 0 takes the seed itself, so n=1
    and n>1 begin alike; the others a splitmix64 mix of both. (`seed + index` made choice 1 of seed 100 the
    choice 0 of seed 101: runs seeded by run number shared most of their samples.) A seed outside [0, 2**63) is
    mixed too, choice 0's included: torch's generator reads 63 bits, so seed 2**63 + 11 (and -5, 2**63 - 5) was
    seed 11 (9223372036854775803) for choice 0 and not for the others."""
    if index == 0 and 0 <= seed < 2 ** 63:
        return seed
    z = ((seed & _MASK64) ^ (index * 0xD1B54A32D192ED03 & _MASK64)) + 0x9E3779B97F4A7C15 & _MASK64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK64
    return (z ^ (z >> 31)) % 2 ** 63
