"""The HF engine's CPU attention and in-place KV cache against transformers' stock path, on the Sokoban
preset's rollout.

Plays the sokoban_cpu preset's task (6x6 Sokoban with the board in words, one valid move a turn, ten
turns) greedily through MultiTurnRollout with the HF engine, twice in this process:
- baseline: transformers' `sdpa` attention (which copies each key/value head for the query heads that
  share it) and a DynamicCache (which appends each forward's keys and values by concatenation);
- GRL's: grl/engines/cpu_attention.py (grouped heads given to PyTorch's kernel as they are) and
  grl/engines/kv_slab.py (one buffer a layer, written in place).
Both are greedy, so they must play the same episodes; the ratio is the speed-up of the engine's time.
Run it beside the timing you report with the CPU kind it prints (capped AVX2: ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2).

    python bench/bench_hf_kernels.py --dtype float32 --agents 32

Options as bench/bench_constrained_rollout.py's.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def stock_prefill_cache(engine):
    """The baseline's `_prefill_cache`: a DynamicCache of the zero-padded prefixes, grown by torch.cat."""
    from transformers import DynamicCache

    def prefill(cached, past, room):
        cache = DynamicCache(config=engine.model.config)
        if past == 0:
            return cache
        template = next(engine.prefixes.last[ids] for ids in cached if ids)
        for layer, (keys, values) in enumerate(template):
            k = keys.new_zeros((len(cached), keys.shape[0], past, keys.shape[-1]))
            v = values.new_zeros((len(cached), values.shape[0], past, values.shape[-1]))
            for row, ids in enumerate(cached):
                if ids:
                    k[row, :, past - len(ids) :] = engine.prefixes.last[ids][layer][0]
                    v[row, :, past - len(ids) :] = engine.prefixes.last[ids][layer][1]
            cache.update(k, v, layer)
        return cache

    return prefill


def main() -> None:
    import torch
    from bench_constrained_rollout import sokoban_setup

    from grl.engines import EngineOptions
    from grl.engines.hf import HFEngine
    from grl.rollout import MultiTurnRollout

    args, task, greedy = sokoban_setup(__doc__.splitlines()[0], "float32", describe_positions=True)
    results = {}
    for kind in ("stock", "grl"):
        engine = HFEngine(args.model, EngineOptions(dtype=args.dtype, device="cpu"))
        if kind == "stock":
            engine.model.set_attn_implementation("sdpa")
            engine._prefill_cache = stock_prefill_cache(engine)
        seconds = [0.0]
        generate = engine.generate

        def timed(*a, _generate=generate, _seconds=seconds, **k):
            start = time.perf_counter()
            try:
                return _generate(*a, **k)
            finally:
                _seconds[0] += time.perf_counter() - start

        engine.generate = timed
        rollout = MultiTurnRollout(engine, engine.tokenizer, max_prompt_length=4096, max_response_length=16)
        result = rollout.run([task], base_seed=0, sampling=greedy)
        results[kind] = (seconds[0], result)
        engine.shutdown()
    (stock_s, stock), (grl_s, ours) = results["stock"], results["grl"]
    same = sum(
        [t.response_ids for t in a.turns] == [t.response_ids for t in b.turns]
        for a, b in zip(stock.episodes, ours.episodes)
    )
    tokens = sum(e.num_tokens for e in ours.episodes)
    print(
        f"model {args.model} ({args.dtype}), cpu {torch.backends.cpu.get_cpu_capability()}, {args.agents} "
        "agents x up to "
        f"{args.max_turns} turns, {tokens} episode tokens, torch threads {args.threads}"
    )
    print(f"engine time, transformers' sdpa + DynamicCache (baseline): {stock_s:7.1f} s")
    print(f"engine time, grouped-head attention + in-place KV cache:   {grl_s:7.1f} s")
    print(f"speed-up: {stock_s / grl_s:.2f}x; same episodes: {same}/{len(ours.episodes)}")


if __name__ == "__main__":
    main()
