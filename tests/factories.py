"""What the tests build and read, defined once: tiny configs and their `memtop train` options,
StepSamples, hand-written run folders, a sink that keeps records, the rows of a metrics file,
the processes a test starts (with the suite's environment), and waits on conditions.

Fixtures built from these are in tests/conftest.py. Nothing here imports torch at module level:
collecting a test file that needs none stays cheap.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.harness.pairs import in_thread  # noqa: F401  (torch work off the main thread)
from probes import records as R
from probes.records import Event, StepSample
from probes.runfolder import METRICS, json_line, read_metrics, write_json

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"  # recorded CUDA data (tests/data/README.md)

# torch's and Kineto's chatter on every run, silenced here and in every process a test starts
QUIET_LOGS = {"TORCH_CPP_LOG_LEVEL": "ERROR", "KINETO_LOG_LEVEL": "5"}
# One OpenMP thread per torch process: the tiny models gain nothing from more, and two torch
# processes with a thread per core each slowed each other ~40x on 2 cores (docs/ARCHITECTURE.md);
# the suite runs on two workers and its tests start children (tests/conftest.py sets it).
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# --- tiny runs -----------------------------------------------------------------------------------
TINY = dict(device="cpu", layers=1, heads=2, dim=32, seq_len=16, block_size=32, batch_size=4,
            warmup_steps=2)


def resolved_amp(run_dir: Path) -> str:
    """The amp mode a run resolved (config.json): what a test expects follows it, never the CPU
    the test was written on (bf16 where it is native or MEMTOP_CPU_BF16=native, fp32 else)."""
    return json.loads((Path(run_dir) / "config.json").read_text())["resolved_amp"]


def cli_options(values: dict[str, Any]) -> list[str]:
    """`memtop train` options for TrainConfig fields: ``{"seq_len": 16}`` -> --seq-len 16."""
    return [part for key, value in values.items()
            for part in (f"--{key.replace('_', '-')}", str(value))]


TINY_ARGS = tuple(cli_options(TINY))  # the tiny run, as `memtop train` options
SWEEP_ARGS = ("--device", "cpu", "--dim", "32", "--layers", "1", "--heads", "2", "--amp", "off",
              "--warmup-steps", "2")  # `memtop sweep` options around the grid a test gives


# the packages that never import torch (pyproject.toml's import contracts, docs/ARCHITECTURE.md)
TORCH_FREE = ("probes.tools", "probes.records", "probes.runfolder", "probes.control",
              "probes.traces", "probes.analysis", "probes.export")


# --- processes -----------------------------------------------------------------------------------
def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a child that imports memtop from this checkout: this process's, with
    ROOT first on PYTHONPATH and torch's logs quiet; ``extra`` on top."""
    env = {**QUIET_LOGS, **os.environ}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                        if p)
    env.update(extra)
    return env


