"""The random states of a process (python, numpy, torch, and CUDA where there is one), in one
format for the driver's JSON state and the workers' checkpoint files."""

from __future__ import annotations

import random
from typing import Any


def rng_state() -> dict[str, Any]:
    """Plain lists and numbers, so the state is JSON-able as well as torch-savable."""
    import numpy as np
    import torch

    py = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": torch.get_rng_state().tolist(),
    }
    # Only a process that uses CUDA has a CUDA generator to keep; asking for it initialises CUDA, which in
    # the driver would open a context on GPU 0 for the rest of the run that no memory plan counts.
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state().tolist()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Also reads the tensors and tuples of checkpoints written before the states were lists."""
    import numpy as np
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.as_tensor(state["cuda"], dtype=torch.uint8))
