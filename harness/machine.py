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


def machine_info() -> dict:
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
