"""GPU claims about the machine and the check itself: the device is seen, memtop's dependencies
import (the carried wheels of benchmarks/gpu/run.sh), and every claim freed its model."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from typing import Any

from benchmarks.gpu.registry import Ctx, Outcome, claim

MIB = 1 << 20
RUNTIME_MODULES = ("textual", "textual_plotext", "plotext", "pynvml", "numpy")
TEST_MODULES = ("pytest", "pytest_asyncio", "xdist", "pytest_timeout", "psutil", "importlinter")


def _version(module: str) -> str:
    try:
        mod = __import__(module)
    except Exception as exc:
        return f"missing: {type(exc).__name__}: {exc}"
    version = getattr(mod, "__version__", None)
    if version is None:
        from importlib import metadata

        dist = {"pynvml": "nvidia-ml-py", "xdist": "pytest-xdist",
                "importlinter": "import-linter", "textual_plotext": "textual-plotext",
                "pytest_asyncio": "pytest-asyncio", "pytest_timeout": "pytest-timeout"}
        try:
            version = metadata.version(dist.get(module, module))
        except Exception:
            version = "present"
    return str(version)


@claim(group="environment", needs_s=1, priority=0, cuda_only=False)
def cuda_device_seen(ctx: Ctx) -> Outcome:
    """torch sees the CUDA device named on the command line; its name, capability, memory, the
    driver and nvidia-smi's view are recorded (environment.json)"""
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "torch_cuda": torch.version.cuda, "host": platform.node(),
                           "cpu_count": os.cpu_count(), "device": ctx.device,
                           "cuda_available": torch.cuda.is_available()}
    smi = shutil.which("nvidia-smi")
    if smi:
        res = subprocess.run([smi, "--query-gpu=index,name,driver_version,memory.total,"
                              "memory.used", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        env["nvidia_smi"] = res.stdout.strip() or res.stderr.strip()
    ok = False
    if ctx.is_cuda and torch.cuda.is_available():
        from trainer.config import bf16_problem

        dev = ctx.torch_device
        props = torch.cuda.get_device_properties(dev)
        env.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                   gpu_total_bytes=props.total_memory, device_count=torch.cuda.device_count(),
                   bf16_native=bf16_problem((props.major, props.minor), props.name) is None,
                   cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                   cudnn=torch.backends.cudnn.version())
        ok = True
    (ctx.out / "environment.json").write_text(json.dumps(env, indent=2, default=str) + "\n")
    if not ctx.is_cuda:
        return Outcome.not_run(f"CPU smoke run: torch {torch.__version__}, no CUDA", **env)
    detail = (f"{env.get('gpu')} (sm {env.get('capability')}, "
              f"{env.get('gpu_total_bytes', 0) / 2**30:.0f} GiB), torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}; nvidia-smi: {env.get('nvidia_smi', 'not found')}")
    return Outcome.check(ok, detail, **env)


@claim(group="environment", needs_s=1, priority=0, cuda_only=False)
def memtop_dependencies_import(ctx: Ctx) -> Outcome:
    """memtop's own dependencies import here (textual, textual-plotext, plotext, nvidia-ml-py;
    the test suite's too, as figures)"""
    runtime = {m: _version(m) for m in RUNTIME_MODULES}
    tests = {m: _version(m) for m in TEST_MODULES}
    missing = [m for m, v in runtime.items() if v.startswith("missing")]
    detail = ", ".join(f"{m} {v}" for m, v in runtime.items())
    if missing:
        detail = f"missing: {', '.join(missing)} (carry their wheels: benchmarks/gpu/run.sh)"
    return Outcome.check(not missing, detail, runtime=runtime, tests=tests)


@claim(group="environment", needs_s=0, priority=1000)
def runs_free_their_memory(ctx: Ctx) -> Outcome:
    """no claim left device tensors behind (each run's model, gradients and optimizer state are
    freed before the next claim: no gc.freeze, caches emptied; counted over the tensors Python
    reaches)"""
    measured = {k: v for k, v in ctx.leftovers.items() if k != "runs_free_their_memory"}
    if not measured:
        return Outcome.not_run("no claim ran on the device before this one")
    kept = {k: v for k, v in measured.items() if v > 1 * MIB}
    detail = (f"{len(measured)} claims measured; kept > 1 MiB: "
              + (", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in kept.items()) or "none"))
    return Outcome.check(not kept, detail, leftover_tensor_bytes=measured)
