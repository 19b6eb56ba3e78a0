"""`compute_advantage`: run the advantage estimator the `algorithm` section names, its call built from
what it declares (grl/algo/registry.py): the batch inputs by name, the hyperparameters from the section."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from grl.algo.advantages import turn_ids_from_mask
from grl.algo.estimators import get
from grl.algo.masked import masked_whiten

if TYPE_CHECKING:
    from grl.schema import Algorithm

# Inputs an estimator may read that follow from the others when the caller leaves them out.
DERIVED_INPUTS = {
    "turn_ids": lambda inputs: turn_ids_from_mask(inputs["loss_mask"]),
    "episode_scores": lambda inputs: torch.where(inputs["loss_mask"] > 0, inputs["token_rewards"], 0.0).sum(
        -1
    ),
}


def compute_advantage(
    inputs: Mapping[str, Any], algorithm: Algorithm, *, whiten: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run estimator `algorithm.adv_estimator` -> (advantages, returns), both `[batch, tokens]`.

    `inputs`: batch inputs by name (grl.algo.registry.BATCH_INPUTS): `token_rewards` and `loss_mask`, and
    the others the estimator reads; `turn_ids` default to one turn per run of generated tokens and
    `episode_scores` to each row's summed rewards on generated tokens. `algorithm`: the typed `algorithm`
    section (grl.config.typed_section), whose keys the estimator's hyperparameters are.
    `whiten` whitens the advantages of the estimators registered with `whiten` (the GAE family) over the
    mask, as verl and RAGEN do; returns stay raw. REINFORCE++ whitens as part of the method; GRPO, RLOO
    and GiGPO are group-normalised, ReBN batch-normalised.
    """
    spec = get(algorithm.adv_estimator)
    call = {}
    for name in spec.inputs:
        value = inputs.get(name)
        if value is None and name in DERIVED_INPUTS:
            value = DERIVED_INPUTS[name](inputs)
        if value is None:
            raise ValueError(f"advantage estimator '{spec.name}' needs '{name}'")
        call[name] = value
    for key in spec.hyperparameters:
        if not hasattr(algorithm, key):
            raise ValueError(
                f"advantage estimator '{spec.name}' reads algorithm.{key}, which the algorithm section lacks"
            )
        call[key] = getattr(algorithm, key)
    advantages, returns = spec.function(**call)
    if whiten and spec.whiten:
        advantages = masked_whiten(advantages, inputs["loss_mask"])
    return advantages, returns
