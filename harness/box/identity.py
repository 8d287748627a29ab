"""What machine a record was measured on (every run record carries it)."""

from __future__ import annotations

import os
import platform
import socket

import psutil


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    """The instruction-set flags of this machine's CPU (/proc/cpuinfo), sorted; '' if unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return ""


# where a scheduler placed the measurement (SLURM exports these into every job step)
SCHEDULER_ENV = {"slurm_job_id": "SLURM_JOB_ID", "slurm_partition": "SLURM_JOB_PARTITION",
                 "slurm_node": "SLURMD_NODENAME"}


def machine_info() -> dict:
    info = {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
    info.update({k: os.environ[v] for k, v in SCHEDULER_ENV.items() if v in os.environ})
    return info
