"""Facts of this machine the server's choices rest on: the memory free now
and the physical cores."""

from __future__ import annotations

import os

__all__ = ["mem_available", "physical_cores"]


def mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def physical_cores() -> int:
    # Mirrors the Rust engine's choice for threads=0, so the start line names
    # the number it will really use.
    try:
        logical = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        logical = os.cpu_count() or 1
    cores: set[tuple[str, str]] = set()
    try:
        phys = core = None
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in list(fh) + [""]:
                if not line.strip():
                    if phys is not None and core is not None:
                        cores.add((phys, core))
                    phys = core = None
                    continue
                k, _, v = line.partition(":")
                if k.strip() == "physical id":
                    phys = v.strip()
                elif k.strip() == "core id":
                    core = v.strip()
    except OSError:
        pass
    return min(len(cores), logical) if cores else logical
