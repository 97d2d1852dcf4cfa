"""The CPU configurations torch computes with: the one the references were recorded under, and the other one
`make test` executes the chapters under, so that every checked cell is shown to survive other CPU kernels."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .book import RECORDED_WITH

# The environment variables that choose torch's CPU kernels and thread count (PyTorch reads them at first use).
CPU_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cpu_configuration() -> dict:
    """What this process's torch computes with: its kernels' instruction set, the variables that choose
    them, its thread count, the CPU."""
    import torch

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            **{name: os.environ.get(name) for name in CPU_VARIABLES},
            "torch_threads": torch.get_num_threads(), "cpu": cpu_model()}


def describe(config: dict) -> str:
    """One line: 'AVX2, 2 threads (ATEN_CPU_CAPABILITY=default)'."""
    threads = config.get("torch_threads")
    text = f"{config.get('cpu_capability')}, {threads} thread{'s' if threads != 1 else ''}"
    set_vars = " ".join(f"{k}={config[k]}" for k in CPU_VARIABLES if config.get(k) is not None)
    return text + (f" ({set_vars})" if set_vars else "")


# How `make test` moves the chapters off the recorded CPU configuration when this machine's native one is the
# recorded one, keyed by the native capability (torch.backends.cpu.get_cpu_capability()). Each choice should
# cost about as much as the native run (CI has 30 minutes on 2 cores): other vectorised kernels of the same
# width class, or the plain kernels with another thread count. OTHER_THREADS stands for "a thread count other
# than the recorded one" (1 if the references were recorded with 2 or more threads, else 2). A capability not
# listed falls back to "*". The slow configuration (plain kernels, SSE4.2 MKL, one thread) is `make portable`.
OTHER_THREADS = "other"
TEST_CONFIGURATIONS = {
    "AVX512": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "AVX2": {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": OTHER_THREADS},
    "*": {"OMP_NUM_THREADS": OTHER_THREADS},
}


def native_capability() -> str:
    """This machine's torch kernels with none of CPU_VARIABLES set (asked in a fresh process)."""
    env = {k: v for k, v in os.environ.items() if k not in CPU_VARIABLES}
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                          env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_env(recorded_with: Path = RECORDED_WITH) -> None:
    """Print the variables `make test` executes the chapters under (see TEST_CONFIGURATIONS)."""
    recorded = json.loads(recorded_with.read_text()) if recorded_with.exists() else None
    what = f"references recorded with {describe(recorded)}" if recorded else f"{recorded_with.name} is missing"
    user = {k: os.environ[k] for k in CPU_VARIABLES if k in os.environ}
    chosen: dict[str, str] = {}
    if user:
        why = "as your environment sets them: " + " ".join(f"{k}={v}" for k, v in user.items())
    else:
        native = native_capability()
        if recorded is None:
            why = f"natively ({native})"
        elif native != recorded.get("cpu_capability"):
            why = f"natively ({native}, not the recorded kernels)"
        else:
            threads = recorded.get("torch_threads") or 1
            chosen = {k: str((1 if threads >= 2 else 2) if v == OTHER_THREADS else v)
                      for k, v in TEST_CONFIGURATIONS.get(native, TEST_CONFIGURATIONS["*"]).items()}
            why = "with " + " ".join(f"{k}={v}" for k, v in chosen.items()) + f" (native {native})"
    print(f"{what}; checked cells run here {why}", file=sys.stderr)
    print(" ".join(f"{k}={v}" for k, v in chosen.items()))
