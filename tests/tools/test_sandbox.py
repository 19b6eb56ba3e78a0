"""Hostile code in the Python sandbox: each case is stopped within its limit plus a second, leaves no
process, file or connection behind, and the next call runs as usual."""

import os
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from grl.tools.sandbox import UID_BASE, UID_SLOTS, SandboxLimits, check_isolation, run_python

LIMITS = SandboxLimits(wall_s=2.5, cpu_s=1, memory_mb=512, max_processes=16, max_output_bytes=65536)
SECRET = f"grl-secret-{uuid.uuid4().hex}"
MARK = uuid.uuid4().hex  # names of the files hostile code tries to write


def sandbox_processes() -> list[int]:
    """Pids of live processes owned by a sandbox uid of this process (each process has its own uid range,
    so the sandboxes of another pytest-xdist worker are not counted)."""
    own_uids = UID_BASE + (os.getpid() % 4096) * UID_SLOTS
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        if own_uids <= uid < own_uids + UID_SLOTS:
            pids.append(int(entry.name))
    return pids


def tool_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("grl-tool-*")}


OUTSIDE = [f"/tmp/{MARK}", f"/dev/shm/{MARK}", f"/var/tmp/{MARK}", str(Path.cwd() / MARK), f"/root/{MARK}"]

HOSTILE = {
    "infinite_loop": "while True:\n    pass\n",
    "fork_bomb": (
        "import os\nwhile True:\n    try:\n        if os.fork() == 0:\n            os.setsid()\n"
        "    except OSError:\n        pass\n"
    ),
    "memory_hog": "hog = []\nwhile True:\n    hog.append(bytearray(50 << 20))\n",
    "print_100_mb": "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))\n",
    "sleep_past_limit": "import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n",
    "close_output_and_hang": "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)\n",
    "ignore_sigterm": (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.1)\n"
    ),
    "kill_the_parent": (
        "import os, signal\nfor act in (lambda: os.kill(os.getppid(), signal.SIGKILL),\n"
        "            lambda: os.kill({parent}, signal.SIGKILL),\n"
        "            lambda: os.killpg(os.getpgid({parent}), signal.SIGKILL),\n"
        "            lambda: os.kill(-1, signal.SIGKILL)):\n"
        "    try:\n        act()\n    except Exception as err:\n        print(type(err).__name__)\n"
    ),
    "write_outside": (
        "import os\nfor path in {outside!r}:\n    try:\n        open(path, 'w').write('x')\n"
        "        print('WROTE', path)\n    except OSError as err:\n        print('refused', path, "
        "err.errno)\n"
        "open('inside.txt', 'w').write('ok')\nprint('inside', open('inside.txt').read())\n"
    ),
    "read_parent_env": (
        "import os, glob\nprint(dict(os.environ))\nfor path in glob.glob('/proc/*/environ') + "
        "['/proc/{parent}/environ']:\n    try:\n        print(open(path, 'rb').read())\n"
        "    except OSError:\n        pass\n"
    ),
    "connect_to_listener": (
        "import socket\nfor host in ('127.0.0.1', 'localhost', '{host_ip}'):\n    try:\n"
        "        socket.create_connection((host, {port}), timeout=1)\n        print('CONNECTED', host)\n"
        "    except OSError as err:\n        print('refused', host, err)\n"
    ),
}


@pytest.fixture(scope="module", autouse=True)
def isolation_available():
    check_isolation(LIMITS)


@pytest.fixture(scope="module")
def listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


@pytest.fixture
def own_temp_folder(monkeypatch):
    """The sandbox's folders go to a temp folder of this test's own, where another pytest-xdist worker's
    sandboxes do not write; like /tmp, the sandbox's user may pass through it (pytest's tmp_path it may
    not)."""
    folder = tempfile.mkdtemp(prefix="grl-sandbox-test-")
    os.chmod(folder, 0o755)
    monkeypatch.setattr(tempfile, "tempdir", folder)
    yield
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.usefixtures("own_temp_folder")
def test_hostile_code_is_contained(case, listener, monkeypatch):
    monkeypatch.setenv("GRL_TEST_SECRET", SECRET)
    code = HOSTILE[case].format(
        parent=os.getpid(),
        outside=OUTSIDE,
        port=listener.getsockname()[1],
        host_ip=socket.gethostbyname(socket.gethostname()),
    )
    folders_before = tool_folders()
    started = time.monotonic()
    result = run_python(code, LIMITS)
    elapsed = time.monotonic() - started
    print(
        f"{case}: {elapsed:.2f} s, exit {result.exit_code}, signal {result.signal}, timed out "
        f"{result.timed_out}, "
        f"{len(result.output)} chars"
    )
    assert elapsed < LIMITS.wall_s + 1.0
    assert result.setup_error is None
    assert len(result.output.encode()) <= LIMITS.max_output_bytes
    assert SECRET not in result.output
    assert "WROTE" not in result.output and "CONNECTED" not in result.output
    assert sandbox_processes() == []
    assert tool_folders() <= folders_before
    assert not any(os.path.exists(path) for path in OUTSIDE)
    with pytest.raises(BlockingIOError):
        listener.accept()
    expected = {
        "infinite_loop": lambda r: r.signal is not None or r.timed_out,
        "fork_bomb": lambda r: r.timed_out,
        "memory_hog": lambda r: "MemoryError" in r.output,
        "print_100_mb": lambda r: r.output_truncated,
        "sleep_past_limit": lambda r: r.timed_out and r.output.startswith("sleeping"),
        "close_output_and_hang": lambda r: r.timed_out,
        "ignore_sigterm": lambda r: r.timed_out,
        "kill_the_parent": lambda r: r.exit_code is not None or r.signal == 9,
        "write_outside": lambda r: "inside ok" in r.output and r.output.count("refused") == len(OUTSIDE),
        "read_parent_env": lambda r: r.exit_code == 0,
        "connect_to_listener": lambda r: r.output.count("refused") == 3,
    }
    assert expected[case](result), result
    # the rollout goes on: the next call runs as usual
    after = run_python("print(6 * 7)", LIMITS)
    assert after.ok and after.output == "42\n"


def test_a_clean_environment_and_a_private_folder():
    result = run_python(
        "import os, sys\nprint(sorted(os.environ))\nprint(os.getuid() != 0, "
        "os.getcwd())\nprint(os.listdir('.'))",
        LIMITS,
    )
    names, user, listing = result.output.splitlines()
    assert "GRL_TEST_SECRET" not in names and "PATH" in names
    assert user.startswith("True ") and "grl-tool-" in user
    assert listing == "['main.py']"


def test_limits_are_checked_with_the_key_named():
    from grl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^tools\.python\.wall_s: must be > 0, got 0"):
        load_config(["tools.python.wall_s=0"])
