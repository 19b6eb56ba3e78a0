"""Build the GPU proof kit: the wheels GRL's GPU path needs and the GPU image lacks, in parts that each
travel beside the repository in one device command (scripts/gpu_kit/README.md says which commands).

    python scripts/gpu_kit/build.py                      # CPython 3.12 / manylinux x86-64 ->
    .gpu_kit/part1..N
    python scripts/gpu_kit/build.py --target host --out DIR   # this machine's Python (the CPU rehearsal)

What is carried is kit.txt, at the versions of requirements/constraints-cpu.txt (vLLM's set:
constraints-gpu-kit.txt); what the image holds is
image.txt. Every requirement of a carried wheel and every dependency of pyproject.toml must be carried, in
the image, or named in kit.txt with its reason, else the build stops with one line per gap. Wheels are
downloaded once per target and pin set into $GRL_CACHE_DIR/gpu_kit (default ~/.cache/grl/gpu_kit); torch
is never downloaded (the image has it). Needs Python >= 3.11 (tomllib) and `packaging`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from parts import KitError, pack, split  # noqa: E402

MIB = 2**20
DEVICE_CALL_LIMIT_MIB = 64  # the device tool's cap on what one command carries, the repository included
DEFAULT_PART_MIB = 55  # 9 parts of the 472 MiB that the kit is with vLLM 0.26
GPU_PYTHON = "3.12"
# pip matches manylinux tags exactly: the ones PyPI's x86-64 wheels of the kit's packages carry.
GPU_PLATFORMS = [
    "manylinux_2_31_x86_64",  # llguidance (the image is glibc 2.39: Python 3.12.3 is Ubuntu 24.04's)
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def spec_lines(path: Path) -> list[list[str]]:
    """The words of each line of a list file, comments dropped."""
    return [words for line in path.read_text().splitlines() if (words := line.split("#", 1)[0].split())]


def image_packages(path: Path = HERE / "image.txt") -> dict[str, str | None]:
    """name -> the version the CPU rehearsal installs (None: in the image, not installed there)."""
    out = {}
    for words in spec_lines(path):
        name, _, version = words[0].partition("==")
        out[normalize(name)] = version or None
    return out


def kit_spec(path: Path = HERE / "kit.txt") -> tuple[dict[str, bool], set[str], set[str]]:
    """(carried name -> built from source, requirements left out on purpose, dependencies never imported)."""
    carried, left_out, unused = {}, set(), set()
    for words in spec_lines(path):
        name = words[0]
        if name.startswith("!"):
            left_out.add(normalize(name[1:]))
        elif name.startswith("?"):
            unused.add(normalize(name[1:]))
        else:
            if words[1:] not in ([], ["sdist"]):
                raise KitError(f"{path}: line {' '.join(words)!r}: expected NAME or NAME sdist")
            carried[normalize(name)] = words[1:] == ["sdist"]
    return carried, left_out, unused


def constraint_pins(
    paths: tuple[Path, ...] = (
        ROOT / "requirements" / "constraints-cpu.txt",
        ROOT / "requirements" / "constraints-gpu-kit.txt",
    ),
) -> dict[str, str]:
    """The CPU freeze's pins, with the kit's vLLM 0.26 set (constraints-gpu-kit.txt) over them."""
    pins = {}
    for path in paths:
        for words in spec_lines(path):
            name, sep, version = words[0].partition("==")
            if sep:
                pins[normalize(name)] = version
    return pins


class Target:
    """Which Python the wheels are for: the GPU image's (CPython 3.12, manylinux x86-64) or this one."""

    def __init__(self, kind: str):
        self.kind = kind
        if kind == "gpu":
            self.python = GPU_PYTHON
            self.tag = f"cp{GPU_PYTHON.replace('.', '')}-manylinux_x86_64"
            self.pip_args = ["--python-version", GPU_PYTHON, "--implementation", "cp"]
            self.pip_args += [arg for platform in GPU_PLATFORMS for arg in ("--platform", platform)]
            self.markers = dict(
                default_environment(),
                python_version=GPU_PYTHON,
                python_full_version="3.12.3",
                implementation_name="cpython",
                platform_python_implementation="CPython",
                sys_platform="linux",
                platform_system="Linux",
                platform_machine="x86_64",
                os_name="posix",
            )
        elif kind == "host":
            self.python = f"{sys.version_info.major}.{sys.version_info.minor}"
            self.tag = f"cp{sys.version_info.major}{sys.version_info.minor}-host"
            self.pip_args, self.markers = [], dict(default_environment())
        else:
            raise KitError(f"--target {kind!r}: expected gpu or host")


