"""Is a competition-math answer equal to the gold one? Graded by `math-verify`, safely.

`judge(gold, answer)` is the rule: the answers match when their plain texts agree after normalising
(`\\text{(C)}` and `C`, `90^\\circ` and `90`), or when math-verify finds them mathematically equal
(`\\frac{3}{4}` and `0.75`, `2\\sqrt{3}` and `\\sqrt{12}`, intervals, sets, `1,000` and `1000`). The
gold is read as LaTeX; the answer both as it is (math-verify finds a `\\boxed{}`, a `$...$` or the number
in prose) and, when it has no math delimiters, as if it were boxed; either reading may match. A gold that
is a word (`\\text{Evelyn}`, `east`) is compared as text only, since sympy reads a word as a product of
letters.

sympy can take forever on what a model writes (`\\boxed{100000000!}`) and math-verify's own timeout
works only in a main thread, while envs step in a thread pool. So `grade` runs `judge` in child
processes (`python -m grl.envs.math_grading`, one JSON line per question) and kills a child that
overruns `timeout` seconds: the answer then counts as wrong. Verdicts are cached.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import NamedTuple

_MAX_ANSWER_CHARS = 4000  # a longer answer is judged by its tail, where the final answer is
_DELIMITERS = ("$", "\\boxed", "\\(", "\\[")
_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\[,;:! ]|\\q?quad|~|\\left|\\right|\s+")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree")
_PERCENT = re.compile(r"\\?%")
_SCIENTIFIC = re.compile(r"(\d)[eE]([+-]?\d+)\b")
_WORD = re.compile(r"[a-z][a-z ]+")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in a text, braces balanced; else None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def plain(text: str) -> str:
    """A text form for exact comparison: no LaTeX wrappers, spacing, degrees, percent or case."""
    boxed = last_boxed(text)
    text = boxed if boxed is not None else text
    for _ in range(3):  # nested wrappers
        text = _WRAPPERS.sub(r"\1", text)
    text = _DEGREES.sub("", _PERCENT.sub("", text))
    text = _SPACING.sub("", text).replace("$", "").replace("dfrac", "frac").replace("tfrac", "frac")
    text = text.replace("{,}", "").rstrip(".").lower()
    if len(text) == 3 and text[0] + text[2] == "()":  # a choice letter: (c)
        text = text[1]
    return text


def _for_sympy(text: str) -> str:
    """What math-verify reads: percent signs dropped, `4.5e-7` written as LaTeX."""
    return _SCIENTIFIC.sub(r"\1\\times10^{\2}", _PERCENT.sub("", text))


def _by_text(gold: str, answer: str) -> bool | None:
    """The verdict where plain text settles it (equal texts, or a word for gold), else None."""
    if plain(answer) and plain(gold) == plain(answer):
        return True
    return False if _WORD.fullmatch(plain(gold)) else None


def judge(gold: str, answer: str) -> bool:
    """The grading rule (module docstring). May be slow on adversarial answers: call `grade`."""
    settled = _by_text(gold, answer)
    if settled is not None:
        return settled
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    latex, both = [LatexExtractionConfig()], [LatexExtractionConfig(), ExprExtractionConfig()]
    op_timeout = int(os.environ.get("GRL_MATH_OP_TIMEOUT", "3"))
    gold_parsed = parse(
        "\\boxed{" + _for_sympy(gold) + "}", extraction_config=latex, parsing_timeout=op_timeout
    )
    if not gold_parsed:
        return False
    text = _for_sympy(answer)
    readings = [parse(text, extraction_config=both, parsing_timeout=op_timeout)]
    if not any(d in text for d in _DELIMITERS):
        readings.append(parse("\\boxed{" + text + "}", extraction_config=latex, parsing_timeout=op_timeout))
    return any(reading and verify(gold_parsed, reading, timeout_seconds=op_timeout) for reading in readings)


# ---------------------------------------------------------------- child processes


class Verdict(NamedTuple):
    correct: bool
    timed_out: bool = False


class _Child:
    """One `python -m grl.envs.math_grading` process answering one JSON line per question."""

    def __init__(self, op_timeout: int):
        root = str(Path(__file__).resolve().parents[2])  # so the child imports this same grl
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
            "GRL_MATH_OP_TIMEOUT": str(op_timeout),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grl.envs.math_grading"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        if self._line(120.0) != "ready":  # importing sympy takes seconds on a busy machine
            self.kill()
            raise RuntimeError(
                "math grading: the math-verify child process did not start (is math-verify installed?)"
            )

    def _line(self, timeout: float) -> str | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline().strip() if ready else None

    def ask(self, gold: str, answer: str, timeout: float) -> bool | None:
        """The verdict, or None when the child overran `timeout` or died."""
        try:
            self.proc.stdin.write(json.dumps([gold, answer]) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        line = self._line(timeout)
        return None if not line else line == "true"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


class _Pool:
    def __init__(self, size: int):
        self.size = size
        self.idle: list[_Child] = []
        self.busy = 0
        self.cond = threading.Condition()
        atexit.register(self.close)

    def grade(self, gold: str, answer: str, timeout: float) -> Verdict:
        with self.cond:
            while not self.idle and self.busy >= self.size:
                self.cond.wait()
            child = self.idle.pop() if self.idle else None
            self.busy += 1
        try:
            child = child or _Child(max(1, int(timeout // 3)))
            correct = child.ask(gold, answer, timeout)
            if correct is None:  # overran (or died): it may be stuck in sympy, so it goes
                child.kill()
                child = None
                return Verdict(False, timed_out=True)
            return Verdict(correct)
        finally:
            with self.cond:
                self.busy -= 1
                if child is not None:
                    self.idle.append(child)
                self.cond.notify()

    def close(self) -> None:
        with self.cond:
            for child in self.idle:
                child.kill()
            self.idle.clear()


_POOL = _Pool(size=max(1, min(4, os.cpu_count() or 1)))


@functools.lru_cache(maxsize=1 << 16)
def grade(gold: str, answer: str, timeout: float = 10.0) -> Verdict:
    """`judge` in a child process under a time limit; an obvious match needs no child."""
    answer = answer[-_MAX_ANSWER_CHARS:]
    settled = _by_text(gold, answer)
    return Verdict(settled) if settled is not None else _POOL.grade(gold, answer, timeout)


def _serve() -> None:
    import logging

    logging.disable(logging.WARNING)  # math-verify logs every unparsable answer
    print("ready", flush=True)
    for line in sys.stdin:
        gold, answer = json.loads(line)
        try:
            correct = judge(gold, answer)
        except Exception:  # noqa: BLE001 - sympy raises anything on odd input; that answer is wrong
            correct = False
        print("true" if correct else "false", flush=True)


if __name__ == "__main__":
    _serve()
