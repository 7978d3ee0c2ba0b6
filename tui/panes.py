"""The dashboard's panes, each declared once: what it shows from a StepSample, its labels and
help on each device kind, the note under its value, the leak counters it stands for.

The pane grid (tui/app.py), the labels, the values pushed each refresh and the counter section
of the help screen (tui/widgets/help_screen.py) are all made from PANES, so a new counter shown
in a pane touches its probe, the schema (probes/records/step.py), this table and a test.
Kept free of Textual and torch, like tui/format.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from probes import records as R
from probes.records import StepSample
from probes.tools.units import format_bytes

PANE_ROWS = 2  # rows of the pane grid: 80×24 has room for two 3-line rows above the chart


@dataclass(frozen=True)
class OnDevice:
    """What a pane says on one device kind ("cpu" or "cuda")."""

    label: str  # where the pane has room
    short: str  # in a 20-column pane at 80×24 (≤ 9 characters, beside a value)
    help: str  # what the counter is there, and at which moment of the step it is read
    note_help: str = ""  # a help paragraph for the note under the value, when it has one
    watches: tuple[str, ...] = ()  # leak-detector counters (probes/instruments/leak.py) it shows


@dataclass(frozen=True)
class PaneSpec:
    """One pane: its id (``#pane-<id>``), the kind of value (tui/format.py format_value), what
    it says on each device, and how its value is read from a StepSample."""

    id: str
    kind: str  # "bytes" | "rate" | "ms" | "scale" | "loss"
    cpu: OnDevice
    cuda: OnDevice
    value: Callable[[StepSample], float | None]  # None is shown as n/a
    # the line in place of min/max (None keeps min/max), from the newest sample (None before
    # the first) and the run_started row's data
    note: Callable[[StepSample | None, Mapping[str, Any]], str | None] | None = None
    # a label the sample decides (both labels), in place of the device's
    sample_label: Callable[[StepSample], str] | None = None
    # True for a sample that carries no value of this pane's own (a framework logs its loss
    # every few steps): the pane keeps showing the last one instead of n/a
    holds_last: Callable[[StepSample], bool] | None = None

    def on(self, device_type: str) -> OnDevice:
        return self.cuda if device_type == "cuda" else self.cpu


_UNDISTURBED = ("The steps memtop's own diagnosis disturbed are left out of it and of its "
                "min/max (a profiler window's traced steps, the steps while its table is "
                "computed and the 3 after, a culprit look's steps and the one after): the pane "
                "holds the last step before them.")


# ---- how values and notes are read ------------------------------------------------------------
def throughput(sample: StepSample) -> float | None:
    """tokens/s when the loop counts tokens, else samples/s, else steps/s."""
    if sample.tokens_per_s is not None:
        return sample.tokens_per_s
    if sample.samples_per_s is not None:
        return sample.samples_per_s
    return 1000.0 / sample.step_ms if sample.step_ms else None


def throughput_label(sample: StepSample, short: bool = False) -> str:
    """The throughput pane's label for what :func:`throughput` shows (``short``: the unit as
    headless lines write it, tui/headless.py)."""
    if sample.tokens_per_s is not None:
        return "tok/s" if short else "tokens/s"
    return "samples/s" if sample.samples_per_s is not None else "steps/s"


def _finite_or_none(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return x


def _is_cuda(sample: StepSample | None) -> bool:
    return sample is not None and str(sample.device).startswith("cuda")


def cache_free_note(sample: StepSample | None, started: Mapping[str, Any]) -> str | None:
    """CUDA, under reserved: the cache's free bytes, with cudaMalloc retries. CPU: how far heap
    held is above RSS, when it is (held_above_rss_note)."""
    if sample is None:
        return None
    if not _is_cuda(sample):
        return held_above_rss_note(sample)
    alloc, resv = sample.allocated_bytes, sample.reserved_bytes
    if alloc is None or resv is None:
        return None
    retries = sample.alloc_retries
    return f"cache free {format_bytes(max(0, resv - alloc))}" + (
        f", {retries} malloc retries" if retries else "")


def held_above_rss_note(sample: StepSample) -> str | None:
    """CPU, under heap held, when it is above RSS: a heap larger than the whole process read as
    a wrong counter (issue 38); it counts address space malloc holds, resident or not."""
    held, rss = sample.reserved_bytes, sample.host_rss_bytes
    if held is None or rss is None or held <= rss:
        return None
    return f"{format_bytes(held - rss)} above RSS: not resident"


def outside_cache_note(sample: StepSample | None, started: Mapping[str, Any]) -> str | None:
    """CUDA, under NVML used: NVML − reserved (context and libraries, probes/counters/cudamem)."""
    if sample is None or not _is_cuda(sample):
        return None
    resv = sample.reserved_bytes
    if sample.driver_used_bytes is None or resv is None:
        return None
    return f"ctx+libs {format_bytes(sample.driver_used_bytes - resv)} (NVML − reserved)"


def workers_note(sample: StepSample | None, started: Mapping[str, Any]) -> str | None:
    """Under RSS, when the loop has DataLoader workers: how many, and the PSS they add."""
    if sample is None or not sample.workers:
        return None
    pss, kind = sample.workers_pss_bytes, "PSS"
    if pss is None:  # no smaps_rollup here: RSS, which counts shared pages per worker
        pss, kind = sample.workers_rss_bytes, "RSS"
    return f"workers {sample.workers} · +{format_bytes(pss)} ({kind})"


def driver_note(sample: StepSample | None, started: Mapping[str, Any]) -> str | None:
    """CUDA: NVML − reserved; CPU: the DataLoader workers beside the trainer's RSS."""
    if _is_cuda(sample):
        return outside_cache_note(sample, started)
    return workers_note(sample, started)