def cache_root() -> Path:
    """grl.models.cache_dir()'s folder (not imported: that would import torch)."""
    return Path(os.environ.get("GRL_CACHE_DIR") or Path.home() / ".cache" / "grl") / "gpu_kit"


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise KitError(f"{' '.join(cmd[2:5])} ... failed: {' | '.join(tail)}")


def wheelhouse(target: Target, carried: dict[str, bool], pins: dict[str, str]) -> Path:
    """The carried wheels for `target`, downloaded (or built) once per pin set."""
    missing = sorted(name for name in carried if name not in pins)
    if missing:
        raise KitError(f"kit.txt: {missing} have no pin in requirements/constraints-cpu.txt")
    wanted = sorted((name, pins[name], carried[name]) for name in carried)
    key = hashlib.sha256(json.dumps([target.tag, wanted]).encode()).hexdigest()[:12]
    folder = cache_root() / f"wheels-{target.tag}-{key}"
    if (folder / "complete").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        binary = [f"{name}=={version}" for name, version, sdist in wanted if not sdist]
        pip("download", "--no-deps", "--only-binary=:all:", "--dest", str(tmp), *target.pip_args, *binary)
        for name, version, sdist in wanted:
            if sdist:
                pip(
                    "wheel", "--no-deps", f"--no-binary={name}", "--wheel-dir", str(tmp), f"{name}=={version}"
                )
        for wheel in tmp.glob("*.whl"):
            if carried.get(normalize(wheel.name.split("-")[0])) and not wheel.name.endswith(
                "-py3-none-any.whl"
            ):
                raise KitError(
                    f"{wheel.name}: built from source but not pure Python; it would not run on the GPU "
                    "machine"
                )
        if len(list(tmp.glob("*.whl"))) != len(wanted):
            raise KitError(
                f"{tmp}: expected {len(wanted)} wheels, got {sorted(p.name for p in tmp.glob('*.whl'))}"
            )
        (tmp / "complete").write_text(json.dumps(wanted) + "\n")
        os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def wheel_metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """(normalized name, version, Requires-Dist lines) from the wheel's METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = zf.read(name).decode()
    header = text.split("\n\n", 1)[0].splitlines()
    field = {k: v for k, _, v in (line.partition(": ") for line in header) if k in ("Name", "Version")}
    requires = [line.split(": ", 1)[1] for line in header if line.startswith("Requires-Dist: ")]
    return normalize(field["Name"]), field["Version"], requires


def requirement_problems(wheels: list[Path], target: Target, image: dict, left_out: set) -> list[str]:
    """One line per requirement of a carried wheel (markers evaluated for the target Python, extras
    skipped) that nobody provides, or that the carried version of it does not meet."""
    metadata = [wheel_metadata(w) for w in wheels]
    versions = {name: version for name, version, _ in metadata}
    problems = []
    for name, _, requires in metadata:
        for line in requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(dict(target.markers, extra="")):
                continue
            dep = normalize(req.name)
            if dep in versions:
                if not req.specifier.contains(versions[dep], prereleases=True):
                    problems.append(f"{name} needs {req}, the kit carries {dep} {versions[dep]}")
            elif dep not in image and dep not in left_out:
                problems.append(
                    f"{name} needs {req}: neither carried nor in image.txt (add it to kit.txt, or !{dep} and "
                    "why)"
                )
    return problems


def pyproject_problems(
    carried: dict, image: dict, unused: set, pyproject: Path = ROOT / "pyproject.toml"
) -> list[str]:
    """One line per dependency of GRL that the kit neither carries, finds in the image, nor names as
    unused."""
    problems = []
    for line in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        try:
            dep = normalize(Requirement(line).name)
        except InvalidRequirement as err:
            problems.append(f"{pyproject.name} dependency {line!r}: {err}")
            continue
        if dep not in carried and dep not in image and dep not in unused:
            problems.append(
                f"{pyproject.name} needs {dep}: neither carried, in image.txt, nor ?{dep} in kit.txt"
            )
    return problems


def repository_bytes() -> int:
    """What the device tool sends of the checkout: tracked and untracked-not-ignored files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum(
        (ROOT / os.fsdecode(p)).stat().st_size for p in listed if p and (ROOT / os.fsdecode(p)).is_file()
    )


