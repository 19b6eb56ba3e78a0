"""Memory and compute planning from a model's shape and a run config; pure arithmetic, no torch."""

from grl.planner.memory import PHASES, plan, plan_run
from grl.planner.shapes import (
    KNOWN_MODELS,
    ModelShape,
    PlanError,
    model_shape,
    peak_flops,
    shape_from_config,
    train_flops,
)
from grl.planner.table import GIB, Plan, format_plan

__all__ = [
    "GIB",
    "KNOWN_MODELS",
    "PHASES",
    "ModelShape",
    "Plan",
    "PlanError",
    "format_plan",
    "model_shape",
    "peak_flops",
    "plan",
    "plan_run",
    "shape_from_config",
    "train_flops",
]
