"""The rollout without a turn barrier against the one with it, on a task whose turns take uneven time.

    .venv/bin/python bench/bench_turn_barrier.py [--model embedded] [--groups 4] [--group-size 4] [--data DIR]

The task is `gsm8kAgent_python_tool` (configs/agents.yaml) on the local GSM8K data (`--data`, default
/work/shared/data): a turn that runs Python waits for the sandbox (a child process, tens to hundreds of
milliseconds), a turn that answers returns at once. With the barrier (`rollout.turn_barrier=true`, the
default) every agent waits for the slowest env step of the turn before any generates again; without it an
agent asks for its next reply when its own step returns, and each engine call serves whoever waits.
Both run the same agents on the same seeds, alternately, `--repeats` times each; printed are the best wall
time of each, the time inside the engine, the engine calls, the turns and tool calls, and the ratio.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_rollout import TimedEngine  # noqa: E402 - the bench folder is the script's own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", help="tiny, embedded, a folder or a hub id")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-response-length", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data", default="/work/shared/data", help="folder holding gsm8k/train.jsonl")
    args = parser.parse_args()
    if not (Path(args.data) / "gsm8k" / "train.jsonl").exists():
        sys.exit(f"bench_turn_barrier: no gsm8k/train.jsonl under {args.data}; give --data")
    os.environ["GRL_DATA_DIR"] = args.data

    import torch

    from grl.config import load_config, run_sections
    from grl.engines.base import SamplingParams
    from grl.engines import EngineOptions
    from grl.engines.hf import HFEngine
    from grl.rollout import MultiTurnRollout, task_specs

    torch.set_num_threads(args.threads)
    task = "gsm8kAgent_python_tool"
    cfg = load_config(
        [
            f"model_path={args.model}",
            f"rollout.training=[{task}]",
            f"rollout.validation=[{task}]",
            f"rollout.agent_group_num=[{args.groups}]",
            f"rollout.agent_group_size=[{args.group_size}]",
            f"max_response_length={args.max_response_length}",
            "max_prompt_length=2048",
            f"{task}.agent_config.max_turns={args.max_turns}",
            "rollout.env_workers=16",
        ]
    )
    engine = HFEngine(args.model, EngineOptions(dtype="bfloat16", device="cpu"))
    timed = TimedEngine(engine)
    run = run_sections(cfg)
    rollout = MultiTurnRollout.from_config(run.rollout, run.data, run.tools, timed, engine.tokenizer)
    sampling = SamplingParams(temperature=1.0, seed=0)
    engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2, seed=0))  # warm-up

    best = {True: (math.inf, 0.0, 0, None), False: (math.inf, 0.0, 0, None)}
    for _ in range(args.repeats):
        for barrier in (True, False):
            timed.seconds, timed.calls = 0.0, 0
            start = time.perf_counter()
            result = rollout.run(
                task_specs(run.rollout, run.tasks), base_seed=0, sampling=sampling, turn_barrier=barrier
            )
            wall = time.perf_counter() - start
            if wall < best[barrier][0]:
                best[barrier] = (wall, timed.seconds, timed.calls, result)
    rollout.close()

    print(
        f"model {args.model}, {args.groups * args.group_size} agents of {task}, up to {args.max_turns} "
        "turns, "
        f"torch threads {args.threads}, best of {args.repeats}"
    )
    for barrier, (wall, inside, calls, result) in best.items():
        turns = sum(len(e.turns) for e in result.episodes)
        tools = sum(e.metrics.get("tool_calls", 0.0) for e in result.episodes)
        tokens = sum(len(t.response_ids) for e in result.episodes for t in e.turns)
        print(
            f"{'with the barrier' if barrier else 'without it':17} {wall:7.2f} s, engine {inside:6.2f} s in "
            f"{calls} calls, {turns} turns, {tools:.0f} tool calls, {tokens} sampled tokens"
        )
    print(f"without / with the barrier: {best[True][0] / best[False][0]:.2f}x the speed")


if __name__ == "__main__":
    main()
