"""The environment contract every task implements.

An env is pure Python: text in, text out, seeded, no model and no Ray. The
agent layer turns its observations into chat messages; the env never sees a
prompt or a token.

What an env returns is checked where it enters GRL (grl/envs/checks.py), so an
env written by someone else can cost an episode, never the run. These end the
agent's episode as an env error (the env-error penalty on the failed turn,
counted in `<task>/env_errors`, logged once per task and kind with the seed,
the value's type and a short repr): a `step()` result that is not a 4-tuple;
a reward that is not a real number; a NaN or infinite reward (also counted in
`<task>/nonfinite_rewards`); a `done` that is not a bool; an `info` that is
not a dict; an observation (of `reset()` or `step()`) that is not a `str`;
under valid-action decoding, a `valid_actions()` that is empty, not a list,
or lists anything but non-empty clean strings. An exception or a call slower
than `rollout.env_step_timeout` ends the episode the same way. These are
repaired and the episode goes on (counted in `<task>/env_warnings`): an
observation longer than `MAX_OBSERVATION_CHARS` (16,384 characters) is cut,
with a note to the model; NUL and lone surrogate characters become U+FFFD.

Blame: every episode an env ends early is the policy's doing or the infrastructure's
(docs/CONTRACTS.md, "Blame"). An env says which by what it raises: `PolicyFault` when the action
itself is to blame (the episode keeps the task's format penalty and is trained on), `InfraFault`
(or any other exception, a bad value, a hang) when the env broke (the episode is left out of the
loss, the group baselines and the critic's targets, and counted in `rollout/infra_failed/<kind>`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parents[2]


class PolicyFault(Exception):
    """Raised by an env (or a tool, or an agent program) when the model's own action ended the episode: an
    action the env cannot even take in, a call the model made wrong. The episode ends with the task's format
    penalty and is trained on, as any other of the policy's mistakes."""


class InfraFault(Exception):
    """Raised by an env (or a tool, or an agent program) that cannot go on for reasons of its own: a service
    down, a file missing. Any other exception is taken the same way; this one names its `kind`, the metric
    `rollout/infra_failed/<kind>` it is counted in. The episode is left out of training."""

    def __init__(self, message: str, kind: str = "exception"):
        super().__init__(message)
        self.kind = kind


POLICY_KIND = "policy"  # the error kind of an episode a PolicyFault ended
_KIND = re.compile(r"[A-Za-z0-9_]{1,40}")


def fault_kind(err: BaseException) -> str:
    """The error kind of an exception an env raised: `policy` for a PolicyFault, the `kind` of an InfraFault
    (or of grl.envs.checks.EnvValueError) where it is a short name (letters, digits, `_`: it names a metric),
    `exception` for anything else."""
    if isinstance(err, PolicyFault):
        return POLICY_KIND
    kind = getattr(err, "kind", None)
    return kind if isinstance(kind, str) and _KIND.fullmatch(kind) and kind != POLICY_KIND else "exception"


class Env:
    """Base class of every environment.

    Subclasses implement `reset` and `step`; `legend` and `action_help` feed
    the first prompt so that the model is told the symbols and the action
    syntax by the env that defines them.
    """

    #: registered name, set by `grl.envs.register`
    name: str = ""

    def reset(self, seed: int) -> str:
        """Start a new episode; the same seed gives the same episode."""
        raise NotImplementedError

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply one action. `info` holds at least `success`,
        `action_is_valid` and `action_is_effective`."""
        raise NotImplementedError

    def valid_actions(self) -> list[str] | None:
        """The action strings `step` accepts as valid in the current state, or None where actions
        are free text (an answer, a SQL query). An action may hold one free-text slot written
        `{text}` (WebShop's `search[{text}]`). Constrained decoding (agent_config.action_decoding)
        lets the model write only these."""
        return None

    def legend(self) -> str:
        """What the symbols of the rendered state mean (may be empty)."""
        return ""

    def action_help(self) -> str:
        """The actions this env accepts, as a sentence for the prompt."""
        return ""

    def close(self) -> None:
        """Release files, connections or threads the env holds."""


def step_info(
    success: bool, action_is_valid: bool, action_is_effective: bool, **extra: Any
) -> dict[str, Any]:
    """The `info` dict of the contract, with task-specific extras."""
    return {
        "success": bool(success),
        "action_is_valid": bool(action_is_valid),
        "action_is_effective": bool(action_is_effective),
        **extra,
    }


def positive_int(env: str, key: str, value: Any) -> int:
    """An env_config value that must be a whole number >= 1 (bools and 2.5 refused)."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or number != value or isinstance(value, bool):
        raise ValueError(f"{env}: {key} must be a positive integer, got {value!r}")
    return number


def flag(env: str, key: str, value: Any) -> bool:
    """An env_config value that must be true or false (1 and "yes" refused)."""
    if not isinstance(value, bool):
        raise ValueError(f"{env}: {key} must be true or false, got {value!r}")
    return value


def resolve_data_path(path: str) -> Path:
    """A relative data path is taken from the working directory, else from the repository root
    (where scripts/install_dataset.sh puts data/), so runs work from any directory."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute() or candidate.exists():
        return candidate
    from_root = _REPO_ROOT / candidate
    return from_root if from_root.exists() else candidate
