"""What a model computes in: the dtype `auto` picks (bf16 on GPU; on CPU bf16 only where the CPU has bf16
instructions that torch and oneDNN may use, AMX or AVX512-BF16, else fp32, since emulated bf16 is many
times slower), and the lines the banner and preflight say about it."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuCompute:
    """What this CPU computes bf16 with, and the dtype `auto` picks from it."""

    capability: str  # torch.backends.cpu.get_cpu_capability(): DEFAULT, AVX2, AVX512, ...
    native_bf16: bool  # bf16 instructions (AMX tiles or AVX512-BF16) that torch and oneDNN may use
    instructions: str  # which ones, for the banner

    @property
    def dtype(self) -> str:
        return "bfloat16" if self.native_bf16 else "float32"

    def describe(self) -> str:
        why = (
            f"the CPU computes bf16 natively ({self.instructions})"
            if self.native_bf16
            else "bf16 would be emulated, many times slower than fp32"
        )
        return f"{self.capability} CPU, {self.dtype} ({why})"


# oneDNN's ISA names from the weakest up; a cap below avx512_core_bf16 turns its bf16 kernels into emulation
_ONEDNN_BF16_ISAS = (
    "AVX512_CORE_BF16",
    "AVX512_CORE_FP16",
    "AVX512_CORE_AMX",
    "AVX512_CORE_AMX_FP16",
    "AVX10_1_512",
    "AVX10_1_512_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX10_2_512",
    "AVX10_2_512_AMX_2",
    "DEFAULT",
    "ALL",
)


def cpu_compute(environ=None) -> CpuCompute:
    """Read what torch reports (never the CPU's name): bf16 is native only with AMX tiles or AVX512-BF16,
    and only while neither torch's kernels (ATEN_CPU_CAPABILITY) nor oneDNN's (ONEDNN_MAX_CPU_ISA) are
    capped below them. Without it bf16 matmuls are emulated (measured 32x slower than fp32 forward +
    backward on an AVX2 EPYC)."""
    import torch

    environ = os.environ if environ is None else environ
    capability = torch.backends.cpu.get_cpu_capability()
    found = [
        name
        for name, present in (
            ("AMX", torch.cpu._is_amx_tile_supported()),
            ("AVX512-BF16", torch.cpu._is_avx512_bf16_supported()),
        )
        if present
    ]
    capped = environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper() not in _ONEDNN_BF16_ISAS
    native = bool(found) and capability.startswith("AVX512") and not capped
    return CpuCompute(capability, native, " and ".join(found) or "none")


def compute_report(dtype: str, device: str) -> str:
    """One line for the start banner: the dtype a role computes in on `device`, and why."""
    if device.startswith("cuda"):
        return f"{dtype_name(dtype, device)} on GPU"
    cpu = cpu_compute()
    if dtype == "auto":
        return f"auto: {cpu.describe()}"
    emulated = not cpu.native_bf16 and dtype_name(dtype, device) == "bfloat16"
    return f"{dtype} as set, on an {cpu.capability} CPU" + (
        " without native bf16 (emulated: slow)" if emulated else ""
    )


def bf16_on_cpu_note(key: str, dtype: str, device: str) -> str | None:
    """A preflight note for bf16 asked for on a CPU that would emulate it."""
    if (
        device.startswith("cuda")
        or dtype_name(dtype, device) != "bfloat16"
        or (cpu := cpu_compute()).native_bf16
    ):
        return None
    return (
        f"{key}: {dtype} on an {cpu.capability} CPU without native bf16 "
        f"(AMX or AVX512-BF16): bf16 is emulated there, many times slower than fp32 (bench/bench_dtype.py "
        f"measures it); set it to auto"
    )


def dtype_name(dtype: str, device: str = "cpu") -> str:
    """`torch_dtype`'s choice by name: float32, bfloat16 or float16."""
    return str(torch_dtype(dtype, device)).removeprefix("torch.")


def torch_dtype(dtype: str, device: str = "cpu"):
    """`auto` is bfloat16 on GPU; on CPU bfloat16 where the CPU computes it natively, else float32
    (`cpu_compute`)."""
    import torch

    if dtype == "auto":
        on_gpu = device.startswith("cuda")
        return torch.bfloat16 if on_gpu or cpu_compute().native_bf16 else torch.float32
    try:
        return {
            "float32": torch.float32,
            "fp32": torch.float32,
            "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16,
            "float16": torch.float16,
            "fp16": torch.float16,
        }[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16") from None
