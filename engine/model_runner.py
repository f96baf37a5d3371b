"""The forward passes: prefill a left-padded mini-batch of prompts, decode one token for every running row.

Owns tensors and the model call, nothing else: no sampling, no text, no request bookkeeping. Must only be used
from the engine thread.
"""

from __future__ import annotations

import inspect
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import DynamicCache

from engine.kv_batch import KVBatch
from engine.model_loader import LoadedModel


# Every SDPA backend but cuDNN's. cuDNN attention (PyTorch's first choice on an H100) builds an execution graph
# for each new query/key length and caches it by shape; a decode step's key length is new at every step, so each
# step paid a build: 60 ms per step against 5 ms once the lengths had been seen (built-in model, H100, bf16,
# 2026-11-25; bench/README.md). Flash and memory-efficient attention take any length without a build.
ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class ModelRunner:
    def __init__(self, loaded: LoadedModel):
        self.model = loaded.model
        self.device = loaded.device
        self.pad_id = 0
        # transformers 5.24 renamed forward's `past_key_values` to `cache` (the old name goes in 5.40); models
        # whose forward still takes the old name get it.
        self.cache_kwarg = "cache" if "cache" in inspect.signature(self.model.forward).parameters \
            else "past_key_values"

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]]) -> tuple[KVBatch, torch.Tensor]:
        """Returns the mini-batch's KV and the last position's logits [b, V]. Rows are left-padded to the longest
        prompt."""
        length = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), length), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, length - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, length - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
        cache = DynamicCache()
        out = self._forward(cache, input_ids=ids, attention_mask=mask, position_ids=position_ids, logits_to_keep=1)
        return KVBatch(cache, mask, mask.sum(-1)), out.logits[:, -1, :]

    @torch.inference_mode()
    def prefill_chunk(self, cache: DynamicCache, prompt: list[int], start: int, end: int,
                      all_logits: bool) -> torch.Tensor:
        """Positions start..end of one prompt whose earlier positions are in `cache` (a prompt prefilled over
        several steps): grows the cache, returns the logits of every position [n, V] (`all_logits`, for prompt
        logprobs) or of the last one [1, V]."""
        ids = torch.tensor([prompt[start:end]], dtype=torch.long, device=self.device)
        out = self._forward(cache, input_ids=ids,
                            attention_mask=torch.ones((1, end), dtype=torch.long, device=self.device),
                            position_ids=torch.arange(start, end, device=self.device).unsqueeze(0),
                            logits_to_keep=0 if all_logits else 1)
        return out.logits[0]

    @torch.inference_mode()
    def decode(self, kv: KVBatch, tokens: torch.Tensor) -> torch.Tensor:
        """One token per row (tokens long [B] on the device) -> logits [B, V]; grows `kv` by one column."""
        kv.mask = torch.cat([kv.mask, kv.mask.new_ones(kv.rows, 1)], dim=1)
        out = self._forward(kv.cache, input_ids=tokens.unsqueeze(1), attention_mask=kv.mask,
                            position_ids=kv.positions.unsqueeze(1), logits_to_keep=1)
        kv.positions = kv.positions + 1
        return out.logits[:, -1, :]

    def _forward(self, cache: DynamicCache, **inputs):
        """The model call, with its KV cache and without cuDNN attention (ATTENTION_BACKENDS)."""
        with sdpa_kernel(ATTENTION_BACKENDS):
            return self.model(use_cache=True, **inputs, **{self.cache_kwarg: cache})


def batching_failure(loaded: LoadedModel) -> str | None:
    """Why the engine's steps give a model wrong logits, or None: two prompts of different lengths prefilled
    left-padded, one decode step, a newcomer prefilled and merged, another decode step, each row's last logits
    then compared with one forward pass over its whole sequence without a cache. transformers 5.24's multi-head
    latent attention (DeepSeek-V3, MiniCPM3) fails on any padded batch of two rows: such a model answered one
    request at a time and failed every two that overlapped with a 500 (QA round 27); RWKV ignores the cache it is
    given, so each step saw its own token alone (review)."""
    runner = ModelRunner(loaded)
    vocab = getattr(loaded.model.get_input_embeddings(), "num_embeddings", None) or loaded.logits_width
    prompts = [[i % vocab for i in p] for p in ([1, 2, 3], [4, 5], [6])]
    try:
        kv, logits = runner.prefill(prompts[:2])
        first = logits.argmax(-1)
        second = runner.decode(kv, first).argmax(-1)
        newcomer, alone = runner.prefill(prompts[2:])
        kv.merge(newcomer)
        last = runner.decode(kv, torch.cat([second, alone.argmax(-1)]))
        sequences = [prompts[0] + [int(first[0]), int(second[0])], prompts[2] + [int(alone.argmax(-1)[0])]]
        with torch.inference_mode():
            reference = [runner.model(input_ids=torch.tensor([seq], device=loaded.device), use_cache=False)
                         .logits[0, -1] for seq in sequences]
    except Exception as exc:  # (whatever the model raises: the reason, in one line)
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    for row, expected in zip((0, 2), reference):
        got = last[row].float()
        expected = expected.float()
        # (far wider than bf16's rounding: a model that loses its state is off by as much as its logits spread)
        if not torch.allclose(got, expected, rtol=0.0, atol=0.1 * float(expected.abs().max()) + 1e-3):
            return f"a row's logits after the engine's steps differ from one pass over its tokens by " \
                   f"{float((got - expected).abs().max()):.3g} (the model keeps state the engine cannot carry?)"
    return None
