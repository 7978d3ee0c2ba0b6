"""`memtop view`'s two halves: the run's request socket, and the dashboard over a run folder
(followed while a real trainer writes it, and finished)."""

from __future__ import annotations

import socket
import stat
import threading

import pytest
from factories import wait_for

from probes import records as R
from probes.control.requests import RunControl
from probes.control.unix_socket import ControlServer, NotLive
from probes.control.unix_socket import request as send
from probes.records import Event
from probes.runfolder import create_run_dir, metrics_files
from tui.widgets.help_screen import HelpScreen, help_markup, keys_markup


def _server(path, control=None):
    control = control or RunControl()
    server = ControlServer(path, control, lambda: {"pid": 1, "rank": None, "step": 7,
                                                   "state": "running"},
                           lambda req: "no leak demo here" if req.kind == "leak_start" else None)
    assert server.start(), server.error
    return server, control


def test_socket_requests_refusals_and_permissions(tmp_path):
    server, control = _server(tmp_path / "control.sock")
    try:
        assert stat.S_IMODE((tmp_path / "control.sock").stat().st_mode) == 0o600
        assert send(server.path, {"request": "ping"}) == {
            "ok": True, "request": "ping", "pid": 1, "rank": None, "step": 7, "state": "running"}
        answer = send(server.path, {"request": "profile", "at_step": 9, "source": "test"})
        assert answer["ok"] and answer["at_step"] == 9
        assert control.take_due(8) == []  # acted on before step 9, not earlier
        (req,) = control.take_due(9)
        assert (req.kind, req.source) == ("profile", "test")
        assert send(server.path, {"request": "leak_start"}) == {
            "ok": False, "request": "leak_start", "error": "no leak demo here"}
        assert "unknown request 'explode'" in send(server.path, {"request": "explode"})["error"]
        with socket.socket(socket.AF_UNIX) as raw:  # bad JSON, by hand
            raw.connect(str(server.path))
            raw.sendall(b"{nope\n")
            assert b"bad JSON" in raw.recv(4096)
        assert server.requests == 1
    finally:
        server.close()
    assert not (tmp_path / "control.sock").exists()  # a finished run is not live


def test_stale_socket_is_not_live_and_is_replaced(tmp_path):
    path = tmp_path / "control.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))  # a socket file whose process is gone: nobody accepts on it
    dead.close()
    with pytest.raises(NotLive, match="no longer live"):
        send(path, {"request": "ping"}, timeout_s=5)
    server, _ = _server(path)  # a new run in the folder takes the stale path over
    try:
        assert send(path, {"request": "ping"})["ok"]
    finally:
        server.close()
    with pytest.raises(NotLive, match="no control socket"):
        send(path, {"request": "ping"})


def test_socket_path_longer_than_the_os_limit(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "control.sock"
    assert len(str(path)) > 108
    server, control = _server(path)
    try:
        assert send(path, {"request": "pause"})["ok"]
        assert [r.kind for r in control.take_due(1)] == ["pause"]
    finally:
        server.close()


@pytest.fixture
def live_run(headless_trainer):
    """A real trainer thread writing a run folder and listening on its socket."""
    return headless_trainer()


@pytest.mark.slow
async def test_viewer_follows_steers_and_leaves_a_live_run(live_run):
    from tui.app import MemtopApp

    trainer = live_run
    app = MemtopApp.for_folder(trainer.run_dir)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.run_state.step >= 3 and app.last_sample is not None,
                       "steps from the followed file")
        first = app.run_state.step
        await wait_for(pilot, lambda: app.run_state.step >= first + 3, "the panes moving")
        assert "viewing" in app.status_line.text
        assert "x" in app.active_bindings and "p" in app.active_bindings  # a viewer's keys
        assert "leave the viewer; the run goes on" in keys_markup("view")
        await pilot.press("p")
        await wait_for(pilot, lambda: bool(app.ops_table.row_names), "top ops from the socket")
        assert any(n.startswith("aten::") for n in app.ops_table.row_names)
        await pilot.press("space")
        await wait_for(pilot, lambda: trainer.status.state == "paused", "the run paused")
        await wait_for(pilot, lambda: "PAUSED" in app.header_bar.text, "PAUSED on the viewer")
        await pilot.press("space")
        await wait_for(pilot, lambda: trainer.status.state == "running", "the run resumed")
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the viewer to exit")
    step = trainer.status.step
    assert trainer.alive and not trainer.status.finished  # q left the run alone
    moved = threading.Event()
    for _ in range(600):  # and it goes on writing (bounded wait on a condition, not a sleep)
        if trainer.status.step > step:
            moved.set()
            break
        moved.wait(0.1)
    assert moved.is_set()


