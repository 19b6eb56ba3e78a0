"""TextWorld text adventures, generated from a seed by TextWorld's own challenges.

A game is built once per (challenge, level, seed) by the `textworld` package (its wheel carries the
Inform 7 compiler, so this works offline) and kept under the GRL cache directory; later resets load
the compiled game. A folder of existing TextWorld games (`.z8`/`.ulx` with their `.json`) can be
played instead: the seed picks one of them.

Only admissible commands reach the game. Anything else is reported invalid and changes nothing, so
no string the model writes can crash or advance the interpreter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import textworld
import textworld.challenges
import textworld.generator
from textworld import EnvInfos

from grl import models
from grl.envs.base import Env, step_info

# What easy / medium / hard mean for each challenge (its own settings; see `tw-make <challenge> --help`).
LEVELS: dict[str, dict[str, dict[str, Any]]] = {
    "tw-cooking": {
        "easy": {"recipe": 1, "take": 1, "go": 1, "open": False, "cook": False, "cut": False},
        "medium": {"recipe": 2, "take": 2, "go": 6, "open": True, "cook": False, "cut": False},
        "hard": {"recipe": 3, "take": 3, "go": 9, "open": True, "cook": True, "cut": True},
    },
    "tw-treasure_hunter": {"easy": {"level": 5}, "medium": {"level": 15}, "hard": {"level": 21}},
    "tw-coin_collector": {"easy": {"level": 5}, "medium": {"level": 15}, "hard": {"level": 110}},
    "tw-simple": {
        "easy": {"rewards": "dense", "goal": "detailed"},
        "medium": {"rewards": "balanced", "goal": "detailed"},
        "hard": {"rewards": "sparse", "goal": "brief"},
    },
}
# Settings a challenge requires but that do not define difficulty.
FIXED_SETTINGS: dict[str, dict[str, Any]] = {
    "tw-cooking": {"drop": False, "split": None},
    "tw-simple": {"test": False},
}
GAME_EXTENSIONS = (".z8", ".ulx")
# jericho warns on every load that it cannot track a TextWorld game's score; TextWorld tracks it. A filter
# set once, not `catch_warnings` per reset: that is not thread-safe and rollouts reset envs on threads.
warnings.filterwarnings("ignore", message=r"Game .* is not fully supported")
# Loading a game parses its rules with TextWorld's shared TatSu parser, which breaks when two threads use it.
_LOAD_LOCK = threading.Lock()
REQUESTED = EnvInfos(
    description=True,
    objective=True,
    admissible_commands=True,
    score=True,
    max_score=True,
    won=True,
    lost=True,
    facts=True,
    policy_commands=True,
)


def game_settings(challenge: str, level: str, seed: int) -> dict[str, Any]:
    """The challenge's settings for a level; the cooking recipe follows the seed too."""
    settings = {**LEVELS[challenge][level], **FIXED_SETTINGS.get(challenge, {})}
    if challenge == "tw-cooking":
        settings["recipe_seed"] = seed
    return settings


def generate_game(challenge: str, level: str, seed: int, root: Path | None = None) -> Path:
    """The compiled game file for (challenge, level, seed), built and cached on first use.

    TextWorld iterates over sets while generating, so the game's bytes follow the hash seed: it is
    built in a child process with PYTHONHASHSEED=0, the same game in every process on every machine.
    """
    key = "-".join(f"{k}={v}" for k, v in sorted(LEVELS[challenge][level].items()))
    root = root or models.cache_dir() / "textworld"
    target = root / f"textworld-{textworld.__version__}" / challenge / key / f"seed{seed}"

    def build(out: Path) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        env = {
            **os.environ,
            "PYTHONHASHSEED": "0",
            "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
        }
        done = subprocess.run(
            [sys.executable, "-m", "grl.envs.textworld", challenge, level, str(seed), str(out)],
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"textworld: generating {challenge} {level} seed {seed} failed: {done.stderr.strip()[-2000:]}"
            )

    return models.publish_dir(build, target, marker="game.json") / "game.z8"


def _compile_game(challenge: str, level: str, seed: int, out: Path) -> None:
    options = textworld.GameOptions()
    options.seeds = seed
    options.path = str(out / "game.z8")
    _, make, _ = textworld.challenges.CHALLENGES[challenge]
    game = make(settings=game_settings(challenge, level, seed), options=options)
    textworld.generator.compile_game(game, options)


def game_text(feedback: str) -> str:
    """The game's reply without the interpreter's trailing prompt and status line."""
    reply = feedback.split("\n>", 1)[0] if "\n>" in feedback else feedback
    return re.sub(r"\n{3,}", "\n\n", reply).strip()


