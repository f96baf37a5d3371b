"""The sampling pipeline's pieces against straightforward reference implementations on small tensors."""

from __future__ import annotations

import math

import torch

from engine.sampler import (SamplingBatch, apply_bitmask, apply_logit_bias, apply_min_p, apply_mirostat,
                            apply_penalties, apply_top_k, apply_top_p, draw_tokens, sample_step,
                            unmask_empty_rows)

NEG = float("-inf")


def random_logits(rows=4, width=11, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=g) * 3


def ref_penalties(logits, counts, prompt, rep, freq, pres):
    out = logits.clone()
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            x = float(logits[b, t])
            c = float(counts[b, t])
            if c > 0 or bool(prompt[b, t]):
                x = x / rep[b] if x > 0 else x * rep[b]
            x -= c * freq[b] + (1.0 if c > 0 else 0.0) * pres[b]
            out[b, t] = x
    return out


def test_penalties_match_the_openai_and_repetition_formulas():
    logits = random_logits()
    counts = torch.zeros_like(logits)
    counts[0, 1], counts[1, 2], counts[2, 3], counts[3, 0] = 3, 1, 2, 5
    prompt = torch.zeros_like(logits, dtype=torch.bool)
    prompt[0, 4] = prompt[2, 5] = True
    rep, freq, pres = [1.3, 1.0, 0.8, 2.0], [0.5, -0.5, 0.0, 1.0], [0.2, 1.0, -1.0, 0.0]
    got = apply_penalties(logits, counts, prompt, torch.tensor(rep), torch.tensor(freq), torch.tensor(pres))
    assert torch.allclose(got, ref_penalties(logits, counts, prompt, rep, freq, pres), atol=1e-6)


def test_logit_bias_plus_100_forces_and_minus_100_bans_a_token():
    logits = random_logits(rows=2)
    biased = apply_logit_bias(logits.clone(), torch.tensor([0, 1]), torch.tensor([7, int(logits[1].argmax())]),
                              torch.tensor([100.0, -100.0]))
    assert int(biased[0].argmax()) == 7
    assert torch.softmax(biased[0], -1)[7] > 0.999
    assert torch.softmax(biased[1], -1)[int(logits[1].argmax())] < 1e-30
    ref = logits.clone()
    ref[0, 7] += 100
    ref[1, int(logits[1].argmax())] -= 100
    assert torch.equal(biased, ref)


def test_logit_bias_cannot_resurrect_a_token_the_grammar_masked():
    logits = torch.tensor([[0.0, NEG, 1.0]])
    out = apply_logit_bias(logits, torch.tensor([0]), torch.tensor([1]), torch.tensor([100.0]))
    assert out[0, 1] == NEG


def ref_min_p(logits, min_p):
    out = logits.clone()
    for b in range(logits.shape[0]):
        probs = torch.softmax(logits[b], -1)
        for t in range(logits.shape[1]):
            if probs[t] < min_p[b] * probs.max():
                out[b, t] = NEG
    return out


def test_min_p_matches_reference():
    logits = random_logits()
    min_p = [0.0, 0.05, 0.3, 1.0]
    assert torch.equal(apply_min_p(logits, torch.tensor(min_p)), ref_min_p(logits, min_p))


def ref_top_k(logits, ks):
    out = logits.clone()
    for b, k in enumerate(ks):
        if k <= 0:
            continue
        keep = sorted(range(logits.shape[1]), key=lambda t: -float(logits[b, t]))[:k]
        for t in range(logits.shape[1]):
            if t not in keep:
                out[b, t] = NEG
    return out


def test_top_k_matches_reference_and_zero_disables():
    logits = random_logits()
    for ks in ([0, 1, 3, 100], [2, 1, 3, 4]):
        assert torch.equal(apply_top_k(logits, torch.tensor(ks)), ref_top_k(logits, ks))


def ref_top_p(logits, ps):
    out = logits.clone()
    for b, p in enumerate(ps):
        probs = torch.softmax(logits[b], -1).tolist()
        order = sorted(range(len(probs)), key=lambda t: -probs[t])
        kept, mass = set(), 0.0
        for t in order:
            kept.add(t)
            mass += probs[t]
            if mass >= p:
                break
        for t in range(len(probs)):
            if t not in kept:
                out[b, t] = NEG
    return out


