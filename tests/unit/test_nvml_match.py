"""NVML device matching and failure handling, driven by a recorded NVML view of one machine
(an H100 node: two GPUs, the second split into MIG instances). pynvml is the only thing
replaced, by an object that answers from that data; torch is not involved."""

from __future__ import annotations

from types import SimpleNamespace

from probes.counters.nvml import NvmlPoller, candidate_uuids, index_fallback

MiB = 1 << 20
GPU0 = "GPU-5b8d3c4e-0f3a-9d1e-2c7b-44a1e6f0b9d2"
MIG1 = "MIG-8e1f9a77-3c2d-5b6e-a0f4-91c2d3e4f5a6"
DEVICES = {  # what nvmlDeviceGetName / GetMemoryInfo returned for each handle
    GPU0: ("NVIDIA H100 80GB HBM3", 85520809984, 2718 * MiB),
    MIG1: ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10200547328, 1310 * MiB),
}


class RecordedNvml:
    """Answers pynvml's calls from DEVICES; ``fail`` names calls that raise as on some hosts."""

    def __init__(self, pid: int, fail: set[str] = frozenset(), init_fails: bool = False):
        self.pid, self.fail, self.init_fails = pid, set(fail), init_fails
        self.shutdowns = 0

    def _maybe_fail(self, name: str) -> None:
        if name in self.fail:
            raise RuntimeError(f"{name}: Not Supported")

    def nvmlInit(self):
        if self.init_fails:
            raise RuntimeError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByUUID(self, text):
        if text not in DEVICES:
            raise RuntimeError("Not Found")
        return text

    def nvmlDeviceGetHandleByIndex(self, index):
        return [GPU0, "GPU-other"][index]

    def nvmlDeviceGetName(self, handle):
        return DEVICES[handle][0].encode()

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._maybe_fail("memory")
        _, total, used = DEVICES[handle]
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle):
        """nvmlUtilization_t's shape (percentages); the values are the test's, not recorded.
        MIG instances answer Not Supported, as NVML documents for utilisation on MIG."""
        self._maybe_fail("util")
        if handle.startswith("MIG-"):
            raise RuntimeError("Not Supported")
        return SimpleNamespace(gpu=87, memory=41)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle):
        self._maybe_fail("v3")
        return [SimpleNamespace(pid=self.pid, usedGpuMemory=DEVICES[handle][2] - 6 * MiB),
                SimpleNamespace(pid=1, usedGpuMemory=None)]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle):
        self._maybe_fail("v2")
        return [SimpleNamespace(pid=self.pid, usedGpuMemory=1000 * MiB)]


def test_candidate_uuids_try_gpu_and_mig():
    bare = GPU0[4:]
    assert candidate_uuids(bare) == [GPU0, "MIG-" + bare]
    assert candidate_uuids(MIG1) == [MIG1]
    assert candidate_uuids(None) == []


