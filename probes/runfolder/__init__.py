"""The run folder, the one interface between every writer and every reader of a run: its
layout, atomic files, the metrics writer and recorder, and reading it back (whole, quickly for
a long run, or followed live). Never imports torch, so `memtop view`, `runs` and `report`
stay light.

    from probes.runfolder import create_run_dir, RunRecorder, read_rows, Follower

    run_dir = create_run_dir("runs")             # runs/<YYYYmmdd-HHMMSS>-<id>/, never reused
    recorder = RunRecorder(run_dir, config={})   # config.json, then metrics.jsonl rows
    recorder.emit("run_started", 0, {"device": "cpu"})
    rows = read_rows(run_dir / "metrics.jsonl")  # every row; junk lines counted in rows.bad
    follower = Follower(run_dir / "metrics.jsonl")
    new_rows = follower.poll()                   # complete rows appended since the last poll

Modules: layout (names, paths, finding runs), atomic (whole files: temp + rename), writer
(metrics.jsonl lines), recorder (one process's records into the file and its sinks), state (a
run's state folded from its records), reader (read back), follower (tail a live file).
"""

from __future__ import annotations

from probes.runfolder.atomic import atomic_path, json_safe, write_json, write_text
from probes.runfolder.follower import Follower
from probes.runfolder.layout import (
    CONFIG,
    METRICS,
    PROFILES,
    REPORT_JSON,
    REPORT_MD,
    STDERR_LOG,
    TORCHRUN_LOG,
    WEIGHTS,
    RunFolderError,
    check_run_folder,
    create_run_dir,
    find_runs,
    find_weights,
    is_run_folder,
    metrics_files,
    metrics_name,
    profile_dir,
    resolve_run,
    socket_name,
    weights_path,
)
from probes.runfolder.reader import (
    History,
    Rows,
    parse_line,
    read_config,
    read_history,
    read_metrics,
    read_rows,
    require_config,
)
from probes.runfolder.recorder import RunRecorder, Sink
from probes.runfolder.state import ProfileWindow, RunState
from probes.runfolder.writer import MetricsWriter, json_line

__all__ = [
    "atomic_path", "json_safe", "write_json", "write_text", "Follower", "CONFIG", "METRICS",
    "PROFILES", "REPORT_JSON", "REPORT_MD", "STDERR_LOG", "TORCHRUN_LOG", "WEIGHTS",
    "RunFolderError", "check_run_folder", "create_run_dir", "find_runs", "find_weights",
    "is_run_folder", "metrics_files", "metrics_name", "profile_dir", "resolve_run",
    "socket_name", "weights_path", "History", "Rows", "parse_line", "read_config",
    "read_history", "read_metrics", "read_rows", "require_config", "RunRecorder", "Sink",
    "ProfileWindow",
    "RunState", "MetricsWriter", "json_line",
]
