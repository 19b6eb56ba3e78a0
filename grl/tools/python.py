"""The `python` tool: the model's code runs in the sandbox and its output comes back as text.

Everything that can go wrong with the code (an exception, a limit, a kill) is reported in the text
the model reads next and in the `ToolOutcome` the agent counts; nothing raises.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from grl.tools.sandbox import SandboxLimits, run_python


@dataclass(frozen=True)
class ToolOutcome:
    text: str  # what the model reads
    error: bool  # the code failed (non-zero exit, exception, killed but not for time, or no sandbox)
    timed_out: bool
    seconds: float


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class PythonTool:
    """Runs a reply's code with `python -I` in a fresh sandboxed process; stdout and stderr come back."""

    name = "python"

    def __init__(self, limits: SandboxLimits = SandboxLimits()):
        self.limits = limits

    def __call__(self, code: str, max_chars: int) -> ToolOutcome:
        result = run_python(code, self.limits)
        output = result.output
        notes = []
        if result.setup_error is not None:
            notes.append(f"[the sandbox could not start: {result.setup_error}]")
        if len(output) > max_chars:  # the end holds the traceback, the start what was printed first
            head = max_chars // 2
            notes.append(
                f"[output truncated: {len(output)} characters, the first {head} and last {max_chars - head} "
                "shown]"
            )
            output = output[:head] + "\n...\n" + output[len(output) - (max_chars - head) :]
        if result.output_truncated:
            notes.append(f"[output passed {self.limits.max_output_bytes} bytes; the code was stopped]")
        if result.timed_out:
            notes.append(f"[stopped: time limit of {self.limits.wall_s:g} s]")
        elif result.signal is not None:
            cpu = result.signal in (signal.SIGXCPU, signal.SIGKILL)
            notes.append(
                "[stopped by "
                f"{_signal_name(result.signal)}{f': CPU limit of {self.limits.cpu_s} s' if cpu else ''}]"
            )
        elif result.exit_code not in (0, None):
            notes.append(f"[exit code {result.exit_code}]")
        if not output.strip() and not notes:
            notes.append("[no output; use print() to see values]")
        text = "\n".join([output.rstrip("\n")] * bool(output.strip()) + notes)
        error = not result.timed_out and (not result.ok or result.setup_error is not None)
        return ToolOutcome(text, error, result.timed_out, result.seconds)
