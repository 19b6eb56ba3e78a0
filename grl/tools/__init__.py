"""Tools an agent may call inside an episode, by name (`agent_config.tools: [python]`).

A tool is a callable `tool(code: str, max_chars: int) -> ToolOutcome` that never raises for what the
model wrote. The sandbox it runs in is described in grl/tools/sandbox.py and docs/TOOLS.md. This
package imports neither torch, ray nor vllm.
"""

from __future__ import annotations

from grl.tools.python import PythonTool, ToolOutcome
from grl.tools.sandbox import SandboxLimits, SandboxResult, SandboxUnavailable, check_isolation, run_python

TOOLS = {"python": PythonTool}


def tool_names() -> list[str]:
    return sorted(TOOLS)


def make_tool(name: str, limits: SandboxLimits = SandboxLimits()):
    if name not in TOOLS:
        raise KeyError(f"unknown tool {name!r} (known: {', '.join(tool_names())})")
    return TOOLS[name](limits)


__all__ = [
    "PythonTool",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "TOOLS",
    "ToolOutcome",
    "check_isolation",
    "make_tool",
    "run_python",
    "tool_names",
]