def test_index_is_used_only_when_it_cannot_be_wrong():
    assert index_fallback({}, 1, 1, 0) == 0
    assert index_fallback({}, 2, 2, 1) is None  # CUDA's default order is fastest-first
    assert index_fallback({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, 2, 2, 1) == 1
    assert index_fallback({"CUDA_VISIBLE_DEVICES": "1"}, 2, 1, 0) is None  # remapped
    assert index_fallback({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, 2, 2, 5) is None


def test_mig_instance_is_matched_by_its_mig_uuid():
    import os

    nv = RecordedNvml(os.getpid())
    poller = NvmlPoller(None, uuid=MIG1[4:], nvml=nv)
    assert poller.available and poller.is_mig and poller.match.startswith(MIG1)
    reading = poller.read_once()
    assert reading.device_name.endswith("MIG 1g.10gb")
    assert reading.device_used_bytes == 1310 * MiB
    assert reading.process_used_bytes == 1304 * MiB
    poller.stop()
    assert nv.shutdowns == 1


def test_unmatched_uuid_says_so_instead_of_guessing(monkeypatch):
    import os

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    nv = RecordedNvml(os.getpid())
    poller = NvmlPoller(None, uuid="0000-unknown", cuda_index=0, cuda_count=1, nvml=nv)
    assert not poller.available and poller.read_once() is None
    assert poller.match.startswith("not matched") and "not matched" in poller.error
    assert nv.shutdowns == 1  # the successful init was undone


def test_failed_init_leaves_nothing_open():
    nv = RecordedNvml(0, init_fails=True)
    poller = NvmlPoller(None, uuid=GPU0, nvml=nv)
    assert not poller.available and "Driver Not Loaded" in poller.error
    assert nv.shutdowns == 0  # nothing to shut down


def test_process_list_failure_keeps_the_device_figure():
    import os

    nv = RecordedNvml(os.getpid(), fail={"v3", "v2"})
    poller = NvmlPoller(None, uuid=GPU0, nvml=nv)
    reading = poller.read_once()
    assert reading.process_used_bytes is None and reading.device_used_bytes == 2718 * MiB
    assert reading.driver_bytes == 2718 * MiB  # the device figure stands in
    assert "process list failed" in poller.process_error
    assert poller.available


def test_v3_missing_falls_back_to_v2():
    import os

    nv = RecordedNvml(os.getpid(), fail={"v3"})
    poller = NvmlPoller(None, uuid=GPU0, nvml=nv)
    assert poller.read_once().process_used_bytes == 1000 * MiB
    assert poller.process_error is None


def test_poller_gives_up_after_repeated_total_failures():
    import os

    nv = RecordedNvml(os.getpid(), fail={"memory", "v3", "v2"})
    nv.fail.discard("memory")
    poller = NvmlPoller(None, uuid=GPU0, nvml=nv)  # set-up reads memory once: let it pass
    nv.fail.add("memory")
    readings = [poller.read_once() for _ in range(6)]
    assert all(r is not None for r in readings[:4]) and readings[4] is None
    assert not poller.available and nv.shutdowns == 1


def test_gpu_utilisation_reaches_the_step_row_and_the_step_time_pane():
    """A new NVML counter end to end (docs/ARCHITECTURE.md, "Where a change goes"): read by the
    poller, named for the step row, kept through metrics.jsonl, shown under step time."""
    import os

    from probes.records import StepSample
    from tui.panes import gpu_busy_note

    poller = NvmlPoller(None, uuid=GPU0, nvml=RecordedNvml(os.getpid()))
    reading = poller.read_once()
    assert reading.gpu_util_pct == 87.0
    row = StepSample(step=1, time_s=0.1, loss=None, tokens_per_s=None, step_ms=5.0,
                     allocated_bytes=1, reserved_bytes=2, peak_allocated_bytes=1,
                     driver_used_bytes=reading.driver_bytes, host_rss_bytes=3, scale=None,
                     skipped_steps=0, amp="bf16", device="cuda:0", **reading.step_fields())
    again = StepSample.from_json(row.to_json())
    assert again.gpu_util_pct == 87.0
    assert gpu_busy_note(again, {}) == "GPU busy 87%"
    poller.stop()

    mig = NvmlPoller(None, uuid=MIG1[4:], nvml=RecordedNvml(os.getpid()))
    reading = mig.read_once()  # utilisation refused; memory still read
    assert reading.gpu_util_pct is None and reading.device_used_bytes == 1310 * MiB
    assert gpu_busy_note(StepSample.from_json({**row.to_json(), **reading.step_fields()}),
                         {}) is None  # the pane keeps its min/max line
    mig.stop()


class BusyNvml(RecordedNvml):
    """RecordedNvml with the busy calls (milliwatts, MHz, °C: NVML's units; the test's values);
    ``fail`` "power" refuses power as some boards do."""

    def nvmlDeviceGetPowerUsage(self, handle):
        self._maybe_fail("power")
        return 212_400

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 300_000

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return 1980

    def nvmlDeviceGetTemperature(self, handle, kind):
        return 71


def test_busy_figures_reach_the_row_each_refusal_on_its_own():
    """Issue 26: the busy figures are read in read_once and named in step_fields; a refused
    call (power here, utilisation on MIG) leaves only its own field null."""
    import os

    from probes.records import GPU_BUSY_FIELDS

    reading = NvmlPoller(None, uuid=GPU0, nvml=BusyNvml(os.getpid())).read_once()
    fields = reading.step_fields()
    assert set(fields) == set(GPU_BUSY_FIELDS)
    assert fields == {"gpu_util_pct": 87.0, "mem_bw_util_pct": 41.0, "power_w": 212.4,
                      "power_limit_w": 300.0, "sm_clock_mhz": 1980.0, "temperature_c": 71.0}
    refused = NvmlPoller(None, uuid=GPU0, nvml=BusyNvml(os.getpid(), fail={"power"}))
    assert refused.read_once().step_fields()["power_w"] is None
    mig = NvmlPoller(None, uuid=MIG1[4:], nvml=BusyNvml(os.getpid())).read_once()
    assert mig.gpu_util_pct is None and mig.mem_bw_util_pct is None and mig.power_w == 212.4
