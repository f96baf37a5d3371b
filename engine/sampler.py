"""One decode step's logits -> tokens, batched on the device, as a short pipeline of pure tensor functions.

Order (DESIGN.md): grammar bitmask -> raw logprobs -> logit_bias -> repetition / frequency / presence penalties
-> greedy rows take argmax -> temperature -> mirostat | min_p -> top_k -> top_p -> sampling (`draw_tokens`:
the exponential race in two levels, on every device; per-row torch.Generator for seeded rows) -> one
device-to-host copy. Never touches Python per-token state, the model or the grammar objects; each function is
tested against a plain reference.

Raw logprobs (documented choice): log_softmax of the model's logits after the grammar mask (and the ids that are no
token) only, before bias, penalties and temperature. Disallowed tokens have logprob -inf and are never listed among
the alternatives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG_INF = float("-inf")


_BYTE_TABLES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _byte_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[256, 8]: row b holds 0 where bit i of byte b is set (allowed) and -inf where it is clear."""
    key = (device, dtype)
    if key not in _BYTE_TABLES:
        bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
        table = torch.zeros((256, 8), dtype=dtype).masked_fill_(bits == 0, NEG_INF)
        _BYTE_TABLES[key] = table.to(device)
    return _BYTE_TABLES[key]


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Disallowed tokens get -inf, in place. Packed int32 rows [B, W] (bit i of word w = token 32*w+i) are read
    as the bytes of little-endian words (byte k holds tokens 8k..8k+7); each byte looks up its 8 additive
    entries (0 or -inf) in a 256-row table, and the result is added to the logits. A lookup and an add are ~5x
    faster on a CPU than unpacking to a bool mask for `masked_fill_` (measured at 16 x 152k), and run as they
    are on a GPU."""
    rows, width = logits.shape
    table = _byte_table(logits.device, logits.dtype)
    packed = bitmask.contiguous().view(torch.uint8).reshape(-1).long()
    additive = table.index_select(0, packed).view(rows, -1)[:, :width]
    return logits.add_(additive)


def unmask_empty_rows(bitmask: torch.Tensor, width: int) -> list[bool]:
    """Rows of the packed host mask [B, W] that allow no token below `width`, each set to allow every token, in
    place: such a row must not turn into NaN (it ends with an error, and its token is thrown away). Checked on the
    host before the mask's one copy to the device: ~10 us at 16 rows of 152k tokens, where the same check and fix
    on the device were three more passes (~0.2 ms a step on a CPU, three more kernel launches on a GPU)."""
    words = bitmask.numpy()
    full, tail = divmod(width, 32)
    allowed = words[:, :full].any(axis=1)
    if tail:
        allowed |= (words[:, full] & ((1 << tail) - 1)) != 0
    empty = ~allowed
    if empty.any():
        words[empty] = -1
    return empty.tolist()


def allows_other_than(row: torch.Tensor, ids) -> bool:
    """Whether one packed host mask row allows a token other than `ids` (`min_tokens` under a grammar bans its end
    tokens only where it does: a document that may only end, ends)."""
    words = row.numpy().view("uint32").copy()
    for token in ids:
        if token >> 5 < len(words):
            words[token >> 5] &= 0xFFFFFFFF ^ (1 << (token & 31))
    return bool(words.any())


def apply_logit_bias(logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                     values: torch.Tensor) -> torch.Tensor:
    """OpenAI logit_bias: added to the logit (so +-100 forces or bans); -inf stays -inf (the mask wins)."""
    if rows.numel():
        logits.index_put_((rows, cols), values, accumulate=True)
    return logits


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, prompt_mask: torch.Tensor,
                    repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """repetition (CTRL / HF formula) over prompt and output tokens: positive logits divided, negative
    multiplied; then OpenAI: logit -= count * frequency + (count > 0) * presence, over output tokens."""
    seen_out = counts > 0
    seen = seen_out | prompt_mask
    r = repetition.unsqueeze(1)
    penalised = torch.where(logits > 0, logits / r, logits * r)
    logits = torch.where(seen, penalised, logits)
    return logits - counts * frequency.unsqueeze(1) - seen_out.to(logits.dtype) * presence.unsqueeze(1)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the most likely token's probability."""
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, NEG_INF)


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keep the k highest logits per row (ties with the k-th are kept); k <= 0 disables."""
    width = logits.shape[-1]
    k = torch.where(top_k <= 0, torch.full_like(top_k, width), top_k.clamp(max=width))
    largest = int(k.max())
    # topk of the largest k needed is much cheaper than a full sort when k is small (the usual case).
    best = logits.topk(largest, dim=-1).values if largest < width else logits.sort(dim=-1, descending=True).values
    kth = best.gather(1, (k - 1).unsqueeze(1))
    return logits.masked_fill(logits < kth, NEG_INF)


# The candidates examined before a full sort, fewest first. Measured on 2 CPU cores, 4 rows x 151,936: topk 1024
# ~4 ms, topk 16384 ~12 ms, a full sort ~62 ms (a flat distribution's nucleus, as a high temperature makes it, does not
# fit in 1024).
TOP_P_CANDIDATES = (1024, 16384)


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus: keep the smallest set of most likely tokens whose mass reaches top_p (at least one).

    Exact, but cheap when the nucleus is small: the top 1024 candidates are examined first, then the top 16384
    (unless the 1024th's probability shows they cannot hold some row's nucleus), and when some row's nucleus does
    not fit in those either, a full sort (one host check per tier). A row at top_p 1 (beside rows that cut) keeps
    every token: a float32 running sum reaches 1 before the last tokens, and ~12,000 unlikely ones were cut."""
    probs = torch.softmax(logits, dim=-1)
    width = logits.shape[-1]
    whole = top_p >= 1.0
    tiers = [k for k in TOP_P_CANDIDATES if k < width]
    for i, candidates in enumerate(tiers):
        cand_probs, cand_ids = probs.topk(candidates, dim=-1)
        mass = cand_probs.sum(dim=-1)
        if bool(((mass >= top_p) | whole).all()):
            return logits.masked_fill(~_nucleus_keep(probs, cand_probs, cand_ids, top_p), NEG_INF)
        if i + 1 < len(tiers):  # the next tier's mass is at most this one's plus its extra tokens at the last's p
            bound = mass + (tiers[i + 1] - candidates) * cand_probs[:, -1]
            if not bool(((bound >= top_p) | whole).all()):
                break
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    return logits.masked_fill(~_nucleus_keep(probs, sorted_probs, order, top_p), NEG_INF)


