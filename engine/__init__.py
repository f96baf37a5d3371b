"""The batched decode loop: model, batch and sampler. Knows nothing about HTTP."""

from engine.engine import Engine
from engine.types import GenerationRequest, SamplingParams, TokenEvent, TokenLogprob, Usage

__all__ = ["Engine", "GenerationRequest", "SamplingParams", "TokenEvent", "TokenLogprob", "Usage"]
