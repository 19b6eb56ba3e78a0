"""GSM8K: grade-school math word problems, answered with one number.

The observation is the question; an action is the answer text. The number it
holds (the whole text when it is a number, else the last number in it) is
compared with the gold number after `####` exactly, as a decimal, so `1,000`,
`1000`, `$1000` and `1000.0` are all the same answer. A wrong answer gets
feedback and, while attempts remain, another try.

`dataset_path` is a Hugging Face hub id (loaded with `datasets`, with
`dataset_config`), a local JSONL file with `question` and `answer` fields, or
a folder holding `<split>.jsonl`. Loaded problems are cached per source and
split for the life of the process, so a thousand agents share one copy.
"""

from __future__ import annotations

import json
import re
import threading
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import NamedTuple

from grl.envs import EnvUnavailable
from grl.envs.base import Env, step_info

# A number as people write it: optional minus (not one joining two numbers,
# as in `3-5`), digits with or without thousands commas, optional decimals.
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])-?\.\d+")
_WHOLE_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_NOISE = str.maketrans("", "", ",$% \t\n")


class Problem(NamedTuple):
    question: str
    gold: Decimal


def to_number(text: str) -> Decimal | None:
    """The number a whole string spells (`1,000`, `$5`, `12%`, `3.`), else None."""
    cleaned = text.translate(_NOISE).rstrip(".") if isinstance(text, str) else ""
    if not _WHOLE_NUMBER.fullmatch(cleaned):
        return None
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def extract_answer(text: str) -> Decimal | None:
    """The number of an answer: the whole text if it is one, else its last number."""
    if not isinstance(text, str):
        return None
    whole = to_number(text)
    if whole is not None:
        return whole
    numbers = _NUMBER.findall(text)
    return to_number(numbers[-1]) if numbers else None


def gold_answer(solution: str) -> Decimal | None:
    """The gold number of a GSM8K solution: what follows the last `####`."""
    if "####" not in solution:
        return None
    return to_number(solution.rsplit("####", 1)[1].strip())


# ---------------------------------------------------------------- loading

_CACHE: dict[tuple[str, str, str], list[Problem]] = {}
_LOCK = threading.Lock()


def _problem(row: dict, where: str) -> Problem:
    question, solution = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not isinstance(solution, str):
        raise ValueError(f"gsm8k: {where}: needs string fields `question` and `answer`")
    gold = gold_answer(solution)
    if gold is None:
        raise ValueError(f"gsm8k: {where}: the answer has no number after `####`")
    return Problem(question.strip(), gold)


def _read_jsonl(path: Path) -> list[Problem]:
    problems = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"gsm8k: {path}:{number}: not JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"gsm8k: {path}:{number}: not a JSON object")
            problems.append(_problem(row, f"{path}:{number}"))
    return problems


def _read_hub(hub_id: str, config: str, split: str) -> list[Problem]:
    where = f"dataset {hub_id!r} (config {config!r}, split {split!r})"
    hint = "set env_config.dataset_path to a local GSM8K JSONL file"
    try:
        import datasets
    except ImportError:
        raise EnvUnavailable(f"gsm8k: loading {where} from the hub needs the `datasets` package; {hint}") from None
    try:
        rows = datasets.load_dataset(hub_id, config, split=split)
    except Exception as err:  # the hub, the network and the cache fail in many ways
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise EnvUnavailable(f"gsm8k: cannot load {where} from the Hugging Face hub ({reason}); {hint}") from None
    return [_problem(row, f"{hub_id} row {i}") for i, row in enumerate(rows)]


def _looks_local(path: str) -> bool:
    return path.startswith(("/", ".", "~")) or path.endswith((".jsonl", ".json"))


def load_problems(dataset_path: str, split: str, dataset_config: str = "main") -> list[Problem]:
    """The problems of a hub id, JSONL file or folder; cached per (path, split, config)."""
    key = (str(dataset_path), str(split), str(dataset_config))
    with _LOCK:
        if key not in _CACHE:
            path = Path(dataset_path).expanduser()
            if path.is_dir():
                path = path / f"{split}.jsonl"
            if path.is_file():
                problems = _read_jsonl(path)
            elif _looks_local(str(dataset_path)) or Path(dataset_path).expanduser().is_dir():
                raise FileNotFoundError(f"gsm8k: dataset_path {str(path)!r} does not exist")
            else:
                problems = _read_hub(str(dataset_path), str(dataset_config), str(split))
            if not problems:
                raise ValueError(f"gsm8k: dataset_path {str(dataset_path)!r} (split {split!r}) holds no problems")
            _CACHE[key] = problems
        return _CACHE[key]


# ---------------------------------------------------------------- env

class GSM8KEnv(Env):
    """One question per episode, chosen by the seed (question `seed % size`)."""

    def __init__(
        self,
        dataset_path: str = "openai/gsm8k",
        split: str = "train",
        dataset_config: str = "main",
        max_attempts: int = 1,
        correct_reward: float = 10.0,
        wrong_reward: float = -0.1,
    ):
        if int(max_attempts) < 1:
            raise ValueError(f"gsm8k: max_attempts must be at least 1, got {max_attempts}")
        self.problems = load_problems(dataset_path, split, dataset_config)
        self.max_attempts = int(max_attempts)
        self.correct_reward = float(correct_reward)
        self.wrong_reward = float(wrong_reward)
        self.problem: Problem | None = None

    def reset(self, seed: int) -> str:
        self.problem = self.problems[int(seed) % len(self.problems)]
        self.attempts = 0
        self.solved = False
        return self.problem.question

    def step(self, action: str):
        if self.problem is None:
            raise RuntimeError("gsm8k: step() before reset()")
        value = extract_answer(action)
        if self.solved or self.attempts >= self.max_attempts:
            return self.problem.question, 0.0, True, step_info(self.solved, False, False, answer=None)
        self.attempts += 1
        self.solved = value is not None and value == self.problem.gold
        done = self.solved or self.attempts >= self.max_attempts
        reward = self.correct_reward if self.solved else self.wrong_reward
        info = step_info(self.solved, value is not None, value is not None,
                         answer=None if value is None else str(value), attempts=self.attempts)
        return self._feedback(value, done), reward, done, info

    def _feedback(self, value: Decimal | None, done: bool) -> str:
        if self.solved:
            return "Correct."
        said = "No number found in your answer." if value is None else f"{value} is not the right answer."
        if done:
            return said
        left = self.max_attempts - self.attempts
        return f"{said} Try again ({left} attempt{'s' if left != 1 else ''} left).\n\n{self.problem.question}"

    def action_help(self) -> str:
        return "Answer with the final number only (no units)."
