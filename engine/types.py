"""What the service hands the engine and what the engine hands back.

Plain data only: no tensors, no HTTP. `service/` builds a `GenerationRequest`; `engine/` answers with
`TokenEvent`s. Changing a field here changes the contract between the two packages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from constrain import Grammar
    from constrain.tools import CallsOpening

FinishReason = Literal["stop", "length", "error"]  # ("tool_calls" is the service's reading of a "stop")
# Why a choice ended with finish_reason "error"; the service maps each to an HTTP status.
ErrorCode = Literal["invalid_request",  # the request cannot run (prompt, n): the client's fault
                    "empty_allowed_set",  # the grammar allows no token (logit_bias never removes one)
                    "constraint_too_complex",  # the grammar gave up mid-output (a backend's work limit)
                    "cancelled",  # the client went away or cancel() was called
                    "unavailable",  # the server is shutting down
                    "engine_failed",  # the engine thread stopped after a failure it cannot go on from
                    "internal"]  # our fault: a failed forward or grammar


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding settings, already validated and defaulted by the service."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: bool = False  # return the sampled token's logprob at each position
    top_logprobs: int = 0  # 0..20 alternatives per position (needs logprobs)
    prompt_logprobs: int | None = None  # completions `echo` + `logprobs`: logprobs of prompt tokens
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0  # EOS and stop_token_ids are banned until this many tokens (unconstrained rows: vLLM's)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    mirostat_target: float | None = None  # mirostat v2 when set (seed 002)
    mirostat_lr: float = 0.1
    n: int = 1

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(frozen=True)
class ReasoningTags:
    """The token ids of the tags around a reasoning block (`<think>`, `</think>`). `opened`: the prompt ends
    inside the block (the template wrote the open tag); else the model may open one with its first token."""

    open_id: int
    close_id: int
    opened: bool = False


@dataclass
class GenerationRequest:
    """One prompt to continue `params.n` times. `grammar` is already compiled (or None). With `reasoning`, the
    text inside the block comes out as `TokenEvent.reasoning` and the rest as `text` (stop strings, logprobs
    and the grammar's answer apply to the rest). With `calls`, the output may hold tool calls, which stop strings
    never cut. `text_answer`: the grammar leaves the answer free text (tools' content under "auto", harmony's
    unconstrained final message), so an output `max_tokens` ends is `length` even where the grammar could end
    (a document or a call the budget rule closed ends `stop`). `group`: the client request this prompt is one of
    (a completions request may send thousands): waiting prompts take turns by it (engine/scheduler.py).
    `after_block`: the prompt ends right after a reasoning block (a continued message closed one), so the answer's
    leading whitespace is dropped, as after a block the model closes."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    grammar: "Grammar | None" = None
    reasoning: ReasoningTags | None = None
    calls: "CallsOpening | None" = None
    text_answer: bool = False
    group: str | None = None
    after_block: bool = False


@dataclass(frozen=True)
class TokenLogprob:
    """One position: the chosen token and its alternatives, from the raw (unprocessed) distribution."""

    token_id: int
    token: str  # decoded text of the token alone (may be a partial UTF-8 char, then uses replacement)
    token_bytes: bytes
    logprob: float
    top: tuple[tuple[int, str, bytes, float], ...] = ()  # (token_id, token, bytes, logprob), best first


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int = 0  # of completion_tokens, those of the reasoning block (its tags included)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TokenEvent:
    """One step of one choice. The final event of a choice has `finish_reason` set and `usage`
    (usage counts that choice's completion tokens; prompt tokens counted once per prompt by the service)."""

    index: int  # choice index within the request (0..n-1)
    text: str  # text delta, never splits a UTF-8 character, never leaks a partial stop string
    reasoning: str = ""  # reasoning text delta (inside the block, without its tags), when the request has tags
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token in token_ids, when params.logprobs
    finish_reason: FinishReason | None = None
    error: str | None = None  # set when finish_reason == "error"
    error_code: ErrorCode | None = None  # set when finish_reason == "error"
    usage: Usage | None = None
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # first event only, when asked