def build(target: Target, out: Path, part_mib: float) -> dict:
    carried, left_out, unused = kit_spec()
    image = image_packages()
    overlap = sorted(carried.keys() & image.keys())
    if overlap:
        raise KitError(f"kit.txt carries {overlap}, which image.txt says the image holds")
    pins = constraint_pins()
    started = time.monotonic()
    folder = wheelhouse(target, carried, pins)
    wheels = sorted(folder.glob("*.whl"))
    built = {wheel_metadata(w)[0] for w in wheels}
    problems = requirement_problems(wheels, target, image, left_out) + pyproject_problems(
        carried, image, unused
    )
    problems += [
        f"kit.txt carries {name}, but no wheel of it was built" for name in sorted(carried.keys() - built)
    ]
    if problems:
        raise KitError("; ".join(problems))
    out.mkdir(parents=True, exist_ok=True)
    archive = out / "kit.tar"
    manifest = {
        "target": target.tag,
        "python": target.python,
        "wheels": pack(wheels, archive),
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    folders = split(archive, out, int(part_mib * MIB), manifest)
    archive.unlink()
    return {"folders": folders, "wheels": wheels, "seconds": time.monotonic() - started, "wheelhouse": folder}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="build.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--target", default="gpu", help="gpu (CPython 3.12, manylinux x86-64; default) or host"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="where partN/ go (default: .gpu_kit for gpu, .gpu_kit/host)"
    )
    parser.add_argument(
        "--part-mib",
        type=float,
        default=DEFAULT_PART_MIB,
        help=f"largest part, MiB (default {DEFAULT_PART_MIB})",
    )
    args = parser.parse_args(argv)
    try:
        target = Target(args.target)
        out = args.out or ROOT / ".gpu_kit" / ("" if target.kind == "gpu" else "host")
        done = build(target, out, args.part_mib)
    except KitError as err:
        print(f"build.py: {err}", file=sys.stderr)
        return 1
    total = sum(w.stat().st_size for w in done["wheels"])
    print(f"{len(done['wheels'])} wheels for {target.tag}, {total / MIB:.1f} MiB, in {done['seconds']:.0f} s")
    print(f"(downloaded once into {done['wheelhouse']})")
    for wheel in done["wheels"]:
        print(f"  {wheel.stat().st_size / MIB:7.2f} MiB  {wheel.name}")
    repo = repository_bytes() / MIB if target.kind == "gpu" else 0.0
    worst = 0.0
    for folder in done["folders"]:
        size = sum(p.stat().st_size for p in folder.iterdir()) / MIB
        worst = max(worst, size)
        call = (
            f"; with the repository ({repo:.1f} MiB) {size + repo:.1f} of {DEVICE_CALL_LIMIT_MIB} MiB a call"
            if repo
            else ""
        )
        print(f"{folder}: {size:.1f} MiB{call}")
    if repo and worst + repo > DEVICE_CALL_LIMIT_MIB - 1:
        print(
            f"build.py: a part ({worst:.1f} MiB) and the repository ({repo:.1f} MiB) exceed the device "
            "call's "
            f"{DEVICE_CALL_LIMIT_MIB} MiB less 1 MiB of margin; rebuild with a smaller --part-mib",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
