"""Agent programs in worker processes (grl/gateway/program_pool.py) against programs on threads (before issue
54).

    .venv/bin/python bench/bench_program_pool.py [--episodes 64] [--workers 8] [--repeats 3] [--imports
    agents]

The program is trivial (it builds its `openai` client and returns 1.0) so that what is timed is what
running it costs: on threads, `CallPool` calling the worker's own code in the trainer's process, as the
gateway did before; in processes, a `ProgramPool` sending the call to a worker and reading the reward back.
Printed: the pool's start-up (a cold pool playing `--workers` episodes, i.e. starting that many workers,
against threads playing them), the wall time per episode of `--episodes` episodes through a warm pool and
through threads (best of `--repeats`) and their ratio, and a worker's resident memory while idle.
`--imports agents` makes the program's module import that module too (the OpenAI Agents SDK: a framework
program's start-up). Both sides are polled the same way (every millisecond); the gateway's loop polls between
engine calls.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grl.gateway.contract import ProgramTask, load_program, reward_of  # noqa: E402
from grl.gateway.program_pool import ProgramPool  # noqa: E402
from grl.gateway.program_worker import ProgramCall, _call, rss_bytes  # noqa: E402
from grl.rollout.env_pool import CallPool  # noqa: E402

PROGRAM = "bench_program_pool:trivial"  # this file, importable in a worker: its folder is on sys.path
HEAVY_IMPORTS = (
    "GRL_BENCH_PROGRAM_IMPORTS"  # what the program's module imports besides, told through the environment
)

for name in filter(None, os.environ.get(HEAVY_IMPORTS, "").split(",")):
    importlib.import_module(name)


def trivial(client, task):
    return 1.0


def play(pool, calls: list[ProgramCall]) -> float:
    """Seconds `pool` takes to play `calls`; every reward must come back as 1.0."""
    start = time.perf_counter()
    for key, call in enumerate(calls):
        if isinstance(pool, CallPool):
            pool.submit(key, lambda call=call: reward_of(_call(load_program(call.program), call)))
        else:
            pool.submit(key, call, list)
    results = []
    while pool.pending:
        results += pool.collect(wait=0.001) if isinstance(pool, CallPool) else pool.collect()
        if isinstance(pool, ProgramPool):
            time.sleep(0.001)
    seconds = time.perf_counter() - start
    bad = [outcome for _, outcome in results if not outcome.ok or outcome.value != (1.0, {})]
    if len(results) != len(calls) or bad:
        sys.exit(
            f"bench_program_pool: {len(results)} of {len(calls)} episodes came back; first bad: {bad[:1]}"
        )
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--imports", default="", help="modules the program's module imports, comma-separated")
    args = parser.parse_args()
    os.environ[HEAVY_IMPORTS] = args.imports
    calls = [
        ProgramCall(PROGRAM, "http://127.0.0.1:9/v1", ProgramTask("bench", i, i, 0, {}), 30.0)
        for i in range(args.episodes)
    ]
    load_program(PROGRAM)  # the thread side imports it and openai once, as the trainer did
    import openai  # noqa: F401

    threads = CallPool(args.workers, 300.0, "program_timeout")
    pool = ProgramPool(args.workers, 300.0)
    try:
        cold_threads = play(threads, calls[: args.workers])
        cold_pool = play(pool, calls[: args.workers])
        idle_rss = [rss_bytes([pid]) / 2**20 for pid in pool.pids()]
        warm = {"threads": float("inf"), "processes": float("inf")}
        for _ in range(args.repeats):
            warm["threads"] = min(warm["threads"], play(threads, calls) / args.episodes)
            warm["processes"] = min(warm["processes"], play(pool, calls) / args.episodes)
    finally:
        threads.close()
        pool.close()

    print(
        f"start-up, {args.workers} episodes on a cold pool: threads {cold_threads:.3f} s, processes "
        f"{cold_pool:.3f} s"
    )
    print(
        f"per episode, {args.episodes} episodes on {args.workers} warm workers: threads "
        f"{warm['threads'] * 1e3:.2f} ms, "
        f"processes {warm['processes'] * 1e3:.2f} ms, ratio {warm['processes'] / warm['threads']:.2f}x "
        f"(+{(warm['processes'] - warm['threads']) * 1e3:.2f} ms an episode)"
    )
    print(f"idle worker resident memory: {min(idle_rss):.0f}-{max(idle_rss):.0f} MiB")


if __name__ == "__main__":
    main()
