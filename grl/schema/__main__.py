"""`python -m grl.schema > docs/CONFIG.md`: the key table of docs/CONFIG.md, from the schema."""

from grl.schema.doc import config_md

print(config_md(), end="")
