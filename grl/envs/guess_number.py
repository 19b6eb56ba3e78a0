"""Guess the number: the example environment of docs/TUTORIAL.md.

The env hides an integer in [1, `max_number`] drawn from the seed. Each action is one guess; the
observation says whether the hidden number is higher or lower. Reward: -0.1 per guess, +10 for the
right one, which ends the episode with success. A guess that is not an integer in range is invalid
(reward -1, nothing learned). The episode also ends after `max_guesses` guesses. Binary search
always wins within ceil(log2(max_number + 1)) guesses.
"""

from __future__ import annotations

import random

from grl.envs.base import Env, step_info


class GuessNumberEnv(Env):
    def __init__(self, max_number: int = 100, max_guesses: int = 10):
        if max_number < 1 or max_guesses < 1:
            raise ValueError("guess_number: max_number and max_guesses must be at least 1")
        self.max_number = max_number
        self.max_guesses = max_guesses
        self.secret = 0
        self.guesses = 0
        self.low, self.high = 1, max_number  # what the guesses so far have ruled out

    def reset(self, seed: int) -> str:
        self.secret = random.Random(seed).randint(1, self.max_number)
        self.guesses = 0
        self.low, self.high = 1, self.max_number
        return self.render()

    def render(self) -> str:
        return (
            f"The number is between {self.low} and {self.high}. Guesses left: "
            f"{self.max_guesses - self.guesses}."
        )

    def legend(self) -> str:
        return f"I am thinking of a whole number from 1 to {self.max_number}."

    def valid_actions(self) -> list[str]:
        return [str(n) for n in range(1, self.max_number + 1)]

    def action_help(self) -> str:
        return "Answer with one whole number, your guess."

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        try:
            guess = int(action.strip())
        except (ValueError, AttributeError):
            guess = None
        if guess is None or not 1 <= guess <= self.max_number:
            return (
                f"{action!r} is not a number from 1 to {self.max_number}. " + self.render(),
                -1.0,
                False,
                step_info(False, action_is_valid=False, action_is_effective=False),
            )
        self.guesses += 1
        narrowed = self.low <= guess <= self.high
        if guess == self.secret:
            return f"{guess} is right!", 10.0, True, step_info(True, True, True)
        if guess < self.secret:
            self.low = max(self.low, guess + 1)
            hint = f"{guess} is too low."
        else:
            self.high = min(self.high, guess - 1)
            hint = f"{guess} is too high."
        done = self.guesses >= self.max_guesses
        return f"{hint} {self.render()}", -0.1, done, step_info(False, True, narrowed)
