"""What the numbers were measured on: CPU, cores, memory, versions, threads, load."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import torch


def cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _mem_total_gib() -> float | None:
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return None


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_seconds() -> dict[str, float]:
    """Machine-wide CPU seconds so far (``/proc/stat``): busy, idle and steal.

    Steal is time the hypervisor ran someone else on our virtual CPUs; on these VMs it
    stretches wall and process-CPU time alike, so the benchmark reports it for its own span.
    """
    stat = Path("/proc/stat")
    if not stat.exists():
        return {}
    fields = [int(v) for v in stat.read_text().splitlines()[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return {"busy_s": (user + nice + system + irq + softirq) / hz,
            "idle_s": (idle + iowait) / hz, "steal_s": steal / hz}


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, not just the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, device, versions, torch threads and the current load average.

    The load average matters here: these machines are shared, so every figure is a median of
    interleaved repetitions and the load at start and end is printed beside it.
    """
    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "mem_total_gib": _mem_total_gib(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "mlflow": _version("mlflow"),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "cpu_seconds": cpu_seconds(),
    }


def describe(info: dict[str, Any]) -> str:
    """One line for the table header."""
    device = info["cuda"] or "no GPU"
    return (
        f"{info['cpu_model']}, {info['usable_cores']} usable of {info['logical_cores']} "
        f"logical cores, {info['mem_total_gib']} GiB, {device}; Python {info['python']}, "
        f"torch {info['torch']} ({info['torch_threads']} thread), mlflow {info['mlflow']}; "
        f"load average {' / '.join(str(x) for x in info['load_avg_1_5_15'])}"
    )
