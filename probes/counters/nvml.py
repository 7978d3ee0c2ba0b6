"""Driver-level GPU memory through NVML, polled on its own thread so the training step never waits.

NVML reads take tens of microseconds to milliseconds, so a poller thread reads at ~2 Hz and the step
path only picks up the latest value. Every failure (no library, no driver, a GPU gone mid-run) turns
into None, which the UI shows as "n/a".

Which NVML device: CUDA and NVML number GPUs differently (CUDA_VISIBLE_DEVICES remaps, and CUDA's
default order is fastest-first, NVML's is PCI bus), so the device is found by the UUID torch
reports, as ``GPU-…`` or, for a MIG instance, ``MIG-…``. When no UUID matches, the poller says "not
matched" instead of guessing an index (probes/counters/nvml.py ``index_fallback`` lists the only
cases where an index is safe). The device-level and per-process figures are separate calls with
separate failures: process lists fail on old drivers, vGPU and in containers, and that must not take
the device figure with it. Read against nvidia-ml-py 13's pynvml.py; never run on a GPU here.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_FAILED_READS = 5  # consecutive reads with no figure at all before the poller gives up


@dataclass(frozen=True)
class NvmlReading:
    process_used_bytes: int | None  # this process's memory on the device (what nvidia-smi lists)
    device_used_bytes: int | None  # all processes plus the driver's own reservations
    device_total_bytes: int | None
    device_name: str | None
    gpu_util_pct: float | None = None  # % of the last sample period in which a kernel ran
    mem_bw_util_pct: float | None = None  # % of it in which device memory was read or written
    power_w: float | None = None  # board power draw (NVML reports mW)
    power_limit_w: float | None = None  # the enforced power limit
    sm_clock_mhz: float | None = None
    temperature_c: float | None = None

    def step_fields(self) -> dict[str, float | int | None]:
        """This poll's figures under their StepSample field names: the step row records the
        latest poll (docs/ARCHITECTURE.md, "Where a change goes": a new NVML counter is read in
        read_once, named here, declared in probes/records/step.py, shown in tui/panes.py)."""
        return {"gpu_util_pct": self.gpu_util_pct, "mem_bw_util_pct": self.mem_bw_util_pct,
                "power_w": self.power_w, "power_limit_w": self.power_limit_w,
                "sm_clock_mhz": self.sm_clock_mhz, "temperature_c": self.temperature_c}

    @property
    def driver_bytes(self) -> int | None:
        """This process's memory when NVML can see our pid; else the whole device's use.

        Inside a container with its own PID namespace NVML lists host pids, so our own never
        matches: the device figure is then the honest stand-in (the run_started label says so).
        """
        return self.process_used_bytes if self.process_used_bytes is not None else \
            self.device_used_bytes


def candidate_uuids(torch_uuid: str | None) -> list[str]:
    """The NVML UUID strings a torch device UUID may stand for: torch prints the bare UUID, NVML
    prefixes it with GPU- (a whole GPU) or MIG- (a MIG instance)."""
    if not torch_uuid:
        return []
    text = str(torch_uuid).strip()
    if text.startswith(("GPU-", "MIG-")):
        return [text]
    return [f"GPU-{text}", f"MIG-{text}"]


def index_fallback(env: Mapping[str, str], nvml_count: int, cuda_count: int,
                   index: int) -> int | None:
    """The NVML index of CUDA device ``index`` when it is certain without a UUID, else None:
    nothing hidden or reordered (no CUDA_VISIBLE_DEVICES) and either CUDA_DEVICE_ORDER=PCI_BUS_ID
    (NVML's order) or a single GPU on both sides."""
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return None
    if not 0 <= index < min(nvml_count, cuda_count):
        return None
    if env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" and nvml_count == cuda_count:
        return index
    return index if nvml_count == 1 and cuda_count == 1 else None


def _number(read: Any, scale: float = 1.0) -> float | None:
    """``read()`` as a float times ``scale``; None when NVML refuses (NotSupported, NoPermission,
    a MIG handle) or answers something that is not a non-negative number."""
    try:
        value = read()
    except Exception:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return float(value) * scale


def busy_figures(nv: Any, handle: Any, is_mig: bool) -> dict[str, float | None]:
    """How busy the GPU is, each figure read on its own (one refused call leaves the others):
    utilisation of kernels and of memory bandwidth (both None on a MIG slice, which NVML does
    not report per slice), power draw and its enforced limit, SM clock, temperature."""
    out: dict[str, float | None] = {"gpu_util_pct": None, "mem_bw_util_pct": None}
    if not is_mig:
        try:
            rates = nv.nvmlDeviceGetUtilizationRates(handle)
        except Exception:
            rates = None  # some vGPUs do not report it either: n/a, not an error
        if rates is not None:
            out["gpu_util_pct"] = _number(lambda: rates.gpu)
            out["mem_bw_util_pct"] = _number(lambda: rates.memory)
    out["power_w"] = _number(lambda: nv.nvmlDeviceGetPowerUsage(handle), 1e-3)
    out["power_limit_w"] = _number(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle), 1e-3)
    out["sm_clock_mhz"] = _number(lambda: nv.nvmlDeviceGetClockInfo(
        handle, getattr(nv, "NVML_CLOCK_SM", 1)))
    out["temperature_c"] = _number(lambda: nv.nvmlDeviceGetTemperature(
        handle, getattr(nv, "NVML_TEMPERATURE_GPU", 0)))
    return out


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


