"""The kit's wheels as one tar archive cut into parts that each travel with one device command.

Standard library only: the GPU machine runs this before anything is installed. The builder (build.py)
packs and splits; the device command (run.py) joins the parts it finds, checks every checksum of the
manifest that each part carries, and unpacks the wheels. Any mismatch ends with one line naming the part.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from pathlib import Path

ARCHIVE = "kit.tar"
MANIFEST = "manifest.json"
CHUNK = 1 << 20


class KitError(RuntimeError):
    """A part or wheel that is missing, corrupted or from another build; the message is one line."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def part_dir_name(index: int) -> str:
    return f"part{index}"


def part_file_name(index: int) -> str:
    return f"{ARCHIVE}.{index}"


def pack(wheels: list[Path], archive: Path) -> list[dict]:
    """A tar of the wheels, byte for byte the same for the same wheels (sorted, no times, no owners)."""
    entries = []
    # GNU: wheel names past ustar's 100 characters (pybase64's four manylinux tags) get a long-name entry
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        for wheel in sorted(wheels, key=lambda p: p.name):
            info = tar.gettarinfo(str(wheel), arcname=wheel.name)
            info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
            with open(wheel, "rb") as f:
                tar.addfile(info, f)
            entries.append({"file": wheel.name, "size": wheel.stat().st_size, "sha256": sha256_of(wheel)})
    return entries


def split(archive: Path, out_dir: Path, max_part_bytes: int, manifest: dict) -> list[Path]:
    """Cut `archive` into the fewest parts of at most `max_part_bytes`, of equal size but the last, each in
    out_dir/partN/ beside a copy of the manifest (which gains the archive's and the parts' checksums)."""
    size = archive.stat().st_size
    count = max(1, -(-size // max_part_bytes))
    per_part = -(-size // count)
    for stale in out_dir.glob("part*"):
        shutil.rmtree(stale)
    manifest = dict(manifest, archive={"file": ARCHIVE, "size": size, "sha256": sha256_of(archive)}, parts=[])
    folders = []
    with open(archive, "rb") as src:
        for index in range(1, count + 1):
            folder = out_dir / part_dir_name(index)
            folder.mkdir(parents=True)
            path = folder / part_file_name(index)
            with open(path, "wb") as dst:
                left = per_part
                while left and (block := src.read(min(CHUNK, left))):
                    dst.write(block)
                    left -= len(block)
            manifest["parts"].append(
                {"index": index, "file": path.name, "size": path.stat().st_size, "sha256": sha256_of(path)}
            )
            folders.append(folder)
    for folder in folders:
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return folders


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise KitError(f"{path}: no readable manifest ({err.__class__.__name__}); rebuild the kit") from None


def check_part(folder: Path) -> tuple[dict, dict]:
    """(manifest, the part's entry) of the part in `folder`, after checking its size and SHA-256."""
    manifest = read_manifest(folder)
    files = sorted(folder.glob(f"{ARCHIVE}.*"))
    if len(files) != 1:
        raise KitError(f"{folder}: expected one {ARCHIVE}.N file, found {len(files)}")
    entry = next((p for p in manifest["parts"] if p["file"] == files[0].name), None)
    if entry is None:
        raise KitError(f"{files[0]}: not a part of the build its manifest describes; rebuild the kit")
    size = files[0].stat().st_size
    if size != entry["size"]:
        raise KitError(
            f"part {entry['index']} ({files[0]}): {size} bytes, the manifest says {entry['size']}: "
            "truncated in transfer, send it again"
        )
    digest = sha256_of(files[0])
    if digest != entry["sha256"]:
        raise KitError(
            f"part {entry['index']} ({files[0]}): SHA-256 {digest[:12]}… is not the manifest's "
            f"{entry['sha256'][:12]}…: "
            "corrupted, send it again"
        )
    return manifest, entry


def find_parts(sources: list[Path]) -> dict[int, Path]:
    """The folders holding a part, by part index, from every source folder (a part folder itself or
    a folder of partN/ folders); the first source that holds an index wins."""
    found: dict[int, Path] = {}
    for source in sources:
        candidates = [source] if (source / MANIFEST).exists() else sorted(source.glob("part*"))
        for folder in candidates:
            name = folder.name
            if name.startswith("part") and name[4:].isdigit() and (folder / MANIFEST).exists():
                found.setdefault(int(name[4:]), folder)
    return found


def join(sources: list[Path], archive: Path) -> dict:
    """Check every part found in `sources` and concatenate them into `archive`; returns the manifest.
    Refuses (KitError) a missing part, a corrupted one, or parts of two different builds."""
    found = find_parts(sources)
    if not found:
        raise KitError(
            f"no kit parts in {', '.join(str(s) for s in sources)}: send them (scripts/gpu_kit/README.md)"
        )
    checked = {index: check_part(folder) for index, folder in sorted(found.items())}
    manifest = checked[min(checked)][0]
    for index, (other, _) in checked.items():
        if (other["archive"], other["parts"]) != (manifest["archive"], manifest["parts"]):
            raise KitError(
                f"part {index} ({found[index]}) belongs to another build of the kit than part "
                f"{min(checked)}; "
                "rebuild and send all parts"
            )
    missing = [p["index"] for p in manifest["parts"] if p["index"] not in checked]
    if missing:
        looked = ", ".join(str(s) for s in sources)
        raise KitError(
            f"kit parts {missing} of {len(manifest['parts'])} are missing (looked in {looked}): send them"
        )
    with open(archive, "wb") as dst:
        for index in sorted(checked):
            with open(found[index] / checked[index][1]["file"], "rb") as src:
                shutil.copyfileobj(src, dst, CHUNK)
    digest = sha256_of(archive)
    if digest != manifest["archive"]["sha256"]:
        raise KitError(
            f"{archive}: the joined parts' SHA-256 {digest[:12]}… is not the manifest's; rebuild the kit"
        )
    return manifest


def unpack(archive: Path, manifest: dict, dest: Path) -> list[Path]:
    """The wheels of `archive` in `dest`, each checked against the manifest."""
    dest.mkdir(parents=True, exist_ok=True)
    expected = {w["file"]: w for w in manifest["wheels"]}
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        names = sorted(m.name for m in members)
        if names != sorted(expected):
            raise KitError(f"{archive}: holds {names}, the manifest lists {sorted(expected)}")
        for member in members:
            if not member.isfile() or "/" in member.name or member.name.startswith("."):
                raise KitError(f"{archive}: unexpected member {member.name!r}")
            with tar.extractfile(member) as src, open(dest / member.name, "wb") as dst:
                shutil.copyfileobj(src, dst, CHUNK)
    wheels = []
    for name, entry in sorted(expected.items()):
        digest = sha256_of(dest / name)
        if digest != entry["sha256"]:
            raise KitError(
                f"wheel {name}: SHA-256 {digest[:12]}… is not the manifest's {entry['sha256'][:12]}…"
            )
        wheels.append(dest / name)
    return wheels
