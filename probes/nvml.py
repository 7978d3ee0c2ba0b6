"""Driver-level GPU memory through NVML, polled on its own thread so the training step never waits.

NVML reads take tens of microseconds to milliseconds, so a poller thread reads at ~2 Hz and the step
path only picks up the latest value. Every failure (no library, no driver, a GPU gone mid-run) turns
into None, which the UI shows as "n/a".
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class NvmlReading:
    process_used_bytes: int | None  # this process's memory on the device (what nvidia-smi lists)
    device_used_bytes: int | None  # all processes plus the driver's own reservations
    device_total_bytes: int | None
    device_name: str | None

    @property
    def driver_bytes(self) -> int | None:
        """This process's memory when NVML can see our pid; else the whole device's use.

        Inside a container with its own PID namespace NVML lists host pids, so our own never
        matches: the device figure is then the honest stand-in (the run_started label says so).
        """
        return self.process_used_bytes if self.process_used_bytes is not None else \
            self.device_used_bytes


class NvmlPoller:
    """Polls one GPU's memory in a daemon thread; ``latest`` is safe to read from any thread."""

    @classmethod
    def for_cuda_device(cls, device: object, interval_s: float = 0.5) -> NvmlPoller:
        """The poller for a torch CUDA device, matched by UUID: CUDA and NVML number GPUs
        differently under CUDA_VISIBLE_DEVICES or the default CUDA_DEVICE_ORDER."""
        uuid = None
        index = getattr(device, "index", None) or 0
        try:
            import torch

            uuid = str(torch.cuda.get_device_properties(index).uuid)
        except Exception:
            pass
        return cls(index, interval_s, uuid=uuid)

    def __init__(self, index: int, interval_s: float = 0.5, uuid: str | None = None) -> None:
        self.index = index
        self.interval_s = interval_s
        self.latest: NvmlReading | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handle = None
        self._name: str | None = None
        self._total: int | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = None
            if uuid:
                with contextlib.suppress(Exception):
                    text = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
                    self._handle = pynvml.nvmlDeviceGetHandleByUUID(text)
            if self._handle is None:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(self._handle)
            self._name = name.decode() if isinstance(name, bytes) else str(name)
            self._total = int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).total)
            self._nvml = pynvml
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver errors ...
            self.error = f"NVML unavailable: {exc}"

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def read_once(self) -> NvmlReading | None:
        """One synchronous read; None once NVML has failed."""
        if self._nvml is None:
            return None
        nv = self._nvml
        try:
            device_used = int(nv.nvmlDeviceGetMemoryInfo(self._handle).used)
            process_used = None
            pid = os.getpid()
            for proc in nv.nvmlDeviceGetComputeRunningProcesses(self._handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    process_used = int(proc.usedGpuMemory)
            return NvmlReading(process_used, device_used, self._total, self._name)
        except Exception as exc:  # NVML failing mid-run: degrade, don't crash
            self.error = f"NVML read failed: {exc}"
            with contextlib.suppress(Exception):
                nv.nvmlShutdown()
            self._nvml = None
            return None

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
            if reading is None:
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None
