"""Typed OpenEnv actions as text: what the model writes, sent as the action the env's schema asks for.

An OpenEnv env publishes the JSON schema of its action at `GET /schema` (its pydantic `Action` class). The
codec reads it once per server:
- an action with one field (besides OpenEnv's own `metadata`), or the field `action_field` names, takes
  the reply as that field's value: a string as written, an integer or a number parsed from the text (a
  move id, as OpenSpiel's `action_id`), a boolean from true/false, an object or a list from JSON;
- an action of several fields is structured: the reply is a JSON object of those fields.
Legal actions (an observation's list, e.g. OpenSpiel's `legal_actions: [0, 4, 8]`) are rendered to text the
same way (a string as is, anything else as compact JSON with sorted keys), so constrained decoding offers
`"4"` and the reply `"4"` goes back as the integer 4: a listed action round-trips exactly. Text that cannot
be read as the schema's type is an invalid action, reported without stepping the env.
"""

from __future__ import annotations

import json
import re
from typing import Any

_INTEGER = re.compile(r"[+-]?\d+")
_OPENENV_FIELDS = ("metadata",)  # every OpenEnv Action carries it; never the model's to write
_KINDS = ("string", "integer", "number", "boolean", "object", "array")


class ActionError(ValueError):
    """Reply text that is not an action of the env's schema (an invalid action, not a failure)."""


def render(value: Any) -> str:
    """One action value as the text the model writes for it."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def _kind(schema: dict[str, Any]) -> str:
    if schema.get("type") in _KINDS:
        return schema["type"]
    for option in schema.get("anyOf") or schema.get("oneOf") or []:  # Optional[int] is anyOf [int, null]
        if isinstance(option, dict) and option.get("type") in _KINDS and option.get("type") != "null":
            return option["type"]
    return "object" if "$ref" in schema or "properties" in schema else "string"


class ActionCodec:
    """Reply text to the action mapping an env's schema asks for, and legal action values to text."""

    def __init__(self, schema: dict[str, Any] | None, field: str | None, where: str):
        properties = {
            key: value
            for key, value in ((schema or {}).get("properties") or {}).items()
            if key not in _OPENENV_FIELDS
        }
        if field is None:
            if not properties:  # no schema to read (an older server): OpenEnv's usual text action
                field = "message"
            elif len(properties) == 1:
                field = next(iter(properties))
        elif properties and field not in properties:
            raise ValueError(
                f"{where}: action_field {field!r} is not a field of the env's action "
                f"({', '.join(properties)})"
            )
        self.field = field  # None: structured, the reply is a JSON object of the action's fields
        self.kind = _kind(properties.get(field) or {"type": "string"}) if field else "object"
        self.fields = sorted(properties)
        self.required = [key for key in (schema or {}).get("required", []) if key in properties]

    def describe(self) -> str:
        """How a reply is read, for the first prompt; "" for plain text."""
        if self.field is None:
            return f"Write the action as a JSON object with the fields {', '.join(self.fields)}."
        return {
            "integer": "Write the action as a whole number.",
            "number": "Write the action as a number.",
        }.get(self.kind, "")

    def encode(self, text: str, legal: dict[str, Any] | None = None) -> dict[str, Any]:
        """The action for reply text; ActionError when the text is not one."""
        if legal and text in legal:
            value = legal[text]
        else:
            value = self._parse(text)
        if self.field is not None:
            return {self.field: value}
        missing = [key for key in self.required if key not in value]
        unknown = [key for key in value if key not in self.fields] if self.fields else []
        if missing or unknown:
            raise ActionError(f"action fields: missing {missing}, unknown {unknown}")
        return value

    def _parse(self, text: str) -> Any:
        stripped = text.strip()
        if self.kind == "string":
            return text
        if self.kind == "integer":
            if not _INTEGER.fullmatch(stripped):
                raise ActionError(f"not a whole number: {text!r}")
            return int(stripped)
        if self.kind == "boolean":
            if stripped.lower() not in ("true", "false"):
                raise ActionError(f"not true or false: {text!r}")
            return stripped.lower() == "true"
        try:
            value = json.loads(stripped)
        except ValueError:
            raise ActionError(f"not JSON: {text!r}") from None
        wanted = {"number": (int, float), "object": dict, "array": list}[self.kind]
        if isinstance(value, bool) or not isinstance(value, wanted):
            raise ActionError(f"not a JSON {self.kind}: {text!r}")
        return value
