"""The `openai` SDK's structured-output helpers against the real server: `parse` with unions and tools, and the
`stream` helper that parses as it goes. Real clients use these, not raw `create` calls."""

from __future__ import annotations

from typing import Literal, Union

import openai
from pydantic import BaseModel, Field

from tests.service.conftest import MODEL


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=1, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Owner(BaseModel):
    """A discriminated union: pydantic writes it as `oneOf` with a `discriminator`."""
    pet: Union[Cat, Dog] = Field(discriminator="kind")
    nickname: str = Field(max_length=12)


ASK = [{"role": "user", "content": "Describe an owner and their pet as JSON."}]


def test_parse_fills_a_discriminated_union(client):
    for seed in range(4):
        r = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Owner, seed=seed,
                                          max_tokens=80)
        owner = r.choices[0].message.parsed
        assert isinstance(owner, Owner), r.choices[0].message.content
        assert isinstance(owner.pet, Cat if owner.pet.kind == "cat" else Dog)


def test_stream_helper_delivers_deltas_and_a_parsed_final_message(client):
    deltas = []
    with client.chat.completions.stream(model=MODEL, messages=ASK, response_format=Owner, seed=3,
                                        max_tokens=80) as stream:
        for event in stream:
            if event.type == "content.delta":
                deltas.append(event.delta)
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert len(deltas) > 1  # streamed, not delivered in one piece
    assert "".join(deltas) == message.content
    assert isinstance(message.parsed, Owner)


class GetWeather(BaseModel):
    """Current weather for a city."""
    city: str = Field(max_length=16)
    unit: Literal["celsius", "fahrenheit"]


def test_parse_with_a_strict_pydantic_tool_gives_parsed_arguments(client):
    tool = openai.pydantic_function_tool(GetWeather)
    assert tool["function"]["strict"] is True
    r = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                      tools=[tool], tool_choice="required", seed=5, max_tokens=80)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name == "GetWeather"
        assert isinstance(call.function.parsed_arguments, GetWeather)


def test_parse_reads_pydantics_own_formats(client):
    """pydantic writes these types as formats JSON Schema does not define (`uuid4`, `base64`, `ipvanyaddress`) or
    holds more narrowly (`duration`): each answer is one the model validates, so `parse()` never fails on them."""
    import datetime

    from pydantic import UUID4, Base64Str, IPvAnyAddress

    class Record(BaseModel):
        id: UUID4
        token: Base64Str
        host: IPvAnyAddress
        wait: datetime.timedelta

    for seed in range(3):
        r = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Record, seed=seed,
                                          max_tokens=160)
        assert isinstance(r.choices[0].message.parsed, Record), r.choices[0].message.content


def test_parse_reads_pydantics_open_intervals(client):
    """`Field(gt=0, lt=1)` answered `0` in half the seeds, and `Field(ge=0.5, lt=1)` wrote `1.000...` until
    `max_tokens` (QA frameworks F1, F2): every answer now ends, and parses."""
    class Scores(BaseModel):
        confidence: float = Field(gt=0, lt=1)
        ratio: float = Field(ge=0.5, lt=1)
        shift: float = Field(gt=-1, le=-0.5)

    for seed in range(6):
        r = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Scores, seed=seed,
                                          max_tokens=80)
        assert r.choices[0].finish_reason == "stop" and isinstance(r.choices[0].message.parsed, Scores)