def test_top_p_matches_reference_keeps_at_least_one_token():
    logits = random_logits()
    ps = [1.0, 0.5, 0.9, 1e-6]
    got = apply_top_p(logits, torch.tensor(ps))
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref_top_p(logits, ps)))
    assert int((~torch.isneginf(got[3])).sum()) == 1


def test_bitmask_unpacking_follows_the_packed_int32_format():
    width = 70  # three words, the last one partial
    allowed = {0, 5, 31, 32, 63, 64, 69}
    words = [0, 0, 0]
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    words = [w - (1 << 32) if w >= 1 << 31 else w for w in words]  # as int32
    logits = torch.zeros(1, width)
    apply_bitmask(logits, torch.tensor([words], dtype=torch.int32))
    assert {t for t in range(width) if logits[0, t] == 0} == allowed


def test_mirostat_drops_tokens_more_surprising_than_mu_but_keeps_the_best():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125], [0.5, 0.25, 0.125, 0.125]]))
    out = apply_mirostat(logits, torch.tensor([1.5, 0.1]))
    # surprises are 1, 2, 3, 3 bits
    assert (~torch.isneginf(out[0])).tolist() == [True, False, False, False]
    assert (~torch.isneginf(out[1])).tolist() == [True, False, False, False]
    out = apply_mirostat(logits[:1], torch.tensor([2.5]))
    assert (~torch.isneginf(out[0])).tolist() == [True, True, False, False]


def test_the_race_samples_the_distribution_and_never_a_zero_probability_token():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    for block in (1024, 4, 2):  # one block; two, the last partial; three
        tokens = draw_tokens(probs.repeat(8000, 1), [None] * 8000, torch.Generator().manual_seed(5), block=block)
        freq = torch.bincount(tokens, minlength=6).float() / 8000
        assert freq[1] == 0 and freq[5] == 0
        assert torch.allclose(freq, probs, atol=0.02), (block, freq)
        unnormalised = draw_tokens(probs.repeat(8000, 1) * 7.0, [None] * 8000, torch.Generator().manual_seed(5),
                                   block=block)
        assert torch.equal(unnormalised, tokens)  # only ratios matter


def test_the_two_level_race_samples_across_blocks_and_a_partial_last_block():
    g = torch.Generator().manual_seed(7)
    width, block, draws = 70, 16, 20000  # 4 full blocks and a partial one of 6 tokens
    probs = torch.rand(width, generator=g) ** 4
    probs[::3] = 0.0  # zeros interleaved
    probs[20:36] = 0.0  # a whole block without mass
    tokens = draw_tokens(probs.repeat(draws, 1), [None] * draws, torch.Generator().manual_seed(1), block=block)
    freq = torch.bincount(tokens, minlength=width).float() / draws
    assert bool((freq[probs == 0] == 0).all())
    assert torch.allclose(freq, probs / probs.sum(), atol=0.01)
    only_last = torch.zeros(3, width)
    only_last[:, -2] = 1.0  # mass only in the partial last block
    assert draw_tokens(only_last, [None] * 3, torch.Generator().manual_seed(2), block=block).tolist() == [68] * 3


def test_a_seeded_row_races_the_same_alone_and_beside_other_rows():
    g = torch.Generator().manual_seed(9)
    probs = torch.rand(5, 3000, generator=g)

    def draws(rows):
        gens = [None] * len(rows)
        gens[rows.index(2)] = torch.Generator().manual_seed(42)
        shared = torch.Generator().manual_seed(len(rows))
        return [int(draw_tokens(probs[rows], gens, shared)[rows.index(2)]) for _ in range(4)]

    assert draws([2]) == draws([0, 1, 2, 3, 4]) == draws([4, 2])


