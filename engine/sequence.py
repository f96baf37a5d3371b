"""Per-choice decoding state (one `Sequence` per row of the batch) and the request it belongs to.

Plain Python state only: output ids, grammar matcher, stop matcher, detokenizer, seeded generator, mirostat mu.
`Sequence.take_token` applies one sampled token and says whether the choice is finished. No tensor math here
beyond creating the per-request generator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from dataclasses import dataclass, field

import torch

from constrain.stops import StopMatcher
from engine.detokenizer import IncrementalDetokenizer
from engine.types import ErrorCode, GenerationRequest, TokenEvent, TokenLogprob, Usage


def _as_spelled(logprob: TokenLogprob, text: str) -> TokenLogprob:
    """The entry of a token whose text is `text` without the whitespace the text leaves out before it: after a
    reasoning block (`" Heard"` after `</think>` is listed as `"Heard"`), and a SentencePiece piece's `▁` at the
    start of the output, which the tokenizer's decode drops (`" alcuni"` after a prompt of special tokens only).
    So the tokens listed (and `text_offset`s) spell the text from its first character."""
    token, data = logprob.token, logprob.token_bytes
    dropped = token[:len(token) - len(text)]
    if len(text) >= len(token) or not token.endswith(text) or not dropped.isspace():
        return logprob
    spelled = dropped.encode()
    return dataclasses.replace(logprob, token=text, token_bytes=data[len(spelled):] if data.startswith(spelled)
                               else data)


def _held_before(answer: str, token: str) -> int:
    """How much of the answer text a token pushed is the text of tokens before it, which the detokenizer held (a
    character they left unfinished comes out, as U+FFFD, with the text of the token that shows it never ends:
    `选\ufffd[B` for `[B`, which was listed though a stop string cut at the U+FFFD, QA stops F1). 0 where the
    token's own text is not the end of it (a token that finishes a character begins with that character)."""
    return len(answer) - len(token) if token and len(answer) > len(token) and answer.endswith(token) else 0


@dataclass
class RequestState:
    """A submitted request: where its events go (queue on its event loop) and how many choices still run."""

    request: GenerationRequest
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    open_choices: int = 0
    cancelled: bool = False
    prompt_logprobs: tuple | None = None
    logit_bias: tuple[torch.Tensor, torch.Tensor] | None = None  # (columns, values) on the device: Engine._logit_bias


