"""The run folder: its paths, atomic writes, the metrics writer, and reading it back (whole or
followed live). The one module that knows the folder's layout (docs/ARCHITECTURE.md):

    runs/<YYYYmmdd-HHMMSS>-<id>/      never reused, never overwritten
      config.json                     the options as given (rank 0 writes it)
      metrics.jsonl                   one JSON object a line: step rows and event rows
      metrics-rank-K.jsonl            instead, one file per rank when several processes write
      control.sock / control-rank-K.sock   the live run's request socket (mode 0600)
      profiles/step-N/[rank-K/]       trace.json, top_ops.txt/json, window.json
      report.md, report.json          written at the end, on request, or by `memtop report`
      weights.pt                      `memtop train`'s weights at the end (memtop header +
                                      state_dict; read with torch.load(weights_only=True))
      stderr.log                      what libraries printed while the dashboard owned the tty
      torchrun.log                    torch.distributed.run's output (memtop train --nproc N)
"""


from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from pathlib import Path

from probes.records.errors import MemtopError

CONFIG = "config.json"
METRICS = "metrics.jsonl"
REPORT_MD = "report.md"
REPORT_JSON = "report.json"
STDERR_LOG = "stderr.log"
TORCHRUN_LOG = "torchrun.log"  # torch.distributed.run's own output under `memtop train --nproc`
PROFILES = "profiles"
WEIGHTS = "weights.pt"
_RANK_FILE = re.compile(r"^metrics-rank-(\d+)\.jsonl$")


class RunFolderError(MemtopError, ValueError):
    """The run folder cannot be created, written or read as one (bad input: exit 2)."""


# ---- paths ---------------------------------------------------------------------------------------
def metrics_name(rank: int | None) -> str:
    """metrics.jsonl for a lone process; metrics-rank-K.jsonl when ranks write side by side."""
    return METRICS if rank is None else f"metrics-rank-{rank}.jsonl"


def socket_name(rank: int | None) -> str:
    return "control.sock" if rank is None else f"control-rank-{rank}.sock"


def profile_dir(run_dir: Path, first_step: int, rank: int | None = None) -> Path:
    """profiles/step-N/ (or profiles/step-N/rank-K/ under several ranks)."""
    path = Path(run_dir) / PROFILES / f"step-{first_step}"
    return path / f"rank-{rank}" if rank is not None else path


def weights_path(run_dir: Path) -> Path:
    return Path(run_dir) / WEIGHTS


def find_weights(path: str | os.PathLike[str]) -> Path:
    """A weights file given as itself or as the run folder holding weights.pt."""
    path = Path(path)
    if not path.exists():
        raise RunFolderError(f"{path} does not exist")
    if path.is_dir():
        if not weights_path(path).is_file():
            raise RunFolderError(f"{path} has no {WEIGHTS} (runs save it at the end unless "
                                 "--no-save-weights; inference runs have none)")
        return weights_path(path)
    return path


def metrics_files(run_dir: Path) -> dict[int | None, Path]:
    """The metrics files a run folder holds: {None: metrics.jsonl} or {rank: metrics-rank-K}."""
    run_dir = Path(run_dir)
    found: dict[int | None, Path] = {}
    if (run_dir / METRICS).is_file():
        found[None] = run_dir / METRICS
    with contextlib.suppress(OSError):
        for entry in os.scandir(run_dir):
            match = _RANK_FILE.match(entry.name)
            if match:
                found[int(match.group(1))] = Path(entry.path)
    return dict(sorted(found.items(), key=lambda kv: -1 if kv[0] is None else kv[0]))


def is_run_folder(path: Path) -> bool:
    path = Path(path)
    return path.is_dir() and ((path / CONFIG).is_file() or bool(metrics_files(path)))


def check_run_folder(path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a run folder, else RunFolderError with one sentence."""
    path = Path(path)
    if not path.exists():
        raise RunFolderError(f"{path} does not exist")
    if not path.is_dir():
        raise RunFolderError(f"{path} is not a folder")
    if not is_run_folder(path):
        raise RunFolderError(f"{path} is not a memtop run folder (no config.json or "
                             "metrics.jsonl)")
    return path


def _subfolders(path: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(path) if e.is_dir()]
    except OSError:
        return []


def find_runs(root: str | os.PathLike[str]) -> list[Path]:
    """Run folders under ``root``, directly or one folder deeper (``--run-dir runs/fp32``
    puts them in runs/fp32/<id>), oldest first (names start with their start time)."""
    found = []
    for path in _subfolders(Path(root)):
        if is_run_folder(path):
            found.append(path)
        else:
            found += [p for p in _subfolders(path) if is_run_folder(p)]
    return sorted(found, key=lambda p: p.name)


def resolve_run(path: str | os.PathLike[str]) -> Path:
    """A run folder, or the newest run in a folder of runs; RunFolderError otherwise."""
    path = Path(path)
    if not path.exists():
        raise RunFolderError(f"{path} does not exist")
    if is_run_folder(path):
        return path
    runs = find_runs(path)
    if not runs:
        raise RunFolderError(f"{path} is neither a memtop run folder nor a folder of runs")
    return runs[-1]


def create_run_dir(root: str | os.PathLike[str]) -> Path:
    """Make ``root/<YYYYmmdd-HHMMSS>-<id>/``; the random id keeps two runs in one second apart."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        msg = (f"cannot create run directory root {root}: {exc.strerror or exc}; "
               "pass --run-dir DIR to write elsewhere")
        raise RunFolderError(msg) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise RunFolderError(f"run directory root {root} is not writable; pass --run-dir DIR")
    for _ in range(10):
        path = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            msg = f"cannot create run directory {path}: {exc.strerror or exc}"
            raise RunFolderError(msg) from None
    raise RunFolderError(f"could not find a fresh run directory name under {root}")
