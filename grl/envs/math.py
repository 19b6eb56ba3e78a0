"""Competition math (`math`): AIME 2024/2025, AMC 2023, MATH-500, Minerva math, or any set in the layout.

Data (`env_config`)
    data_path    a JSONL file with `problem` and `answer` per line (plus whatever the set has: `solution`,
                 `subject`, `level`, `id`...), `{split}` replaced by `split`; `question` is read for
                 `problem` and, without `answer`, the last `\\boxed{}` of `solution` is the answer, so the
                 hub layouts of these sets load as they are. `hf:<dataset id>` reads the hub instead
                 (`hub_config`). `scripts/install_dataset.sh --math` writes data/math/<set>/test.jsonl.
                 Lookup, cache and errors: grl/envs/data.py.
Episode
    `reset(seed)` shows problem `seed % n`. Each `step(answer)` is one attempt, graded by
    grl/envs/math_grading.py (math-verify, with a plain-text fallback). A right answer ends the episode;
    a wrong one is told so and, while attempts remain (`max_attempts`), the problem is shown again.
Reward
    `correct_reward` for a right answer, `wrong_reward` for each wrong or empty one (GRL: 10 and -0.1), so
    an episode's reward is the sum over its attempts. `success` is a right answer; `action_is_valid` and
    `action_is_effective`: the answer is not empty. Extras in info: `attempts`, `grading_timed_out`.
"""

from __future__ import annotations

from typing import NamedTuple

from grl.envs.base import Env, positive_int, step_info
from grl.envs.data import load_records, question_text
from grl.envs.math_grading import grade, last_boxed

INSTALL = "scripts/install_dataset.sh --math"


class Problem(NamedTuple):
    problem: str
    answer: str


def math_record(row: dict, where: str) -> Problem:
    """A problem of any of the sets' layouts (module docstring)."""
    answer = row.get("answer")
    if answer is None and isinstance(row.get("solution"), str):
        answer = last_boxed(row["solution"])
    problem = question_text(row)
    usable = isinstance(answer, (str, int, float)) and not isinstance(answer, bool) and str(answer).strip()
    if problem is None or not usable:
        raise ValueError(
            f"math: {where}: needs a `problem` (or `question`) and an `answer` (or a `solution` with a "
            f"\\boxed{{}} answer)"
        )
    return Problem(problem, str(answer).strip())


class MathEnv(Env):
    """One problem per episode, chosen by the seed; free-text answers."""

    def __init__(
        self,
        data_path: str,
        split: str = "test",
        hub_config: str | None = None,
        max_attempts: int = 1,
        correct_reward: float = 10.0,
        wrong_reward: float = -0.1,
        grading_timeout: float = 10.0,
    ):
        self.max_attempts = positive_int("math", "max_attempts", max_attempts)
        if not float(grading_timeout) > 0:
            raise ValueError(
                f"math: grading_timeout must be a positive number of seconds, got {grading_timeout!r}"
            )
        self.problems = load_records("math", data_path, split, hub_config, INSTALL, math_record)
        self.correct_reward = float(correct_reward)
        self.wrong_reward = float(wrong_reward)
        self.grading_timeout = float(grading_timeout)
        self.problem: Problem | None = None

    def reset(self, seed: int) -> str:
        self.problem = self.problems[int(seed) % len(self.problems)]
        self.attempts = 0
        self.solved = False
        return self.problem.problem

    def step(self, action: str):
        if self.problem is None:
            raise RuntimeError("math: step() before reset()")
        if self.solved or self.attempts >= self.max_attempts:
            return (
                self.problem.problem,
                0.0,
                True,
                step_info(self.solved, False, False, attempts=self.attempts),
            )
        answer = action.strip() if isinstance(action, str) else ""
        verdict = grade(self.problem.answer, answer, self.grading_timeout) if answer else None
        self.attempts += 1
        self.solved = bool(verdict and verdict.correct)
        done = self.solved or self.attempts >= self.max_attempts
        info = step_info(
            self.solved,
            bool(answer),
            bool(answer),
            attempts=self.attempts,
            grading_timed_out=bool(verdict and verdict.timed_out),
        )
        reward = self.correct_reward if self.solved else self.wrong_reward
        return self._feedback(answer, done), reward, done, info

    def _feedback(self, answer: str, done: bool) -> str:
        if self.solved:
            return "Correct."
        said = "No answer found in your reply." if not answer else f"{answer[:200]} is not the right answer."
        return said if done else f"{said} Try again.\n\n{self.problem.problem}"

    def action_help(self) -> str:
        return (
            "Answer with the final result only, in LaTeX where needed (e.g. \\frac{3}{4}, 2\\sqrt{3}, "
            "(-\\infty, 2])."
        )