WORKERS_READ = (
    "the training process's children, read from /proc/PID/smaps_rollup about once a second on "
    "their own thread, never on the step path (memtop's own profiler-analysis child and "
    "multiprocessing's helper processes are left out).")
WORKERS_HELP = (
    "[b]RSS[/b] counts every page a "
    "process maps, so the pages forked workers share with the trainer count again in each "
    "worker; [b]PSS[/b] splits each shared page among the processes that map it, so it adds "
    "up without counting a page twice; [b]USS[/b] is the pages only a worker maps, what it "
    "adds to the box: the leak detector watches the workers' USS, and --max-memory and the "
    "time to full count RSS + the workers' USS. Workers grow for two reasons: a dataset that "
    "caches what __getitem__ returns, and copy-on-read: reading a Python object in a forked "
    "worker writes its reference count, so the page holding it is copied into that worker, "
    "and a big list or dict of Python objects ends up copied into every worker. Keep the "
    "data in numpy arrays, torch tensors or Arrow (one buffer, no object per item) and keep "
    "no per-item cache.")


def gpu_busy_note(sample: StepSample | None, started: Mapping[str, Any]) -> str | None:
    """CUDA, under step time: the clock the step time is on (a run that says, issue 45) and
    how busy NVML saw the GPU at its latest poll."""
    if sample is None:
        return None
    busy = f"GPU busy {sample.gpu_util_pct:.0f}%" if sample.gpu_util_pct is not None else None
    if "step_clock" not in started or not _is_cuda(sample):
        return busy
    clock = "device clock" if R.step_clock(sample, started) == R.STEP_CLOCK_CUDA \
        else "host clock"
    return f"{clock}, {busy}" if busy else clock


def _scale_note(sample: StepSample | None, started: Mapping[str, Any]) -> str | None:
    """Skipped steps while a scaler runs; else why there is none."""
    if sample is not None and sample.scale is not None:
        return f"skipped steps {sample.skipped_steps}"
    if started.get("mode") == "infer":
        return "none: inference"
    amp = str(started.get("amp") or "")
    return f"not needed ({amp})" if amp and amp not in ("fp16", "auto") else None


def _loss_note(sample: StepSample | None, started: Mapping[str, Any]) -> str | None:
    return "none: inference" if started.get("mode") == "infer" else None


def _named(pane_id: str, device_type: str) -> tuple[str, str]:
    """(label, short) of a memory pane: the counter's one name at every width
    (probes/records/names.py), the same in headless, the rank table, the ledger and the help."""
    name = R.counter_name(pane_id, device_type)
    return name, name


def _both(label: str, short: str, help: str) -> dict[str, OnDevice]:
    """A pane that says the same on CPU and CUDA."""
    same = OnDevice(label, short, help)
    return {"cpu": same, "cuda": same}


