"""Checks on every value an env hands to GRL, where it enters (the agent calls these).

An env may be written by someone else and may return anything. Nothing it returns may end a
run, and nothing malformed may reach the tokenizer, the metrics or the loss:

- `step()` must return a 4-tuple (or list) `(observation, reward, done, info)`; a 2- or a
  5-tuple (gymnasium's `terminated, truncated`) is an error of kind `result`.
- `reward` must be a real number (int, float, bool or a numpy scalar): anything else is kind
  `reward`; NaN, +inf and -inf are kind `nonfinite_reward`.
- `done` must be a bool (or a numpy bool): kind `done`.
- `info` must be a mapping: kind `info`.
- the observation of `reset()` and `step()` must be a `str`: bytes, numbers or None are kind
  `observation`. A valid observation is repaired, never refused: lone surrogates and NUL
  characters (which tokenizers and C strings cannot take) become U+FFFD (kind
  `observation_repaired`), and text beyond `MAX_OBSERVATION_CHARS` characters is cut off with a
  note to the model saying so (kind `observation_cut`).
- `valid_actions()`, under valid-action decoding, must return None (free text) or a non-empty
  list of non-empty strings that are clean text: anything else is kind `valid_actions`.

An error raises `EnvValueError`: the agent ends the episode as an env error, the infrastructure's
doing (the rollout gives it the env-error penalty, logs it once per task and kind, counts it in
`<task>/env_errors` and `rollout/infra_failed/<kind>`, and leaves it out of training:
grl/rollout/blame.py). A value of any shape is caught here, so none can end the run. A
repair is a `Repair` note: the episode goes on, the rollout counts it in `<task>/env_warnings`.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# About 4k tokens, the default rollout.max_episode_length: a longer observation could not be
# trained on anyway, and tokenizing megabytes every turn would stall the rollout.
MAX_OBSERVATION_CHARS = 16_384

_UNSAFE_CHARS = re.compile("[\x00\ud800-\udfff]")  # NUL and every surrogate code point
_REPR_CHARS = 60


# The kinds of EnvValueError: what each means is in the module doc.
VALUE_KINDS = frozenset(
    {"result", "reward", "nonfinite_reward", "done", "info", "observation", "valid_actions"}
)


class EnvValueError(ValueError):
    """A value from the env that breaks the contract; `kind` names which (see the module doc)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Repair:
    """A value from the env that was repaired, not refused."""

    kind: str  # observation_cut | observation_repaired
    detail: str


def describe(value: Any) -> str:
    """The value's type and a short repr, cheap even for a 10 MB value."""
    if isinstance(value, (str, bytes, bytearray)):
        text = repr(value[:_REPR_CHARS]) + ("..." if len(value) > _REPR_CHARS else "")
    else:
        text = repr(value)
        text = text[:_REPR_CHARS] + ("..." if len(text) > _REPR_CHARS else "")
    return f"{type(value).__name__} {text}"


def check_observation(value: Any, where: str) -> tuple[str, list[Repair]]:
    """The observation as safe text, and what was repaired. `where` is reset or step."""
    if not isinstance(value, str):
        raise EnvValueError(
            "observation", f"{where}() returned an observation that is not text: {describe(value)}"
        )
    repairs = []
    text = value
    if len(text) > MAX_OBSERVATION_CHARS:
        text = (
            text[:MAX_OBSERVATION_CHARS]
            + f"\n[observation cut: {len(value)} characters, only the first {MAX_OBSERVATION_CHARS} are "
            "shown]"
        )
        repairs.append(
            Repair(
                "observation_cut",
                f"{where}() returned an observation of {len(value)} characters; cut to "
                f"{MAX_OBSERVATION_CHARS}",
            )
        )
    text, replaced = _UNSAFE_CHARS.subn("\ufffd", text)
    if replaced:
        repairs.append(
            Repair(
                "observation_repaired",
                f"{where}() returned an observation with {replaced} NUL or "
                f"lone surrogate characters, replaced by U+FFFD: {describe(value)}",
            )
        )
    return text, repairs


def check_reward(value: Any) -> float:
    if not isinstance(value, numbers.Real):
        raise EnvValueError("reward", f"step() returned a reward that is not a number: {describe(value)}")
    reward = float(value)
    if not math.isfinite(reward):
        raise EnvValueError("nonfinite_reward", f"step() returned a non-finite reward: {describe(value)}")
    return reward


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or (
        type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    )


def check_step(result: Any) -> tuple[str, float, bool, dict[str, Any], list[Repair]]:
    """`env.step()`'s result checked: (observation, reward, done, info, repairs)."""
    if not isinstance(result, (tuple, list)) or len(result) != 4:
        size = f"a {len(result)}-tuple" if isinstance(result, (tuple, list)) else describe(result)
        raise EnvValueError(
            "result",
            f"step() must return (observation, reward, done, info), got {size}"
            + (
                " (gymnasium's terminated/truncated split is not GRL's contract)"
                if isinstance(result, (tuple, list)) and len(result) == 5
                else ""
            ),
        )
    observation, reward, done, info = result
    if not _is_bool(done):
        raise EnvValueError("done", f"step() returned a `done` that is not a bool: {describe(done)}")
    if not isinstance(info, Mapping):
        raise EnvValueError("info", f"step() returned an `info` that is not a dict: {describe(info)}")
    reward = check_reward(reward)
    observation, repairs = check_observation(observation, "step")
    return observation, reward, bool(done), dict(info), repairs


def check_valid_actions(value: Any) -> list[str] | None:
    """`env.valid_actions()` under valid-action decoding: None (free text) or the actions."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise EnvValueError(
            "valid_actions", f"valid_actions() must return a list of strings, got {describe(value)}"
        )
    if not value:
        raise EnvValueError(
            "valid_actions", "valid_actions() returned an empty list: the model has nothing to choose"
        )
    for action in value:
        if not isinstance(action, str) or not action.strip() or _UNSAFE_CHARS.search(action):
            raise EnvValueError(
                "valid_actions",
                f"valid_actions() must list non-empty strings of clean text, got {describe(action)} in "
                f"{describe(value)}",
            )
    return list(value)
