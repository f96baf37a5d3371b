"""OpenAI sampling fields -> engine `SamplingParams` (defaults, aliases, token-id checks). No tensors here."""

from __future__ import annotations

from engine.types import SamplingParams
from service.errors import invalid
from service.protocol import SamplingFields

GREEDY_BELOW = 1e-5  # a temperature below this is served as 0 (greedy)
MIROSTAT_TARGET = 1.5  # seed 002: the target perplexity when a request sets only `mirostat_lr`


def logit_bias(req: SamplingFields, vocab_size: int) -> dict[int, float]:
    """Token id -> bias. Ids are those of the tokenizer's vocabulary: a model's padded logits beyond it are no
    token (a bias of 100 on one made the model write ids that decode to nothing, to `max_tokens`)."""
    out = {}
    for key, value in (req.logit_bias or {}).items():
        digits = key.lstrip("0") or "0"  # (past 4300 digits `int` raises: a key that long was a 500)
        if len(digits) > len(str(vocab_size)) or int(digits) >= vocab_size:
            shown = digits if len(digits) <= 24 else f"{digits[:12]}...({len(digits)} digits)"
            raise invalid(f"logit_bias token id {shown} is out of range: the vocabulary has {vocab_size} tokens",
                          "logit_bias")
        token = int(digits)
        if token in out:  # ("5" and "05": one would silently win over the other)
            raise invalid(f"logit_bias names token {token} twice (keys with leading zeros name the same token)",
                          "logit_bias")
        out[token] = float(value)
    return out


def stop_token_ids(req: SamplingFields, vocab_size: int) -> tuple[int, ...]:
    """vLLM's `stop_token_ids`: ids of the tokenizer's vocabulary, as `logit_bias` keys are."""
    for token in req.stop_token_ids or ():
        if not 0 <= token < vocab_size:
            raise invalid(f"stop_token_ids holds {token}, not a token id: the vocabulary has {vocab_size} tokens",
                          "stop_token_ids")
    return tuple(dict.fromkeys(req.stop_token_ids or ()))


def sampling_params(req: SamplingFields, *, max_tokens: int, logits_width: int, vocab_size: int,
                    logprobs: bool = False, top_logprobs: int = 0, prompt_logprobs: int | None = None) -> SamplingParams:
    temperature = 1.0 if req.temperature is None else req.temperature
    top_p = 1.0 if req.top_p is None else req.top_p
    if top_p == 0.0:  # nucleus of zero mass: only the most likely token
        temperature = 0.0
        top_p = 1.0
    if temperature < GREEDY_BELOW:  # (as vLLM does: dividing by less can take logits past float32's range)
        temperature = 0.0
    top_k = req.top_k if req.top_k not in (None, -1) else 0
    if top_k >= logits_width:  # (keeps every token, as 0 does; and stays within a tensor's int64)
        top_k = 0
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=req.min_p or 0.0,
        seed=None if req.seed == -1 else req.seed,  # (-1: no seed, as vLLM and llama.cpp read it)
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=logit_bias(req, vocab_size),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        prompt_logprobs=prompt_logprobs,
        ignore_eos=bool(req.ignore_eos),
        stop_token_ids=stop_token_ids(req, vocab_size),
        min_tokens=req.min_tokens or 0,
        stop=req.stop_list,
        include_stop_str_in_output=bool(req.include_stop_str_in_output),
        skip_special_tokens=True if req.skip_special_tokens is None else req.skip_special_tokens,
        # (seed 002's defaults: target 1.5, rate 0.1; a rate alone asks for mirostat at the default target)
        mirostat_target=MIROSTAT_TARGET if req.mirostat_target is None and req.mirostat_lr is not None
        else req.mirostat_target,
        mirostat_lr=0.1 if req.mirostat_lr is None else req.mirostat_lr,
        n=req.n or 1,
    )
