"""The repository holds source and text only: no wheels, archives or other binary artefacts in git."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_binary_files_are_tracked():
    # git marks a staged file it judges binary `i/-text`
    out = subprocess.run(["git", "ls-files", "--eol"], cwd=ROOT, capture_output=True, text=True, check=True)
    binaries = [line.split("\t", 1)[1] for line in out.stdout.splitlines() if line.startswith("i/-text")]
    assert binaries == [], f"binary files tracked in git: {binaries}"
