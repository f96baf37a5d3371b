"""Drive an Engine from tests: run concurrent requests from asyncio and gather each choice's tokens and text."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from engine import Engine, GenerationRequest, SamplingParams, TokenEvent


@dataclass
class Choice:
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    events: list[TokenEvent] = field(default_factory=list)

    @property
    def last(self) -> TokenEvent:
        return self.events[-1]


def collect_events(events: list[TokenEvent]) -> dict[int, Choice]:
    choices: dict[int, Choice] = {}
    for ev in events:
        c = choices.setdefault(ev.index, Choice())
        c.tokens += ev.token_ids
        c.text += ev.text
        c.events.append(ev)
    return choices


async def run_one(eng: Engine, request: GenerationRequest) -> dict[int, Choice]:
    return collect_events([ev async for ev in eng.generate(request)])


def run_all(eng: Engine, *requests: GenerationRequest) -> list[dict[int, Choice]]:
    async def main():
        return await asyncio.gather(*(run_one(eng, r) for r in requests))

    return asyncio.run(main())


def request(rid: str, prompt_ids: list[int], grammar=None, **params) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_ids=list(prompt_ids), params=SamplingParams(**params),
                             grammar=grammar)