def test_a_race_keeps_its_tokens_when_the_logits_move_by_a_rounding_error():
    """Forwards round differently at other batch sizes and paddings (a GPU's kernels, a CPU's too), and a
    seeded draw must not follow. Seeded the same way, an inverse CDF moves many of these 64 tokens (a flat
    distribution over 152k tokens, as a random model's: its prefix sums shift with every rounding error)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 151936, generator=g)
    moved = logits + 1e-3 * torch.randn(logits.shape, generator=g)

    def generators():
        return [torch.Generator().manual_seed(i) for i in range(64)]

    def tokens(x):
        return draw_tokens(torch.softmax(x, dim=-1), generators(), None)

    assert torch.equal(tokens(logits), tokens(moved))

    def inverse_cdf(x):
        probs = torch.softmax(x, dim=-1)
        u = torch.stack([torch.rand(1, generator=gen) for gen in generators()])
        return torch.searchsorted(probs.cumsum(dim=-1), u * probs.sum(dim=-1, keepdim=True)).squeeze(1)

    assert int((inverse_cdf(logits) != inverse_cdf(moved)).sum()) > 8  # what the race is kept from


def test_temperature_scales_the_sampling_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = torch.log(probs).repeat(4000, 1)
    batch = make_batch(4000, temperature=torch.full((4000,), 0.5), any_temperature=True)
    out = sample_step(logits, batch, None, torch.zeros(4000, 3), torch.zeros(4000, 3, dtype=torch.bool),
                      torch.Generator().manual_seed(2))
    freq = torch.bincount(torch.tensor(out.tokens), minlength=3).float() / 4000
    expected = probs ** 2 / (probs ** 2).sum()  # p^(1/T), renormalised
    assert torch.allclose(freq, expected, atol=0.03)


def test_top_p_with_a_wide_vocabulary_matches_reference_on_both_paths():
    g = torch.Generator().manual_seed(3)
    peaked = torch.randn(2, 3000, generator=g) * 8  # nucleus within the 1024 candidates
    flat = torch.randn(2, 3000, generator=g) * 0.1  # nucleus needs the full sort
    for logits in (peaked, flat):
        ps = [0.9, 0.5]
        got = apply_top_p(logits, torch.tensor(ps))
        ref = ref_top_p(logits, ps)
        assert torch.equal(torch.isneginf(got), torch.isneginf(ref))


def test_a_row_at_top_p_1_keeps_every_token_beside_rows_that_cut(monkeypatch):
    """A float32 running sum reaches 1 before a peaked row's last tokens: a request that asked for no nucleus had
    ~12,000 of them cut whenever another row of its batch asked for one, and it made every such step sort in full."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 151936, generator=g) * 3.0
    sorts = []
    original = torch.Tensor.sort
    monkeypatch.setattr(torch.Tensor, "sort", lambda self, *a, **k: sorts.append(1) or original(self, *a, **k))
    got = apply_top_p(logits.clone(), torch.tensor([1.0, 0.5]))
    assert not bool(torch.isneginf(got[0]).any())
    assert torch.equal(torch.isneginf(got[1:]), torch.isneginf(apply_top_p(logits[1:].clone(), torch.tensor([0.5]))))
    assert sorts == []


