"""Continuous batching: a request's tokens do not depend on who else is in the batch, rows join and leave at
step boundaries, n > 1 forks one prefill, cancellation frees the row and its cache."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.engine.driver import collect_events, request, run_all, run_one

PROMPT_A = list(range(1000, 1012))
PROMPT_B = list(range(2000, 2003))
PROMPT_C = list(range(3000, 3030))  # longer than A: the running batch gets left-padded when C joins

# Greedy with penalties so the tiny random model writes varied tokens instead of one token repeated.
GREEDY = dict(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5, max_tokens=24)
SEEDED = dict(temperature=1.0, top_p=0.95, seed=1234, max_tokens=24)


def run_with_traffic(eng, target):
    """Run `target` while one request runs from the start and leaves early, and another joins mid-way."""
    async def main():
        events, tasks = [], []
        early = asyncio.create_task(run_one(eng, request("early", PROMPT_B, temperature=0.7, max_tokens=4)))
        async for ev in eng.generate(target):
            events.append(ev)
            if len(events) == 6:
                tasks.append(asyncio.create_task(run_one(eng, request(
                    "late", PROMPT_C, temperature=0.9, seed=5, max_tokens=40, presence_penalty=1.0))))
        others = await asyncio.gather(early, *tasks)
        return collect_events(events), others

    return asyncio.run(main())


def test_greedy_request_is_identical_alone_and_while_others_join_and_leave(engine):
    (alone,) = run_all(engine, request("a", PROMPT_A, **GREEDY))
    batched, others = run_with_traffic(engine, request("a", PROMPT_A, **GREEDY))
    assert len(set(alone[0].tokens)) > 3
    assert batched[0].tokens == alone[0].tokens
    assert batched[0].text == alone[0].text
    assert [o[0].last.finish_reason for o in others] == ["length", "length"]


def test_seeded_request_is_identical_alone_and_in_any_batch(engine):
    (alone,) = run_all(engine, request("s", PROMPT_A, **SEEDED))
    batched, _ = run_with_traffic(engine, request("s", PROMPT_A, **SEEDED))
    assert batched[0].tokens == alone[0].tokens
    (other_seed,) = run_all(engine, request("s", PROMPT_A, **{**SEEDED, "seed": 99}))
    assert other_seed[0].tokens != alone[0].tokens


def test_n_choices_fork_one_prefill_and_choice_zero_matches_a_single_request(engine):
    (forked,) = run_all(engine, request("n", PROMPT_A, n=3, **SEEDED))
    (single,) = run_all(engine, request("one", PROMPT_A, **SEEDED))
    assert sorted(forked) == [0, 1, 2]
    assert forked[0].tokens == single[0].tokens
    assert forked[1].tokens != forked[0].tokens
    for choice in forked.values():
        assert [ev.finish_reason for ev in choice.events].count("length") == 1
        assert choice.last.usage.completion_tokens == len(choice.tokens) == 24
        assert choice.last.usage.prompt_tokens == len(PROMPT_A)
    assert engine.stats()["prefill_tokens"] == 2 * len(PROMPT_A)  # the n=3 request was prefilled once


def test_cancelling_a_stream_frees_its_row_and_cache_and_the_batch_continues(engine):
    (alone,) = run_all(engine, request("keep", PROMPT_B, **GREEDY))

    async def main():
        keep = asyncio.create_task(run_one(engine, request("keep", PROMPT_B, **GREEDY)))
        stream = engine.generate(request("drop", PROMPT_C, temperature=0.0, max_tokens=500))
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 3:
                break
        rows_before = engine.stats()["batch_size"]
        at_close = engine.stats()["tokens_generated"]
        await stream.aclose()  # what the service does on a client disconnect
        observed = []
        deadline = time.monotonic() + 60  # (200 polls, a second, was a bound on a loaded machine's engine thread)
        while time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            kv = engine.kv
            observed.append((engine.stats()["batch_size"], kv.rows if kv is not None else 0,
                             kv.cache.layers[0].keys.shape[0] if kv is not None else 0))
            if observed[-1][0] <= 1:
                break
        return rows_before, observed, await keep, engine.stats()["tokens_generated"] - at_close

    rows_before, observed, kept, after_close = asyncio.run(main())
    assert rows_before == 2
    # (the dropped row left when closed, not once it ended by itself: with the close ignored it ran on to its EOS,
    # 42 tokens after the close, and the polls above saw one row all the same. After the close only `keep`'s rest
    # and the steps under way then add tokens.)
    assert after_close <= len(alone[0].tokens) + 2, after_close
    assert observed[-1][0] <= 1 and observed[-1][1] <= 1 and observed[-1][2] <= 1
    assert kept[0].tokens == alone[0].tokens
    stats = engine.stats()
    assert stats["batch_size"] == 0 and engine.kv is None  # all rows and their cache released


def test_cancel_by_request_id_ends_the_stream_with_an_error_event(engine):
    async def main():
        events, at_cancel = [], None
        async for ev in engine.generate(request("victim", PROMPT_A, temperature=0.0, max_tokens=500)):
            events.append(ev)
            if len(events) == 2:
                at_cancel = engine.stats()["tokens_generated"]  # (the engine's own: the only request)
                engine.cancel("victim")
        return events, at_cancel

    events, at_cancel = asyncio.run(main())
    assert events[-1].finish_reason == "error" and events[-1].error == "cancelled"
    assert events[-1].error_code == "cancelled"
    # Ended at a step boundary: at most the step under way when `cancel` was called and the one it had begun
    # add a token. (`len(events) < 50` counted the steps the engine thread ran before this loop read its second
    # event: on a loaded machine the engine thread runs on, not waiting for the reader.)
    assert sum(len(ev.token_ids) for ev in events) <= at_cancel + 2 < 500
    assert engine.stats()["batch_size"] == 0


def test_batch_size_limit_queues_requests_and_serves_them_all(builtin):
    from engine import Engine

    eng = Engine(builtin, max_batch_size=2, max_prefill_tokens=64)
    eng.start()
    try:
        results = run_all(eng, *[request(f"r{i}", PROMPT_A, temperature=0.0, max_tokens=5) for i in range(5)])
    finally:
        eng.shutdown()
    assert all(r[0].last.finish_reason == "length" and len(r[0].tokens) == 5 for r in results)
    assert len({tuple(r[0].tokens) for r in results}) == 1


def test_prompts_of_one_client_request_take_turns_with_other_requests(builtin):
    """A completions request of many prompts queued them all at once, and a request sent beside it waited for every
    one of them (35 s behind 64 prompts x n 4). Prompts now take turns by the client request (`group`): with one
    row, the lone request runs once the big one's first prompt or two are done, not after all eight."""
    import dataclasses

    from engine import Engine

    eng = Engine(builtin, max_batch_size=1)
    eng.start()
    finished: list[str] = []

    async def run(req):
        await run_one(eng, req)
        finished.append(req.request_id)

    async def main():
        big = [dataclasses.replace(request(f"big-{i}", PROMPT_A, max_tokens=3, ignore_eos=True), group="big")
               for i in range(8)]
        await asyncio.gather(*(run(r) for r in big + [request("lone", PROMPT_A, max_tokens=3, ignore_eos=True)]))

    try:
        asyncio.run(main())
    finally:
        eng.shutdown()
    assert sorted(finished) == sorted([f"big-{i}" for i in range(8)] + ["lone"])
    assert finished.index("lone") <= 2, finished


