"""Host memory that freed tensors leave behind, handed back to the OS.

glibc keeps the pages of freed heap chunks mapped for reuse. An engine on CPU frees key/value caches of many
sizes, call after call, and what it frees is seldom the size it next asks for: without a trim its rank's
resident memory climbs to the high-water mark of every call (7.9 GiB under a 3 GiB KV budget,
docs/PERFORMANCE.md). Trimming costs page faults when the pages are used again, so it is done only once the
free memory glibc holds passes a slack. Other C libraries (musl): nothing to do, nothing is measured."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

TRIM_SLACK_BYTES = 256 * 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _glibc():
    """The C library when it is glibc 2.33 or newer (malloc_trim and mallinfo2), else None."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not (hasattr(libc, "malloc_trim") and hasattr(libc, "mallinfo2")):
        return None
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


def held_free_bytes() -> int | None:
    """Bytes of freed heap chunks glibc holds in every arena (None without glibc)."""
    libc = _glibc()
    return None if libc is None else int(libc.mallinfo2().fordblks)


def release_freed_host_memory(slack_bytes: int = 0) -> bool:
    """Trim every arena when glibc holds more than `slack_bytes` of freed memory; whether it trimmed."""
    held = held_free_bytes()
    if held is None or held <= slack_bytes:
        return False
    _glibc().malloc_trim(0)
    return True
