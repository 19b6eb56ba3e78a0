"""Blame: every episode that ended early is the policy's doing or the infrastructure's, and only the
policy's are trained on.

The policy's (`POLICY`): what its own tokens did. Its format, its action budget, an invalid action, a
malformed tool call and its own context overflow keep the episode going or end it with their penalty
(grl/agents/base.py), without an error; an env, tool or program that raises `PolicyFault`
(grl/envs/base.py) ends it with the task's format penalty; a program whose clock ran out while the model's
replies kept it busy (`reply_timeout`, grl/gateway/program_pool.py) too. All of them are trained on.

The infrastructure's (`INFRA`): everything else that ended an episode. The env's or tool's exception
(`InfraFault` names a kind of its own), hang (`timeout`) or bad value (the kinds of grl/envs/checks.py);
a program's exception, timeout in its own code, crash, memory kill or leftover process
(grl/gateway/program_pool.py), or a reward it returned that is none (`bad_reward`). Such an episode is left
out before the batch is built (`without_infra_failures`), so it
takes no part in the loss, the reward normalisation, the group filter, the group baselines (GRPO,
RLOO, GiGPO and ReBN see only the members that remain) and the critic's targets; a group it leaves
with fewer than two members (of two or more) is left out whole, since a baseline of one compares nothing.
Counted per kind: `rollout/infra_failed_episodes`, `rollout/infra_failed/<kind>`, beside
`rollout/policy_failed_episodes`. Past `rollout.max_infra_failed_ratio` of a step's episodes the run
stops (grl/rollout/env_faults.py `check_infra_ratio`: one line, the kind, the count, the last error).
"""

from __future__ import annotations

from collections import Counter

from grl.envs.base import POLICY_KIND
from grl.rollout.types import Episode

POLICY, INFRA = "policy", "infra"


# The error kinds that are the policy's doing: a PolicyFault, and a program's clock run out while the model's
# replies kept it busy (grl/gateway/program_pool.py `timeout_blamed`).
POLICY_KINDS = frozenset({POLICY_KIND, "reply_timeout"})


def blame_of(error_kind: str | None) -> str | None:
    """Whose doing an episode's failure of this kind is: None for an episode that did not fail."""
    if error_kind is None:
        return None
    return POLICY if error_kind in POLICY_KINDS else INFRA


def infra_failed(episode) -> bool:
    """Whether the infrastructure ended the episode (an Episode, or the rollout's Slot that plays one): a
    failure not blamed on the policy is its."""
    return episode.error is not None and episode.blame != POLICY


def without_infra_failures(episodes: list[Episode]) -> tuple[list[Episode], int]:
    """The episodes to train on: all but the infrastructure's, and but the groups those leave with fewer
    than two members (of two or more). -> (kept, episodes left out)."""
    sizes = Counter(ep.group_id for ep in episodes)
    kept = [ep for ep in episodes if not infra_failed(ep)]
    left = Counter(ep.group_id for ep in kept)
    kept = [ep for ep in kept if left[ep.group_id] >= 2 or sizes[ep.group_id] < 2]
    return kept, len(episodes) - len(kept)


def blame_metrics(episodes: list[Episode]) -> dict[str, float]:
    """`rollout/infra_failed_episodes`, `rollout/infra_failed/<kind>` and `rollout/policy_failed_episodes`."""
    kinds = Counter(ep.error_kind or "exception" for ep in episodes if infra_failed(ep))
    return {
        "rollout/infra_failed_episodes": float(sum(kinds.values())),
        **{f"rollout/infra_failed/{kind}": float(n) for kind, n in sorted(kinds.items())},
        "rollout/policy_failed_episodes": float(
            sum(ep.error is not None and ep.blame == POLICY for ep in episodes)
        ),
    }
