"""GEM's environments (github.com/axon-rl/gem, PyPI `gem-llm`) behind GRL's env contract.

`env_config`: `env_id`, a GEM id (`game:GuessTheNumber-v0-easy`, `rg:leg_counting`, ...), and `env_kwargs`,
passed to `gem.make`. Ids that need a model hub, a dataset download or a service (GEM's `math:`, `qa:`,
`code:`, the nltk word games) fail when the env is built, with one line naming the id.

How GEM's conventions map onto GRL's:
- One GEM env per GRL env, stepped directly. GEM's vector env resets an env in the very step that ends it
  (same-step auto-reset), so its last observation would be the next episode's first; it is not used.
- The observation is composed as GEM's ObservationWrapper composes it: `info["prefix"]`, the env's text
  ending in a newline, `info["suffix"]` (a game's suffix is its board and the request for a move). `done` is
  `terminated or truncated`; both are in `info`, with GEM's raw observation.
- GEM's games draw from the global `random` and `numpy.random` (seeded in `reset`, drawn again in `step`:
  2048's new tiles, Minesweeper's mines). Each GemEnv keeps its own state of both generators and swaps
  it in around every call to GEM, under one lock, so envs stepped on rollout threads stay independent
  and a seed always gives the same episode.
- GEM's reasoning-gym env draws a new dataset every `size` resets, which would make the question of a
  seed depend on how often the env was reset before; the adapter holds its reset counter at zero.
- Success: the episode ended inside the game (terminated, not truncated) with a positive reward, or a
  single-turn task scored 1. GEM has no validity flag: an action is valid when it is one that
  `valid_actions()` lists (games that can list them) or, elsewhere, when it holds a `\\boxed{}` answer,
  the only place GEM reads one from.
"""

from __future__ import annotations

import importlib.util
import logging
import random
import re
import threading
from typing import Any, Callable

import numpy as np

from grl.envs.base import Env, step_info
from grl.errors import first_line

if importlib.util.find_spec("gem") is None:  # the registry reports the env unavailable, with this reason
    raise ImportError("No module named 'gem' (install the pinned gem-llm: bash env_setup.sh)")

_RNG_LOCK = threading.Lock()
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_gem_module = None


def _gem():
    """`import gem`, once. GEM's package calls logging.basicConfig(level=INFO) on import, which would turn
    on every library's INFO records in this process; the root logger is put back as it was."""
    global _gem_module
    if _gem_module is None:
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        import gem

        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
        _gem_module = gem
    return _gem_module


def _boxed(action: str) -> str | None:
    """The last `\\boxed{...}` content, spaces collapsed and lower-cased: the key two actions share when
    GEM reads them as the same move."""
    found = _BOXED.findall(action)
    return " ".join(found[-1].split()).lower() if found else None


# The moves a game accepts now, read from its state (GEM has no method for it). Keyed by class name.
def _guess_the_number(game) -> list[str]:
    return [
        f"\\boxed{{{n}}}"
        for n in range(max(game.min_number, 1), game.max_number + 1)
        if n not in game.previous_guesses
    ]


def _tower_of_hanoi(game) -> list[str]:
    def legal(
        src: str, dst: str
    ) -> bool:  # GEM also takes a disk back onto its own tower, a move that does nothing
        return (
            src != dst
            and bool(game.board[src])
            and (not game.board[dst] or game.board[src][-1] < game.board[dst][-1])
        )

    return [f"\\boxed{{{s} {d}}}" for s in "ABC" for d in "ABC" if legal(s, d)]


def _game_2048(game) -> list[str]:
    return [f"\\boxed{{{d}}}" for d in ("up", "down", "left", "right") if game._is_valid_move(d)]


def _minesweeper(game) -> list[str]:
    cells = [(r, c) for r in range(game.rows) for c in range(game.cols) if not game.revealed[r][c]]
    return [f"\\boxed{{reveal {r} {c}}}" for r, c in cells if not game.flags[r][c]] + [
        f"\\boxed{{flag {r} {c}}}" for r, c in cells
    ]


