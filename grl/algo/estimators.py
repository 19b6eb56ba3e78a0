"""The advantage estimators, each declared once with the properties the rest of GRL reads.

The config's choices for `algorithm.adv_estimator`, the checks that depend on an estimator (a
critic, groups of two or more agents), which workers the trainer builds and which inputs it hands
over all follow from these entries: a new estimator is its function plus one `register` line.
No torch here, so that the config can read the registry before anything heavy loads; an
estimator's module is imported when it first runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Estimator:
    name: str
    function: str  # "module:function": AdvantageInputs (grl/algo/dispatch.py) -> (advantages, returns)
    needs_critic: bool = False  # reads `values`, so the critic is built and trained
    group_based: bool = False  # compares the agents of a group (`group_ids`): groups need two or more
    needs_step_keys: bool = False  # groups turns by the env state they acted on (`turn_states`)
    whiten: bool = False  # raw advantages that the dispatcher whitens over the loss mask, as verl does

    def load(self) -> Callable:
        module, _, name = self.function.partition(":")
        return getattr(importlib.import_module(module), name)


ESTIMATORS: dict[str, Estimator] = {}


def register(name: str, function: str | Callable, **properties: bool) -> Estimator:
    """Declare an estimator by its function (or a "module:function" path) and its properties,
    the boolean fields of `Estimator`."""
    if not isinstance(function, str):
        function = f"{function.__module__}:{function.__qualname__}"
    ESTIMATORS[name] = Estimator(name, function, **properties)
    return ESTIMATORS[name]


def get(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of: {', '.join(ESTIMATORS)}")
    return ESTIMATORS[name]


register("gae", "grl.algo.dispatch:gae_estimator", needs_critic=True, whiten=True)
register("bi_level_gae", "grl.algo.dispatch:bi_level_gae_estimator", needs_critic=True, whiten=True)
register("weighted_gae", "grl.algo.dispatch:weighted_gae_estimator", needs_critic=True, whiten=True)
register("grpo", "grl.algo.dispatch:grpo_estimator", group_based=True)
register("rloo", "grl.algo.dispatch:rloo_estimator", group_based=True)
register("reinforce_plus_plus", "grl.algo.dispatch:reinforce_plus_plus_estimator")
register("gigpo", "grl.algo.dispatch:gigpo_estimator", group_based=True, needs_step_keys=True)
register("rebn", "grl.algo.dispatch:rebn_estimator")