def test_request_wider_than_the_batch_is_refused_without_blocking_the_queue(builtin):
    from engine import Engine

    eng = Engine(builtin, max_batch_size=2)
    eng.start()
    try:
        wide, normal = run_all(eng, request("w", PROMPT_A, n=3, max_tokens=2),
                               request("ok", PROMPT_A, temperature=0.0, max_tokens=2))
    finally:
        eng.shutdown()
    assert sorted(wide) == [0, 1, 2] and all(c.last.finish_reason == "error" for c in wide.values())
    assert "n=3" in wide[0].last.error
    assert normal[0].last.finish_reason == "length" and len(normal[0].tokens) == 2


def test_low_temperature_rows_sample_likelier_tokens_than_temperature_one_rows(engine):
    """Temperature reaches the sampler: at 0.1 the sampled tokens' raw logprobs are clearly higher on average
    than at 1.0 (the built-in model's logits are nearly flat, so 1.0 samples almost uniformly)."""
    def mean_logprob(temperature):
        runs = run_all(engine, *[request(f"t{temperature}-{i}", PROMPT_A, temperature=temperature, seed=i,
                                         max_tokens=50, logprobs=True, ignore_eos=True) for i in range(4)])
        lps = [lp.logprob for run in runs for ev in run[0].events for lp in ev.logprobs]
        return sum(lps) / len(lps)

    assert mean_logprob(0.1) > mean_logprob(1.0) + 0.1


