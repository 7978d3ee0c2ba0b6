"""The DataLoader workers' figures once measured (tests/integration/test_workers.py measures them
with real workers): /proc's text parsed, the rows and events read back (old folders without
them too), the RSS pane's note, the ledger's line, the report's peaks, the leak banner, the
guard's tree, and `memtop view` over a folder with workers."""

from __future__ import annotations

import json

import pytest
from factories import METRICS, make_sample, started_event, wait_for, write_run

from probes import records as R
from probes.analysis.report.build import build_report
from probes.counters.fill import TREE_COUNTER, filling_counter
from probes.counters.proctree import exit_text, parse_rollup, parse_stat
from probes.records import Event, StepSample
from probes.runfolder import json_line
from tui.format_panels import leak_alert_line
from tui.panes import PANES, driver_note, workers_note

GiB, MiB = 1024**3, 1024**2
WORKER_ROW = dict(workers=2, workers_rss_bytes=3 * GiB, workers_pss_bytes=int(1.6 * GiB),
                  workers_uss_bytes=int(1.5 * GiB))
ROLLUP = b"""55d0c-7ffd [rollup]
Rss:              281344 kB
Pss:              111632 kB
Pss_Dirty:         25600 kB
Shared_Clean:     250000 kB
Shared_Dirty:       5000 kB
Private_Clean:      1024 kB
Private_Dirty:     25320 kB
Swap:                  0 kB
"""
WORKER_LEAK = {"counter": R.WORKERS_COUNTER, "bytes_per_step": 4 * MiB, "since_step": 6,
               "workers": 2, "trainer_flat": True, "trainer_bytes_per_step": 300,
               "hint": "a dataset cache, likely", "fill_counter": TREE_COUNTER,
               "limit_name": "host RAM available", "steps_to_full": 900,
               "seconds_to_full": 120.0, "capacity_bytes": 4 * GiB,
               "fill_bytes_per_step": 4 * MiB}


# ---- /proc ------------------------------------------------------------------------------------
def test_smaps_rollup_gives_rss_pss_and_private_bytes():
    assert parse_rollup(ROLLUP) == (281344 * 1024, 111632 * 1024, (1024 + 25320) * 1024)
    assert parse_rollup(b"Rss: 10 kB\nPss: 5 kB\n") is None  # no private lines: not a rollup


def test_stat_gives_name_state_parent_start_and_exit_status():
    fields = ["Z", "41"] + ["0"] * 17 + ["777"] + ["0"] * 29 + ["9"]
    raw = b"123 (pt data (worker)) " + " ".join(fields).encode()
    assert parse_stat(raw) == ("pt data (worker)", "Z", 41, 777, 9)  # a ")" in the name
    assert exit_text(9) == "killed by signal 9" and exit_text(256) == "exit 1"
    assert exit_text(0) == "exit 0" and exit_text(None) is None


# ---- rows and events --------------------------------------------------------------------------
def test_rows_carry_the_workers_and_old_rows_read_without_them():
    row = make_sample(3, **WORKER_ROW).to_json()
    assert {k: row[k] for k in R.WORKER_FIELDS} == WORKER_ROW
    assert StepSample.from_json(row).workers_pss_bytes == WORKER_ROW["workers_pss_bytes"]
    old = {k: v for k, v in row.items() if k not in R.WORKER_FIELDS}  # before issue 43
    back = StepSample.from_json(old)
    assert back.workers is None and back.workers_uss_bytes is None
    assert "workers_pss_bytes is -1, negative" in R.step_row_problem(
        {**row, "workers_pss_bytes": -1})


def test_the_workers_events_read_back_and_say_what_changed():
    data = {"started": [{"pid": 11, "comm": "pt_data_worker", "pss_bytes": 20 * MiB}],
            "ended": [{"pid": 9, "comm": "pt_data_worker", "lived_s": 4.2, "exit":
                       "killed by signal 9", "uss_bytes": GiB, "peak_uss_bytes": GiB}],
            "left_out": [{"pid": 12, "comm": "python", "why": "multiprocessing's resource "
                                                              "tracker"}], "workers": 1}
    event = Event.from_json(Event(R.WORKERS, 5, 1.0, data).to_json())
    text = event.summary()
    assert "started pt_data_worker 11 (PSS 20.0 MiB)" in text
    assert "ended pt_data_worker 9 after 4.2 s, killed by signal 9, USS 1.0 GiB" in text
    assert "left out python 12: multiprocessing's resource tracker" in text
    assert not R.EVENT_KINDS[R.WORKERS].loud  # each epoch's workers: in the file, no toast
    died = Event(R.WORKER_DIED, 5, 1.0, data["ended"][0])
    assert R.EVENT_KINDS[R.WORKER_DIED].loud
    assert died.summary() == ("worker pt_data_worker 9 killed by signal 9 after 4.2 s, "
                              "holding USS 1.0 GiB")


def test_a_workers_leak_reads_as_the_workers_in_the_event_and_the_banner():
    event = Event(R.LEAK_SUSPECTED, 9, 1.0, WORKER_LEAK)
    assert event.summary().startswith(
        "DataLoader workers: +4.0 MiB/step between 2 workers, the trainer flat since step 6")
    line = leak_alert_line(WORKER_LEAK, 9, compact=True, room=72)
    assert line.startswith("DataLoader workers: +4.0 MiB/step between 2 workers, the trainer "
                           "flat") and len(line) <= 72
    grows = {**WORKER_LEAK, "trainer_flat": False, "trainer_bytes_per_step": 150 * 1024}
    assert "the trainer +150 KiB/step too" in leak_alert_line(grows, 9)


