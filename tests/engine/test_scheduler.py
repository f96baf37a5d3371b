"""Admission at a step boundary: rows, the padded prefill budget, and prompts prefilled in chunks one at a time."""

from __future__ import annotations

import asyncio

from engine.scheduler import Scheduler
from engine.sequence import RequestState
from tests.engine.driver import request


def waiting(rid: str, length: int, **params) -> RequestState:
    return RequestState(request=request(rid, [7] * length, **params), queue=asyncio.Queue(), loop=None,
                        open_choices=params.get("n", 1))


def admitted(scheduler: Scheduler, running_rows: int = 0, chunking: bool = False) -> list[str]:
    return [s.request.request_id for s in scheduler.admit(running_rows, chunking)]


def test_prompts_over_the_budget_and_scored_prompts_are_prefilled_in_chunks():
    scheduler = Scheduler(max_batch_size=8, max_prefill_tokens=100)
    assert not scheduler.prefilled_in_chunks(waiting("a", 100))
    assert scheduler.prefilled_in_chunks(waiting("b", 101))
    assert scheduler.prefilled_in_chunks(waiting("c", 3, prompt_logprobs=0))


def test_one_chunked_prompt_at_a_time_and_shorter_prompts_pass_the_one_waiting():
    scheduler = Scheduler(max_batch_size=8, max_prefill_tokens=100)
    for state in (waiting("long1", 500), waiting("short1", 10), waiting("long2", 300), waiting("short2", 10)):
        scheduler.submit(state)
    assert admitted(scheduler) == ["long1", "short1", "short2"]  # long2 waits for long1's prefill
    assert admitted(scheduler, running_rows=3, chunking=True) == []
    assert admitted(scheduler, running_rows=3) == ["long2"]


def test_the_padded_budget_counts_only_prompts_prefilled_whole():
    scheduler = Scheduler(max_batch_size=8, max_prefill_tokens=100)
    for state in (waiting("long", 1000), waiting("a", 50), waiting("b", 50), waiting("c", 50)):
        scheduler.submit(state)
    assert admitted(scheduler) == ["long", "a", "b"]  # c would make 3 x 50 padded tokens
    assert admitted(scheduler, running_rows=3) == ["c"]


def test_rows_of_a_chunked_prompt_count_and_a_request_that_does_not_fit_blocks_the_queue():
    scheduler = Scheduler(max_batch_size=4, max_prefill_tokens=100)
    for state in (waiting("long", 500, n=3), waiting("wide", 10, n=2), waiting("one", 10)):
        scheduler.submit(state)
    assert admitted(scheduler) == ["long"]  # "wide" needs 2 of the 1 row left, and "one" waits behind it
    assert admitted(scheduler, running_rows=3, chunking=True) == []
    assert admitted(scheduler, running_rows=0) == ["wide", "one"]


def test_a_prompt_waiting_for_the_chunked_prefill_is_passed_even_when_its_rows_would_not_fit():
    scheduler = Scheduler(max_batch_size=4, max_prefill_tokens=100)
    for state in (waiting("long", 500, n=2), waiting("short", 10)):
        scheduler.submit(state)
    assert admitted(scheduler, running_rows=3, chunking=True) == ["short"]