class NvmlPoller:
    """Polls one GPU's memory in a daemon thread; ``latest`` is safe to read from any thread.

    ``index`` is an NVML index the caller vouches for; ``uuid`` (torch's) is matched first.
    ``match`` says how the device was found ("GPU-… by UUID", "not matched: …").
    """

    @classmethod
    def for_cuda_device(cls, device: object, interval_s: float = 0.5) -> NvmlPoller:
        """The poller for a torch CUDA device, matched by UUID, never by a guessed index."""
        uuid = None
        index = getattr(device, "index", None)
        cuda_count = 0
        try:
            import torch

            if index is None:
                index = torch.cuda.current_device()
            cuda_count = torch.cuda.device_count()
            uuid = str(torch.cuda.get_device_properties(index).uuid)
        except Exception:
            pass
        return cls(None, interval_s, uuid=uuid, cuda_index=index or 0, cuda_count=cuda_count)

    def __init__(self, index: int | None, interval_s: float = 0.5, uuid: str | None = None,
                 cuda_index: int = 0, cuda_count: int = 0, nvml: Any = None) -> None:
        self.index = index
        self.interval_s = interval_s
        self.latest: NvmlReading | None = None
        self.error: str | None = None
        self.process_error: str | None = None  # the process list failed; the device figure stays
        self.match: str = "not matched"
        self.is_mig = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handle = None
        self._name: str | None = None
        self._total: int | None = None
        self._procs_fn: Any = None
        self._failed_reads = 0
        try:
            if nvml is None:
                import pynvml as nvml
        except Exception as exc:  # ImportError
            self.error = f"NVML unavailable: {exc}"
            return
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, driver not loaded ...
            self.error = f"NVML unavailable: {exc}"
            return
        try:
            self._handle = self._find(nvml, uuid, cuda_index, cuda_count)
            if self._handle is None:
                raise LookupError(self.match)
            name = nvml.nvmlDeviceGetName(self._handle)
            self._name = name.decode() if isinstance(name, bytes) else str(name)
            self._total = int(nvml.nvmlDeviceGetMemoryInfo(self._handle).total)
            self._nvml = nvml
        except Exception as exc:
            self.error = f"NVML unavailable: {exc}"
            self._handle = None
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()  # the init succeeded: undo it

    def _find(self, nv: Any, uuid: str | None, cuda_index: int, cuda_count: int) -> Any:
        for text in candidate_uuids(uuid):
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(text)
            except Exception:
                continue
            self.match = f"{text} by UUID"
            self.is_mig = text.startswith("MIG-")
            return handle
        index = self.index
        why = f"no NVML device has torch's UUID {uuid}" if uuid else "torch gave no UUID"
        if index is None:
            try:
                count = int(nv.nvmlDeviceGetCount())
            except Exception:
                count = 0
            index = index_fallback(os.environ, count, cuda_count, cuda_index)
            if index is None:
                self.match = (f"not matched: {why}, and CUDA_VISIBLE_DEVICES or the device "
                              "order make an index guess unsafe")
                return None
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        self.match = f"NVML index {index}"
        return handle

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def _processes(self, nv: Any) -> list[Any]:
        """This device's compute processes: _v3, else _v2 (drivers before 510 lack _v3)."""
        if self._procs_fn is not None:
            return self._procs_fn(self._handle)
        last: Exception | None = None
        for name in ("nvmlDeviceGetComputeRunningProcesses_v3",
                     "nvmlDeviceGetComputeRunningProcesses_v2"):
            fn = getattr(nv, name, None)
            if fn is None:
                continue
            try:
                procs = fn(self._handle)
            except Exception as exc:
                last = exc
                continue
            self._procs_fn = fn
            return procs
        raise last if last is not None else RuntimeError("no process-list call in pynvml")

    def read_once(self) -> NvmlReading | None:
        """One synchronous read; None once NVML has failed for good."""
        if self._nvml is None:
            return None
        nv = self._nvml
        device_used = process_used = None
        try:
            device_used = int(nv.nvmlDeviceGetMemoryInfo(self._handle).used)
        except Exception as exc:
            self.error = f"NVML memory read failed: {exc}"
        try:
            pid = os.getpid()
            for proc in self._processes(nv):
                if getattr(proc, "pid", None) == pid:
                    process_used = _int_or_none(getattr(proc, "usedGpuMemory", None))
            self.process_error = None
        except Exception as exc:  # old driver, vGPU, no permission: the device figure stays
            self.process_error = f"NVML process list failed: {exc}"
        busy = busy_figures(nv, self._handle, self.is_mig)
        if device_used is None and process_used is None:
            self._failed_reads += 1
            if self._failed_reads >= MAX_FAILED_READS:
                self._give_up()
                return None
        else:
            self._failed_reads = 0
        return NvmlReading(process_used, device_used, self._total, self._name, **busy)

    def _give_up(self) -> None:
        nv, self._nvml = self._nvml, None
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()

    def start(self) -> None:
        if self._nvml is None or self._thread is not None:
            return
        self.latest = self.read_once()
        self._thread = threading.Thread(target=self._run, name="memtop-nvml", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            reading = self.read_once()
            self.latest = reading
            if reading is None and self._nvml is None:
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._nvml is not None:
            self._give_up()