def _nucleus_keep(probs: torch.Tensor, sorted_probs: torch.Tensor, order: torch.Tensor,
                  top_p: torch.Tensor) -> torch.Tensor:
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p.unsqueeze(1)
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, order, keep_sorted)
    return keep | (top_p >= 1.0).unsqueeze(1)  # (see apply_top_p)


def apply_mirostat(logits: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """Mirostat v2 truncation: drop tokens whose surprise -log2 p exceeds mu (the most likely always stays)."""
    logp = torch.log_softmax(logits, dim=-1)
    surprise = -logp / torch.log(torch.tensor(2.0, device=logits.device))
    drop = surprise > mu.unsqueeze(1)
    drop.scatter_(1, logits.argmax(dim=-1, keepdim=True), False)
    return logits.masked_fill(drop, NEG_INF)


def _per_row(out: torch.Tensor, generators: list[torch.Generator | None], shared: torch.Generator | None,
             draw) -> torch.Tensor:
    """Fills `out` [B, ...] with `draw(tensor, generator)` (an in-place random fill): a row with its own
    generator draws only from it, so a seeded row's draws do not depend on which other rows share the batch; the
    other rows draw together from `shared`."""
    shared_rows = [i for i, g in enumerate(generators) if g is None]
    if len(shared_rows) == len(generators):  # no seeded row: one draw for the batch, no scatter
        return draw(out, shared)
    if shared_rows:
        out[shared_rows] = draw(torch.empty_like(out[shared_rows]), shared)
    for i, g in enumerate(generators):
        if g is not None:
            draw(out[i], g)
    return out


SAMPLE_BLOCK = 1024


def draw_tokens(probs: torch.Tensor, generators: list[torch.Generator | None],
                shared: torch.Generator | None, block: int = SAMPLE_BLOCK) -> torch.Tensor:
    """long [B]: one token per row from `probs` [B, V] (not necessarily normalised), by the exponential race
    (gpt-fast, vLLM: the argmax of p / E with E ~ Exp(1) samples p exactly) run in two levels: a race among
    blocks of `block` tokens by their mass, then among the tokens of the chosen block. Exact (P(block) times
    P(token | block)), and it draws V / block + block numbers per row instead of V (the one-level race cost ~100
    ms per step at 16 x 152k on a CPU).

    A race's winner changes only when two candidates tie within rounding, so a seeded row keeps its tokens when
    its logits move by a rounding error: forwards round differently at other batch sizes and paddings (a GPU's
    kernels, and a CPU's too), and an inverse CDF, whose prefix sums shift with every such error, changed 4 of 10
    seeded 64-token answers when other requests shared the batch. E is kept above 0 and zero-probability
    blocks and tokens score 0, so they are never chosen over a positive one."""
    rows, width = probs.shape
    full = width // block
    sums = probs[:, : full * block].reshape(rows, full, block).sum(dim=-1)
    if full * block < width:  # the last, partial block
        sums = torch.cat([sums, probs[:, full * block:].sum(dim=-1, keepdim=True)], dim=1)
    chosen = first_max(sums / _exponentials(rows, sums.shape[1], probs.device, generators, shared))
    ids = chosen.unsqueeze(1) * block + torch.arange(block, device=probs.device)
    inside = torch.where(ids < width, probs.gather(1, ids.clamp(max=width - 1)), 0.0)
    return chosen * block + first_max(inside / _exponentials(rows, block, probs.device, generators, shared))


def _exponentials(rows: int, width: int, device: torch.device, generators: list[torch.Generator | None],
                  shared: torch.Generator | None) -> torch.Tensor:
    """float [rows, width] of Exp(1) draws (`_per_row`), each -log U with U uniform in (0, 1): above 0, and
    3x faster than `exponential_` on a CPU."""
    uniform = _per_row(torch.empty((rows, width), device=device, dtype=torch.float32), generators, shared,
                       lambda t, g: t.uniform_(generator=g))
    return uniform.clamp_(min=torch.finfo(torch.float32).tiny).log_().neg_()


def first_max(logits: torch.Tensor) -> torch.Tensor:
    """long [B]: argmax per row (the first index among ties). `max(dim).indices` gives the same index and runs
    about 3x faster than `argmax` on a CPU (measured at 16 x 152k)."""
    return logits.max(dim=-1).indices


@dataclass
class SamplingBatch:
    """Per-row sampling settings of the running batch as device tensors, built by the batch owner."""

    temperature: torch.Tensor  # float [B]; 1.0 on greedy rows
    greedy: torch.Tensor  # bool [B]
    top_k: torch.Tensor  # long [B]; 0 disables
    top_p: torch.Tensor  # float [B]
    min_p: torch.Tensor  # float [B]
    repetition: torch.Tensor  # float [B]
    frequency: torch.Tensor  # float [B]
    presence: torch.Tensor  # float [B]
    bias_rows: torch.Tensor  # long [N]
    bias_cols: torch.Tensor  # long [N]
    bias_values: torch.Tensor  # float [N]
    unsampled: torch.Tensor  # long [U]: ids that are no token (padded logits, `[PADnnnn]` artefacts), never sampled
    mirostat: torch.Tensor  # bool [B]
    mirostat_mu: torch.Tensor  # float [B]
    generators: list[torch.Generator | None]
    any_penalty: bool
    any_top_k: bool
    any_top_p: bool
    any_min_p: bool
    any_mirostat: bool
    any_temperature: bool  # some row's temperature is not 1 (else the division is skipped)
    all_greedy: bool
    any_greedy: bool
    top_logprobs: int  # max alternatives any row asked for (0..20)
    want_logprobs: bool


@dataclass
class StepOutput:
    """Host-side results of one step, one entry per row."""

    tokens: list[int]
    logprobs: list[float]  # raw logprob of the sampled token
    chosen_prob: list[float]  # probability of the sampled token in the final distribution (mirostat)
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]
    empty: list[bool]  # the row's allowed set was empty: error, token meaningless
    raw_logprobs: torch.Tensor | None = None  # [B, V] on the device, when logprobs were asked for

    def replace_token(self, row: int, token: int) -> None:
        """The row appends `token` instead of the sampled one (a grammar's budget rule): its logprob follows
        (one small device-to-host copy, only in this rare case)."""
        self.tokens[row] = token
        if self.raw_logprobs is not None:
            self.logprobs[row] = float(self.raw_logprobs[row, token])


