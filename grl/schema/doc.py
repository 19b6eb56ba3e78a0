"""The key tables that `grl-train --help` prints and docs/CONFIG.md holds, read from the schema."""

from __future__ import annotations

from grl.schema.keys import markdown_table, rows, text_table
from grl.schema.run import GRLConfig
from grl.schema.tasks import AgentConfig

HEADER = """\
# Config keys

Generated from the schema (grl/schema/) by `python -m grl.schema > docs/CONFIG.md`; do not edit by hand
(tests/test_schema.py fails when this file and the schema differ). Set any key on the command line as
`KEY=VALUE`; `${key}` defaults follow the key they name.

"""


def config_md() -> str:
    return (
        f"{HEADER}## Run keys\n\n{markdown_table(rows(GRLConfig))}\n\n"
        "## agent_config of a task instance (configs/agents.yaml)\n\n"
        "Set as `<task>.agent_config.KEY=VALUE`; a key a block leaves out takes this default.\n\n"
        f"{markdown_table(rows(AgentConfig, '<task>.agent_config.'))}\n"
    )


def help_text() -> str:
    return (
        f"keys (type = default):\n{text_table(rows(GRLConfig))}\n\n"
        f"task instance keys:\n{text_table(rows(AgentConfig, '<task>.agent_config.'))}\n"
    )