# ---- the table, in display order --------------------------------------------------------------
PANES: tuple[PaneSpec, ...] = (
    PaneSpec(
        "allocated", "bytes",
        cpu=OnDevice(
            *_named("allocated", "cpu"),
            "bytes malloc has handed out and not taken back (uordblks + hblkhd), the closest "
            "thing to allocated, read at the end of every step (where one read costs over 2 ms "
            "and 1% of the step, every k-th, k ≤ 16: the rows between repeat it and say so in "
            "heap_read_step). It must come back to the same level after every step.",
            watches=("device_allocated", "host_heap")),
        cuda=OnDevice(
            *_named("allocated", "cuda"),
            "bytes held by live tensors (torch.cuda.memory_allocated), read at the end of every "
            "step, after the optimizer update. This is what your code controls: it must come "
            "back to the same level after every step, or something leaks.",
            watches=("device_allocated",)),
        value=lambda s: s.allocated_bytes),
    PaneSpec(
        "reserved", "bytes",
        cpu=OnDevice(
            *_named("reserved", "cpu"),
            "bytes malloc holds from the OS (arena + hblkhd), read with heap used, ≥ heap "
            "used. Freed memory stays here for reuse, like CUDA's reserved.",
            note_help="[b]heap held above RSS[/b] (\"… above RSS: not resident\" under heap "
            "held): heap held counts the address space malloc holds, and a page is resident "
            "only once written: a large tensor's mmap'd block not yet filled, or pages malloc "
            "handed back with madvise, count in heap held but not in RSS. It is not a "
            "wrong reading; RSS is what the kernel charges (--max-memory watches it)."),
        cuda=OnDevice(
            *_named("reserved", "cuda"),
            "bytes the caching allocator holds from the driver (memory_reserved), read with "
            "allocated, always ≥ allocated. Freed tensors return their blocks to this cache, "
            "not to the driver, so reserved stays high after a peak: that is reuse, not a leak.",
            note_help="[b]reserved − allocated[/b] (\"cache free\" under reserved): the cache's "
            "free blocks. Large against allocated, or with cudaMalloc retries, it is "
            "fragmentation; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets segments "
            "grow in place instead."),
        value=lambda s: s.reserved_bytes, note=cache_free_note),
    PaneSpec(
        "peak", "bytes",
        cpu=OnDevice(
            *_named("peak", "cpu"),
            "the largest heap used value memtop saw, at the end of each step and after each "
            "forward pass (while that read costs ≤ 0.2% of a step) and at the ledger's "
            "measurements, since the reset after warmup, leaving out the steps memtop's own "
            "diagnosis disturbed (a profiler window's traced steps, the steps while its table "
            "is computed and the 3 after, a culprit look's steps and the one after: their "
            "buffers are not the model's). A sampled peak can miss a spike "
            "between two samples; CUDA keeps a true high-water mark, CPU does not."),
        cuda=OnDevice(
            *_named("peak", "cuda"),
            "the allocator's high-water mark, reset at the start of every step and read at its "
            "end (that step's peak is what an OOM runs into; --max-memory watches it and "
            "reserved); the pane shows the largest step peak since warmup, leaving out the "
            "steps memtop's own diagnosis disturbed (a profiler window's traced steps, the "
            "steps while its table is computed and the 3 after, a culprit look's steps and "
            "the one after), the mark that "
            "decides whether a bigger batch fits. All three come from one memory_stats read "
            "per step."),
        value=lambda s: s.peak_allocated_bytes),
    PaneSpec(
        "driver", "bytes",
        cpu=OnDevice(
            *_named("driver", "cpu"),
            "resident pages of the whole process (/proc/self/statm), read at the end of every "
            "step: the heap plus code, libraries, thread stacks and pages malloc has not given "
            "back. The CPU stand-in for nvidia-smi's driver-level number.",
            note_help="[b]workers N · +X (PSS)[/b] (under RSS, when the loop has DataLoader "
                      f"workers): {WORKERS_READ}\n\n{WORKERS_HELP}",
            watches=("host_rss", R.WORKERS_COUNTER)),
        cuda=OnDevice(
            *_named("driver", "cuda"),
            "what the driver says this process uses, the number nvidia-smi shows: reserved "
            "plus the CUDA context and library workspaces (cuBLAS, cuDNN). Read every 0.5 s on "
            "its own thread (each step shows the latest reading); n/a when NVML is missing or "
            "cannot be matched to this CUDA device by UUID (memtop never guesses by index).",
            note_help="[b]NVML used − reserved[/b] (\"ctx+libs\" under NVML used): memory "
            "outside PyTorch's cache: the CUDA context (a few hundred MiB), cuBLAS/cuDNN "
            "workspaces, NCCL buffers, other libraries' allocations.\n\n[b]DataLoader "
            "workers[/b] live in host memory, not on the device: the ledger's \"DataLoader "
            f"workers\" line and the leak alerts show them, {WORKERS_READ} " + WORKERS_HELP),
        value=lambda s: s.driver_used_bytes, note=driver_note),
    PaneSpec(
        "scale", "scale",
        **_both("grad scale", "scale",
                "the GradScaler's loss scale (fp16), read when the step ends, with the loss. It "
                "halves, and the step is skipped, when gradients overflow (the count is under "
                "it); \"no scaler\" for bf16 and fp32, which need none."),
        value=lambda s: s.scale, note=_scale_note),
    PaneSpec(
        "tokens", "rate",
        **_both("tokens/s", "tok/s",
                "B×T divided by the step time (the step time pane's: wall time on CPU, the "
                "device's time from CUDA events on a GPU), timed when the step ends. A loop "
                "that counts samples instead shows samples/s, one that counts neither steps/s. "
                "The steps a profiler window or a culprit look disturbed are left out: the pane "
                "holds the last step before them."),
        value=throughput, sample_label=throughput_label, holds_last=R.is_disturbed),
    PaneSpec(
        "step_ms", "ms",
        cpu=OnDevice("step time", "step",
                     "the wall time of the whole step (data to optimizer update), from its start "
                     "to its end. " + _UNDISTURBED),
        cuda=OnDevice("step time", "step",
                      "the device's time for the whole step (data to optimizer update): CUDA "
                      "events recorded at the start and the end of the step, read once the GPU "
                      "reached them (never a sync), so it is the GPU's time, not the host's, "
                      "which runs ahead of it when the loop does not wait. A step whose events "
                      "were not done yet is read at a later step (the step split names it). "
                      + _UNDISTURBED,
                      note_help="The note says which clock the step time is on: \"device "
                                "clock\" (CUDA events), or \"host clock\" (wall time: the "
                                "step split off, or the first steps, before any step's events "
                                "were done). GPU busy: NVML's utilisation at its latest poll "
                                "(every 0.5 s, off the step path): the share of the last "
                                "sample period in which a kernel ran, not how much of the GPU "
                                "it used; n/a on MIG slices, which do not report it."),
        value=lambda s: s.step_ms, note=gpu_busy_note, holds_last=R.is_disturbed),
    PaneSpec(
        "loss", "loss",
        **_both("loss", "loss",
                "the loss the loop handed over, read when the step ends, at the same one "
                "wait for the device as the gradient norm and the scale "
                "(probes/monitor/stepvalues.py); n/a when it is not finite. Under the HF "
                "Trainer it is the loss HF logs, every logging_steps: the pane shows the "
                "last one logged."),
        value=lambda s: _finite_or_none(s.loss), note=_loss_note,
        holds_last=lambda s: s.loss is None),
)

