"""The machine a run is on, in the terms that change a backend's kernels, and whether an entry applies to it.

Float kernels (XNNPACK's float16 GEMMs, torch's own vectorised paths) pick their
instructions at run time: a check that fails on one CPU can pass on another. The
report names the machine, and a known-failures entry may say where it applies
(``when = { cpu_flags = ["avx512_fp16"] }``) in the same vocabulary.
"""

from __future__ import annotations

import platform
from typing import Any

#: The keys of an entry's ``when`` table, each matched against `describe_machine`'s field of that name.
WHEN_KEYS = ("machine", "cpu_capability", "cpu_flags")
#: The CPU features that change which kernels run (x86: vector widths, half and bfloat16 arithmetic,
#: matrix units; Arm: NEON/ASIMD, SVE and its half/bfloat16 forms), as the kernel names them.
KERNEL_FLAGS = frozenset(
    {
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
        "asimd",
        "asimdhp",
        "fphp",
        "sve",
        "sve2",
        "bf16",
        "i8mm",
    }
)


def cpu_info(text: str) -> tuple[str, list[str]]:
    """(model name, the kernel-relevant flags) from the text of ``/proc/cpuinfo`` (x86 or Arm)."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu part") and not model:
            model = value.strip()
        elif key in ("flags", "features"):
            flags.update(value.split())
    return model, sorted(flags & KERNEL_FLAGS)


def describe_machine() -> dict[str, Any]:
    """``machine``, ``cpu_model``, ``cpu_capability`` (torch's dispatch level) and ``cpu_flags``."""
    import torch

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as file:
            model, flags = cpu_info(file.read(1 << 20))
    except OSError:
        model, flags = platform.processor(), []
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):  # older torch: the dispatch level is not exposed
        capability = ""
    return {"machine": platform.machine(), "cpu_model": model, "cpu_capability": capability, "cpu_flags": flags}


def machine_line(machine: dict[str, Any]) -> str:
    """One line for the terminal: ``x86_64, AMD EPYC, torch kernels AVX2, flags avx avx2 f16c fma``."""
    flags = " ".join(machine.get("cpu_flags") or []) or "none listed"
    return (
        f"{machine.get('machine') or '?'}, {machine.get('cpu_model') or 'unknown CPU'}, "
        f"torch kernels {machine.get('cpu_capability') or '?'}, flags {flags}"
    )


def applies(when: dict[str, Any], machine: dict[str, Any]) -> bool:
    """Whether an entry's ``when`` holds on ``machine``: every key matches (``cpu_flags``: all present)."""
    for key, wanted in when.items():
        if key == "cpu_flags":
            if not set(wanted) <= set(machine.get("cpu_flags") or ()):
                return False
        elif str(machine.get(key, "")).lower() != str(wanted).lower():
            return False
    return True
