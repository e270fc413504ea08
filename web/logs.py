"""The deployment page's log panel: Triton's log with the lines a machine without a GPU always prints (the CUDA
driver, NVML, DCGM, pinned memory) folded away, since they say nothing about the models and read like failures."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Matched anywhere in a line, case-insensitive. Every Triton start on a CPU-only machine prints these as warnings or
# errors (verified with the nvidia-pytriton build, docs/local-runtime.md); a line about a model that mentions CUDA
# (a model asking for a GPU instance) has the model's name in it and stays visible.
GPU_NOISE = re.compile(r"cuda|nvml|dcgm|pinned (system )?memory|gpu metrics", re.IGNORECASE)
_MODEL_LINE = re.compile(r"\bmodel|failed to load|loading:", re.IGNORECASE)


@dataclass(frozen=True)
class FoldedLog:
    text: str  # the log without the folded lines
    gpu_noise: tuple[str, ...]  # the folded lines, in order


def fold_gpu_noise(log: str) -> FoldedLog:
    kept, noise = [], []
    for line in log.splitlines():
        if GPU_NOISE.search(line) and not _MODEL_LINE.search(line):
            noise.append(line)
        else:
            kept.append(line)
    return FoldedLog(text="\n".join(kept), gpu_noise=tuple(noise))
