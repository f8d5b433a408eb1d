"""Memory figures for the benchmarks (the CUDA allocator's, or the process's resident set),
and the device waited for before a figure or a time is read."""

from __future__ import annotations

import gc

import torch


def memory_in_use(device: str) -> int:
    """Bytes in use: the CUDA allocator's, or this process's resident set (VmRSS)."""
    if device == "cuda":
        return torch.cuda.memory_allocated()
    return _proc_status_kib("VmRSS") * 1024


def reset_peak(device: str) -> None:
    """Start a new peak: the allocator's statistics, or the kernel's peak-RSS counter."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return
    try:  # NOTE: writing 5 to clear_refs resets the kernel's peak-RSS counter (VmHWM)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak(device: str) -> int:
    """Bytes at the peak since the last reset_peak."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated()
    return _proc_status_kib("VmHWM") * 1024


def sync(device: str) -> None:
    """The host waits for the device's work so far (nothing to wait for on the CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()


def release(device: str) -> None:
    """Memory of dropped objects given back: Python's cycles collected, then (CUDA) the
    allocator's cached blocks, so that the next method starts from the same free memory."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _proc_status_kib(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return 0
