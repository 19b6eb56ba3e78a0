"""GSM8K: grade-school math word problems, answered with one number.

The observation is the question; an action is the answer text. The number it
holds (the whole text when it is a number, else the last number in it) is
compared with the gold number after `####` exactly, as a decimal, so `1,000`,
`1000`, `$1000` and `1000.0` are all the same answer. A wrong answer gets
feedback and, while attempts remain, another try.

`data_path` is a local JSONL file (`{split}` replaced by `split`; default
`data/gsm8k/{split}.jsonl`, written by `scripts/install_dataset.sh --gsm8k`)
with `problem` and `answer` (the final number) per line, or GSM8K's own
`question` and `answer` (the solution ending in `#### N`); or a folder holding
`<split>.jsonl`; or `hf:openai/gsm8k` to read the hub (config `hub_config`).
See grl/envs/data.py for the lookup, the cache and the errors.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import NamedTuple

from grl.envs.base import Env, step_info
from grl.envs.data import load_records, question_text

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

INSTALL = "scripts/install_dataset.sh --gsm8k"


def _problem(row: dict, where: str) -> Problem:
    question, answer = question_text(row), row.get("answer")
    if question is None or not isinstance(answer, (str, int, float)) or isinstance(answer, bool):
        raise ValueError(f"gsm8k: {where}: needs a `problem` (or `question`) and an `answer`")
    # GRL's layout holds the final number; GSM8K's own holds the worked solution ending in `#### N`.
    gold = gold_answer(answer) if isinstance(answer, str) and "####" in answer else to_number(str(answer))
    if gold is None:
        raise ValueError(f"gsm8k: {where}: the answer {str(answer)[-40:]!r} is not a number")
    return Problem(question, gold)


def load_problems(data_path: str, split: str, hub_config: str | None = "main") -> list[Problem]:
    """The problems of a local JSONL file or folder, or of a hub dataset named `hf:<id>`
    (grl/envs/data.py)."""
    return load_records("gsm8k", data_path, split, hub_config, INSTALL, _problem)


# ---------------------------------------------------------------- env


class GSM8KEnv(Env):
    """One question per episode, chosen by the seed (question `seed % size`)."""

    def __init__(
        self,
        data_path: str = "data/gsm8k/{split}.jsonl",
        split: str = "train",
        hub_config: str | None = "main",
        max_attempts: int = 1,
        correct_reward: float = 10.0,
        wrong_reward: float = -0.1,
    ):
        if int(max_attempts) < 1:
            raise ValueError(f"gsm8k: max_attempts must be at least 1, got {max_attempts}")
        self.problems = load_problems(data_path, split, hub_config)
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
        info = step_info(
            self.solved,
            value is not None,
            value is not None,
            answer=None if value is None else str(value),
            attempts=self.attempts,
        )
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
