"""The records a rollout produces and the batch the trainer consumes.

`Turn` and `Episode` are plain Python (token ids as lists); `Batch` holds
`[rows, tokens]` tensors plus per-row metadata, one episode per row, and can
`select` rows (the driver cuts shards and mini-batches in grl/workers/sharding.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Turn:
    prompt_ids: list[
        int
    ]  # tokens added before this turn's reply: the whole first prompt, then template + env tokens
    response_ids: list[int]  # exactly what the engine sampled
    response_log_probs: list[float] | None
    reward: float  # env reward of the turn, format penalty included
    info: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = ""  # the engine's: "stop" or "length"
    state_key: str = ""  # the agent's key of the env state the reply acted on (GiGPO's anchor states)
    # Each response token's allowed set, (signed size, ids) as in grl/engines/constraint.py: the set
    # top-k/top-p
    # kept (grl/engines/kept_sets.py), else the grammar's; None when the reply was drawn from the full
    # softmax.
    response_allowed: list[tuple[int, tuple[int, ...]]] | None = None
    # `prompt_ids` are a whole prompt the reply was written to (the first turn's, or a windowed one:
    # agent_config.max_context_window), not a continuation of the turns before.
    new_context: bool = False


@dataclass
class Episode:
    task: str  # task instance name, e.g. simpleSokobanAgent
    group_id: int  # unique across tasks within one rollout
    seed: int
    turns: list[Turn]
    score: float  # episode reward: the sum of its turn rewards
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # env failure that ended the episode, if any
    error_kind: str | None = None  # exception | timeout | the kind of bad value (grl/envs/checks.py)
    blame: str | None = (
        None  # whose doing the failure was: policy | infra (grl/rollout/blame.py); infra if unset
    )
    env_warnings: int = 0  # values of the env repaired during the episode (grl/envs/checks.py)
    member: int = 0  # position of the agent within its group
    messages: list[dict[str, str]] = field(default_factory=list)  # the chat as the agent saw it, for logging
    policy_version: int = 0  # training steps behind the weights that sampled it (set by the trainer)

    @property
    def uid(self) -> str:
        """Unique within one rollout: group id and position in the group."""
        return f"{self.group_id}-{self.member}"

    @property
    def num_tokens(self) -> int:
        return sum(len(t.prompt_ids) + len(t.response_ids) for t in self.turns)


@dataclass
class Batch:
    """`tensors`: name -> `[rows, tokens]` (or `[rows]`) torch tensors;
    `meta`: name -> list with one entry per row."""

    tensors: dict[str, Any]
    meta: dict[str, list] = field(default_factory=dict)

    def __len__(self) -> int:
        for value in self.tensors.values():
            return int(value.shape[0])
        for value in self.meta.values():
            return len(value)
        return 0

    def __getitem__(self, name: str):
        return self.tensors[name]

    def __setitem__(self, name: str, value) -> None:
        self.tensors[name] = value

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def select(self, rows) -> Batch:
        """Rows by index list or boolean tensor."""
        import torch

        from grl.rollout.allowed_sets import take_rows

        index = torch.as_tensor(rows)
        if index.dtype == torch.bool:
            index = index.nonzero(as_tuple=True)[0]
        positions = index.tolist()
        return Batch(
            take_rows(self.tensors, index), {k: [v[i] for i in positions] for k, v in self.meta.items()}
        )