async def test_viewer_opens_a_finished_run_on_its_final_state(tiny_config):
    from factories import in_thread

    from trainer.loop import Trainer
    from tui.app import MemtopApp

    cfg = tiny_config(steps=6)
    trainer = Trainer(cfg, create_run_dir(cfg.run_dir), listen=False)
    in_thread(trainer.run)
    app = MemtopApp.for_folder(trainer.run_dir)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: "finished at step 6" in app.status_line.text,
                       "the final state")
        assert app.run_state.outcome == "finished" and app.last_sample.step == 6
        replayed = {e.event for e in app.source.history()[0] if isinstance(e, Event)}
        assert {R.WEIGHTS_SAVED, R.RUN_FINISHED} <= replayed
        # the past gets no default toasts (tui/live_events.py): they would say "just now"
        assert not any(n.title in ("weights saved", "run finished") for n in app.notices)
        # nothing to steer: the footer offers no p / l / space / x / w, the help says why
        await wait_for(pilot, lambda: "p" not in app.active_bindings, "p leaves the footer")
        assert not {"l", "space", "x", "w"} & set(app.active_bindings)
        assert "?" in app.active_bindings or "question_mark" in app.active_bindings
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        assert app.screen.role == "ended"
        assert "run has ended" in help_markup(app.device_type, None, "ended")
        await pilot.press("escape")
        await pilot.press("q")
    assert list(metrics_files(trainer.run_dir)) == [None]


async def test_viewer_says_a_run_that_died_is_not_live(tmp_path, monkeypatch):
    """A killed run leaves no run_finished: the viewer kept saying RUNNING until a key sent a
    request. Now a run quiet for LIVE_CHECK_S is pinged off the loop, and a socket nobody
    answers makes the header NOT LIVE and the status line say why."""
    from factories import METRICS, write_run

    from tui import sources
    from tui.app import MemtopApp

    monkeypatch.setattr(sources, "LIVE_CHECK_S", 0.3)
    run = write_run(tmp_path / "killed", steps=20)
    rows = (run / METRICS).read_text().splitlines()
    (run / METRICS).write_text("\n".join(rows[:-1]) + "\n")  # no run_finished: it was killed
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(run / "control.sock"))  # its socket file, left behind: nobody answers
    dead.close()
    app = MemtopApp.for_folder(run)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.last_sample is not None
                       and app.last_sample.step == 20, "the run's rows")
        await wait_for(pilot, lambda: "NOT LIVE" in app.header_bar.text, "NOT LIVE")
        assert "RUNNING" not in app.header_bar.text
        assert "not live" in app.status_line.text


def test_rows_arriving_make_a_run_live_again(tmp_path):
    """A ping that failed (the socket not made yet, a timeout) left a run that went on writing
    marked not live for good."""
    from factories import METRICS, write_run

    from tui.sources import FolderSource

    run = write_run(tmp_path / "run", steps=5)
    rows = (run / METRICS).read_text().splitlines()
    (run / METRICS).write_text("\n".join(rows[:3]) + "\n")
    source = FolderSource(run)
    source.start()
    source.not_live = "the socket is not there yet"
    assert not source.live
    with open(run / METRICS, "a", encoding="utf-8") as f:
        f.write(rows[3] + "\n")
    assert source.poll() and source.not_live is None and source.live
