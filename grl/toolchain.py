"""What Triton needs to compile on this machine, asked without a config (`python -m grl.preflight
--check-toolchain`) and by preflight before a CUDA run."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path


def python_include_dir() -> str:
    """Where Triton looks for Python.h: the include folder of this interpreter's default install scheme,
    with Debian's posix_local read as posix_prefix (triton/runtime/build.py, _build)."""
    scheme = sysconfig.get_default_scheme()
    return sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]


def toolchain_problem(environ=None) -> str | None:
    """What Triton lacks here to compile the launcher it builds for each kernel at run time
    (triton/runtime/build.py): a C compiler, $CC when set, else gcc or clang on PATH; and Python.h in
    `python_include_dir()`. One line naming what is missing and the fix, or None."""
    environ = os.environ if environ is None else environ
    path = environ.get("PATH", os.defpath)
    missing, fixes, packages = [], [], []
    compiler = environ.get("CC")
    if compiler is not None and shutil.which(compiler, path=path) is None:
        missing.append(f"CC={compiler!r}, which names no program")
        fixes.append("set CC to a C compiler or unset it")
    elif compiler is None and not (shutil.which("gcc", path=path) or shutil.which("clang", path=path)):
        missing.append("no C compiler (gcc or clang on PATH)")
        packages.append("gcc")
    header = Path(python_include_dir()) / "Python.h"
    if not header.is_file():
        missing.append(f"no Python headers ({header} is missing)")
        packages.append(f"python{sys.version_info.major}.{sys.version_info.minor}-dev")
    if not missing:
        return None
    fixes += [f"apt-get install {' '.join(packages)}"] if packages else []
    return (
        "toolchain: Triton compiles a launcher for each kernel at run time (vLLM's engine uses it on CUDA), "
        f"and this machine has {' and '.join(missing)}; {'; '.join(fixes)}"
    )
