"""The machinery of the schema: `key(...)` declares a leaf once (default, help, allowed values, range),
and everything else reads that declaration: the typed merge, the value checks, `grl-train --help`
and docs/CONFIG.md."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A configuration mistake, described in one line that names the key."""


@dataclass(frozen=True)
class Rule:
    """What a leaf accepts beyond its type. `choices` may be a zero-argument function, so that a
    registry (estimators, tools, validation controls) is read when checking, not when importing."""

    choices: Any = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    no_effect: str | None = None  # why nothing reads this key (kept so GRL's and verl's command lines run)

    def allowed(self) -> tuple:
        return tuple(self.choices() if callable(self.choices) else self.choices)

    def bounds(self, integer: bool) -> str | None:
        low = f"({self.gt:g}" if self.gt is not None else f"[{self.ge:g}" if self.ge is not None else None
        high = f"{self.lt:g})" if self.lt is not None else f"{self.le:g}]" if self.le is not None else None
        if low and high:
            return f"in {low}, {high}"
        if low:
            op, bound = (">", self.gt) if self.gt is not None else (">=", self.ge)
            return f"{'an integer ' if integer else ''}{op} {bound:g}"
        if high:
            op, bound = ("<", self.lt) if self.lt is not None else ("<=", self.le)
            return f"{op} {bound:g}"
        return None

    def within(self, v) -> bool:
        return (
            (self.ge is None or v >= self.ge)
            and (self.gt is None or v > self.gt)
            and (self.le is None or v <= self.le)
            and (self.lt is None or v < self.lt)
        )


def key(
    default: Any,
    help: str,
    *,
    choices: Any = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    no_effect: str | None = None,
) -> Any:
    """One leaf of the config: its default (an `II(...)` interpolation points at another key), a
    help line, and what it accepts. A key nothing reads says why in `no_effect`; it keeps its default."""
    meta = {"help": help, "rule": Rule(choices, ge, gt, le, lt, no_effect)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls: type, **defaults: Any) -> Any:
    """A nested section; `defaults` replace the section's own (the critic's learning rate is not the
    actor's)."""
    return field(default_factory=lambda: cls(**defaults))


# ---------------------------------------------------------------- walking


@dataclass(frozen=True)
class Leaf:
    path: str
    type: Any
    default: Any
    help: str
    rule: Rule


def leaves(cls: type, prefix: str = "", instance: Any = None) -> Iterator[Leaf]:
    """Every leaf of a schema dataclass, depth first, in declaration order."""
    instance = instance if instance is not None else cls()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            yield from leaves(hints[f.name], f"{prefix}{f.name}.", value)
        else:
            yield Leaf(
                f"{prefix}{f.name}",
                hints[f.name],
                value,
                f.metadata.get("help", ""),
                f.metadata.get("rule", Rule()),
            )


def defaults(cls: type) -> dict:
    """The schema's values as a plain (untyped) dict, interpolations kept: what Hydra composes first."""
    return OmegaConf.to_container(OmegaConf.structured(cls), resolve=False)  # type: ignore[return-value]


# ---------------------------------------------------------------- checking


