"""Freed host memory goes back to the OS (grl/engines/host_memory.py), measured by the process's resident
memory, not by what the module reports about itself."""

import torch

from grl.engines.host_memory import held_free_bytes, release_freed_host_memory

PAGE = 4096


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


BLOCK = 64 * 1024
BLOCKS = 2000


def fragment_the_heap(count: int = BLOCKS, size: int = BLOCK):
    """`count` tensors small enough for glibc's heap (below its mmap threshold), every other one freed and
    the last kept: the freed ones sit between live ones, where glibc's own trimming of the heap's top
    cannot reach them."""
    blocks = [torch.ones(size // 4) for _ in range(count)]
    kept = blocks[1::2]
    del blocks
    return kept


def test_a_trim_hands_the_freed_pages_back_and_a_slack_holds_it_off():
    kept = fragment_the_heap()
    held = held_free_bytes()
    freed_here = BLOCKS // 2 * BLOCK
    assert held >= freed_here, held  # with what earlier tests of this process freed
    assert release_freed_host_memory(slack_bytes=held + 1) is False  # under the slack: nothing done
    before = resident_bytes()
    assert release_freed_host_memory(slack_bytes=0) is True
    after = resident_bytes()
    # What earlier tests freed may be trimmed already or never touched, so only this test's blocks count.
    assert before - after >= freed_here // 2, (before, after, freed_here)
    assert sum(t.numel() for t in kept) == BLOCKS // 2 * BLOCK // 4  # the live ones are untouched
    assert all(bool((t == 1).all()) for t in kept)
