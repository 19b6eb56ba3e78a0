"""The rollout engine as the driver sees it: generation and weight updates run in the actor ranks."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from grl.engines.base import Engine, NamedTensors, SamplingParams


class Ranks(Protocol):
    """What the proxy needs of its worker group (an ActorRolloutRefGroup, which builds the proxy)."""

    _closed: bool

    def call_ranks(self, ranks: list[int], method: str, per_rank_args: list[tuple]) -> list: ...


class EngineProxy(Engine):
    """The rollout engine as the driver sees it. Generation runs inside the
    actor ranks that hold an engine; prompts are split over them in order."""

    def __init__(self, group: Ranks, ranks: list[int]):
        self._group, self._ranks = group, ranks

    def generate(
        self, prompt_token_ids: list[list[int]], sampling: SamplingParams, constraints: list | None = None
    ) -> list:
        n, k = len(prompt_token_ids), len(self._ranks)
        bounds = [round(i * n / k) for i in range(k + 1)]
        busy = [i for i in range(k) if bounds[i + 1] > bounds[i]]
        # Engines seed request j with seed + j (or its own of request_seeds); shift each piece so every
        # prompt keeps the seed it would get from one engine (no two share a stream).
        pieces = [
            (
                prompt_token_ids[bounds[i] : bounds[i + 1]],
                _piece(sampling, bounds[i], bounds[i + 1]),
                None if constraints is None else constraints[bounds[i] : bounds[i + 1]],
            )
            for i in busy
        ]
        results = self._group.call_ranks([self._ranks[i] for i in busy], "engine_generate", pieces)
        return [out for part in results for out in part]

    def rows_within(self, row_tokens: int) -> int | None:
        """The prompts are split evenly over the ranks' engines: as many rows as the tightest holds, each."""
        held = self._group.call_ranks(
            self._ranks, "engine_call", [("rows_within", row_tokens)] * len(self._ranks)
        )
        return None if None in held else min(held) * len(held)

    def update_weights(self, named_tensors: NamedTensors) -> None:
        items = list(named_tensors.items()) if hasattr(named_tensors, "items") else list(named_tensors)
        self._group.call_ranks(self._ranks, "engine_update_weights", [(items,)] * len(self._ranks))

    def sleep(self, discard_weights: bool = False) -> None:
        self._group.call_ranks(self._ranks, "engine_call", [("sleep", discard_weights)] * len(self._ranks))

    def wake(self) -> None:
        self._group.call_ranks(self._ranks, "engine_call", [("wake",)] * len(self._ranks))

    def shutdown(self) -> None:
        if not self._group._closed:
            self._group.call_ranks(self._ranks, "engine_call", [("shutdown",)] * len(self._ranks))


def _piece(sampling: SamplingParams, start: int, end: int) -> SamplingParams:
    """The sampling of requests start..end of a batch, each keeping its seed."""
    if sampling.request_seeds is not None:
        return replace(sampling, request_seeds=sampling.request_seeds[start:end])
    return sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + start)