def run_cli(*args: str, cwd: Path | str | None = None, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m tui.cli ARGS` to its end (real process, real exit code, output kept);
    ``env`` adds to the suite's environment."""
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env=subprocess_env(**(env or {})), stdin=subprocess.DEVNULL)


def start_cli(*args: str, **popen: Any) -> subprocess.Popen:
    """Start `python -m tui.cli ARGS` and return at once: the test waits on what it writes and
    ends it. ``popen`` goes to Popen (stdout, env, ...)."""
    popen.setdefault("cwd", ROOT)
    popen.setdefault("env", subprocess_env())
    popen.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen([sys.executable, "-m", "tui.cli", *args], **popen)


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -c CODE ARGS`` in a fresh interpreter (nothing imported yet), output kept."""
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=subprocess_env(),
                          stdin=subprocess.DEVNULL)


def shared_gpu_artifact(name: str) -> Path | None:
    """A file of ``../shared/gpu-artifacts/`` (real GPU traces and snapshots recorded by others,
    too big for tests/data; CI has the folder beside its checkout), or None when this machine
    has none. It is looked for beside the checkout, and beside the main checkout whose git
    directory this one shares: a git worktree lives elsewhere (e.g. /work/wt/NAME) but its
    common git directory is the main checkout's .git."""
    roots = [ROOT.parent]
    try:
        common = subprocess.run(["git", "rev-parse", "--git-common-dir"], cwd=ROOT,
                                capture_output=True, text=True, timeout=10).stdout.strip()
        if common:
            roots.append((ROOT / common).resolve().parent.parent)
    except (OSError, subprocess.SubprocessError):
        pass
    for root in roots:
        path = root / "shared" / "gpu-artifacts" / name
        if path.is_file():
            return path
    return None


def import_benchmark(name: str) -> ModuleType:
    """A module of the benchmarks package by its dotted name under benchmarks/ ("gpu.registry",
    "cases.step_cost.synthetic_step"); a flat script of benchmarks/ (``benchmarks/X.py``, which
    imports ``common`` by bare name) by its bare name."""
    if "." not in name and (ROOT / "benchmarks" / f"{name}.py").is_file():
        folder = str(ROOT / "benchmarks")
        if folder not in sys.path:
            sys.path.insert(0, folder)
        return importlib.import_module(name)
    return importlib.import_module(f"benchmarks.{name}")


def import_example(name: str) -> ModuleType:
    """A script of examples/ as a module (its model and data builders, its main)."""
    folder = str(ROOT / "examples")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


# --- threads and waits ---------------------------------------------------------------------------
DEADLINE_S = 90.0  # an upper bound for a busy 2-core machine, never a duration to wait out




def wait_until(condition, what: str, timeout_s: float = DEADLINE_S, poll_s: float = 0.01):
    """Block until ``condition()`` is true (returns its value); AssertionError naming ``what``
    after ``timeout_s``. For threads and processes; ``wait_for`` below is the Pilot's."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll_s)
    return value


async def wait_for(pilot, condition, what: str, step_s: float = 0.1) -> None:
    """Let the app run until ``condition()`` holds; fail with ``what`` after a long deadline."""
    waited = 0.0
    while not condition():
        if waited > DEADLINE_S:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(step_s)
        waited += step_s


# --- records -------------------------------------------------------------------------------------
def make_sample(step: int = 1, **fields: Any) -> StepSample:
    """A step of a tiny CPU bf16 run; ``fields`` set whatever the test looks at."""
    values: dict[str, Any] = dict(
        step=step, time_s=0.1 * step, loss=2.0, tokens_per_s=1000.0, step_ms=10.0,
        allocated_bytes=100, reserved_bytes=200, peak_allocated_bytes=150,
        driver_used_bytes=None, host_rss_bytes=300, scale=None, skipped_steps=0, amp="bf16",
        device="cpu")
    values.update(fields)
    return StepSample(**values)


def started_event(**data: Any) -> Event:
    """The run_started row of a tiny CPU bf16 run; ``data`` adds or replaces its fields."""
    return Event(R.RUN_STARTED, 0, 0.0, {"device": "cpu", "amp": "bf16", "params": 10, **data})


def record_line(record: StepSample | Event) -> bytes:
    """A record as one line of metrics.jsonl, as memtop writes it."""
    return json_line(record.to_json()).encode() + b"\n"


class RecordSink:
    """A trainer sink that keeps every record: steps and events apart, and all in order."""

    def __init__(self) -> None:
        self.samples: list[StepSample] = []
        self.events: list[Event] = []
        self.records: list[StepSample | Event] = []

    def __call__(self, record: StepSample | Event) -> None:
        (self.samples if isinstance(record, StepSample) else self.events).append(record)
        self.records.append(record)

    def named(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.event == kind]


def run_context(run_dir: Path, **fields: Any):
    """The RunContext a loop gives its hooks at set-up (probes/instruments/hooks.py), for a hook
    driven by hand: a CPU loop with nothing in it; ``fields`` set what the hook reads."""
    import torch

    from probes.instruments.hooks import RunContext

    values: dict[str, Any] = dict(
        model=None, optimizer=None, scaler=None, device=torch.device("cpu"), amp="off",
        run_dir=Path(run_dir), memory=None, emit=lambda event: None, elapsed_s=lambda: 0.0,
        device_total_bytes=None)
    values.update(fields)
    return RunContext(**values)


# --- a profiler window's table ----------------------------------------------------------------
# three rows of a CPU window's top ops, as profile_done carries them
TOP_OPS = [
    {"name": "aten::mm", "calls": 105, "self_cpu_us": 31000.0, "cpu_total_us": 31400.0,
     "self_device_us": None, "device_total_us": None, "cpu_memory_bytes": None,
     "device_memory_bytes": None},
    {"name": "aten::copy_", "calls": 1272, "self_cpu_us": 24000.0, "cpu_total_us": 24000.0,
     "self_device_us": None, "device_total_us": None, "cpu_memory_bytes": None,
     "device_memory_bytes": None},
    {"name": "autograd::engine::evaluate_function: ScaledDotProductAttentionBackward0",
     "calls": 12, "self_cpu_us": 900.0, "cpu_total_us": 45000.0, "self_device_us": None,
     "device_total_us": None, "cpu_memory_bytes": None, "device_memory_bytes": None},
]


# --- run folders, read ---------------------------------------------------------------------------
def read_jsonl(path: Path) -> list[dict]:
    """Every row of a JSONL file in order; each line must be whole JSON (a torn one raises)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def read_jsonl_so_far(path: Path) -> list[dict]:
    """The rows of a JSONL file another process is still appending to: the complete lines only
    (a last line without its newline is being written), none while the file is absent."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")[:-1]
    return [json.loads(line) for line in lines if line.strip()]


def metrics_rows(run_dir: Path, name: str = METRICS) -> tuple[list[dict], list[dict]]:
    """(step rows, event rows) of a finished run's metrics file, every line whole JSON."""
    rows = read_jsonl(Path(run_dir) / name)
    return [r for r in rows if "event" not in r], [r for r in rows if "event" in r]


def events_named(run_dir: Path, kind: str, name: str = METRICS) -> list[dict]:
    return [e for e in metrics_rows(run_dir, name)[1] if e["event"] == kind]


def event_names(run_dir: Path) -> list[str]:
    """The events of a run still being written; the line being written is left out."""
    return [e["event"] for e in read_metrics(Path(run_dir) / METRICS)[1]]


# --- run folders, written by hand ----------------------------------------------------------------
RUN_CONFIG = dict(device="cpu", amp="off", batch_size=4, seq_len=16, block_size=32, layers=1,
                  heads=2, dim=32, attention="explicit", steps=60, warmup_steps=2, seed=1,
                  run_dir="runs")


def write_run(path: Path, *, amp: str = "off", step_ms: float = 10.0, jitter: float = 0.05,
              peak: int = 1000, loss_shift: float = 0.0, part_at: int | None = None,
              steps: int = 60, seed: int = 0, **config: Any) -> Path:
    """A run folder as memtop writes it: config.json (RUN_CONFIG with ``config``), metrics.jsonl
    with run_started, one row per step (step times around ``step_ms``, loss falling and, from
    ``part_at``, parting), run_finished."""
    rng = random.Random(seed)
    path.mkdir(parents=True)
    write_json(path / "config.json", dict(RUN_CONFIG, amp=amp, steps=steps, **config))
    rows: list[StepSample | Event] = [
        Event(R.RUN_STARTED, 0, 0.0, {"device": "cpu", "amp": amp, "params": 1000})]
    for step in range(1, steps + 1):
        ms = step_ms * (1 + jitter * (rng.random() - 0.5))
        loss = 5.0 - step * 0.02 + loss_shift
        if part_at is not None and step >= part_at:
            loss += 0.05 * (step - part_at + 1)
        rows.append(make_sample(step, time_s=step * ms / 1000, loss=loss,
                                tokens_per_s=64 * 1000 / ms, step_ms=ms,
                                allocated_bytes=peak // 2, reserved_bytes=peak,
                                peak_allocated_bytes=peak, driver_used_bytes=peak * 3,
                                host_rss_bytes=peak * 3, amp=amp))
    rows.append(Event(R.RUN_FINISHED, steps, 1.0, {"reason": "finished"}))
    (path / METRICS).write_text("".join(json_line(r.to_json()) + "\n" for r in rows),
                                encoding="utf-8")
    return path


RUN_FILES = ("config.json", METRICS)  # what a run writes; report.md/json are derived from them


def copy_run(src: Path, dst: Path) -> Path:
    """A copy of a run folder's own files, for a test to change."""
    dst.mkdir()
    for name in RUN_FILES:
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_digests(run_dir: Path) -> dict[str, str]:
    """The digests of a run folder's own files: equal before and after means untouched."""
    return {name: file_digest(Path(run_dir) / name) for name in RUN_FILES}


def write_junk_run(tmp_path: Path, started: dict, extra: list, tail: str = "") -> Path:
    """A 5-step run folder whose rows parse as JSON but may hold values of the wrong type:
    ``started`` goes into run_started, ``extra`` rows before run_finished, ``tail`` after."""
    run_dir = tmp_path / "junk"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(dict(TINY, steps=5)))
    rows = [{"event": "run_started", "step": 0, "time_s": 0.0, "device": "cpu",
             "device_name": "CPU", "amp": "bf16", "params": 21984,
             "system": {"cpu_model": "test CPU", "cpu_count": 2, "ram_bytes": 2**30}, **started}]
    rows += [{"step": s, "time_s": s / 10, "loss": 5.0 - s / 10, "tokens_per_s": 640.0,
              "step_ms": 100.0, "peak_allocated_bytes": 4096, "reserved_bytes": 8192,
              "driver_used_bytes": 2**20, "skipped_steps": 0} for s in range(1, 6)]
    rows += extra + [{"event": "run_finished", "step": 5, "time_s": 0.6, "reason": "finished"}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (run_dir / METRICS).write_text(text + tail)
    return run_dir


# --- inference -----------------------------------------------------------------------------------
INFER_TINY = dict(device="cpu", layers=1, heads=2, dim=32, block_size=32, batch_size=2,
                  prompt_len=8, new_tokens=8, requests=2, baseline_tokens=4, profile_phase="none")


def run_infer(tmp_path: Path, control=None, **overrides: Any):
    """A tiny `memtop infer` run on a thread, to its end: (exit code, run folder, step rows,
    event rows); every row of its metrics file must read."""
    from probes.runfolder import create_run_dir
    from trainer.infer import InferenceRunner
    from trainer.infer_config import InferConfig, prepare_model

    cfg = InferConfig(**{**INFER_TINY, "run_dir": str(tmp_path / "runs"), **overrides})
    spec = prepare_model(cfg)
    run_dir = create_run_dir(cfg.run_dir)
    runner = InferenceRunner(cfg, spec, run_dir, control=control, listen=False,
                             freeze_gc=False)
    code = in_thread(runner.run)
    steps, events, bad = read_metrics(run_dir / METRICS)
    assert bad == 0
    return code, run_dir, steps, events
