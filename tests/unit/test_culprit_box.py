"""The culprit finder on the dashboard: `w` on a real (tiny) trainer running its leak demo
names the demo's list in the culprit box; the box's text on its own; the event's sentence."""

from __future__ import annotations

import io
import json

import pytest
from factories import event_names, wait_for

from probes.records import Event
from tui.widgets.culprit_box import MAX_LINES, culprit_box_text

TENSORS = {"kind": "tensors", "holder": "`losses` (train.py:42, a global)", "container": "list",
           "what": "scalar float32 on cpu, grad_fn=AddBackward0", "count": 12,
           "count_per_step": 1.0, "bytes": 48, "bytes_per_step": 4.0}


def test_event_sentence_names_holder_rate_and_fix():
    event = Event("leak_culprit", 20, 1.0, {"steps": 3, "culprits": [TENSORS]})
    assert event.summary() == (
        "holder: list `losses` (train.py:42, a global) keeps 12 tensors (+1/step, 48 B + their "
        "graphs) of scalar float32 on cpu, grad_fn=AddBackward0 — keep loss.item() (or "
        ".detach()), not the tensor with its graph")


def test_event_without_culprits_says_so_and_gives_the_guess_as_a_guess():
    event = Event("leak_culprit", 20, 1.0, {"steps": 3, "culprits": [],
                                            "guess": "a retained graph, likely"})
    assert event.summary().startswith("nothing named over 3 steps")
    assert "a guess from the rate: a retained graph, likely" in event.summary()
    assert Event("leak_culprit", 1, 0.0, {}).summary() == \
        "incomplete event (no culprits, steps)"


def test_box_text_lists_culprits_up_to_its_height():
    data = {"steps": 3, "look_s": 0.25, "culprits": [TENSORS] * (MAX_LINES + 2)}
    lines = culprit_box_text(20, data).splitlines()
    assert lines[0] == "WHO HOLDS MEMORY (step 20 over 3 steps, look 0.25 s; w looks again)"
    assert len(lines) == MAX_LINES + 2 and lines[-1] == "... 2 more in the report"


@pytest.mark.slow
async def test_w_names_the_leak_demo_list_on_a_real_trainer(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.trainer.status.step >= 3, "the first steps")
        assert app.can("who_holds")
        await pilot.press("l")
        await wait_for(pilot, lambda: "leak_demo_started" in event_names(app.run_dir),
                       "the leak demo")
        await pilot.press("w")
        await wait_for(pilot, lambda: "leak_culprit" in event_names(app.run_dir),
                       "the finder's answer")
        await wait_for(pilot, lambda: "LeakInjector" in app.culprit_box.text, "the box")
        assert "attribute `kept` of LeakInjector (trainer/leaks.py:" in app.culprit_box.text
        assert "grad_fn=" in app.culprit_box.text
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")


def test_report_section_lists_each_answer_and_reads_a_bad_row_as_incomplete(tmp_path):

    from factories import TINY

    from probes.analysis.report import write_report

    rows = [{"event": "run_started", "step": 0, "time_s": 0.0, "device": "cpu", "amp": "off"},
            {"step": 1, "time_s": 0.1, "step_ms": 100.0, "loss": 1.0},
            {"event": "leak_culprit", "step": 1, "time_s": 0.2, "trigger": "leak_suspected",
             "steps": 3, "look_s": 0.5, "objects_scanned": 1234, "culprits": [TENSORS]},
            {"event": "leak_culprit", "step": 1, "time_s": 0.3, "trigger": "request",
             "steps": "three", "culprits": [TENSORS]},
            {"event": "run_finished", "step": 1, "time_s": 0.4, "reason": "finished"}]
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(TINY))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = write_report(run).read_text()
    report = json.loads((run / "report.json").read_text())
    assert [e["trigger"] for e in report["culprits"]] == ["leak_suspected", "request"]
    part = md[md.index("## Who holds the memory"):]
    assert "### Step 1, at the leak alert: over 3 steps, looks took 0.50 s, 1,234 objects" in part
    assert "- holder: list `losses` (train.py:42, a global) keeps 12 tensors" in part
    assert "incomplete event (no steps)" in part  # "three" is not an int: dropped on reading


def test_device_culprit_sentence_names_the_allocating_line():
    from probes.records.culprits import culprit_line

    line = culprit_line({"kind": "cuda", "where": "model.py:39 forward", "bytes": 3 << 20,
                         "bytes_per_step": 1 << 20, "count": 3})
    assert line.startswith("device memory: model.py:39 forward allocated 3.0 MiB in 3 blocks "
                           "still alive (+1.0 MiB/step)")


def test_headless_prints_the_culprit_line():
    from tui.headless import HeadlessPrinter

    out = io.StringIO()
    HeadlessPrinter(10, out)(Event("leak_culprit", 20, 1.0, {"steps": 3, "culprits": [TENSORS]}))
    assert out.getvalue().startswith("== leak_culprit at step 20  holder: list `losses`")


@pytest.fixture
def leaking_run(headless_trainer):
    """A real trainer thread running its graph leak demo, listening on its socket, as a
    headless `memtop train --leak graph` in another terminal would."""
    return headless_trainer(leak="graph", leak_at=2)


@pytest.mark.slow
async def test_w_in_a_viewer_asks_the_run_through_its_socket(leaking_run):
    from tui.app import MemtopApp

    trainer = leaking_run
    app = MemtopApp.for_folder(trainer.run_dir)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.run_state.step >= 4 and trainer.status.leak_active,
                       "the leak demo running")
        await pilot.press("w")

        def answered() -> list[dict]:  # the run's answers to a request (not to its own alert)
            from probes.runfolder import read_metrics

            _steps, events, _bad = read_metrics(trainer.run_dir / "metrics.jsonl")
            return [e for e in events if e["event"] == "leak_culprit"
                    and e.get("trigger") == "request"]

        await wait_for(pilot, lambda: bool(answered()), "the run's answer to the viewer's w")
        assert "LeakInjector" in json.dumps(answered()[-1])
        # the box shows the latest answer: this one, or the leak alert's own if it came after
        await wait_for(pilot, lambda: "LeakInjector" in app.culprit_box.text,
                       "the answer in the viewer's box")
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the viewer to exit")
