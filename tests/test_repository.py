"""The repository holds source and text only: no wheels, archives or other binary artefacts in git.
The one exception is the figures the documentation shows (PNG files under docs/). And no module
of the package is longer than one sitting's read, ruff's lint (pyproject.toml) finds nothing and ruff's
formatter would change nothing."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_binary_files_are_tracked():
    # git marks a staged file it judges binary `i/-text`
    out = subprocess.run(["git", "ls-files", "--eol"], cwd=ROOT, capture_output=True, text=True, check=True)
    binaries = [line.split("\t", 1)[1] for line in out.stdout.splitlines() if line.startswith("i/-text")]
    binaries = [path for path in binaries if not (path.startswith("docs/") and path.endswith(".png"))]
    assert binaries == [], f"binary files tracked in git: {binaries}"


def test_no_module_of_the_package_is_over_400_lines():
    """A newcomer reads any file of grl/ in one sitting; a longer one is two jobs to split."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "grl").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, long


def test_ruff_lint_passes_on_the_tree():
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-1000:]


def test_ruff_format_leaves_the_tree_as_it_is():
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-1000:]