@dataclass
class Sequence:
    """One choice being decoded; the row it occupies in the batch is its position in the running list."""

    state: RequestState
    index: int
    detok: IncrementalDetokenizer
    stops: StopMatcher
    eos_ids: frozenset[int]
    max_new_tokens: int  # min(max_tokens, context room)
    matcher: object | None = None
    lane: int = 0  # the matcher's lane (Grammar.matcher): one mask thread fills the rows of a lane
    generator: torch.Generator | None = None
    mirostat_mu: float = 0.0
    output_ids: list[int] = field(default_factory=list)
    finished: str | None = None  # finish reason once done
    error: str | None = None
    error_code: ErrorCode | None = None
    sent_first: bool = False
    ends_banned: bool = False  # this step's mask row allows other tokens than `ends_to_ban`, which are banned
    grammar_error: str | None = None  # the matcher raised: this choice ends with an error, the batch goes on
    grammar_error_code: ErrorCode = "internal"  # "constraint_too_complex": the matcher gave up (a work limit)
    # With reasoning tags: "before" (the model may open the block), "inside", "done" (the answer). Without: "done".
    reasoning_phase: str = "done"
    reasoning_tokens: int = 0
    # Reasoning text has been written, and a message header followed it (harmony): the next reasoning message's text
    # comes a line after it (messages joined as they were, words ran together: QA reasoning D2).
    _reasoning_written: bool = False
    _reasoning_parted: bool = False
    _strip_leading: bool = False  # the answer has not started after a reasoning block: leading whitespace goes
    # Logprobs go out with the text of their tokens: the stop matcher holds back text that may begin a stop string,
    # and the tokens it holds keep theirs (start: where the token's text begins in the answer) until that text is
    # emitted; those a stop string cuts off are dropped, so the tokens listed spell the text returned.
    _answer_in: int = 0  # characters of answer text pushed to the stop matcher
    _answer_out: int = 0  # characters it emitted
    _held_logprobs: list[tuple[int, TokenLogprob]] = field(default_factory=list)
    # The budget rule put EOS in place of the sampled token (what the model began would not fit): free text so ended
    # was cut by max_tokens, as far as the client can tell ("length"), though the grammar lets it end there.
    budget_ended: bool = False

    def __post_init__(self) -> None:
        tags = self.state.request.reasoning
        if tags is not None:
            self.reasoning_phase = "inside" if tags.opened else "before"
        self._strip_leading = self.state.request.after_block

    @property
    def params(self):
        return self.state.request.params

    @property
    def prompt_len(self) -> int:
        return len(self.state.request.prompt_ids)

    @property
    def tokens_left(self) -> int:
        return self.max_new_tokens - len(self.output_ids)

    def ends_on(self, token: int) -> bool:
        """`token` ends the output: an EOS id, or one of `stop_token_ids`, but under a constraint only where its
        document may end (elsewhere the grammar's token is written: a document or a call is never cut there)."""
        return token in self.eos_ids and (self.matcher is None or token not in self.params.stop_token_ids
                                          or self.matcher.can_end())

    @property
    def ends_to_ban(self) -> frozenset[int]:
        """Under a constraint, the end tokens banned this step wherever the grammar allows another token: every one
        until `min_tokens`; past it, with `ignore_eos`, the model's EOS ids (not `stop_token_ids`), so the answer
        goes on while its document may (unconstrained, `ignore_eos` leaves them out of `eos_ids`; under a
        constraint it did nothing: QA tokenizers F2)."""
        if self.may_not_end_yet:
            return self.eos_ids
        if self.params.ignore_eos and self.matcher is not None:
            return self.eos_ids - frozenset(self.params.stop_token_ids)
        return frozenset()

    @property
    def may_not_end_yet(self) -> bool:
        """`min_tokens` not reached: the output's end tokens are banned (under a constraint, wherever the grammar
        allows another token: a document that may only end, ends), and stop strings do not end it yet."""
        return len(self.output_ids) < self.params.min_tokens

    def take_token(self, token: int, logprob: TokenLogprob | None, chosen_prob: float) -> TokenEvent:
        """Apply one sampled token: grammar, detokenize, stop strings, limits. Returns this step's event."""
        params = self.params
        self.output_ids.append(token)
        text = reasoning = ""
        start = self._answer_in  # (where this token's answer text begins)
        is_stop_token = self.ends_on(token)
        # the token belongs to the answer (not to a reasoning block, nor stripped after one, nor the end token,
        # which is not in the text: OpenAI lists no end token among the logprobs)
        in_answer = not is_stop_token
        if params.mirostat_target is not None:
            surprise = -math.log2(max(chosen_prob, 1e-30))
            self.mirostat_mu -= params.mirostat_lr * (surprise - params.mirostat_target)
        if is_stop_token:
            self.finished = "length" if self.budget_ended and self.state.request.text_answer else "stop"
        elif self.matcher is not None and not self.matcher.accept(token):
            self.finished, self.error = "error", f"token {token} was sampled but the grammar rejected it"
            self.error_code = "internal"
        elif (delta := self._reasoning_step(token)) is not None:
            reasoning, in_answer = delta, False
        elif (tagged := self._tagged_step(token)) is not None:
            # (a header's tokens are not listed: a call's, whose last one begins the answer's text, neither, as
            # its other tokens were reasoning's or a tag's: the call's logprobs are its arguments')
            reasoning, answer = tagged
            in_answer = False
            if answer:
                text, stopped = self._push_answer(answer)
                if stopped:
                    self.finished = "stop"
        else:
            raw = self.detok.push(token)
            answer = self._answer_text(raw)
            in_answer = bool(answer) or not raw  # (not whitespace dropped after a reasoning block)
            if logprob is not None and answer:
                logprob = _as_spelled(logprob, answer)
                start += _held_before(answer, logprob.token)
            text, stopped = self._push_answer(answer)
            if stopped or (self.matcher is not None and self.matcher.is_terminated()):
                self.finished = "stop"
        if self.finished is None and self.tokens_left <= 0:
            # A constrained output that is complete when the budget runs out ended with its grammar: "stop".
            # (The budget rule steers documents to close in time; "length" would make clients drop them.) Free text
            # is cut there, whatever the grammar says: "length" (the service reports complete calls as tool calls).
            complete = self.matcher is not None and not self.state.request.text_answer and self.matcher.can_end()
            self.finished = "stop" if complete else "length"
        if self.finished in ("stop", "length") and (self.reasoning_phase == "inside" or self._role() == "reasoning"):
            reasoning += self.detok.flush()  # the output ended inside the block
        elif self.finished in ("stop", "length") and not self.stops.stopped:
            tail, _ = self._push_answer(self._answer_text(self.detok.flush()))
            rest = self.stops.flush()
            self._answer_out += len(rest)
            text += tail + rest
            if self.stops.stopped:
                self.finished = "stop"
        return self._event(text, (token,), self._logprobs_out(logprob if in_answer else None, start), reasoning)

    def _push_answer(self, answer: str) -> tuple[str, bool]:
        """Answer text through the stop matcher: (text to emit now, stopped?), counted for `_logprobs_out`. Until
        `min_tokens` a stop string ends nothing (vLLM's rule: one that ends in a later token's text does)."""
        text, stopped = self.stops.push(answer, may_stop=len(self.output_ids) > self.params.min_tokens)
        self._answer_in += len(answer)
        self._answer_out += len(text)
        return text, stopped

    def _logprobs_out(self, logprob: TokenLogprob | None, start: int) -> tuple[TokenLogprob, ...]:
        """The logprobs this step's event carries: this token's (its text beginning at `start`) and held ones,
        once their text is emitted (all of them when nothing is held back, or the output ended otherwise than
        by a stop string); at a stop string, those whose text it cut off are dropped."""
        if logprob is not None:
            self._held_logprobs.append((start, logprob))
        if not self._held_logprobs:
            return ()
        held = self._answer_in != self._answer_out or self.detok.holding  # (a character's first bytes: no text yet)
        if self.finished is not None and not self.stops.stopped or not held:
            out, self._held_logprobs = self._held_logprobs, []
        else:
            out = [h for h in self._held_logprobs if h[0] < self._answer_out]
            self._held_logprobs = [] if self.finished is not None else self._held_logprobs[len(out):]
        return tuple(lp for _, lp in out)

    def _reasoning_step(self, token: int) -> str | None:
        """The reasoning text delta of `token` when it belongs to the block (its tags included; their own text is
        dropped), else None: it belongs to the answer. Moves past the block's end."""
        tags = self.state.request.reasoning
        if tags is None or self.reasoning_phase == "done":
            return None
        if self.reasoning_phase == "before":
            if token != tags.open_id:
                self.reasoning_phase = "done"
                return None
            self.reasoning_phase = "inside"
            self.reasoning_tokens += 1
            self.detok.push(token)  # a tag is decoded (context for what follows) and dropped
            return ""
        self.reasoning_tokens += 1
        if token != tags.close_id:
            return self.detok.push(token)
        tail = self.detok.flush()
        self.detok.push(token)
        self.reasoning_phase, self._strip_leading = "done", True
        return tail

    def _role(self) -> str | None:
        """The last token's role, where the grammar gives each token one (`Matcher.token_role`); else None."""
        return self.matcher.token_role if self.matcher is not None else None

    def _tagged_step(self, token: int) -> tuple[str, str] | None:
        """(reasoning text, answer text) of `token` where the grammar gives it a role other than the answer's:
        reasoning text, a header's tag (its text dropped; counted as reasoning inside reasoning messages), or the
        end of a call's header (the call's text begins: the grammar spells it). None: the token is the answer's."""
        role = self._role()
        if role is None or role == "answer":
            return None
        if role == "reasoning":
            self.reasoning_tokens += 1
            text = self.detok.push(token)
            if text and self._reasoning_parted:
                text, self._reasoning_parted = "\n" + text, False
            self._reasoning_written |= bool(text)
            return text, ""
        tail = self.detok.flush()  # (what a tag follows is reasoning text, or nothing)
        self._reasoning_written |= bool(tail)
        self._reasoning_parted = self._reasoning_written
        self.detok.push(token)
        if role == "reasoning_tag":
            self.reasoning_tokens += 1
        return tail, self.matcher.call_text if role == "call_header" else ""

    def _answer_text(self, delta: str) -> str:
        """The whitespace between a reasoning block and the answer is not part of the answer; under a constraint,
        only what the reasoning matcher took itself: text the answer's grammar wrote is the answer's (a regex
        `' [a-z]{3}'` lost its space)."""
        if self._strip_leading and self.matcher is not None and self.matcher.answer_begun:
            self._strip_leading = False
        if self._strip_leading:
            delta = delta.lstrip()
            self._strip_leading = not delta
        return delta

    def finish_without_tokens(self) -> TokenEvent:
        """No room to generate (max_tokens 0, e.g. echo-only prompt scoring): one final "length" event."""
        self.finished = "length"
        return self._event("", (), ())

    def finish_with_error(self, message: str, code: ErrorCode) -> TokenEvent:
        self.finished, self.error, self.error_code = "error", message, code
        return self._event("", (), ())

    def _event(self, text: str, token_ids: tuple[int, ...], logprobs: tuple, reasoning: str = "") -> TokenEvent:
        first = not self.sent_first
        self.sent_first = True
        done = self.finished is not None
        return TokenEvent(
            index=self.index, text=text, reasoning=reasoning, token_ids=token_ids, logprobs=logprobs,
            finish_reason=self.finished if done else None, error=self.error if done else None,
            error_code=self.error_code if done else None,
            usage=Usage(self.prompt_len, len(self.output_ids), self.reasoning_tokens) if done else None,
            prompt_logprobs=self.state.prompt_logprobs if first else None,
        )
