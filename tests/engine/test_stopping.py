"""Stopping and output events: EOS ids, stop strings across tokens, stop_token_ids, max_tokens, the context
limit, ignore_eos, usage, logprobs and prompt logprobs, and a row whose allowed set is empty."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from constrain.grammar import ConstraintError, Grammar, Matcher
from engine import Engine
from tests.engine.driver import request, run_all

PROMPT = list(range(1000, 1012))
VARIED = dict(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5)


def test_eos_ends_the_choice_with_stop_and_counts_the_token(engine, builtin):
    eos = min(builtin.eos_token_ids)
    (out,) = run_all(engine, request("e", PROMPT, temperature=0.0, max_tokens=10, logit_bias={eos: 100.0}))
    assert out[0].last.finish_reason == "stop"
    assert out[0].tokens == [eos] and out[0].text == ""
    assert out[0].last.usage.completion_tokens == 1 and out[0].last.usage.total_tokens == len(PROMPT) + 1


def test_ignore_eos_keeps_generating_until_max_tokens(engine, builtin):
    eos = min(builtin.eos_token_ids)
    (out,) = run_all(engine, request("e", PROMPT, temperature=0.0, max_tokens=4, ignore_eos=True,
                                     logit_bias={eos: 100.0}))
    assert out[0].last.finish_reason == "length" and out[0].tokens == [eos] * 4


def test_stop_string_spanning_tokens_ends_the_choice_without_leaking(engine, builtin):
    (alone,) = run_all(engine, request("a", PROMPT, max_tokens=16, **VARIED))
    tok = builtin.tokenizer
    pieces = [tok.decode(alone[0].tokens[: i + 1]) for i in range(len(alone[0].tokens))]
    boundary = len(pieces[4])  # the text of tokens 0..4; the stop string straddles the 4/5 boundary
    full = alone[0].text
    stop = full[boundary - 2: boundary + 2]
    assert len(stop) == 4
    (out,) = run_all(engine, request("s", PROMPT, max_tokens=16, stop=(stop,), **VARIED))
    assert out[0].last.finish_reason == "stop"
    assert out[0].text == full[: full.find(stop)]
    (kept,) = run_all(engine, request("s", PROMPT, max_tokens=16, stop=(stop,), include_stop_str_in_output=True,
                                      **VARIED))
    assert kept[0].text == full[: full.find(stop) + len(stop)]


def test_stop_token_ids_end_the_choice(engine):
    (alone,) = run_all(engine, request("a", PROMPT, max_tokens=12, **VARIED))
    target = alone[0].tokens[5]
    (out,) = run_all(engine, request("t", PROMPT, max_tokens=12, stop_token_ids=(target,), **VARIED))
    first = alone[0].tokens.index(target)
    assert out[0].tokens == alone[0].tokens[: first + 1]
    assert out[0].last.finish_reason == "stop"


def test_min_tokens_bans_the_end_tokens_until_reached_in_a_batch_that_goes_on(engine, builtin):
    """vLLM's `min_tokens`: EOS and stop_token_ids are banned until that many tokens (a +100 bias on EOS loses),
    then allowed again (the batch's sampling settings are rebuilt) while the other rows go on."""
    eos = min(builtin.eos_token_ids)
    stop = 1000
    forced_end, forced_stop, other = run_all(
        engine,
        request("e", PROMPT, temperature=0.0, max_tokens=10, min_tokens=3, logit_bias={eos: 100.0}),
        request("s", PROMPT, temperature=0.7, seed=3, max_tokens=10, min_tokens=5, stop_token_ids=(stop,),
                logit_bias={stop: 100.0}),
        request("o", PROMPT, max_tokens=12, **VARIED))
    assert len(forced_end[0].tokens) == 4 and forced_end[0].tokens[-1] == eos and eos not in forced_end[0].tokens[:3]
    assert forced_end[0].last.finish_reason == "stop"
    assert len(forced_stop[0].tokens) == 6 and forced_stop[0].tokens[-1] == stop
    assert stop not in forced_stop[0].tokens[:5] and forced_stop[0].last.finish_reason == "stop"
    (alone,) = run_all(engine, request("o", PROMPT, max_tokens=12, **VARIED))
    assert other[0].tokens == alone[0].tokens


def test_min_tokens_defers_stop_strings_as_vllm_does(engine, builtin):
    """A stop string ends the output only once `min_tokens` are written (vLLM's rule, which the README and 8df0cd4
    claimed this server followed while a stop string in the first token's text ended it); one that begins before
    that point and ends after it does."""
    tok = builtin.tokenizer
    (alone,) = run_all(engine, request("a", PROMPT, max_tokens=16, **VARIED))
    full = alone[0].text
    stop = tok.decode(alone[0].tokens[:2])[-2:]  # (ends in the second token's text)
    (cut,) = run_all(engine, request("s", PROMPT, max_tokens=16, stop=(stop,), **VARIED))
    assert cut[0].text == full[: full.find(stop)] and cut[0].last.finish_reason == "stop"
    (deferred,) = run_all(engine, request("m", PROMPT, max_tokens=16, stop=(stop,), min_tokens=5, **VARIED))
    boundary = len(tok.decode(alone[0].tokens[:5]))
    later = [p for p in range(len(full)) if full.startswith(stop, p) and p + len(stop) > boundary]
    assert deferred[0].text == (full[: later[0]] if later else full)
    assert len(deferred[0].tokens) >= 5


def _grammar(builtin, **constraint):
    from constrain import GrammarCompiler, Vocabulary, spec_from_request

    vocab = Vocabulary.from_tokenizer(builtin.tokenizer, builtin.logits_width, builtin.eos_token_ids)
    compiler = GrammarCompiler(vocab, builtin.tokenizer, backend="llguidance", background_outlines=False)
    try:
        return compiler.compile(spec_from_request(**constraint))
    finally:
        compiler.close()


def test_min_tokens_leaves_a_constrained_answer_to_end_where_its_document_does(engine, builtin):
    """A grammar that may only end would leave no token: the document's end is the answer's."""
    grammar = _grammar(builtin, choice=["yes", "no"])
    (out,) = run_all(engine, request("c", PROMPT, grammar=grammar, temperature=0.0, max_tokens=10, min_tokens=8))
    assert out[0].last.finish_reason == "stop" and out[0].text in ("yes", "no")


def test_min_tokens_bans_the_end_under_a_constraint_that_leaves_other_tokens(engine, builtin):
    """A constrained answer that may end at any point (free text or calls under tools `auto`, a regex) ended at
    once whatever `min_tokens` said: the end tokens are banned in its mask while the grammar allows another."""
    eos = min(builtin.eos_token_ids)
    grammar = _grammar(builtin, regex="[a-z ]{0,200}")
    (out,) = run_all(engine, request("r", PROMPT, grammar=grammar, temperature=0.0, max_tokens=12, min_tokens=6,
                                     logit_bias={eos: 100.0}))
    assert len(out[0].tokens) == 7 and out[0].tokens[-1] in builtin.eos_token_ids
    assert eos not in out[0].tokens[:6] and out[0].last.finish_reason == "stop"


def test_ignore_eos_under_a_constraint_goes_on_while_the_grammar_allows_another_token(engine, builtin):
    """`ignore_eos` did nothing under a constraint (QA tokenizers F2): the EOS ids are now banned wherever the
    grammar allows another token, as `min_tokens` bans them, and the answer ends where its document must (or at
    max_tokens)."""
    eos = min(builtin.eos_token_ids)
    bias = {e: 100.0 for e in builtin.eos_token_ids}
    free = _grammar(builtin, regex="[a-z]{1,200}")
    (goes_on,) = run_all(engine, request("r", PROMPT, grammar=free, temperature=0.0, max_tokens=8, ignore_eos=True,
                                         logit_bias=bias))
    assert len(goes_on[0].tokens) == 8 and not set(goes_on[0].tokens) & builtin.eos_token_ids
    assert goes_on[0].last.finish_reason == "stop"  # (a document complete at max_tokens ended with its grammar)
    (ends,) = run_all(engine, request("e", PROMPT, grammar=free, temperature=0.0, max_tokens=8, logit_bias=bias))
    assert ends[0].last.finish_reason == "stop" and ends[0].tokens[-1] == eos and len(ends[0].tokens) <= 2
    closed = _grammar(builtin, choice=["yes", "no"])
    (whole,) = run_all(engine, request("c", PROMPT, grammar=closed, temperature=0.0, max_tokens=10, ignore_eos=True,
                                       logit_bias=bias))
    assert whole[0].last.finish_reason == "stop" and whole[0].text in ("yes", "no")


def test_min_tokens_under_a_constraint_leaves_the_logprobs_as_the_model_gave_them(engine, builtin):
    """Logprobs are the distribution after the grammar's mask, before logit bias: under a constraint `min_tokens`
    cleared the end tokens in the mask, so after `a` of `["a", "ab"]` the `b` was reported forced (logprob 0,
    listed alone) where the model gave it -1.08 (QA sampling 1). The ban now comes after the logprobs, as a -100
    bias on the end does."""
    tok = builtin.tokenizer
    first, whole = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("ab")
    grammar = _grammar(builtin, choice=["a", "ab"])
    bias = {whole: -100.0}  # (so the answer is `a`, then `b`)
    ends = {eos: -100.0 for eos in builtin.eos_token_ids}
    banned, biased = run_all(
        engine,
        request("m", PROMPT, grammar=grammar, temperature=0.0, max_tokens=4, min_tokens=2, logit_bias=bias,
                logprobs=True, top_logprobs=5),
        request("b", PROMPT, grammar=grammar, temperature=0.0, max_tokens=4, logit_bias={**bias, **ends},
                logprobs=True, top_logprobs=5))
    assert banned[0].tokens[:2] == biased[0].tokens[:2] == [first, tok.convert_tokens_to_ids("b")]
    second = [ev.logprobs for ev in banned[0].events if ev.logprobs][1][0]
    assert second.logprob < -1e-3 and {t for t, *_ in second.top} & set(builtin.eos_token_ids), second
    expected = [ev.logprobs for ev in biased[0].events if ev.logprobs][1][0]
    assert second.logprob == pytest.approx(expected.logprob, abs=1e-5)
    assert [t for t, *_ in second.top] == [t for t, *_ in expected.top]


def test_a_repetition_penalty_float32_rounds_to_zero_never_makes_nan(engine, builtin):
    """1e-300 passes `> 0` but is 0 in float32: a banned token's -inf times 0 was NaN, which argmax takes first
    (a 500 "sampled but the grammar rejected it" under a choice; `[PAD...]` ids written without one)."""
    from constrain.vocabulary import unsampled_ids

    pads = set(unsampled_ids(builtin.tokenizer, builtin.logits_width))
    prompt = PROMPT + [1000, 1001]  # (repeated ids: the penalty applies to them)
    chosen, free = run_all(engine, request("c", prompt, grammar=_grammar(builtin, choice=["yes", "no"]),
                                           temperature=0.0, max_tokens=5, repetition_penalty=1e-300),
                           request("f", prompt, temperature=0.0, max_tokens=5, repetition_penalty=1e-300))
    assert chosen[0].last.finish_reason == "stop" and chosen[0].text in ("yes", "no")
    assert len(free[0].tokens) == 5 and not set(free[0].tokens) & pads


def test_a_stop_token_id_never_cuts_a_constrained_document(engine, builtin):
    """Under a constraint a stop token id ends the output only where the document may end; elsewhere it is the
    grammar's token, written (every digit a stop id under `[0-9]{4}` ended the answer at its first digit)."""
    digits = tuple(builtin.tokenizer.convert_tokens_to_ids(list("0123456789")))
    (out,) = run_all(engine, request("d", PROMPT, grammar=_grammar(builtin, regex="[0-9]{4}"), temperature=0.8,
                                     seed=5, max_tokens=10, stop_token_ids=digits))
    assert out[0].last.finish_reason == "stop" and len(out[0].text) == 4 and out[0].text.isdigit()
    (cut,) = run_all(engine, request("u", PROMPT, temperature=0.0, max_tokens=10, stop_token_ids=digits,
                                     logit_bias={digits[3]: 100.0}))
    assert cut[0].tokens == [digits[3]] and cut[0].text == ""  # (unconstrained, it ends the output at once)


def test_ids_that_are_no_token_are_never_sampled_without_a_constraint(engine, builtin):
    """The built-in tokenizer's `[PADnnnn]` artefacts (GGUF padding) were sampled by the random model, which wrote
    `[PAD151697]` in its answers; a bias of +100 on one does not bring it back."""
    from constrain.vocabulary import unsampled_ids

    pads = unsampled_ids(builtin.tokenizer, builtin.logits_width)
    assert len(pads) == 290 and builtin.tokenizer.convert_ids_to_tokens(pads[0]).startswith("[PAD")
    forced, sampled = run_all(engine, request("p", PROMPT, temperature=0.0, max_tokens=4, logit_bias={pads[7]: 100.0}),
                              request("s", PROMPT, temperature=1.5, seed=11, max_tokens=40,
                                      logit_bias={p: 5.0 for p in pads[:50]}))
    assert not set(forced[0].tokens + sampled[0].tokens) & set(pads)
    assert len(forced[0].tokens) == 4 and "[PAD" not in forced[0].text + sampled[0].text


def test_max_tokens_and_context_length_end_with_length(builtin):
    small = dataclasses.replace(builtin, context_length=len(PROMPT) + 3)
    eng = Engine(small)
    eng.start()
    try:
        capped, fits, too_long = run_all(eng, request("c", PROMPT, temperature=0.0, max_tokens=50),
                                         request("f", PROMPT[:5], temperature=0.0, max_tokens=2),
                                         request("l", list(range(100, 100 + len(PROMPT) + 3)), max_tokens=1))
    finally:
        eng.shutdown()
    assert capped[0].last.finish_reason == "length" and len(capped[0].tokens) == 3
    assert fits[0].last.finish_reason == "length" and len(fits[0].tokens) == 2
    assert too_long[0].last.finish_reason == "error" and "context" in too_long[0].last.error
    assert too_long[0].last.error_code == "invalid_request"


def test_every_choice_ends_with_exactly_one_final_event_carrying_usage(engine):
    (out,) = run_all(engine, request("u", PROMPT, n=2, temperature=0.8, max_tokens=5))
    for choice in out.values():
        finals = [ev for ev in choice.events if ev.finish_reason is not None]
        assert finals == [choice.last]
        assert all(ev.usage is None for ev in choice.events[:-1])
        assert choice.last.usage.completion_tokens == 5


def test_logprobs_are_raw_and_the_greedy_token_is_the_top_alternative(engine, builtin):
    (out,) = run_all(engine, request("l", PROMPT, temperature=0.0, max_tokens=4, logprobs=True, top_logprobs=5))
    events = out[0].events
    assert [len(ev.logprobs) for ev in events] == [1, 1, 1, 1]
    with torch.inference_mode():
        logits = builtin.model(torch.tensor([PROMPT], device=builtin.device)).logits[0, -1].float()
    from constrain.vocabulary import unsampled_ids

    pads = torch.tensor(unsampled_ids(builtin.tokenizer, builtin.logits_width), device=logits.device)
    logits = logits.index_fill(-1, pads, float("-inf"))  # (no token: never listed)
    expected = torch.log_softmax(logits, -1)
    first = events[0].logprobs[0]
    assert first.token_id == out[0].tokens[0] == int(expected.argmax())
    assert abs(first.logprob - float(expected[first.token_id])) < 1e-4
    assert [t[0] for t in first.top] == expected.topk(5).indices.tolist()
    assert first.top[0][3] == first.logprob
    tid, text, data, _ = first.top[1]
    assert data == builtin.tokenizer.decode([tid]).encode() or text == data.decode("utf-8", "replace")


def _reference_logprobs(builtin, prompt: list[int]) -> torch.Tensor:
    """log_softmax of one forward's logits, the ids that are no token masked as the engine masks them."""
    from constrain.vocabulary import unsampled_ids

    with torch.inference_mode():
        logits = builtin.model(torch.tensor([prompt], device=builtin.device)).logits[0].float()
    pads = torch.tensor(unsampled_ids(builtin.tokenizer, builtin.logits_width), device=logits.device)
    return torch.log_softmax(logits.index_fill(-1, pads, float("-inf")), -1)


def test_prompt_logprobs_come_with_the_first_event_only(engine, builtin):
    (out,) = run_all(engine, request("p", PROMPT, temperature=0.0, max_tokens=2, prompt_logprobs=2))
    first, second = out[0].events
    assert second.prompt_logprobs is None
    plp = first.prompt_logprobs
    assert len(plp) == len(PROMPT) and plp[0] is None
    expected = _reference_logprobs(builtin, PROMPT)
    for pos in range(1, len(PROMPT)):
        assert plp[pos].token_id == PROMPT[pos]
        assert abs(plp[pos].logprob - float(expected[pos - 1, PROMPT[pos]])) < 1e-4
        assert len(plp[pos].top) == 2


def test_zero_prompt_logprobs_means_the_prompt_tokens_logprobs_without_alternatives(engine):
    (out,) = run_all(engine, request("p0", PROMPT, temperature=0.0, max_tokens=1, prompt_logprobs=0))
    plp = out[0].events[0].prompt_logprobs
    assert plp is not None and len(plp) == len(PROMPT) and plp[0] is None
    assert all(entry.token_id == token and entry.top == () for entry, token in zip(plp[1:], PROMPT[1:]))


def test_echo_scoring_with_zero_max_tokens_returns_prompt_logprobs_and_no_tokens(engine):
    (out,) = run_all(engine, request("z", PROMPT, max_tokens=0, prompt_logprobs=1))
    (event,) = out[0].events
    assert event.finish_reason == "length" and event.usage.completion_tokens == 0
    assert len(event.prompt_logprobs) == len(PROMPT)


class _NothingAllowed(Grammar):
    """A grammar whose allowed set is empty from the start (what a broken schema/bias combination produces)."""

    backend = "test"

    def matcher(self, lane: int = 0) -> Matcher:
        return _EmptyMatcher()


class _EmptyMatcher(Matcher):
    def fill_bitmask(self, bitmask, row, tokens_left=None):
        bitmask[row].zero_()

    def accept(self, token_id):
        return False

    def is_terminated(self):
        return False

    def can_end(self):
        return False


def test_empty_allowed_set_ends_that_choice_with_an_error_and_the_batch_continues(engine):
    (alone,) = run_all(engine, request("a", PROMPT, max_tokens=6, **VARIED))
    broken, ok = run_all(engine, request("b", PROMPT, grammar=_NothingAllowed(), max_tokens=6, temperature=1.0),
                         request("a", PROMPT, max_tokens=6, **VARIED))
    assert broken[0].last.finish_reason == "error" and "no token is allowed" in broken[0].last.error
    assert broken[0].last.error_code == "empty_allowed_set"


class _GivesUp(_NothingAllowed):
    """A grammar whose matcher gives up at its first mask, as llguidance does past its per-token work limit."""

    def matcher(self, lane: int = 0) -> Matcher:
        return _GivingUpMatcher()


class _GivingUpMatcher(_EmptyMatcher):
    def fill_bitmask(self, bitmask, row, tokens_left=None):
        raise ConstraintError("the output constraint is too complex to follow here", param="response_format",
                              code="constraint_too_complex")


def test_a_matcher_giving_up_ends_that_choice_as_constraint_too_complex_and_the_batch_continues(engine):
    (alone,) = run_all(engine, request("a", PROMPT, max_tokens=6, **VARIED))
    broken, ok = run_all(engine, request("b", PROMPT, grammar=_GivesUp(), max_tokens=6),
                         request("a", PROMPT, max_tokens=6, **VARIED))
    assert broken[0].last.finish_reason == "error" and "too complex" in broken[0].last.error
    assert broken[0].last.error_code == "constraint_too_complex"
    assert ok[0].tokens == alone[0].tokens
    assert broken[0].tokens == []
    assert ok[0].tokens == alone[0].tokens


def test_mirostat_with_a_tiny_target_keeps_only_the_most_likely_token(engine):
    (greedy,) = run_all(engine, request("g", PROMPT, temperature=0.0, max_tokens=8))
    (miro,) = run_all(engine, request("m", PROMPT, temperature=1.0, seed=1, max_tokens=8, mirostat_target=0.01,
                                      mirostat_lr=0.1))
    (plain,) = run_all(engine, request("p", PROMPT, temperature=1.0, seed=1, max_tokens=8))
    assert miro[0].tokens == greedy[0].tokens
    assert plain[0].tokens != greedy[0].tokens  # without mirostat the flat random model wanders


def test_stats_report_rows_queue_steps_and_tokens(engine):
    run_all(engine, request("a", PROMPT, temperature=0.0, max_tokens=3), request("b", PROMPT, max_tokens=2))
    stats = engine.stats()
    assert stats["batch_size"] == 0 and stats["queue_depth"] == 0
    assert stats["tokens_generated"] == 5 and stats["steps"] >= 3


def test_out_of_range_prompt_ids_fail_that_request_only(engine, builtin):
    bad, good = run_all(engine, request("bad", [5, builtin.logits_width + 10], max_tokens=2),
                        request("good", PROMPT, temperature=0.0, max_tokens=2))
    assert bad[0].last.finish_reason == "error" and "token ids" in bad[0].last.error
    assert good[0].last.finish_reason == "length" and len(good[0].tokens) == 2


def test_prompt_logprobs_of_a_prompt_prefilled_in_chunks_match_one_full_forward(engine, builtin, monkeypatch):
    """Prompt-logprob requests are prefilled a chunk of positions at a time (the prompt x vocabulary logits
    never exist at once): the logprobs match one forward over the whole prompt, and decoding goes on from the
    chunked cache exactly as from a plain prefill."""
    import engine.engine as engine_module

    monkeypatch.setattr(engine_module, "PROMPT_LOGPROB_CHUNK", 5)  # PROMPT has 12 tokens: chunks of 5, 5, 2
    (scored,) = run_all(engine, request("c", PROMPT, temperature=0.0, max_tokens=6, prompt_logprobs=3))
    (plain,) = run_all(engine, request("p", PROMPT, temperature=0.0, max_tokens=6))
    plp = scored[0].events[0].prompt_logprobs
    expected = _reference_logprobs(builtin, PROMPT)
    assert len(plp) == len(PROMPT) and plp[0] is None
    for pos in range(1, len(PROMPT)):
        assert plp[pos].token_id == PROMPT[pos]
        assert abs(plp[pos].logprob - float(expected[pos - 1, PROMPT[pos]])) < 1e-4
        assert [t[0] for t in plp[pos].top] == expected[pos - 1].topk(3).indices.tolist()
    assert scored[0].tokens == plain[0].tokens


def test_the_answers_first_token_is_listed_without_the_whitespace_dropped_after_the_block(engine, builtin):
    """Where the whitespace dropped after the block begins the answer's first token (`" Heard"`), its logprob
    entry leaves it out too, so the tokens listed spell the text (QA reasoning F2: they began with a space the
    text had not). Tags here are ids a seeded output uses, so the same tokens come out as without tags."""
    import dataclasses as dc

    from engine.types import ReasoningTags

    tok = builtin.tokenizer
    for seed in range(20):
        (plain,) = run_all(engine, request("p", PROMPT, max_tokens=12, temperature=1.0, seed=seed))
        toks = plain[0].tokens
        spaced = [k for k in range(len(toks) - 1) if toks[k] not in toks[:k]
                  and tok.decode([toks[k + 1]])[:1].isspace() and tok.decode([toks[k + 1]]).strip()]
        if spaced:
            break
    k = spaced[0]
    thinking = request("r", PROMPT, max_tokens=12, temperature=1.0, seed=seed, logprobs=True)
    thinking = dc.replace(thinking, reasoning=ReasoningTags(open_id=151667, close_id=toks[k], opened=True))
    (out,) = run_all(engine, thinking)
    assert out[0].tokens == toks
    listed = [lp for e in out[0].events for lp in e.logprobs]
    assert listed[0].token_id == toks[k + 1] and listed[0].token == tok.decode([toks[k + 1]]).lstrip()
    assert "".join(lp.token for lp in listed) == out[0].text
    assert b"".join(lp.token_bytes for lp in listed) == out[0].text.encode()


def test_a_reasoning_block_comes_out_apart_from_the_answer(engine, builtin):
    """With reasoning tags, the block's text is `reasoning` (tags dropped), the answer is `text` less the whitespace
    after the block; stop strings and logprobs belong to the answer, and usage counts the block's tokens. The
    tags here are ids the greedy output uses, so the same tokens come out as without tags."""
    import dataclasses as dc

    from engine.types import ReasoningTags

    (plain,) = run_all(engine, request("p", PROMPT, max_tokens=12, **VARIED))
    toks = plain[0].tokens
    close = next(t for i, t in enumerate(toks) if i >= 3 and t not in toks[:i] and t not in toks[i + 1:])
    k = toks.index(close)
    tok = builtin.tokenizer
    inside, after = tok.decode(toks[:k]), tok.decode(toks[k + 1:])
    stop = inside[-3:]  # text of the block: no stop there
    assert stop and stop not in after
    thinking = request("r", PROMPT, max_tokens=12, logprobs=True, stop=(stop,), **VARIED)
    thinking = dc.replace(thinking, reasoning=ReasoningTags(open_id=151667, close_id=close, opened=True))
    (out,) = run_all(engine, thinking)
    assert out[0].tokens == toks
    assert "".join(e.reasoning for e in out[0].events) == inside
    assert out[0].text == after.lstrip()
    assert out[0].last.finish_reason == plain[0].last.finish_reason
    assert out[0].last.usage.reasoning_tokens == k + 1
    dropped = 0  # whitespace-only tokens right after the block
    while k + 1 + dropped < len(toks) and not tok.decode([toks[k + 1 + dropped]]).strip():
        dropped += 1
    assert [lp.token_id for e in out[0].events for lp in e.logprobs] == toks[k + 1 + dropped:]
