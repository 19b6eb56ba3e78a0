"""The advantage-estimator registry: `@register_estimator` on the function that computes an estimator
declares it where it is defined, with what it reads.

An estimator's parameters say what it reads: batch inputs by their names in `BATCH_INPUTS`, and the
`algorithm` section's keys it lists in `hyperparameters`; any other parameter keeps its default. The
properties the rest of GRL reads (a critic, groups of two or more agents, the env states of the turns)
follow from the batch inputs, so an estimator cannot read an input nobody built for it.
No torch here, and nothing of GRL's: grl.config reads the registry before anything heavy loads, and
an estimator's module that names torch through `ImportedOnFirstUse` keeps that true (grl/algo/advantages.py).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

# What the dispatcher (grl/algo/dispatch.py) can hand an estimator, by parameter name.
BATCH_INPUTS = {
    "token_rewards": "`[batch, tokens]` rewards on the last generated token of a turn or episode",
    "loss_mask": "`[batch, tokens]` 1.0 on the tokens the model sampled",
    "turn_ids": "`[batch, tokens]` the turn each token belongs to (-1 on padding)",
    "episode_scores": "`[batch]` each episode's summed rewards on its generated tokens",
    "values": "`[batch, tokens]` the critic's values: reading them builds and trains the critic",
    "group_ids": "one id per episode, its group's: reading them asks for groups of two or more agents",
    "turn_states": (
        "`[batch, turns]` ids of the env state each turn acted on: reading them collects the states"
    ),
    "teacher_log_probs": "`[batch, tokens]` a teacher's log-probs of the sampled tokens: it needs a teacher",
    "student_log_probs": "`[batch, tokens]` the sampling policy's log-probs of the sampled tokens",
}


@dataclass(frozen=True)
class Estimator:
    name: str
    function: Callable  # (**inputs, **hyperparameters) -> (advantages, returns), both `[batch, tokens]`
    inputs: tuple[str, ...]  # the batch inputs it reads, in BATCH_INPUTS
    hyperparameters: tuple[str, ...]  # the `algorithm` keys it reads, each a parameter of the same name
    whiten: bool = False  # raw advantages that the dispatcher whitens over the loss mask, as verl does

    @property
    def needs_critic(self) -> bool:
        return "values" in self.inputs

    @property
    def group_based(self) -> bool:  # compares the agents of a group
        return "group_ids" in self.inputs

    @property
    def needs_teacher(self) -> bool:  # on-policy distillation: a teacher scores the sampled tokens
        return "teacher_log_probs" in self.inputs

    @property
    def needs_step_keys(self) -> bool:  # groups turns by the env state they acted on
        return "turn_states" in self.inputs


ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str, *, hyperparameters: tuple[str, ...] = (), whiten: bool = False) -> Callable:
    """Decorator: register the function as advantage estimator `name` (`algorithm.adv_estimator=name`).
    `hyperparameters`: the `algorithm` keys it reads, each a parameter of the same name; `whiten`: the
    dispatcher whitens its advantages over the loss mask."""

    def register(function: Callable) -> Callable:
        parameters = inspect.signature(function).parameters
        for key in hyperparameters:
            if key not in parameters:
                raise ValueError(
                    f"advantage estimator {name!r}: hyperparameter {key!r} is not a parameter of "
                    f"{function.__name__}"
                )
        for parameter in parameters.values():
            unknown = parameter.name not in BATCH_INPUTS and parameter.name not in hyperparameters
            if unknown and parameter.default is inspect.Parameter.empty:
                raise ValueError(
                    f"advantage estimator {name!r}: parameter {parameter.name!r} of {function.__name__} is "
                    "neither a "
                    f"batch input ({', '.join(BATCH_INPUTS)}) nor a hyperparameter, and has no default"
                )
        inputs = tuple(p for p in parameters if p in BATCH_INPUTS)
        ESTIMATORS[name] = Estimator(name, function, inputs, tuple(hyperparameters), whiten)
        return function

    return register


class ImportedOnFirstUse:
    """Stands for a module and imports it when one of its attributes is first read, so that importing an
    estimator's module registers it without loading torch."""

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attribute: str):
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)


def get(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of: {', '.join(ESTIMATORS)}")
    return ESTIMATORS[name]
