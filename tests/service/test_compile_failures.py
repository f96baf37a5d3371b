"""A constraint backend that fails, or panics, while compiling a client's constraint fails only that request, with
a 400 in the OpenAI shape, not a 500; a request cancelled while its constraint compiles stays cancelled.

A panic cannot be produced on demand from the real backends (each one found was a bug, since fixed or steered
around), so the compiler here raises what pyo3 raises for one: an exception derived from BaseException."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from service.errors import APIError
from service.generation import Generation
from service.protocol import ChatCompletionRequest
from tests.conftest import TOKENIZERS


class PanicException(BaseException):
    """pyo3's exception for a panic in a Rust extension (llguidance, outlines-core, rpds) is not an Exception."""


class _FailingCompiler:
    named_schemas = None

    def __init__(self, exc: BaseException):
        self.exc = exc

    async def compile_async(self, spec):
        raise self.exc


def _generation(exc: BaseException) -> Generation:
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZERS["gpt2"])
    return Generation(engine=None, compiler=_FailingCompiler(exc), loaded=SimpleNamespace(tokenizer=tokenizer),
                      config=None, template=None, metrics=None)


REQUEST = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                response_format={"type": "json_schema",
                                                 "json_schema": {"name": "x", "schema": {"type": "object"}}})


@pytest.mark.parametrize("exc", [RuntimeError("boom"), PanicException("index out of bounds")],
                         ids=["exception", "panic"])
def test_a_backend_failing_or_panicking_on_a_constraint_fails_the_request_with_a_400(exc):
    with pytest.raises(APIError) as raised:
        asyncio.run(_generation(exc)._compile(REQUEST))
    assert raised.value.status == 400 and raised.value.code == "invalid_constraint"
    assert raised.value.param == "response_format" and type(exc).__name__ in raised.value.message


def test_a_request_cancelled_while_its_constraint_compiles_stays_cancelled():
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(_generation(asyncio.CancelledError())._compile(REQUEST))
