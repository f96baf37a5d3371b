"""The forward passes: prefill a left-padded mini-batch of prompts, decode one token for every running row.

Owns tensors and the model call, nothing else: no sampling, no text, no request bookkeeping. Must only be used
from the engine thread.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from engine.kv_batch import KVBatch
from engine.model_loader import LoadedModel


class ModelRunner:
    def __init__(self, loaded: LoadedModel):
        self.model = loaded.model
        self.device = loaded.device
        self.pad_id = 0

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], all_logits: bool = False) -> tuple[KVBatch, torch.Tensor]:
        """Returns the mini-batch's KV and logits: [b, V] for the last position, or [b, L, V] when
        `all_logits` (prompt logprobs). Rows are left-padded to the longest prompt."""
        length = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), length), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, length - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, length - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
        cache = DynamicCache()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
                         use_cache=True, logits_to_keep=0 if all_logits else 1)
        positions = mask.sum(-1)
        logits = out.logits if all_logits else out.logits[:, -1, :]
        return KVBatch(out.past_key_values, mask, positions), logits

    @torch.inference_mode()
    def decode(self, kv: KVBatch, tokens: torch.Tensor) -> torch.Tensor:
        """One token per row (tokens long [B] on the device) -> logits [B, V]; grows `kv` by one column."""
        kv.mask = torch.cat([kv.mask, kv.mask.new_ones(kv.rows, 1)], dim=1)
        out = self.model(input_ids=tokens.unsqueeze(1), attention_mask=kv.mask,
                         position_ids=kv.positions.unsqueeze(1), past_key_values=kv.cache, use_cache=True,
                         logits_to_keep=1)
        kv.positions = kv.positions + 1
        return out.logits[:, -1, :]
