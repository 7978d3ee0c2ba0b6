"""Every metric memtop exports, declared once: its Prometheus name (base units, ``_total`` for
counters), its type, the step-row field it comes from, and its HELP text on each device kind.

On CPU the same names carry the CPU's counters, as the run folder's fields do
(probes/records/names.py): ``memtop_allocated_bytes`` is glibc's heap in use there, CUDA's
``memory_allocated`` on a GPU. The HELP text says which; an endpoint that serves runs of both
kinds says both.
"""

from __future__ import annotations

from dataclasses import dataclass

# the labels of every per-rank series; CUDA series add gpu_uuid (NVIDIA's "GPU-…" id, the
# label dcgm-exporter calls UUID and nvitop-exporter uuid, so a query can join theirs)
LABELS = ("run", "rank", "host", "device")
GPU_UUID = "gpu_uuid"

# memtop_run_state's states, one series each (1 for the run's state, 0 for the others)
STATES = ("running", "paused", "finished", "interrupted", "failed")
# a run's outcome (probes/analysis/runlist.py run_outcome, probes/runfolder/state.py) -> state;
# "stopped" (a viewer, the memory guard, a full disk) is a run that ended cleanly: finished
OUTCOME_STATE = {"live": "running", "paused": "paused", "finished": "finished",
                 "stopped": "finished", "incomplete": "finished",
                 "interrupted": "interrupted", "failed": "failed"}

# the step split's phases: memtop_phase_seconds{phase=...} from these row fields
PHASES = {"data_wait": "data_wait_ms", "forward": "forward_ms", "backward": "backward_ms",
          "optimizer": "optimizer_ms", "other": "other_ms"}


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric read from a step row's field (scaled to base units)."""

    name: str  # without _total: prometheus_client adds it to a counter's sample
    kind: str  # "gauge" | "counter"
    field: str  # StepSample's field
    cuda: str  # HELP on a CUDA device
    cpu: str  # HELP on the CPU
    scale: float = 1.0  # to base units (ms -> s)
    unit: str = ""  # OpenMetrics' UNIT, where the name ends in it


STEP_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("memtop_allocated_bytes", "gauge", "allocated_bytes",
               "CUDA caching allocator: memory_allocated at the end of the last step",
               "CPU: glibc heap in use (mallinfo2) at the end of the last step", unit="bytes"),
    MetricSpec("memtop_reserved_bytes", "gauge", "reserved_bytes",
               "CUDA caching allocator: memory_reserved at the end of the last step",
               "CPU: bytes glibc malloc holds from the OS (heap held) at the end of the last "
               "step", unit="bytes"),
    MetricSpec("memtop_peak_allocated_bytes", "gauge", "peak_allocated_bytes",
               "CUDA: max_memory_allocated since the reset after warmup",
               "CPU: the highest sampled heap in use since the reset after warmup",
               unit="bytes"),
    MetricSpec("memtop_driver_used_bytes", "gauge", "driver_used_bytes",
               "NVML: device memory used by this process (the driver's view)",
               "CPU: the process's resident set size (RSS)", unit="bytes"),
    MetricSpec("memtop_steps", "counter", "step",
               "optimizer steps finished (the last step row's step)",
               "optimizer steps finished (the last step row's step)"),
    MetricSpec("memtop_step_seconds", "gauge", "step_ms",
               "wall time of the last optimizer step, data to update",
               "wall time of the last optimizer step, data to update", 1e-3, "seconds"),
    MetricSpec("memtop_tokens_per_second", "gauge", "tokens_per_s",
               "tokens of the last step over its wall time",
               "tokens of the last step over its wall time"),
    MetricSpec("memtop_loss", "gauge", "loss", "the last step's loss, as the loop handed it",
               "the last step's loss, as the loop handed it"),
    MetricSpec("memtop_grad_scale", "gauge", "scale",
               "GradScaler's scale after the last step (fp16 runs only)",
               "GradScaler's scale after the last step (runs with a scaler only)"),
    MetricSpec("memtop_skipped_steps", "counter", "skipped_steps",
               "optimizer steps GradScaler skipped (inf/nan gradients) so far",
               "optimizer steps GradScaler skipped (inf/nan gradients) so far"),
)

PHASE_HELP = ("where the last measured step went, by phase: CUDA events (device time) on a GPU",
              "where the last measured step went, by phase: host clocks on the CPU")
LEAK_ALERT_HELP = "1 while a leak alert is open on this rank (memtop's leak watch), else 0"
LEAK_RATE_HELP = ("growth of the leaking counter per step, for the open leak alert with the "
                  "fastest growth (absent when none is open)")
TO_FULL_HELP = ("seconds until the leaking counter reaches its limit at its current growth "
                "(the soonest of the open alerts; absent when none is open or none is known)")
INFO_HELP = "the run's facts as labels (value 1): amp, model, device_name, versions"
STATE_HELP = ("the run's state, one series per state, 1 for the one it is in: running, paused, "
              "finished (ran its steps or stopped on request), interrupted (killed: no "
              "run_finished and nobody answers its socket), failed")
UNREADABLE_HELP = ("lines of this rank's metrics file that could not be read (junk, a "
                   "truncated line, a value that breaks the row schema): skipped, never exported")
INFO_LABELS = ("amp", "model", "device_name", "torch_version", "memtop_version", "params",
               "world_size", "counters")


def help_text(spec_cuda: str, spec_cpu: str, kinds: set[str]) -> str:
    """The HELP of a metric on an endpoint serving runs of ``kinds`` ({"cpu", "cuda"})."""
    if kinds == {"cuda"}:
        return spec_cuda
    if kinds == {"cpu"} or not kinds or spec_cuda == spec_cpu:
        return spec_cpu
    return f"{spec_cuda}; {spec_cpu}"


def device_kind(device: str) -> str:
    return "cuda" if str(device).startswith("cuda") else "cpu"


# every sample name an endpoint can serve (a dashboard or rule may name no other)
EXPORTED: tuple[str, ...] = (
    *(m.name + ("_total" if m.kind == "counter" else "") for m in STEP_METRICS),
    "memtop_phase_seconds", "memtop_leak_alert", "memtop_leak_bytes_per_step",
    "memtop_seconds_to_full", "memtop_run_info", "memtop_run_state",
    "memtop_unreadable_rows_total")
