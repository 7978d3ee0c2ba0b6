"""GPU check: every claim memtop makes about CUDA, checked on a real GPU, one claim at a time.

    python -m benchmarks.gpu.check OUT_DIR [--device cuda|cuda:N] [--budget-s 330]
                                       [--only NAME_OR_GROUP,...]
    python -m benchmarks.gpu.check OUT_DIR --dry-run     # lists every claim NOT RUN, runs none
    python -m benchmarks.gpu.check OUT_DIR --device cpu  # smoke run: CUDA claims NOT RUN

The claims live in benchmarks/gpu/claims/<area>.py, one function each, registered through
benchmarks/gpu/registry.py (its docstring says how to add one). Each claim runs on its own
thread with its own time limit: a claim that fails, raises or hangs is recorded and the next one
runs. After every claim OUT_DIR/summary.json, summary.md and results.jsonl are rewritten, so a
run that is killed keeps every claim finished so far (the rest read NOT RUN, not reached).
The device tensors Python reaches are counted before and after each claim (a claim must free
its model), beside allocated memory.

Writes into OUT_DIR (new or empty): summary.md (every claim PASS / FAIL / NOT RUN with its
detail), summary.json (with figures and tracebacks), results.jsonl, gpu_check.log,
environment.json, runs/ (each claim's run folders) and the dashboard SVGs. Without CUDA (and no
--device cpu) it prints one line and exits 2, writing nothing. Exit 0 when no claim failed, 1
otherwise. On the lent GPU machine run it through benchmarks/gpu/run.sh, which installs the
missing wheels and packs the results into the files that machine can return; its claims go into
RESULTS.md's rows with `python -m benchmarks record-gpu OUT_DIR/summary.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

from benchmarks.gpu import device  # noqa: E402
from benchmarks.gpu import registry as reg  # noqa: E402

LEFTOVER_LIMIT_BYTES = 1 << 20  # more live bytes after a claim than before: it kept a model


@dataclasses.dataclass
class Result:
    name: str
    group: str
    text: str
    status: str = reg.NOT_RUN
    detail: str = "not reached"
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    leftover_bytes: int | None = None  # allocated after − before (a figure: workspaces too)
    leftover_tensor_bytes: int | None = None  # device tensors still reachable (judged)
    traceback: str | None = None


def run_one(c: reg.Claim, ctx: reg.Ctx) -> Result:
    """One claim on its own thread, under its time limit; whatever happens, a Result."""
    r = Result(c.name, c.group, c.text)
    if c.cuda_only and not ctx.is_cuda:
        r.detail = "CUDA only (this run is on the CPU)"
        return r
    missing = [m for m in c.requires if importlib.util.find_spec(m) is None]
    if missing:
        r.detail = f"not installed: {', '.join(missing)}"
        return r
    if ctx.left_s() < c.needs_s:
        r.detail = f"time budget: {ctx.left_s():.0f} s left, the claim needs {c.needs_s:.0f} s"
        return r
    before = device.allocated_bytes(ctx.device)
    tensors_before = device.live_tensor_bytes(ctx.device)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["outcome"] = c.fn(ctx)
        except BaseException as exc:  # the claim's FAIL; the runner goes on
            box["error"] = exc
            box["traceback"] = traceback.format_exc()

    t0 = time.monotonic()
    thread = threading.Thread(target=target, name=f"gpu-claim-{c.name}", daemon=True)
    thread.start()
    thread.join(max(1.0, min(c.limit_s, ctx.left_s() + 20.0)))
    r.seconds = round(time.monotonic() - t0, 1)
    if thread.is_alive():
        r.status, r.detail = reg.FAIL, (f"did not finish in {r.seconds:.0f} s (given up; its "
                                        "thread may still hold the GPU)")
        return r
    outcome = box.get("outcome")
    if "error" in box:
        exc = box["error"]
        r.status, r.detail = reg.FAIL, f"{type(exc).__name__}: {exc}"
        r.traceback = box["traceback"]
    elif not isinstance(outcome, reg.Outcome):
        r.status, r.detail = reg.FAIL, f"the claim returned {type(outcome).__name__}"
    else:
        r.status, r.detail, r.figures = outcome.status, outcome.detail, outcome.figures
    box.clear()  # the claim's outcome holds no model; its frames go with the exception
    device.free_device()
    after = device.allocated_bytes(ctx.device)
    tensors_after = device.live_tensor_bytes(ctx.device)
    if before is not None and after is not None:
        r.leftover_bytes = after - before
    if tensors_before is not None and tensors_after is not None:
        r.leftover_tensor_bytes = tensors_after - tensors_before
        ctx.leftovers[c.name] = r.leftover_tensor_bytes
    return r


def _cell(text: Any, limit: int = 400) -> str:
    return str(text).replace("|", "/").replace("\n", " ")[:limit]


def write_summary(out: Path, results: list[Result], meta: dict[str, Any]) -> int:
    """summary.json and summary.md from the results so far (the rest NOT RUN, not reached);
    returns the exit status the run would have now."""
    failed = [r.name for r in results if r.status == reg.FAIL]
    counts = {s: sum(r.status == s for r in results) for s in (reg.PASS, reg.FAIL, reg.NOT_RUN)}
    data = {**meta, "seconds": round(time.time() - meta["started"], 1), "ok": not failed,
            "counts": counts, "claims": [dataclasses.asdict(r) for r in results]}
    _write(out / "summary.json", json.dumps(data, indent=2, default=str) + "\n")
    lines = [f"# memtop GPU check ({meta['started_utc']} UTC, {data['seconds']} s)", "",
             f"Device: {meta.get('device_name') or meta['device']}; torch {meta['torch']}, "
             f"CUDA {meta['torch_cuda']}; Python {meta['python']}; `{meta['command']}`", "",
             f"**{counts[reg.PASS]} PASS, {counts[reg.FAIL]} FAIL, {counts[reg.NOT_RUN]} NOT "
             f"RUN** of {len(results)} claims"
             + (f"; failed: {', '.join(failed)}" if failed else ""), "",
             "| group | claim | status | s | detail |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.group} | `{r.name}`: {_cell(r.text, 300)} | **{r.status}** | "
                     f"{r.seconds:g} | {_cell(r.detail)} |")
    if counts[reg.PASS] == 0 and counts[reg.FAIL] == 0:
        lines += ["", "Nothing measured: every claim NOT RUN."]
    _write(out / "summary.md", "\n".join(lines) + "\n")
    return 1 if failed else 0


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _meta(device: str, started: float) -> dict[str, Any]:
    import platform

    import torch

    name = None
    if device.startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name(torch.device(device))
    return {"device": device, "device_name": name, "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "python": platform.python_version(),
            "started": started,
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
            "command": " ".join([os.path.basename(sys.executable), *sys.argv])}


def select(claims: list[reg.Claim], only: str) -> tuple[list[reg.Claim], set[str]]:
    """The claims --only names (claim names or groups); the unknown names."""
    wanted = {n.strip() for n in only.split(",") if n.strip()}
    if not wanted:
        return claims, set()
    known = {c.name for c in claims} | {c.group for c in claims}
    return [c for c in claims if c.name in wanted or c.group in wanted], wanted - known


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output folder (created; must be new or empty)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (smoke run)")
    parser.add_argument("--budget-s", type=float, default=330.0,
                        help="start no claim after this many seconds (each has a time limit)")
    parser.add_argument("--only", default="", help="comma-separated claim names or groups")
    parser.add_argument("--dry-run", action="store_true",
                        help="run no claim: summary.md lists every claim NOT RUN")
    args = parser.parse_args(argv)
    reg.load_claim_modules()
    claims, unknown = select(reg.ordered_claims(), args.only)
    if unknown:
        print(f"gpu_check: unknown claim or group: {', '.join(sorted(unknown))}",
              file=sys.stderr)
        return 2
    import torch

    is_cuda = args.device.startswith("cuda")
    if is_cuda and not args.dry_run and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}, "
              f"torch.cuda.is_available() is False): nothing measured, nothing written; run it "
              f"on a CUDA machine, or pass --device cpu for a smoke run", file=sys.stderr)
        return 2
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        print(f"gpu_check: {args.out} is not an empty folder; give a new one", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    meta = _meta(args.device if not args.dry_run else "dry run", started)
    results = [Result(c.name, c.group, c.text) for c in claims]
    if args.dry_run:
        for r in results:
            r.detail = "dry run"
        write_summary(args.out, results, meta)
        print(f"gpu_check: {len(results)} claims listed in {args.out / 'summary.md'}")
        return 0
    log_fh = open(args.out / "gpu_check.log", "w", encoding="utf-8")

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        log_fh.write(line + "\n")
        log_fh.flush()

    ctx = reg.Ctx(args.out, args.device, time.monotonic() + args.budget_s, log)
    write_summary(args.out, results, meta)
    code = 0
    for i, c in enumerate(claims):
        log(f"{c.name} ...")
        results[i] = r = run_one(c, ctx)
        log(f"{c.name}: {r.status} ({r.seconds} s) {r.detail}")
        with open(args.out / "results.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(dataclasses.asdict(r), default=str) + "\n")
        code = write_summary(args.out, results, meta)  # partial results survive a kill
    log(f"done in {time.time() - started:.0f} s: {args.out / 'summary.md'}")
    log_fh.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
