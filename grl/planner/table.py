"""The memory plan's table: bytes per component and phase for one device and one node's host, the
verdict on the first phase that does not fit, and its printout. grl/planner/memory.py fills it in."""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 2**30


@dataclass
class Plan:
    """Bytes per component and phase, for one GPU (one worker process on CPU) and one node's host."""

    title: str
    phases: tuple[str, ...]
    capacity: float | None  # bytes per device (None: unknown, nothing is checked)
    unit: str = "GPU"  # what one column of the device table is: a GPU, or a CPU rank's processes
    device: dict[str, dict[str, float]] = field(default_factory=dict)
    host: dict[str, dict[str, float]] = field(default_factory=dict)
    fixes: dict[str, str] = field(default_factory=dict)  # component -> the key=value that shrinks it
    cached: set[str] = field(
        default_factory=set
    )  # components a pass frees into its process's allocator cache
    processes: dict[str, dict[str, float]] = field(
        default_factory=dict
    )  # GPU: bytes per process (actor, critic) and phase

    def add(
        self, where: str, component: str, nbytes: float, phases=None, fix: str = "", cached: bool = False
    ) -> None:
        if nbytes <= 0:
            return
        if cached:
            self.cached.add(component)
        table = self.device if where == "device" else self.host
        row = table.setdefault(component, {})
        for phase in self.phases if phases is None else [p for p in phases if p in self.phases]:
            row[phase] = row.get(phase, 0.0) + nbytes
        if fix:
            self.fixes[component] = fix

    def device_total(self, phase: str) -> float:
        return sum(row.get(phase, 0.0) for row in self.device.values())

    def host_total(self, phase: str) -> float:
        return sum(row.get(phase, 0.0) for row in self.host.values())

    def overflow(self) -> str | None:
        """One line naming the first phase that does not fit and the key to change; None if all fit."""
        if self.capacity is None:
            return None
        for phase in self.phases:
            need = self.device_total(phase)
            if need > self.capacity:
                parts = sorted(
                    (
                        (row.get(phase, 0.0), name)
                        for name, row in self.device.items()
                        if name in self.fixes and row.get(phase)
                    ),
                    reverse=True,
                )
                fix = (
                    (
                        f"the largest part that a key changes is {parts[0][1]} ({parts[0][0] / GIB:.1f} "
                        "GiB): "
                        f"set {self.fixes[parts[0][1]]}"
                    )
                    if parts
                    else "use GPUs with more memory"
                )
                return (
                    f"{phase}: needs {need / GIB:.1f} GiB per {self.unit} of {self.capacity / GIB:.1f} GiB; "
                    f"{fix}"
                )
        return None


def format_plan(plan: Plan) -> str:
    total = f"total per {plan.unit}"
    width = max(len(name) for name in [*plan.device, *plan.host, total]) + 1
    lines = [plan.title, f"{'GiB per ' + plan.unit:<{width}}" + "".join(f"{p:>14}" for p in plan.phases)]
    for name, row in plan.device.items():
        lines.append(f"{name:<{width}}" + "".join(f"{row.get(p, 0.0) / GIB:14.2f}" for p in plan.phases))
    lines.append(f"{total:<{width}}" + "".join(f"{plan.device_total(p) / GIB:14.2f}" for p in plan.phases))
    if plan.capacity is not None:
        lines.append(
            f"{'memory per ' + plan.unit:<{width}}" + f"{plan.capacity / GIB:14.2f}" * len(plan.phases)
        )
    if plan.host:
        lines.append("GiB of host memory per node")
        for name, row in plan.host.items():
            lines.append(f"{name:<{width}}" + "".join(f"{row.get(p, 0.0) / GIB:14.2f}" for p in plan.phases))
        lines.append(
            f"{'total host':<{width}}" + "".join(f"{plan.host_total(p) / GIB:14.2f}" for p in plan.phases)
        )
    problem = plan.overflow()
    lines.append(
        f"does not fit: {problem}"
        if problem
        else "fits"
        if plan.capacity is not None
        else "GPU memory unknown: set trainer.gpu_memory_gb"
    )
    return "\n".join(lines)
