"""The suite's own rules (tests/conftest.py), run on a throwaway suite laid out like this one: only GPU
tests may skip, a missing data set fails naming its path, and the finer marks imply `slow`."""

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")


def suite(pytester, **files: str):
    """tests/conftest.py (a copy) and `files` (path -> source) under a fresh tests/ folder."""
    (pytester.path / "tests" / "gpu").mkdir(parents=True)
    (pytester.path / "tests" / "conftest.py").write_text(CONFTEST.read_text())
    for path, source in files.items():
        (pytester.path / "tests" / path).write_text(source)


# CI runs the suite on two pytest-xdist workers; there the controller, not the process that collected a
# module, writes the summary and the exit status.
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one process", "xdist"])
def test_only_gpu_tests_may_skip_and_missing_data_fails_naming_its_path(pytester, workers):
    suite(
        pytester,
        **{
            "test_plain.py": "import pytest\n\ndef test_skips():\n    pytest.skip('no data here')\n",
            "test_module.py": (
                "import pytest\n\npytest.importorskip('no_such_package_here')\n\ndef test_a():\n    pass\n"
            ),
            "test_marked.py": (
                "import pytest\n\n@pytest.mark.gpu\ndef test_gpu_marked():\n    pytest.skip('needs CUDA')\n\n"
                "@pytest.mark.shared_data('nope/missing.jsonl')\ndef test_data():\n    pass\n"
            ),
            "gpu/test_on_gpu.py": (
                "import pytest\n\ndef test_skips():\n    pytest.skip('needs a CUDA device')\n"
            ),
        },
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-rfEs", *workers, "tests")
    out = result.stdout.str()
    # The module's skip still counts as one, but it is named as a failure and fails the run.
    result.assert_outcomes(failed=1, errors=1, skipped=3)
    assert result.ret == 1
    assert "tests/test_plain.py::test_skips: only GPU tests may skip; this one did: no data here" in out
    assert (
        "FAILED tests/test_module.py: only GPU tests may skip; this module did: could not import "
        "'no_such_package_here'" in out
    )
    assert f"test data missing: {pytester.path.parent / 'shared' / 'data' / 'nope' / 'missing.jsonl'}" in out


def test_learning_and_multinode_tests_are_slow(pytester):
    suite(
        pytester,
        **{
            "test_kinds.py": (
                "import pytest\n\n@pytest.mark.learning\ndef test_learns():\n    pass\n\n"
                "@pytest.mark.multinode\ndef test_two_nodes():\n    pass\n\ndef test_quick():\n    pass\n"
            )
        },
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-m", "not slow", "tests")
    result.assert_outcomes(passed=1, deselected=2)


def test_each_xdist_worker_runs_on_its_own_cores(pytester, tmp_path):
    """Two workers, two tests that each hold their worker until both have recorded the cores they run
    on: the workers' cores are disjoint shares of this process's (one each where there is only one)."""
    import os

    cores = os.sched_getaffinity(0)
    seen = tmp_path / "seen"
    seen.mkdir()
    record = (
        "import os, time\nfrom pathlib import Path\n\n"
        f"SEEN = Path({str(seen)!r})\n\n"
        "def record():\n"
        "    name = os.environ['PYTEST_XDIST_WORKER']\n"
        "    (SEEN / name).write_text(' '.join(map(str, sorted(os.sched_getaffinity(0)))))\n"
        "    deadline = time.time() + 60\n"
        "    while len(list(SEEN.iterdir())) < 2 and time.time() < deadline:\n"
        "        time.sleep(0.05)\n\n"
        "def test_a():\n    record()\n\n"
        "def test_b():\n    record()\n"
    )
    suite(pytester, **{"test_cores.py": record})
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-n", "2", "tests")
    result.assert_outcomes(passed=2)
    shares = {p.name: set(map(int, p.read_text().split())) for p in seen.iterdir()}
    assert sorted(shares) == ["gw0", "gw1"]
    assert all(share and share <= cores for share in shares.values())
    if len(cores) >= 2:
        assert not shares["gw0"] & shares["gw1"] and len(shares["gw0"]) + len(shares["gw1"]) == len(cores)