LISTERS: dict[str, Callable[[Any], list[str]]] = {
    "GuessTheNumberEnv": _guess_the_number,
    "TowerofHanoiEnv": _tower_of_hanoi,
    "Game2048Env": _game_2048,
    "MinesweeperEnv": _minesweeper,
}


class GemEnv(Env):
    def __init__(self, env_id: str = "game:GuessTheNumber-v0-easy", env_kwargs: dict | None = None):
        if not isinstance(env_id, str) or not env_id:
            raise ValueError(f"gem: env_id must be a GEM env id such as game:Sokoban-v0-easy, got {env_id!r}")
        kwargs = dict(env_kwargs or {})
        gem = _gem()
        from gem.envs.registration import ENV_REGISTRY

        if env_id not in ENV_REGISTRY:
            raise ValueError(
                f"gem: env_id {env_id!r} is not a GEM env id (gem-llm lists {len(ENV_REGISTRY)}, "
                "e.g. game:GuessTheNumber-v0-easy, game:Sokoban-v0-easy, rg:leg_counting)"
            )
        self.env_id = env_id
        # a fixed generator state for the build: GEM's games reset once inside their constructor
        self._rng_state = (random.Random(0).getstate(), np.random.RandomState(0).get_state())
        try:
            self._game = self._call(gem.make, env_id, **kwargs)
        except Exception as err:  # noqa: BLE001 - a GEM id that cannot run here (hub, service, bad kwargs)
            raise ValueError(
                f"gem: env_id {env_id!r} cannot be built here: {first_line(err, with_type=True)}"
            ) from None
        self._lister = LISTERS.get(type(self._game.unwrapped).__name__)
        self._over = True

    def _call(self, fn: Callable, *args, **kwargs):
        """Run `fn` with this env's own `random` / `numpy.random` states as the global ones."""
        with _RNG_LOCK:
            outer = random.getstate(), np.random.get_state()
            random.setstate(self._rng_state[0])
            np.random.set_state(self._rng_state[1])
            try:
                return fn(*args, **kwargs)
            finally:
                self._rng_state = random.getstate(), np.random.get_state()
                random.setstate(outer[0])
                np.random.set_state(outer[1])

    @staticmethod
    def compose(observation: str, info: dict[str, Any]) -> str:
        """GEM's ObservationWrapper text for one observation: prefix + text ending in a newline + suffix."""
        text = str(observation)
        if text and not text.endswith("\n"):
            text += "\n"
        return f"{info.get('prefix', '')}{text}{info.get('suffix', '')}"

    def reset(self, seed: int) -> str:
        game = self._game.unwrapped
        if hasattr(game, "ds") and hasattr(game, "idx"):  # reasoning-gym: one dataset, whatever came before
            game.idx = 0
        observation, info = self._call(self._game.reset, seed=seed)
        self._over = False
        return self.compose(observation, info)

    def valid_actions(self) -> list[str] | None:
        if self._lister is None:
            return None
        return [] if self._over else self._lister(self._game.unwrapped)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        action = action if isinstance(action, str) else ""
        if self._over:
            return "The episode is over; call reset().", 0.0, True, step_info(False, False, False)
        listed = self.valid_actions()
        key = _boxed(action)
        valid = key is not None and (listed is None or key in {_boxed(a) for a in listed})
        observation, reward, terminated, truncated, info = self._call(self._game.step, action)
        reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        self._over = terminated or truncated
        success = terminated and reward > 0 and (not truncated or reward >= 1.0)
        return (
            self.compose(observation, info),
            reward,
            self._over,
            step_info(
                success,
                valid,
                valid,
                terminated=terminated,
                truncated=truncated,
                gem_observation=str(observation),
            ),
        )

    def action_help(self) -> str:
        return "Write your move inside \\boxed{}, in the form the game's instructions give."
