"""Preflight: look at the world a validated config points at, before Ray starts.

`grl.config` checks the config against itself (keys, types, choices, ranges); this
module checks it against the machine: the model and its tokenizer, every task
instance's data, the folders the run will write, the W&B login, the Ray cluster, the toolchain, and
what the model decides (a context longer than the model's). The first failure is one
`PreflightError` line naming the key, its value and the fix; nothing is
written (the folder check creates and removes one probe file). The memory
planner (grl.planner) checks that every phase fits the device.

`python -m grl.preflight --check-toolchain` checks only what Triton needs to compile on this machine
(`toolchain_problem`), without a config: exit status 1 and one line on stderr when something is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from grl import config
from grl.config import task_instance
from grl.errors import first_line
from grl.machine import ray_address
from grl.preflight_models import PreflightError, check_model, check_teacher
from grl.run_plan import Run, RunPlan, build_run
from grl.toolchain import toolchain_problem

__all__ = ["PreflightError", "check", "check_model", "check_teacher", "toolchain_problem"]


def check(cfg: DictConfig, environ: os._Environ | dict | None = None, run: Run | None = None) -> list[str]:
    """Run every check; returns notes to print. `cfg` is only read; `run` is the builder's (its plan with
    `auto` resolved, grl/train.py), by default the run on this machine."""
    environ = os.environ if environ is None else environ
    notes = config.notes(cfg)
    check_wandb(cfg, environ)
    check_ray_address(cfg, environ)
    run = run or build_run(cfg)
    check_folders(cfg)
    check_resume(cfg)
    check_model(cfg, environ)
    check_teacher(cfg, environ, run)
    check_vllm(cfg, environ, run.plan)
    check_toolchain(cfg, environ, run.plan)
    notes += check_memory(run)
    notes += check_dtype(cfg, run.plan)
    check_tasks(cfg)
    return notes


# ---------------------------------------------------------------- W&B


def check_wandb(cfg: DictConfig, environ) -> None:
    if "wandb" not in cfg.trainer.logger or environ.get("WANDB_MODE", "").lower() != "online":
        return
    if environ.get("WANDB_API_KEY"):
        return
    netrc = Path(environ.get("NETRC") or Path.home() / ".netrc")
    if netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="replace"):
        return
    raise PreflightError(
        "trainer.logger: wandb with WANDB_MODE=online but no WANDB_API_KEY (nor `wandb login`); "
        "set WANDB_API_KEY, or WANDB_MODE=offline to log locally"
    )


# ---------------------------------------------------------------- Ray


def check_ray_address(cfg: DictConfig, environ, timeout: float = 5.0) -> None:
    """A named cluster that does not answer fails in seconds, not after Ray's minutes of retries."""
    import socket

    key = "trainer.ray_address" if cfg.trainer.ray_address else "RAY_ADDRESS"
    address = ray_address(cfg.trainer.ray_address, environ)
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except (OSError, ValueError) as err:
        raise PreflightError(
            f"{key}: cannot reach a Ray cluster at {address!r} ({err}); unset it to start a local Ray runtime"
        ) from None


# ---------------------------------------------------------------- folders


def check_folders(cfg: DictConfig) -> None:
    """Each output folder is a folder (or can become one) that this user may write."""
    export = Path(cfg.trainer.default_local_dir) / "hf_actor"
    for key, path in (
        ("trainer.run_dir", Path(cfg.trainer.run_dir)),
        ("trainer.default_local_dir", Path(cfg.trainer.default_local_dir)),
        ("trainer.export_hf", export if cfg.trainer.export_hf else None),
    ):
        if path is not None:
            problem = _unwritable(path)
            if problem:
                raise PreflightError(f"{key}: {str(path)!r} {problem}; choose another folder")


def check_resume(cfg: DictConfig) -> None:
    """The checkpoint a run would resume from is one this version reads."""
    from grl.trainer.checkpoint import resume_path

    try:
        resume_path(cfg.trainer.resume_mode, cfg.trainer.default_local_dir)
    except (ValueError, FileNotFoundError) as err:
        raise PreflightError(f"trainer.resume_mode: {first_line(err)}") from None


