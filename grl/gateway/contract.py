"""What an agent program is to GRL: `function(client, task)` (or `async def function(client, task)`) found by
its "package.module:function" path, told its episode by a `ProgramTask`, and returning a reward that
`reward_of` reads (grl/gateway/programs.py describes the whole contract; grl/gateway/program_worker.py
calls it)."""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from grl.gateway.episodes import EpisodeLog

MODEL_NAME = "grl-policy"


@dataclass(frozen=True)
class ProgramTask:
    """What a program is told about its episode."""

    task: str  # the task instance's name
    seed: int  # the episode's seed: the attempts of a group share it
    group: int
    attempt: int  # position within the group
    config: dict  # the task's env_config
    model: str = MODEL_NAME  # what to pass as `model` (the gateway serves one)


def load_program(path: str) -> Callable:
    """The callable named by "package.module:function"; ValueError with one line otherwise."""
    module_name, _, name = str(path).partition(":")
    if not module_name or not name:
        raise ValueError(f"program {path!r}: expected 'package.module:function'")
    if os.getcwd() not in sys.path:  # a program of the user's own, next to where they run (as uvicorn does)
        sys.path.append(os.getcwd())
    try:
        target = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any import failure is the config's to report
        raise ValueError(
            f"program {path!r}: cannot import {module_name}: {type(err).__name__}: {err}"
        ) from None
    for part in name.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise ValueError(f"program {path!r}: {module_name} has no callable {name}")
    return target


def final_messages(episode: EpisodeLog) -> list[dict]:
    """The messages a program's reward function is given: the last call's, then its reply."""
    last = episode.calls[-1] if episode.calls else None
    return [*last.messages, last.returned] if last else []


class ProgramValueError(ValueError):
    """A program returned something that is not a reward."""


def reward_of(result: Any) -> tuple[float, dict[str, float]]:
    """(reward, metrics) of what a program returned: a finite number, or a mapping with `reward` (a finite
    number) and metrics (finite numbers or bools, e.g. `success: True`)."""

    def number(value, what: str, flag_ok: bool = False) -> float:
        if (
            (isinstance(value, bool) and not flag_ok)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise ProgramValueError(
                f"{what} must be a finite number, got {type(value).__name__} {str(value)[:80]!r}"
            )
        return float(value)

    if isinstance(result, Mapping):
        if "reward" not in result:
            raise ProgramValueError(
                f"a returned mapping needs 'reward'; it has {sorted(map(str, result))[:8]}"
            )
        return number(result["reward"], "reward"), {
            str(k): number(v, str(k), True) for k, v in result.items() if k != "reward"
        }
    return number(result, "the returned reward"), {}