PANE_IDS: tuple[str, ...] = tuple(spec.id for spec in PANES)
CHART_PANES = ("allocated", "reserved", "peak")  # the memory chart's series, named as these
_BY_ID = {spec.id: spec for spec in PANES}


def grid_size() -> tuple[int, int]:
    """(columns, rows) of the pane grid: PANE_ROWS rows, as many columns as the panes need."""
    return math.ceil(len(PANES) / PANE_ROWS), PANE_ROWS


def pane_labels(device_type: str, short: bool = False) -> dict[str, str]:
    """Pane id -> label; CPU counters are named for what glibc and /proc report.

    Short labels fit a 20-column pane at 80×24 ("(s)" = sampled, explained in the help).
    """
    return {spec.id: spec.on(device_type).short if short else spec.on(device_type).label
            for spec in PANES}


def chart_labels(device_type: str) -> tuple[str, str, str]:
    """The memory chart's series names: the labels of the panes it draws."""
    a, b, c = (_BY_ID[pane_id].on(device_type).label for pane_id in CHART_PANES)
    return a, b, c


def sample_values(sample: StepSample) -> dict[str, float | None]:
    """The value each pane shows for one StepSample (None -> n/a)."""
    return {spec.id: spec.value(sample) for spec in PANES}


def counter_pane(counter: str, device_type: str) -> str | None:
    """Which pane shows the leak counter that grew (None when no pane shows it)."""
    return next((spec.id for spec in PANES if counter in spec.on(device_type).watches), None)
