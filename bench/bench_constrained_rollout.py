"""A constrained multi-turn rollout with and without reuse of the previous turn's KV cache.

Runs the CPU preset's task (6x6 Sokoban, one valid move per turn under the valid-action grammar,
ten turns) through MultiTurnRollout with the HF engine, twice: prefix reuse on (each turn prefills
only its new template and environment tokens) and off (each turn prefills the whole episode so far,
the baseline). Both are greedy, so they must play the same episodes; the ratio is the speed-up.

    python bench/bench_constrained_rollout.py --model embedded --dtype bfloat16 --agents 16
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def sokoban_setup(description: str, dtype: str, describe_positions: bool = False):
    """The command line shared by the Sokoban rollout benches -> (args, task, greedy sampling)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="embedded", help="tiny, embedded, a folder or a hub id")
    parser.add_argument("--dtype", default=dtype)
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()

    import torch
    from omegaconf import OmegaConf

    from grl.agents import task_from_block
    from grl.config import CONFIG_DIR
    from grl.engines.base import SamplingParams
    from grl.rollout import TaskSpec

    torch.set_num_threads(args.threads)
    block = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "agents.yaml"), resolve=True)[
        "simpleSokobanAgent"
    ]
    block["agent_config"].update(
        action_decoding="constrained",
        enable_think=False,
        max_tokens=16,
        max_turns=args.max_turns,
        max_actions_per_turn=1,
    )
    if describe_positions:
        block["env_config"] = {**block.get("env_config", {}), "describe_positions": True}
    task = TaskSpec("simpleSokobanAgent", task_from_block("simpleSokobanAgent", block), args.agents, 1)
    return args, task, SamplingParams(greedy=True, max_new_tokens=16)


def main() -> None:
    from grl.engines import EngineOptions
    from grl.engines.hf import HFEngine
    from grl.rollout import MultiTurnRollout

    args, task, greedy = sokoban_setup(__doc__.splitlines()[0], "bfloat16")
    results = {}
    for reuse in (False, True):
        engine = HFEngine(args.model, EngineOptions(dtype=args.dtype, device="cpu"), reuse_prefixes=reuse)
        rollout = MultiTurnRollout(engine, engine.tokenizer, max_prompt_length=4096, max_response_length=16)
        start = time.perf_counter()
        result = rollout.run([task], base_seed=0, sampling=greedy)
        results[reuse] = (time.perf_counter() - start, result)
        engine.shutdown()
    (base_s, base), (reuse_s, reused) = results[False], results[True]
    same = sum(
        a.turns[-1].response_ids == b.turns[-1].response_ids and len(a.turns) == len(b.turns)
        for a, b in zip(base.episodes, reused.episodes)
    )
    tokens = sum(e.num_tokens for e in reused.episodes)
    print(
        f"model {args.model} ({args.dtype}), {args.agents} agents x up to {args.max_turns} turns, "
        f"{tokens} episode tokens, torch threads {args.threads}"
    )
    print(f"prefill every turn whole (baseline): {base_s:7.1f} s")
    print(f"reuse the previous turn's KV cache:  {reuse_s:7.1f} s")
    print(
        f"speed-up: {base_s / reuse_s:.2f}x; same episodes: {same}/{len(base.episodes)}; greedy success "
        f"{base.metrics['simpleSokobanAgent/success']:.3f} vs "
        f"{reused.metrics['simpleSokobanAgent/success']:.3f}"
    )


if __name__ == "__main__":
    main()
