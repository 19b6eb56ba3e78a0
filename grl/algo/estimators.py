"""GRL's advantage estimators, registered (grl/algo/registry.py): importing this module loads their
registrations from grl/algo/advantages.py, group_advantages.py and distill.py, which import torch only when an
estimator first runs, so grl.config, the run plan and preflight read names and properties before anything
heavy loads."""

from grl.algo import advantages, group_advantages, distill  # noqa: F401, I001 - their @register_estimator lines fill it, RL first
from grl.algo.registry import BATCH_INPUTS, ESTIMATORS, Estimator, get, register_estimator

__all__ = ["BATCH_INPUTS", "ESTIMATORS", "Estimator", "get", "register_estimator"]