LONG_PROMPT = list(range(4000, 4040))


def test_a_prompt_longer_than_the_prefill_budget_is_prefilled_in_chunks_with_the_same_tokens(builtin):
    """A prompt over `max_prefill_tokens` is prefilled that many positions a step (the running rows decode in
    between) and decodes exactly as after one prefill; a short request sent beside it is served meanwhile."""
    from engine import Engine

    chunked = Engine(builtin, max_batch_size=4, max_prefill_tokens=16)
    widths = []  # positions per forward
    hook = builtin.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    chunked.start()
    try:
        long_out, short_out = run_all(chunked, request("long", LONG_PROMPT, **GREEDY), request("short", PROMPT_B, **GREEDY))
        stats = chunked.stats()
    finally:
        chunked.shutdown()
        hook.remove()
    whole = Engine(builtin, max_batch_size=4)
    whole.start()
    try:
        (expected,) = run_all(whole, request("long", LONG_PROMPT, **GREEDY))
    finally:
        whole.shutdown()
    assert long_out[0].tokens == expected[0].tokens and len(long_out[0].tokens) == 24
    assert long_out[0].last.usage.prompt_tokens == len(LONG_PROMPT)
    assert short_out[0].last.finish_reason == "length"
    assert sorted(w for w in widths if w > 1) == [3, 8, 16, 16]  # PROMPT_B whole; LONG_PROMPT 16 + 16 + 8
    assert stats["prefill_tokens"] == len(LONG_PROMPT) + len(PROMPT_B)
    assert stats["batch_size"] == 0


def tokens_seen_while_prefilled(eng, slow):
    """Tokens a running request received between `slow`'s submission and `slow`'s first event."""
    async def main():
        counts = {"running": 0}
        running = eng.generate(request("running", PROMPT_A, temperature=0.0, max_tokens=200, ignore_eos=True))
        await running.__anext__()

        async def drain():
            async for ev in running:
                counts["running"] += len(ev.token_ids)

        drainer = asyncio.create_task(drain())
        await asyncio.sleep(0)
        at_submit = counts["running"]
        events = eng.generate(slow)
        first = await events.__anext__()
        seen = counts["running"] - at_submit
        rest = [ev async for ev in events]
        eng.cancel("running")
        await drainer
        return seen, collect_events([first, *rest])

    return asyncio.run(main())


def test_running_rows_decode_while_a_scored_prompt_is_prefilled_chunk_by_chunk(engine, monkeypatch):
    """Scoring a prompt (prompt logprobs: every position's logits) took one engine step for the whole prompt, ~10 s
    for 4096 tokens on 2 cores, during which every stream stood still. It now takes a chunk a step, and the
    running rows get a token at each."""
    import engine.engine as engine_module

    monkeypatch.setattr(engine_module, "PROMPT_LOGPROB_CHUNK", 2)  # 40 prompt tokens: 20 steps
    seen, scored = tokens_seen_while_prefilled(engine, request("scored", LONG_PROMPT, max_tokens=3,
                                                               prompt_logprobs=1, temperature=0.0))
    assert seen >= 15, seen
    plp = scored[0].events[0].prompt_logprobs
    assert len(plp) == len(LONG_PROMPT) and plp[0] is None
    assert [entry.token_id for entry in plp[1:]] == LONG_PROMPT[1:]
    assert scored[0].last.finish_reason == "length" and len(scored[0].tokens) == 3


