"""The driver's view of the GPU: name and memory, asked without a CUDA context in the driver.

torch answers `get_device_properties` / `get_device_name` only after initialising CUDA in the calling
process (torch.cuda._lazy_init), which on the driver opens a context on GPU 0 that stays for the whole
run: about 0.5 GiB that no rank owns and the memory plan (grl/planner/memory.py) does not count. So a
short-lived child process asks torch and exits, taking its context with it. `torch.cuda.is_available()`
stays in the driver: it counts devices without a context.
"""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import sys
from dataclasses import dataclass

log = logging.getLogger(__name__)

QUERY_TIMEOUT_S = 120  # a child that imports torch and initialises CUDA: seconds, minutes on a busy node
QUERY = (
    "import json, torch\n"
    "p = torch.cuda.get_device_properties(0)\n"
    "print(json.dumps({'name': p.name, 'total_memory': p.total_memory}))\n"
)


@dataclass(frozen=True)
class CudaDevice:
    name: str
    total_memory: int  # bytes


@functools.lru_cache(maxsize=1)
def cuda_device() -> CudaDevice | None:
    """The first CUDA device as torch in this environment sees it (CUDA_VISIBLE_DEVICES applies), or None
    where torch sees none or the child cannot tell (logged). Asked once per driver."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        done = subprocess.run([sys.executable, "-c", QUERY], capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
        if done.returncode == 0:
            answer = json.loads(done.stdout.splitlines()[-1])
            return CudaDevice(str(answer["name"]), int(answer["total_memory"]))
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    except (OSError, subprocess.TimeoutExpired, ValueError, LookupError) as err:
        why = str(err)
    log.warning("the CUDA device's name and memory are unknown (a child process asked torch: %s)", why)
    return None
