"""TextWorld games: building a new seed against loading a cached one.

For each level of a challenge, the bench generates games for seeds nobody has built (into a fresh temporary
cache), then resets an env on the same seeds again, now loading them from that cache, and prints the mean
seconds of each and their ratio. It also times env steps along the walkthrough (admissible-command check
included), the cost a rollout pays per command.

Run: python bench/bench_textworld.py [--challenge tw-cooking] [--seeds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from grl.envs.textworld import LEVELS, TextWorldEnv  # noqa: E402


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--challenge", default="tw-cooking", choices=sorted(LEVELS))
    parser.add_argument("--seeds", type=int, default=3, help="new seeds per level")
    args = parser.parse_args()
    print(f"{args.challenge}: {args.seeds} new seeds per level; times are means per game")
    print(f"{'level':<8} {'new seed s':>11} {'cached s':>10} {'new / cached':>13} {'step ms':>8}")
    with tempfile.TemporaryDirectory() as cache:
        for level in LEVELS[args.challenge]:
            env = TextWorldEnv(challenge=args.challenge, level=level, cache_dir=cache)
            seeds = range(1000, 1000 + args.seeds)  # seeds the tests do not use
            new = [timed(lambda s=s: env.reset(s)) for s in seeds]
            cached = [timed(lambda s=s: env.reset(s)) for s in seeds]
            steps = []
            for seed in seeds:
                env.reset(seed)
                steps += [timed(lambda c=c: env.step(c)) for c in env.walkthrough()]
            env.close()
            new_s, cached_s = statistics.mean(new), statistics.mean(cached)
            print(
                f"{level:<8} {new_s:>11.2f} {cached_s:>10.3f} {new_s / cached_s:>12.0f}x "
                f"{1000 * statistics.mean(steps):>8.1f}"
            )


if __name__ == "__main__":
    main()