def test_cancelling_a_prompt_while_it_is_prefilled_in_chunks_ends_it_and_frees_the_engine(engine, monkeypatch):
    import engine.engine as engine_module

    monkeypatch.setattr(engine_module, "PROMPT_LOGPROB_CHUNK", 1)

    async def main():
        stream = engine.generate(request("victim", LONG_PROMPT * 20, max_tokens=2, prompt_logprobs=0))
        waiter = asyncio.create_task(stream.__anext__())
        deadline = time.monotonic() + 60  # (400 polls, two seconds, was a bound on a loaded machine's engine thread)
        while time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            if engine._chunked is not None and engine._chunked.done > 0:
                break
        in_progress = engine._chunked is not None and engine._chunked.done < 800
        engine.cancel("victim")
        event = await waiter
        return in_progress, event

    in_progress, event = asyncio.run(main())
    assert in_progress
    assert event.finish_reason == "error" and event.error_code == "cancelled"
    (after,) = run_all(engine, request("after", PROMPT_A, temperature=0.0, max_tokens=2))
    assert after[0].last.finish_reason == "length"
    assert engine._chunked is None and engine.stats()["batch_size"] == 0


def test_a_failure_as_a_chunked_prompt_joins_ends_it_with_an_error(builtin):
    """A prompt whose last chunk is in is no longer in progress: a failure while its rows join (a device out of
    memory merging the cache) left it with no answer at all, as neither newcomer nor prompt in progress."""
    from engine import Engine

    eng = Engine(builtin, max_batch_size=4, max_prefill_tokens=16)
    join, failed = eng._join, []

    def failing_join(new_seqs, new_kv):
        if not failed and any(s.state.request.request_id == "long" for s in new_seqs):
            failed.append(True)
            raise RuntimeError("out of memory")
        return join(new_seqs, new_kv)

    eng._join = failing_join
    eng.start()
    try:
        async def main():
            return await asyncio.wait_for(run_one(eng, request("long", LONG_PROMPT, temperature=0.0, max_tokens=4)), 60)

        out = asyncio.run(main())
        (after,) = run_all(eng, request("after", PROMPT_A, temperature=0.0, max_tokens=2))
    finally:
        eng.shutdown()
    assert failed and out[0].last.finish_reason == "error" and out[0].last.error_code == "internal"
    assert after[0].last.finish_reason == "length"


def test_a_prefill_that_fails_ends_only_its_prompts_and_the_running_rows_go_on(builtin):
    """A prefill forward that raised (a long prompt running the GPU out of memory) failed every running row with
    it. Now it fails the prompts it prefilled (whole, or the one prefilled in chunks), and the running request
    ends as it does alone."""
    from engine import Engine

    eng = Engine(builtin, max_batch_size=4, max_prefill_tokens=16)
    prefill, prefill_chunk = eng.runner.prefill, eng.runner.prefill_chunk

    def failing_prefill(prompts):
        if PROMPT_B in prompts:
            raise RuntimeError("CUDA out of memory")
        return prefill(prompts)

    def failing_chunk(cache, prompt, start, end, all_logits):
        if start > 0:  # (the second chunk: the first one's cache is dropped with the prompt)
            raise RuntimeError("CUDA out of memory")
        return prefill_chunk(cache, prompt, start, end, all_logits)

    eng.runner.prefill, eng.runner.prefill_chunk = failing_prefill, failing_chunk
    eng.start()
    try:
        (alone,) = run_all(eng, request("alone", PROMPT_A, **GREEDY))

        async def main():
            events, failed = [], []
            async for ev in eng.generate(request("running", PROMPT_A, **GREEDY)):
                events.append(ev)
                if len(events) == 3:
                    failed = [asyncio.create_task(run_one(eng, request("short", PROMPT_B, max_tokens=4))),
                              asyncio.create_task(run_one(eng, request("long", LONG_PROMPT, max_tokens=4)))]
            return collect_events(events), await asyncio.gather(*failed)

        running, (short, long) = asyncio.run(main())
        (after,) = run_all(eng, request("after", PROMPT_A, temperature=0.0, max_tokens=2))
    finally:
        eng.shutdown()
    assert running[0].tokens == alone[0].tokens and running[0].last.finish_reason == "length"
    for failed in (short, long):
        assert failed[0].tokens == [] and failed[0].last.finish_reason == "error"
        assert failed[0].last.error_code == "internal" and "prefilling the prompt" in failed[0].last.error
    assert after[0].last.finish_reason == "length" and eng.stats()["batch_size"] == 0


