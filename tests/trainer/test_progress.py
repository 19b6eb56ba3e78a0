"""The console while a run trains: step lines, warnings and the final report stay whole lines of the
terminal, above the progress bars, rather than being written into them."""

import io
import logging
import re
import sys

from grl.tracking import Tracker, console_line
from grl.trainer.progress import Progress


def screen(output: str) -> list[str]:
    """The rows a terminal shows after `output`: carriage return, newline (the tty's ONLCR: back to the
    first column too), cursor up (ESC [ A, tqdm's way back from a lower bar) and overwriting characters."""
    rows, row, col = [[]], 0, 0
    for token in re.findall(r"\x1b\[A|\r|\n|[^\r\n\x1b]", output):
        if token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            rows.extend([] for _ in range(row + 1 - len(rows)))
        elif token == "\x1b[A":
            row = max(row - 1, 0)
        else:
            line = rows[row]
            line.extend(" " for _ in range(col + 1 - len(line)))
            line[col] = token
            col += 1
    shown = ["".join(line).rstrip() for line in rows]
    while shown and not shown[-1]:  # the cursor's empty row after the last newline
        shown.pop()
    return shown


def test_step_lines_and_warnings_are_whole_rows_above_the_bars(tmp_path, monkeypatch):
    terminal = io.StringIO()  # stdout and stderr share one terminal
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # no logging configured (pytest's own aside)
    tracker = Tracker(["console"], tmp_path, "p", "e", total_steps=3)
    progress = Progress(enabled=True)
    progress.start_run(3, done=0)
    lines = []
    for step in (1, 2, 3):
        with progress.step(step, ("gen", "adv")) as phase:
            with phase("gen"):
                progress.show_turn(0, 3, 4)
                logging.getLogger("grl.trainer").warning("step %d: a warning from the step", step)
            with phase("adv"):
                pass
        metrics = {"reward/mean": 0.25 * step, "timing_s/step": 1.5}
        tracker.log(metrics, step)
        progress.step_done(metrics)
        lines += [f"step {step}: a warning from the step", console_line(metrics, step, 3)]
    progress.close()
    print("finished: the report")
    rows = screen(terminal.getvalue())
    assert [row for row in rows if row in lines] == lines, rows
    assert rows[-2].startswith("run: 100%") and rows[-1] == "finished: the report", rows
    assert logging.getLogger("grl").handlers == []  # the stand-in handler leaves with the bars


def test_without_the_console_logger_no_bar_and_no_handler(monkeypatch):
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    progress = Progress(enabled=False)
    progress.start_run(2, done=0)
    assert logging.getLogger("grl").handlers == []
    progress.close()
    assert terminal.getvalue() == ""
