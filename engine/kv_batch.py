"""The running batch's KV cache and attention mask: rows join (merge), leave (select) and padding is trimmed.

Baseline proven on transformers 5.x `DynamicCache`: rows are left-padded; a newcomer mini-batch is padded on
the left to the running length (or the running batch to the newcomers') and concatenated along the batch axis;
leaving rows are dropped with `batch_select_indices`, then columns that are padding in every row are cut on the
left. The cache is built without the model config, so every layer is a full-attention `DynamicLayer` (sliding
windows stay correct through the attention mask; `DynamicSlidingWindowLayer.cumulative_length` would not survive
a merge). Never samples, never decodes text.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class KVBatch:
    """cache: DynamicCache of B rows; mask: long [B, L], 1 on real tokens; positions: long [B] next position."""

    def __init__(self, cache: DynamicCache, mask: torch.Tensor, positions: torch.Tensor):
        self.cache = cache
        self.mask = mask
        self.positions = positions

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def select(self, indices: list[int]) -> None:
        """Keep (and reorder, or repeat for forks) these rows; then trim all-padding columns."""
        idx = torch.tensor(indices, dtype=torch.long, device=self.mask.device)
        self.cache.batch_select_indices(idx)
        self.mask = self.mask[idx]
        self.positions = self.positions[idx]
        self.trim()

    def trim(self) -> None:
        if self.rows == 0:
            return
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if used.numel() else self.length
        if first > 0:
            for layer in self.cache.layers:
                if layer.is_initialized and layer.keys.numel():
                    layer.keys = layer.keys[..., first:, :]
                    layer.values = layer.values[..., first:, :]
            self.mask = self.mask[:, first:]

    def merge(self, other: "KVBatch") -> None:
        """Append `other`'s rows after ours (left-padding whichever is shorter)."""
        width = max(self.length, other.length)
        self._pad_left(width - self.length)
        other._pad_left(width - other.length)
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.keys = torch.cat([mine.keys, theirs.keys], dim=0)
            mine.values = torch.cat([mine.values, theirs.values], dim=0)
        self.mask = torch.cat([self.mask, other.mask], dim=0)
        self.positions = torch.cat([self.positions, other.positions], dim=0)

    def _pad_left(self, n: int) -> None:
        if n <= 0:
            return
        for layer in self.cache.layers:
            k, v = layer.keys, layer.values
            layer.keys = torch.cat([k.new_zeros(*k.shape[:-2], n, k.shape[-1]), k], dim=-2)
            layer.values = torch.cat([v.new_zeros(*v.shape[:-2], n, v.shape[-1]), v], dim=-2)
        self.mask = torch.cat([self.mask.new_zeros(self.rows, n), self.mask], dim=1)