def test_a_nucleus_past_1024_candidates_is_found_without_a_full_sort(monkeypatch):
    """A flatter distribution (a high temperature) whose nucleus needs thousands of tokens was sorted in full at every
    step (~15 ms a row at 152k on a CPU); the top 16384 are examined first, with the same result."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 40000, generator=g)  # the 0.5 nucleus: ~4-5k tokens
    ps = [0.5, 0.6]
    sorts = []
    original = torch.Tensor.sort
    monkeypatch.setattr(torch.Tensor, "sort", lambda self, *a, **k: sorts.append(1) or original(self, *a, **k))
    got = apply_top_p(logits, torch.tensor(ps))
    assert sorts == []
    kept = (~torch.isneginf(got)).sum(dim=-1)
    assert bool((kept > 1024).all())
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref_top_p(logits, ps)))


def make_batch(rows, **over) -> SamplingBatch:
    base = dict(
        temperature=torch.ones(rows), greedy=torch.zeros(rows, dtype=torch.bool),
        top_k=torch.zeros(rows, dtype=torch.long), top_p=torch.ones(rows), min_p=torch.zeros(rows),
        repetition=torch.ones(rows), frequency=torch.zeros(rows), presence=torch.zeros(rows),
        bias_rows=torch.zeros(0, dtype=torch.long), bias_cols=torch.zeros(0, dtype=torch.long),
        bias_values=torch.zeros(0), unsampled=torch.zeros(0, dtype=torch.long), mirostat=torch.zeros(rows, dtype=torch.bool), mirostat_mu=torch.zeros(rows),
        generators=[None] * rows, any_penalty=False, any_top_k=False, any_top_p=False, any_min_p=False,
        any_mirostat=False, any_temperature=False, all_greedy=False, any_greedy=False, top_logprobs=0,
        want_logprobs=False)
    base.update(over)
    return SamplingBatch(**base)


def test_empty_allowed_set_flags_only_that_row_and_produces_no_nan():
    logits = random_logits(rows=3, width=40)
    mask = torch.full((3, 2), -1, dtype=torch.int32)
    mask[1] = 0  # nothing allowed in row 1
    mask[2] = torch.tensor([1 << 3, 0], dtype=torch.int32)  # only token 3 in row 2
    batch = make_batch(3, want_logprobs=True, top_logprobs=5)
    empty = unmask_empty_rows(mask, 40)
    out = sample_step(logits, batch, mask, torch.zeros(3, 40), torch.zeros(3, 40, dtype=torch.bool),
                      torch.Generator().manual_seed(0), empty)
    assert empty == out.empty == [False, True, False]
    assert out.tokens[2] == 3
    assert abs(out.logprobs[2]) < 1e-6  # the only allowed token has probability 1 under the mask
    assert all(not math.isnan(x) for x in out.logprobs + out.chosen_prob)
    assert out.top_logprobs[2][1] == NEG  # disallowed alternatives carry -inf (the engine drops them)


def test_a_row_that_allows_only_padded_ids_counts_as_empty_and_is_unmasked():
    """Bits past the logits' width (a padded vocabulary's ids) allow nothing; an empty row allows every token."""
    mask = torch.tensor([[0, 1 << 9], [0, 1 << 7], [1, 0]], dtype=torch.int32)  # bit 41; bit 39; bit 0
    assert unmask_empty_rows(mask, 40) == [True, False, False]
    assert mask.tolist() == [[-1, -1], [0, 1 << 7], [1, 0]]
    assert unmask_empty_rows(torch.tensor([[0, -(1 << 31)]], dtype=torch.int32), 64) == [False]  # (bit 63; no tail)


def test_a_logit_past_float32s_range_is_drawn_as_a_token_of_the_vocabulary_not_as_nan():
    """A repetition penalty of 1e-45 divides a seen positive logit into +inf (a temperature of 1e-45 every positive
    one): the row still draws a token of the vocabulary (the seen one, which that penalty favours), beside an
    ordinary row. (The service serves temperatures that small as greedy: service/sampling.py.)"""
    logits = random_logits(rows=2, width=40)
    seen = torch.zeros(2, 40, dtype=torch.bool)
    seen[0, 7] = True
    logits[0, 7] = 1.0
    for over in ({"repetition": torch.tensor([1e-45, 1.0]), "any_penalty": True},
                 {"temperature": torch.tensor([1e-45, 1.0]), "any_temperature": True}):
        out = sample_step(logits.clone(), make_batch(2, **over), None, torch.zeros(2, 40), seen,
                          torch.Generator().manual_seed(0))
        assert all(0 <= t < 40 for t in out.tokens) and all(math.isfinite(x) for x in out.chosen_prob)
        assert out.tokens[0] == 7 or "temperature" in over
        assert logits[0, out.tokens[0]] > 0  # (every positive logit overflows alike under that temperature)


def test_raw_logprobs_come_from_the_masked_distribution_before_bias_and_temperature():
    logits = random_logits(rows=1, width=8)
    batch = make_batch(1, want_logprobs=True, top_logprobs=3, temperature=torch.tensor([0.3]), any_temperature=True,
                       bias_rows=torch.tensor([0]), bias_cols=torch.tensor([2]), bias_values=torch.tensor([100.0]))
    out = sample_step(logits.clone(), batch, None, torch.zeros(1, 8), torch.zeros(1, 8, dtype=torch.bool),
                      torch.Generator().manual_seed(0))
    assert out.tokens == [2]
    expected = torch.log_softmax(logits, -1)
    assert abs(out.logprobs[0] - float(expected[0, 2])) < 1e-5
    assert out.top_ids[0] == expected[0].topk(3).indices.tolist()


def test_sampling_frequencies_follow_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1, 0.0])
    logits = torch.log(probs).repeat(4000, 1)
    batch = make_batch(4000)
    out = sample_step(logits, batch, None, torch.zeros(4000, 4), torch.zeros(4000, 4, dtype=torch.bool),
                      torch.Generator().manual_seed(1))
    freq = torch.bincount(torch.tensor(out.tokens), minlength=4).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03)
    assert freq[3] == 0
