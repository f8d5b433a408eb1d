"""What every benchmark's output starts and ends with: the environment line heading its
table (machine, GPU, driver, torch, CUDA, NCCL) and its JSON record, written whole."""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

import torch


def environment_line(device: str) -> str:
    parts = [datetime.date.today().isoformat(), f"torch {torch.__version__}"]
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        parts += [f"GPU {props.name} ({props.multi_processor_count} SMs) x{torch.cuda.device_count()}",
                  f"CUDA {torch.version.cuda}"]
        try:
            parts.append("NCCL " + ".".join(str(x) for x in torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - NCCL absent
            pass
        try:
            import subprocess

            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=10).stdout.split("\n")[0].strip()
            parts.append(f"driver {driver}")
        except Exception:  # noqa: BLE001 - no nvidia-smi
            pass
    else:
        cpu = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
        import os

        parts.append(f"CPU {cpu} ({os.cpu_count()} cores)")
    return " | ".join(parts)


def write_json(path: Path | None, record: dict) -> None:
    """`record` written to `path` (None: nowhere) through a temporary file, never half-written."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    tmp.replace(path)
