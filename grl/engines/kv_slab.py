"""A KV cache written in place: the HF engine's cache for one generate call.

transformers' DynamicCache appends a forward's keys and values with `torch.cat`, which copies the whole
cache: for the engine's batches (64 rows of a thousand cached tokens, 30 layers) that is a copy of every
layer's cache at the turn's prefill and again at each decoding step. The engine knows the columns a call
needs (the cached prefixes, the new prompt tokens, and room for the reply), so each layer here takes one
buffer of that size and a forward writes its columns into it; a longer reply grows it by half again.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class SlabLayer(DynamicLayer):
    """A DynamicLayer over a preallocated `[batch, heads, capacity, dim]` buffer; `keys`/`values` are
    views of its filled columns. A forward that would overflow it moves the cache to a buffer half as large
    again as it needs, so a long reply costs a few copies, not one a token."""

    def __init__(
        self,
        capacity: int,
        keys: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
        filled: int = 0,
    ):
        super().__init__()
        self.capacity = capacity
        self._key_buffer, self._value_buffer, self._filled = keys, values, filled
        if keys is not None:
            self._expose()

    def _expose(self) -> None:
        self.keys = self._key_buffer[:, :, : self._filled]
        self.values = self._value_buffer[:, :, : self._filled]
        self.dtype, self.device = self.keys.dtype, self.keys.device
        self.is_initialized = True

    def _moved(self, buffer: torch.Tensor) -> torch.Tensor:
        grown = buffer.new_empty((*buffer.shape[:2], self.capacity, buffer.shape[-1]))
        grown[:, :, : self._filled] = buffer[:, :, : self._filled]
        return grown

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self._key_buffer is None:
            batch, heads, _, dim = key_states.shape
            self._key_buffer = key_states.new_empty((batch, heads, self.capacity, dim))
            self._value_buffer = value_states.new_empty((batch, heads, self.capacity, dim))
        end = self._filled + key_states.shape[-2]
        if end > self.capacity:
            self.capacity = end + end // 2
            self._key_buffer = self._moved(self._key_buffer)
            self._value_buffer = self._moved(self._value_buffer)
        self._key_buffer[:, :, self._filled : end] = key_states
        self._value_buffer[:, :, self._filled : end] = value_states
        self._filled = end
        self._expose()
        return self.keys, self.values


def prefix_slab(
    prefixes: list[list[tuple[torch.Tensor, torch.Tensor]] | None], past: int, room: int, num_layers: int
) -> Cache:
    """A cache of `past + room` columns a layer; row i's prefix (per layer `(keys, values)` of
    `[heads, len, dim]`, or None for no prefix) right-aligned in the first `past`, zeros before it."""
    template = next((p for p in prefixes if p is not None), None)
    if template is None:
        return Cache(layers=[SlabLayer(past + room) for _ in range(num_layers)])
    layers = []
    for layer, (keys, values) in enumerate(template):
        heads, dim = keys.shape[0], keys.shape[-1]
        slab_keys = keys.new_empty((len(prefixes), heads, past + room, dim))
        slab_values = values.new_empty((len(prefixes), heads, past + room, dim))
        for row, prefix in enumerate(prefixes):
            length = 0 if prefix is None else prefix[layer][0].shape[1]
            # The padding is masked out, but a masked score times garbage can still be NaN: zero it.
            slab_keys[row, :, : past - length] = 0
            slab_values[row, :, : past - length] = 0
            if length:
                slab_keys[row, :, past - length : past] = prefix[layer][0]
                slab_values[row, :, past - length : past] = prefix[layer][1]
        layers.append(SlabLayer(past + room, slab_keys, slab_values, filled=past))
    return Cache(layers=layers)
