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
    """Why a batch of two requests fails in the model's forward pass, or None: the steps the engine takes (two
    prompts of different lengths prefilled left-padded, one decode step, a newcomer prefilled and merged, another
    decode step). transformers 5.24's multi-head latent attention (DeepSeek-V3, MiniCPM3) fails on any padded
    batch of two rows, so such a model served one request at a time and failed every request that overlapped
    another with a 500 (QA round 27); it is refused at start-up instead."""
    runner = ModelRunner(loaded)
    try:
        kv, logits = runner.prefill([[1, 2, 3], [4, 5]])
        runner.decode(kv, logits.argmax(-1))
        newcomer, first = runner.prefill([[6]])
        kv.merge(newcomer)
        runner.decode(kv, torch.cat([logits.argmax(-1), first.argmax(-1)]))
    except Exception as exc:  # (whatever the model raises: the reason, in one line)
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return None