def normalize(command: str) -> str:
    return " ".join(command.split()).lower()


class TextWorldEnv(Env):
    """One TextWorld game per episode; actions are the game's commands, one per step.

    Reward is the change of the game's score; the episode ends when the game is won or lost.
    """

    def __init__(
        self,
        challenge: str = "tw-cooking",
        level: str = "easy",
        games_dir: str | None = None,
        list_commands: bool = True,
        cache_dir: str | None = None,
    ):
        if challenge not in LEVELS:
            raise ValueError(f"textworld: challenge must be one of {', '.join(LEVELS)}, got {challenge!r}")
        if level not in LEVELS[challenge]:
            raise ValueError(f"textworld: level must be one of easy, medium, hard, got {level!r}")
        self.challenge, self.level = challenge, level
        self.list_commands = bool(list_commands)
        self.cache_root = Path(cache_dir).expanduser() if cache_dir else None
        self.games: list[Path] = []
        if games_dir is not None:
            folder = Path(games_dir).expanduser()
            if not folder.is_dir():
                raise ValueError(f"textworld: games_dir {games_dir!r} is not a folder")
            self.games = sorted(p for p in folder.iterdir() if p.suffix in GAME_EXTENSIONS)
            if not self.games:
                raise ValueError(f"textworld: games_dir {games_dir!r} holds no .z8 or .ulx game")
            bare = [p.name for p in self.games if not p.with_suffix(".json").is_file()]
            if bare:
                raise ValueError(
                    f"textworld: games_dir {games_dir!r}: {bare[0]} has no .json beside it (TextWorld "
                    "games only: the .json holds the rules that give the valid commands)"
                )
        self._game = None
        self._state = None
        self._observation = ""
        self._walkthrough: list[str] = []
        self._over = False  # won or lost: the game takes no more commands

    def game_file(self, seed: int) -> Path:
        if self.games:
            return self.games[seed % len(self.games)]
        return generate_game(self.challenge, self.level, seed, self.cache_root)

    def reset(self, seed: int) -> str:
        self.close()
        game_file = self.game_file(seed)
        with _LOAD_LOCK:
            self._game = textworld.start(str(game_file), request_infos=REQUESTED)
            self._state = self._game.reset()
        self._walkthrough = list(self._state["policy_commands"] or [])
        self._over = False
        text = game_text(f"{self._state['objective']}\n\n{self._state['description']}")
        self._observation = self._render(text)
        return self._observation

    def _render(self, text: str) -> str:
        if not self.list_commands:
            return text
        return f"{text}\n\nValid commands: {', '.join(self.valid_actions())}"

    def valid_actions(self) -> list[str]:
        if self._state is None or self._over:
            return []
        return list(self._state["admissible_commands"] or [])

    def walkthrough(self) -> list[str]:
        """The winning command sequence from the start of the episode: TextWorld's shortest policy
        for the game's quest. (The `walkthrough` stored in cooking games may repeat `open door` on
        an open door, which is not an admissible command.)"""
        if not self._walkthrough:
            raise RuntimeError("textworld: call reset() before walkthrough()")
        return list(self._walkthrough)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._state is None:
            return "No game is running; call reset().", 0.0, True, step_info(False, False, False)
        if self._over:
            return (
                f"The game is over.\n\n{self._observation}",
                0.0,
                True,
                step_info(self._state["won"], False, False, score=float(self._state["score"])),
            )
        command = normalize(action) if isinstance(action, str) else ""
        by_text = {normalize(c): c for c in self.valid_actions()}
        if command not in by_text:
            note = f"That command is not available here: {action!r}."[:300]
            return (
                f"{note}\n\n{self._observation}",
                0.0,
                False,
                step_info(self._state["won"], False, False, score=float(self._state["score"])),
            )
        before = self._state
        self._state, _, done = self._game.step(by_text[command])
        reward = float(self._state["score"] - before["score"])
        changed = set(self._state["facts"]) != set(before["facts"])
        done = self._over = bool(done or self._state["won"] or self._state["lost"])
        self._observation = self._render(game_text(self._state.feedback))
        return (
            self._observation,
            reward,
            done,
            step_info(
                self._state["won"],
                True,
                changed,
                score=float(self._state["score"]),
                max_score=float(self._state["max_score"]),
            ),
        )

    def action_help(self) -> str:
        where = "listed with the state" if self.list_commands else "that the game accepts at this moment"
        return (
            "Give one game command per answer, in plain words (for example: go north, take key, "
            f"open door); only the valid commands {where} work."
        )

    def close(self) -> None:
        if self._game is not None:
            self._game.close()
        self._game, self._state = None, None


if __name__ == "__main__":  # the child process of generate_game
    _compile_game(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
