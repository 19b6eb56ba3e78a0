"""Multi-turn rollout wall time against one plain batched generate call.

Runs `simpleSokobanAgent` groups through MultiTurnRollout with the HF engine,
counts the tokens the engine sampled, then has the same engine generate the
same number of tokens in a single batched call (the agents' first prompts,
eos ignored, equal lengths). The ratio is the price of multi-turn: one engine
call per turn with growing prompts, decoding, env steps and token
bookkeeping. The time spent inside the engine during the rollout is printed
too, so the rollout's own overhead is visible.

    python bench/bench_rollout.py --model tiny --groups 4 --group-size 4
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, embedded, a folder or a hub id")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-response-length", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs of each")
    args = parser.parse_args()

    import torch
    from omegaconf import OmegaConf

    from grl.agents import task_from_block
    from grl.config import CONFIG_DIR
    from grl.engines.base import SamplingParams
    from grl.engines import EngineOptions
    from grl.engines.hf import HFEngine
    from grl.rollout import MultiTurnRollout, TaskSpec

    torch.set_num_threads(args.threads)
    block = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "agents.yaml"), resolve=True)[
        "simpleSokobanAgent"
    ]
    block["agent_config"]["max_turns"] = args.max_turns
    task = TaskSpec(
        "simpleSokobanAgent", task_from_block("simpleSokobanAgent", block), args.groups, args.group_size
    )
    engine = HFEngine(args.model, EngineOptions(dtype="float32", device="cpu"))
    rollout = MultiTurnRollout(
        engine,
        engine.tokenizer,
        max_prompt_length=2048,
        max_response_length=args.max_response_length,
        env_workers=4,
    )
    sampling = SamplingParams(temperature=1.0, seed=0)
    engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2, seed=0))  # warm-up

    rollout_s = plain_s = math.inf
    for _ in range(args.repeats):  # same seeds each time, so the same episodes
        start = time.perf_counter()
        result = rollout.run([task], base_seed=0, sampling=sampling)
        if time.perf_counter() - start < rollout_s:
            rollout_s, parts = (
                time.perf_counter() - start,
                result.times,
            )  # the rollout's own split (grl/rollout/clock.py)
    engine_s, env_s = parts["gen_engine"], parts["gen_env"]
    tokens = sum(len(t.response_ids) for e in result.episodes for t in e.turns)
    turns = sum(len(e.turns) for e in result.episodes)

    first_prompts = [e.turns[0].prompt_ids for e in result.episodes]
    per_prompt = math.ceil(tokens / len(first_prompts))
    plain = SamplingParams(temperature=1.0, seed=0, max_new_tokens=per_prompt, ignore_eos=True)
    for _ in range(args.repeats):
        start = time.perf_counter()
        outputs = engine.generate(first_prompts, plain)
        plain_s = min(plain_s, time.perf_counter() - start)
    plain_tokens = sum(len(o.token_ids) for o in outputs)

    agents = args.groups * args.group_size
    print(
        f"model {args.model}, {agents} agents, {turns} turns, torch threads {args.threads}, best of "
        f"{args.repeats}"
    )
    print(
        f"rollout:      {rollout_s:8.2f} s for {tokens} sampled tokens ({tokens / rollout_s:8.1f} tok/s); "
        f"engine {engine_s:.2f} s, env {env_s:.2f} s, rest {rollout_s - engine_s - env_s:.2f} s"
    )
    print(f"plain batch:  {plain_s:8.2f} s for {plain_tokens} tokens ({plain_tokens / plain_s:8.1f} tok/s)")
    print(f"ratio rollout / plain batch (per token): {(rollout_s / tokens) / (plain_s / plain_tokens):.2f}x")
    rest = rollout_s - engine_s - env_s
    print(f"rollout overhead outside the engine and the envs: {100 * rest / rollout_s:.1f}% of its time")


if __name__ == "__main__":
    main()