def did_you_mean(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def one_line(err: BaseException) -> str:
    """The first informative line of an OmegaConf/Hydra error."""
    cause = err
    while cause.__cause__ is not None and isinstance(cause.__cause__, OmegaConfBaseException):
        cause = cause.__cause__
    text = str(cause).strip().splitlines()
    return text[0] if text else type(cause).__name__


def merge_typed(cls: type, cfg: Any, prefix: str = "") -> DictConfig:
    """`cfg` (a DictConfig or a plain mapping) merged into the schema: types checked, unknown keys refused."""
    try:
        return OmegaConf.merge(OmegaConf.structured(cls), cfg)
    except OmegaConfBaseException as err:
        key_name = getattr(err, "full_key", None) or ""
        full = f"{prefix}{key_name}" if key_name else prefix.rstrip(".") or "config"
        message = one_line(err)
        if "not in struct" in message or message.startswith("Key '"):  # from a DictConfig or a plain mapping
            known = [f"{prefix}{leaf.path}" for leaf in leaves(cls)]
            raise ConfigError(f"{full}: unknown key{did_you_mean(full, known)}") from None
        given = _given(cfg, key_name)
        if "is not a ListConfig" in message and isinstance(given, (str, int, float, bool)):
            raise ConfigError(
                f"{full}: takes a list, not the single value {given!r}; use [{shown(given)}]"
            ) from None
        raise ConfigError(f"{full}: {message}") from None


def _given(cfg: Any, dotted: str) -> Any:
    """The value `cfg` (a DictConfig or a plain mapping) holds at `dotted`, as given; None where it holds
    none."""
    try:
        return OmegaConf.select(cfg if OmegaConf.is_config(cfg) else OmegaConf.create(cfg), dotted)
    except OmegaConfBaseException:
        return None


def check_values(cls: type, cfg: DictConfig, prefix: str = "") -> None:
    """Each leaf's value against its declared choices and range (null passes: the type allows it)."""
    for leaf in leaves(cls):
        value = OmegaConf.select(cfg, leaf.path)
        rule, name = leaf.rule, f"{prefix}{leaf.path}"
        many = isinstance(value, (list, tuple)) or OmegaConf.is_list(value)
        values = list(value) if many else [] if value is None else [value]
        if rule.choices is not None:
            allowed = rule.allowed()
            for v in values:
                if v not in allowed:
                    raise ConfigError(f"{name}: {v!r} is not one of {', '.join(map(str, allowed))}")
        bounds = rule.bounds(integer=_base_type(leaf.type) is int)
        if bounds and not all(rule.within(v) for v in values):
            got = list(values) if many else value
            raise ConfigError(f"{name}: {'every entry ' if many else ''}must be {bounds}, got {got!r}")


def one_entry_each(node: DictConfig, key: str, along: str, prefix: str) -> None:
    """`node.key` is a list with one entry for each entry of the list `node.along`."""
    if len(node[key]) != len(node[along]):
        raise ConfigError(
            f"{prefix}{key}: has {len(node[key])} entries but {prefix}{along} has {len(node[along])}"
        )


def check_together(cls: type, root: DictConfig, node: DictConfig | None = None, prefix: str = "") -> None:
    """The rules over several keys that no one key's declaration can say, each declared beside its keys as
    the section's `together(node, prefix, root)` (`root`: the whole config, for a key of another section the
    rule reads). Inner sections are checked before the section that holds them."""
    node = root if node is None else node
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            check_together(hints[f.name], root, node[f.name], f"{prefix}{f.name}.")
    if hasattr(cls, "together"):
        cls.together(node, prefix, root)


def checked(cls: type, cfg: Any, prefix: str = "") -> DictConfig:
    """Merged into the schema and checked: what a consumer given a plain mapping starts from."""
    typed = merge_typed(cls, cfg, prefix)
    check_values(cls, typed, prefix)
    return typed


# ---------------------------------------------------------------- the key table


def _base_type(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) is typing.Union and len(args) == 1 else tp


def type_name(tp: Any) -> str:
    if tp is Any:
        return "any"
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union:
        return " | ".join("null" if a is type(None) else type_name(a) for a in args)
    if args:
        return f"{typing.get_origin(tp).__name__}[{', '.join(type_name(a) for a in args)}]"
    return tp.__name__


def shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return str(value)


def describe(leaf: Leaf) -> str:
    """The help line with what the key accepts, as the table shows it."""
    rule, parts = leaf.rule, [leaf.help]
    if rule.choices is not None:
        parts.append(f"one of: {', '.join(map(str, rule.allowed()))}")
    bounds = rule.bounds(integer=_base_type(leaf.type) is int)
    if bounds:
        parts.append(f"must be {bounds}")
    if rule.no_effect:
        parts.append(f"no effect (GRL compatibility): {rule.no_effect}")
    return "; ".join(p for p in parts if p)


def rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every leaf."""
    return [
        (f"{prefix}{leaf.path}", type_name(leaf.type), shown(leaf.default), describe(leaf))
        for leaf in leaves(cls)
    ]


def markdown_table(table: list[tuple[str, str, str, str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {cell(t)} | `{cell(d)}` | {cell(h)} |" for k, t, d, h in table]
    return "\n".join(lines)


def text_table(table: list[tuple[str, str, str, str]], width: int = 110) -> str:
    import textwrap

    out = []
    for k, t, d, h in table:
        out.append(f"  {k}: {t} = {d}")
        out += textwrap.wrap(h, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(out)