@pytest.mark.timeout(120)
def test_a_failure_that_stops_the_engine_in_a_later_chunk_still_ends_that_prompt(builtin):
    """A failure the engine cannot go on from (here a KeyboardInterrupt) in a prompt's second chunk: the prompt was
    let go as failed before the failure was raised on, so `_end_all` no longer found it, and it was never answered
    (review of 67bd059)."""
    from engine import Engine

    eng = Engine(builtin, max_batch_size=4, max_prefill_tokens=16)
    prefill_chunk = eng.runner.prefill_chunk

    def failing_chunk(cache, prompt, start, end, all_logits):
        if start > 0:
            raise KeyboardInterrupt("stop here")
        return prefill_chunk(cache, prompt, start, end, all_logits)

    eng.runner.prefill_chunk = failing_chunk
    eng.start()
    try:
        (out,) = run_all(eng, request("long", LONG_PROMPT, max_tokens=4))
    finally:
        eng.shutdown()
    assert out[0].last.finish_reason == "error" and out[0].last.error_code == "engine_failed"


@pytest.mark.timeout(120)  # (without the fix the requests wait forever)
def test_an_engine_thread_stopped_by_a_failure_ends_every_request_and_refuses_new_ones(builtin):
    """A failure the engine cannot go on from (`recoverable` is False: here a KeyboardInterrupt out of a step) ends
    the engine thread. The running request, the one waiting for a row, and any sent later end at once with an
    "engine_failed" error: before, they waited for events that never came, and a server waits for its requests
    before it stops (it took a second SIGTERM)."""
    from engine import Engine

    eng = Engine(builtin, max_batch_size=1)
    real_step, steps = eng.step, []

    def failing_step():
        steps.append(1)
        if len(steps) == 3:
            raise KeyboardInterrupt("stop here")
        real_step()

    eng.step = failing_step
    eng.start()
    try:
        running, waiting = run_all(eng, request("running", PROMPT_A, max_tokens=50, ignore_eos=True),
                                   request("waiting", PROMPT_A, n=1, max_tokens=50, ignore_eos=True))
        assert not eng.alive and "KeyboardInterrupt" in eng.failure
        (later,) = run_all(eng, request("later", PROMPT_A, n=2, max_tokens=5))
    finally:
        eng.shutdown()
    for choices in (running, waiting, later):
        for choice in choices.values():
            assert choice.last.finish_reason == "error" and choice.last.error_code == "engine_failed"
            assert "restarted" in choice.last.error
    assert len(running[0].tokens) < 50 and waiting[0].tokens == [] and sorted(later) == [0, 1]


@pytest.mark.timeout(120)
def test_shutdown_ends_running_requests_and_a_later_request_as_unavailable(builtin):
    """At shutdown the running request ends with an "unavailable" error (the server answers 503
    server_shutting_down), and a request made after it ends at once the same way (it raised a RuntimeError, a 500)."""
    import threading

    from engine import Engine

    eng = Engine(builtin, max_batch_size=2)
    eng.start()
    real_step, steps = eng.step, []

    def step():
        steps.append(1)
        if len(steps) == 3:
            threading.Thread(target=eng.shutdown).start()  # (as the server's lifespan does, from another thread)
        real_step()

    eng.step = step
    running, = run_all(eng, request("running", PROMPT_A, max_tokens=200, ignore_eos=True))
    assert not eng.alive and eng.failure is None
    later, = run_all(eng, request("later", PROMPT_A, max_tokens=5))
    for choice in (running[0], later[0]):
        assert choice.last.finish_reason == "error" and choice.last.error_code == "unavailable"
        assert choice.last.error == "the server is shutting down"
    assert 0 < len(running[0].tokens) < 200 and later[0].tokens == []
