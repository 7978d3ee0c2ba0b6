"""A GPU run's claims into RESULTS.md: each claim's row ``gpu/<name>`` (met = PASS, missed =
FAIL, with its detail and the run's date and device) and the run's claim table as a section of
that day's log in benchmarks/results/.

    python -m benchmarks record-gpu OUT/gpu_check.json      # summary.json of benchmarks.gpu.check
    python -m benchmarks record-gpu results.jsonl --date 2026-12-04T14:43 --machine "NVIDIA H200"
    python -m benchmarks record-gpu --add-missing           # a NOT RUN row for each new claim

A claim the run did not run (NOT RUN: the time budget, one GPU) leaves a row that holds a
measured status as it was. A run on the CPU (a rehearsal, --device cpu, a dry run) measured no
claim and is refused.
"""

from __future__ import annotations

import argparse
import calendar
import json
import sys
import time
from pathlib import Path

from benchmarks.harness.results import LOGS, RESULTS, Figure, Table, cell, record

STATUS = {"PASS": "met", "FAIL": "missed", "NOT RUN": "NOT RUN"}


def read_run(path: Path) -> tuple[list[dict], dict]:
    """(claims, meta) of a summary.json (gpu_check.json) or a results.jsonl."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()], {}
    data = json.loads(text)
    return data["claims"], data


def what(text: str, limit: int = 140) -> str:
    """A claim's statement, cut for the table at a word (the whole is in the registry)."""
    text = cell(text, 1000)
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def figures(claims: list[dict], table: Table) -> list[Figure]:
    out = []
    for c in claims:
        fid = f"gpu/{c['name']}"
        held = table.rows.get(fid)
        if c["status"] == "NOT RUN" and held is not None and held[4] != "NOT RUN":
            continue  # keep the last measured status
        out.append(Figure(fid, what(c["text"]), "PASS", cell(c["detail"], 200),
                          STATUS.get(c["status"], "missed"),
                          f"GPU_RUN_ONLY={c['name']} bash benchmarks/gpu/run.sh"))
    return out


def log_body(claims: list[dict], meta: dict) -> str:
    counts = {s: sum(c["status"] == s for c in claims) for s in STATUS}
    lines = [f"**{counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['NOT RUN']} NOT RUN** of "
             f"{len(claims)} claims" + (f"; torch {meta['torch']}, CUDA {meta['torch_cuda']}"
                                        if meta.get("torch") else "") + ".", "",
             "| group | claim | status | s | detail |", "|---|---|---|---|---|"]
    lines += [f"| {c['group']} | `{c['name']}` | **{c['status']}** | {c.get('seconds', '')} | "
              f"{cell(c['detail'])} |" for c in claims]
    return "\n".join(lines)


def add_missing(results: Path) -> int:
    """A NOT RUN row for every registered claim without one; the gpu/ rows in the registry's
    order (rows of claims no longer registered last). Returns how many rows were added."""
    from benchmarks.gpu import registry as reg

    reg.load_claim_modules()
    table = Table(results)
    claims = reg.ordered_claims()
    new = [c for c in claims if f"gpu/{c.name}" not in table.rows]
    for c in new:
        table.set(Figure(f"gpu/{c.name}", what(c.text), "PASS", "not run on a GPU yet",
                         "NOT RUN", f"GPU_RUN_ONLY={c.name} bash benchmarks/gpu/run.sh"),
                  "", "", "", "")
    order = [f"gpu/{c.name}" for c in claims]
    rows = {k: v for k, v in table.rows.items() if not k.startswith("gpu/")}
    rows.update({k: table.rows[k] for k in order})
    rows.update({k: v for k, v in table.rows.items() if k not in rows})
    table.rows = rows
    table.save()
    return len(new)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks record-gpu",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("summary", type=Path, nargs="?",
                    help="gpu_check.json / summary.json, or results.jsonl")
    ap.add_argument("--add-missing", action="store_true",
                    help="only add a NOT RUN row for each claim the table lacks")
    ap.add_argument("--date", help="YYYY-MM-DDTHH:MM UTC of the run (default: the summary's)")
    ap.add_argument("--machine", help="the device and its host, as the table's machine cell "
                                      "(default: the summary's device name)")
    ap.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    ap.add_argument("--logs", type=Path, default=LOGS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.add_missing:
        print(f"record-gpu: {add_missing(args.results)} NOT RUN rows added to {args.results.name}")
        return 0
    if args.summary is None:
        ap.error("give a gpu_check summary (or --add-missing)")
    try:
        claims, meta = read_run(args.summary)
        when = (calendar.timegm(time.strptime(args.date, "%Y-%m-%dT%H:%M")) if args.date
                else float(meta["started"]))
    except (OSError, ValueError, KeyError) as exc:
        print(f"record-gpu: {args.summary}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    device = meta.get("device", "cuda")
    if not str(device).startswith("cuda") or not any(c["status"] != "NOT RUN" for c in claims):
        print(f"record-gpu: {args.summary} measured no claim on a GPU (device {device}): "
              "nothing recorded", file=sys.stderr)
        return 2
    machine = args.machine or meta.get("device_name") or device
    figs = figures(claims, Table(args.results))
    log, _ = record(f"GPU check on {machine}", log_body(claims, meta), figs,
                 command="bash benchmarks/gpu/run.sh", machine_line=machine,
                 machine_short=machine, results=args.results, logs=args.logs, when=when)
    print(f"record-gpu: {len(figs)} rows of {args.results.name} updated; log {log}")
    return 0