def sample_step(logits: torch.Tensor, batch: SamplingBatch, bitmask: torch.Tensor | None,
                counts: torch.Tensor, prompt_mask: torch.Tensor, shared: torch.Generator | None,
                empty: list[bool] | None = None,
                ends_banned: tuple[torch.Tensor, torch.Tensor] | None = None) -> StepOutput:
    """logits [B, V] (any float dtype) -> one StepOutput, with exactly one device-to-host copy. `bitmask` allows
    some token in every row (`unmask_empty_rows`); `empty` flags the rows whose own mask allowed none;
    `ends_banned` (rows, columns): end tokens `min_tokens` bans in constrained rows this step, after the logprobs,
    as the logit bias bans them in the others."""
    logits = logits.float()
    if bitmask is not None:
        apply_bitmask(logits, bitmask)
    if batch.unsampled.numel():  # (as a mask, before the logprobs: no alternative listed is one of them)
        logits.index_fill_(1, batch.unsampled, NEG_INF)
    raw_logprobs = torch.log_softmax(logits, dim=-1) if batch.want_logprobs else None

    if ends_banned is not None:
        logits = logits.index_put(ends_banned, torch.tensor(NEG_INF, device=logits.device))
    logits = apply_logit_bias(logits, batch.bias_rows, batch.bias_cols, batch.bias_values)
    if batch.any_penalty:
        logits = apply_penalties(logits, counts, prompt_mask, batch.repetition, batch.frequency, batch.presence)
    greedy_tokens = first_max(logits) if batch.any_greedy else None
    if batch.all_greedy:
        tokens = greedy_tokens
        chosen_prob = torch.ones_like(logits[:, 0])
    else:
        if batch.any_temperature:
            logits = logits / batch.temperature.unsqueeze(1)
        if batch.any_temperature or batch.any_penalty:
            # A tiny temperature or repetition penalty can take a logit past float32's range: +inf, which softmax
            # turns into NaN (and the draw into a token id past the vocabulary). The largest float is still first.
            logits = logits.clamp(max=torch.finfo(logits.dtype).max)
        if batch.any_mirostat:
            truncated = apply_mirostat(logits, batch.mirostat_mu)
            logits = torch.where(batch.mirostat.unsqueeze(1), truncated, logits)
        if batch.any_min_p:
            logits = apply_min_p(logits, batch.min_p)
        if batch.any_top_k:
            logits = apply_top_k(logits, batch.top_k)
        if batch.any_top_p:
            logits = apply_top_p(logits, batch.top_p)
        probs = torch.softmax(logits, dim=-1)
        sampled = draw_tokens(probs, batch.generators, shared)
        tokens = torch.where(batch.greedy, greedy_tokens, sampled) if batch.any_greedy else sampled
        chosen_prob = probs.gather(1, tokens.unsqueeze(1)).squeeze(1)

    k = batch.top_logprobs
    columns = [tokens.float().unsqueeze(1), chosen_prob.unsqueeze(1)]
    if raw_logprobs is not None:
        columns.append(raw_logprobs.gather(1, tokens.unsqueeze(1)))
        if k:
            top = raw_logprobs.topk(k, dim=-1)
            columns += [top.indices.float(), top.values]
    host = torch.cat(columns, dim=1).cpu()  # the one device-to-host copy of the step
    rows = host.tolist()
    out = StepOutput(tokens=[int(r[0]) for r in rows], chosen_prob=[r[1] for r in rows],
                     empty=empty or [False] * len(rows), logprobs=[], top_ids=[], top_logprobs=[],
                     raw_logprobs=raw_logprobs)
    if raw_logprobs is not None:
        out.logprobs = [r[2] for r in rows]
        if k:
            out.top_ids = [[int(x) for x in r[3:3 + k]] for r in rows]
            out.top_logprobs = [r[3 + k:3 + 2 * k] for r in rows]
    return out
