"""The GPU proof kit's rehearsal on CPU: the device commands, in order, on this machine.

    python scripts/gpu_kit/rehearse.py WORK      # e.g. /tmp/kit-rehearsal; prints run.py's summary

1. build.py --target host: the same wheels for this machine's Python, in parts of `--part-mib`;
2. a venv of image.txt's versioned lines only (the GPU image's packages that GRL's training path can import;
   cached under $GRL_CACHE_DIR/gpu_kit, keyed by those lines), never touched after it is made;
3. `run.py stash` for every part but the last, each from a folder of its own, as separate device calls send
   them; then `run.py run --cpu` with the last: join, check, install without an index, train, resume, plan,
   gpu_parts, report. Exit status: run.py's (0 when every stage passed).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build import DEFAULT_PART_MIB, Target, build, cache_root, image_packages  # noqa: E402
from parts import KitError  # noqa: E402


def image_requirements() -> list[str]:
    return sorted(f"{name}=={version}" for name, version in image_packages().items() if version)


def image_venv() -> Path:
    """A venv holding image.txt's versioned packages and nothing else, made once per version set."""
    wanted = image_requirements()
    key = hashlib.sha256("\n".join([sys.version, *wanted]).encode()).hexdigest()[:12]
    venv = cache_root() / f"image-venv-cp{sys.version_info.major}{sys.version_info.minor}-{key}"
    if (venv / "complete").exists():
        return venv
    # Made where it lives (a venv's scripts name their folder); the stamp is written last, and an
    # unfinished one is removed, so a venv with the stamp is complete.
    shutil.rmtree(venv, ignore_errors=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
        ]
        done = subprocess.run([*pip, *wanted], capture_output=True, text=True)
        if done.returncode:
            raise KitError(
                f"the image venv's install failed: {' | '.join(done.stderr.strip().splitlines()[-3:])}"
            )
        (venv / "complete").write_text("\n".join(wanted) + "\n")
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)
        raise
    return venv


def rehearse(
    work: Path, part_mib: float = DEFAULT_PART_MIB, budget_s: float = 900
) -> subprocess.CompletedProcess:
    """Build, stash all parts but the last, run the last in CPU mode; returns run.py's process (output
    captured)."""
    kit = work / "kit"
    build(Target("host"), kit, part_mib)
    venv = image_venv()
    parts = sorted(kit.glob("part*"), key=lambda p: int(p.name[4:]))
    env = dict(os.environ, GRL_KIT_STASH=str(work / "stash"))
    env.pop("OUT", None)
    python, script = str(venv / "bin" / "python"), str(HERE / "run.py")
    for part in parts[:-1]:
        subprocess.run(
            [python, script, "stash", "--sent", str(part)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
    cmd = [
        python,
        script,
        "run",
        "--cpu",
        "--parts",
        str(parts[-1]),
        "--work",
        str(work / "run"),
        "--budget",
        str(budget_s),
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rehearse.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path, help="a folder for the parts, the stash, the install and the runs")
    parser.add_argument("--part-mib", type=float, default=DEFAULT_PART_MIB)
    args = parser.parse_args(argv)
    try:
        done = rehearse(args.work.resolve(), args.part_mib)
    except (KitError, subprocess.CalledProcessError) as err:
        print(f"rehearse.py: {err}", file=sys.stderr)
        return 2
    print(done.stdout + done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