def test_culprit_line_says_it_cannot_walk_a_workers_objects():
    culprit = {"kind": "workers", "holder": "DataLoader workers", "count": 2,
               "bytes": GiB, "bytes_per_step": 4 * MiB, "what": "dataset cache or copy-on-read"}
    text = Event(R.LEAK_CULPRIT, 9, 1.0, {"culprits": [culprit], "steps": 3}).summary()
    assert text.startswith("DataLoader workers: 2 processes hold 1.0 GiB of their own")
    assert "cannot walk a worker's objects" in text and "numpy arrays" in text


# ---- the screen -------------------------------------------------------------------------------
def test_the_rss_pane_notes_the_workers_pss():
    assert workers_note(make_sample(**WORKER_ROW), {}) == "workers 2 · +1.6 GiB (PSS)"
    assert workers_note(make_sample(workers=0, workers_pss_bytes=0), {}) is None
    assert workers_note(make_sample(), {}) is None  # an old row: no note, min/max stay
    no_rollup = make_sample(workers=1, workers_rss_bytes=GiB)  # a kernel without smaps_rollup
    assert workers_note(no_rollup, {}) == "workers 1 · +1.0 GiB (RSS)"
    cuda = make_sample(device="cuda:0", driver_used_bytes=3 * GiB, reserved_bytes=2 * GiB,
                       **WORKER_ROW)
    assert driver_note(cuda, {}).startswith("ctx+libs")  # CUDA: the ledger shows the workers
    (driver,) = [p for p in PANES if p.id == "driver"]
    assert R.WORKERS_COUNTER in driver.cpu.watches  # a workers' alert marks the RSS pane
    assert "PSS" in driver.cpu.note_help and "copy-on-read" in driver.cpu.note_help
    assert "Arrow" in driver.cuda.note_help


def test_the_guard_and_time_to_full_count_rss_plus_the_workers_own_pages():
    where = filling_counter("cpu", 10 * GiB, rss_bytes=GiB, reserved_bytes=None,
                            driver_used_bytes=None, device_total_bytes=None,
                            host_available=None, workers_bytes=2 * GiB)
    assert where == (TREE_COUNTER, "--max-memory", 3 * GiB, 7 * GiB)
    alone = filling_counter("cpu", None, rss_bytes=GiB, reserved_bytes=None,
                            driver_used_bytes=None, device_total_bytes=None,
                            host_available=5 * GiB, workers_bytes=0)
    assert alone == ("host RSS", "host RAM available", GiB, 5 * GiB)


# ---- the report and `memtop view` -------------------------------------------------------------
def _workers_run(tmp_path, with_workers=True):
    run = write_run(tmp_path / "run", steps=12)
    rows = [json.loads(line) for line in (run / METRICS).read_text().splitlines()]
    out = []
    for row in rows:
        if "event" not in row and with_workers:
            grown = row["step"] * 100 * MiB
            row.update(WORKER_ROW, workers_pss_bytes=WORKER_ROW["workers_pss_bytes"] + grown,
                       workers_uss_bytes=WORKER_ROW["workers_uss_bytes"] + grown)
        if row.get("event") == R.RUN_FINISHED and with_workers:
            out.append(Event(R.LEAK_SUSPECTED, 10, 0.5, WORKER_LEAK).to_json())
        out.append(row)
    (run / METRICS).write_text("".join(json_line(r) + "\n" for r in out))
    return run


def test_the_report_gives_the_workers_peaks_and_none_for_an_old_folder(tmp_path):
    report = build_report(_workers_run(tmp_path))
    res = report["results"]
    assert res["workers_peak"] == 2
    assert res["workers_pss_peak_bytes"] == WORKER_ROW["workers_pss_bytes"] + 1200 * MiB
    assert res["tree_peak_bytes"] == 3000 + WORKER_ROW["workers_uss_bytes"] + 1200 * MiB
    old = build_report(write_run(tmp_path / "old", steps=5))["results"]
    assert old["workers_peak"] is None and old["tree_peak_bytes"] is None


@pytest.mark.parametrize("size", [(160, 40)])
async def test_memtop_view_shows_the_workers_from_the_run_folder(tmp_path, size):
    from tui.app import MemtopApp

    app = MemtopApp.for_folder(_workers_run(tmp_path))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.last_sample is not None
                       and app.last_sample.step == 12, "the run's rows")
        await wait_for(pilot, lambda: app.panes["driver"].note is not None, "the note")
        assert app.panes["driver"].note == "workers 2 · +2.8 GiB (PSS)"
        await wait_for(pilot, lambda: "DataLoader workers: +4.0 MiB/step" in
                       app.leak_banner.text, "the workers' alert")
        assert "w cannot walk their objects" in app.leak_banner.text
        assert app.panes["driver"].has_class("-alert")
        await pilot.press("q")


def test_a_started_row_says_how_the_workers_are_read():
    assert R.EVENT_KINDS[R.RUN_STARTED].fields["workers_counter"] == "str"
    event = Event.from_json(started_event(workers_counter="child processes of pid 1").to_json())
    assert event.data["workers_counter"] == "child processes of pid 1"
