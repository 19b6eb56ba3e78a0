"""The one line of an exception that GRL's own errors quote (a key's problem, a rank's death)."""

from __future__ import annotations

import re


def first_line(err: BaseException, with_type: bool = False) -> str:
    """The first line of `err`'s message that says something (colour codes and rules of `*` dropped:
    nltk decorates its messages with both), or its type when it has none."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
    lines = [line.strip() for line in text.splitlines() if line.strip().strip("*").strip()]
    if not lines:
        return type(err).__name__
    return f"{type(err).__name__}: {lines[0]}" if with_type else lines[0]