def _unwritable(path: Path) -> str | None:
    path = path.expanduser().absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot be created: {str(existing)!r} is a file"
    try:  # os.access is wrong for root and for some network file systems; a probe file is not
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".grl-preflight-"):
            pass
    except OSError as err:
        return f"is not writable ({err.strerror} in {str(existing)!r})"
    return None


# ---------------------------------------------------------------- memory


def check_memory(run: Run) -> list[str]:
    """The memory planner's verdict (grl.planner): a phase that needs more than the device has
    stops the run here, naming the key to change, rather than as an out-of-memory error after
    minutes of start-up. A model the planner cannot size is a note, not a failure."""
    from grl.planner import PlanError, plan_run

    try:
        problem = plan_run(run.sections, run.plan).overflow()
    except PlanError as err:
        return [f"memory plan skipped: {err}"]
    if problem:
        raise PreflightError(f"memory plan (grl plan): {problem}")
    return []


def check_dtype(cfg: DictConfig, run: RunPlan) -> list[str]:
    """bf16 set by hand on a CPU that only emulates it is a note: it runs, many times slower."""
    from grl.compute import bf16_on_cpu_note

    keys = ["actor_rollout_ref.model.dtype"] + (["critic.model.dtype"] if run.use_critic else [])
    notes = (bf16_on_cpu_note(key, OmegaConf.select(cfg, key), run.device) for key in keys)
    return [note for note in notes if note]


# ---------------------------------------------------------------- toolchain


def check_vllm(cfg: DictConfig, environ, run: RunPlan) -> None:
    """A vllm run on this machine needs a vLLM release GRL supports (grl/engines/vllm_version.py)."""
    from grl.engines.vllm_version import installed_vllm, vllm_version_problem

    if run.engine == "vllm" and not ray_address(cfg.trainer.ray_address, environ):
        if problem := vllm_version_problem(installed_vllm()):
            raise PreflightError(problem)


def check_toolchain(cfg: DictConfig, environ, run: RunPlan) -> None:
    """A CUDA run on a machine with Triton (vLLM 0.32 runs its V2 model runner wherever Triton imports,
    vllm/config/vllm.py use_v2_model_runner) needs what Triton compiles with (`toolchain_problem`);
    without it the engine dies minutes into its start. A named Ray cluster runs the ranks elsewhere."""
    if ray_address(cfg.trainer.ray_address, environ) or run.device != "cuda":
        return
    if not any(importlib.util.find_spec(package) for package in ("triton", "vllm")):
        return
    problem = toolchain_problem(environ)
    if problem:
        raise PreflightError(problem)


# ---------------------------------------------------------------- tasks


def check_tasks(cfg: DictConfig) -> None:
    """Build every task instance once, as the rollout will: agent_config and
    env_config are checked and dataset envs load their files."""
    import grl.agents

    names = list(dict.fromkeys([*cfg.rollout.training, *cfg.rollout.validation]))
    for name in names:
        program = cfg[name].agent_config.program
        try:
            if program:  # an agent program plays it: its function must import
                from grl.gateway.contract import load_program

                load_program(program)
                continue
            agent = grl.agents.make_agent(name, task_instance(cfg, name))
        except Exception as err:  # noqa: BLE001 - any failure to build the task is the task's config
            message = first_line(err)
            named = message.startswith((f"{name}:", f"{name}.", f"{name} "))
            raise PreflightError(message if named else f"{name}: {message}") from None
        agent.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grl.preflight", description="Checks of this machine that need no config."
    )
    parser.add_argument(
        "--check-toolchain",
        action="store_true",
        required=True,
        help="the C compiler and Python headers Triton compiles with; exit status 1 and one line when one is "
        "missing",
    )
    parser.parse_args(argv)
    problem = toolchain_problem()
    if problem:
        print(f"grl preflight: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
