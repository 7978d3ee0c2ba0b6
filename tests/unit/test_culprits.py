"""The culprit finder on the loops of examples/leaky_loops.py, run as a user runs them: each
of the five leaks is named by its holder (or hook, line, gc state), the two healthy loops get
no alert and no culprit event; and the parts on their own (census, referrer walk, gc count,
the deepcopy-safe forward hook)."""

from __future__ import annotations

import copy
import gc
import inspect
import json
import sys

import pytest
import torch
from factories import ROOT

sys.path.insert(0, str(ROOT / "examples"))

import leaky_loops  # noqa: E402

from probes.instruments.culprits.census import take_census  # noqa: E402
from probes.instruments.culprits.holders import find_holders, holder_names  # noqa: E402
from probes.instruments.culprits.hostgrowth import unreachable_now  # noqa: E402
from probes.records import Event  # noqa: E402


def events_of(run_dir, kind):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [Event.from_json(r) for r in rows if r.get("event") == kind]


def culprit_of(loop, tmp_path, steps=24):
    run_dir = leaky_loops.train(loop, steps, tmp_path, listen=False, write_report=False,
                                ledger=False, profiler=False)
    assert events_of(run_dir, "leak_suspected"), f"{loop}: no leak alert in {steps} steps"
    found = events_of(run_dir, "leak_culprit")
    assert len(found) == 1, f"{loop}: {len(found)} leak_culprit events"
    return found[0]


def line_of(marker):
    """The line of examples/leaky_loops.py with ``marker``: read from the file, not assumed."""
    lines = inspect.getsource(leaky_loops).splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text)


def test_graph_leak_is_named_by_its_list_and_grad_fn(tmp_path):
    event = culprit_of("graph", tmp_path)
    top = event.data["culprits"][0]
    assert top["kind"] == "tensors" and "`losses`" in top["holder"]
    assert top["container"] == "list" and "grad_fn=MeanBackward0" in top["what"]
    assert top["count_per_step"] >= 1
    assert "`losses`" in event.summary() and "loss.item()" in event.summary()


def test_logits_leak_is_named_by_its_list(tmp_path):
    top = culprit_of("logits", tmp_path).data["culprits"][0]
    assert "`kept_outputs`" in top["holder"] and "128×256 float32" in top["what"]
    assert "grad_fn" not in top["what"]
    assert top["bytes_per_step"] == pytest.approx(128 * 256 * 4)


def test_hook_leak_names_the_module_and_the_hook_function(tmp_path):
    event = culprit_of("hook", tmp_path)
    top = event.data["culprits"][0]
    assert top["kind"] == "hooks" and top["holder"] == "model.fc2"
    assert top["count_per_step"] == 1
    assert f"leaky_loops.py:{line_of('def keep_output')}" in top["where"]
    kept = [c for c in event.data["culprits"] if c["kind"] == "tensors"]
    assert kept and "`hook_outputs`" in kept[0]["holder"]


def test_host_bytes_are_named_by_the_allocating_line(tmp_path):
    event = culprit_of("host", tmp_path)
    host = [c for c in event.data["culprits"] if c["kind"] == "host"]
    assert host[0]["where"].endswith(f"leaky_loops.py:{line_of('bytearray(64 * 1024)')}")
    assert host[0]["bytes_per_step"] >= 64 * 1024


def test_cycles_with_gc_off_are_counted_and_left_alone(tmp_path):
    event = culprit_of("cycles", tmp_path)
    assert gc.isenabled()  # the loop turned it back on
    top = event.data["culprits"][0]
    assert top["kind"] == "gc" and top["tensors"] >= 1 and "Node" in top["what"]
    assert event.data["gc_enabled"] is False and "DEBUG_SAVEALL" in event.data["note"]


@pytest.mark.parametrize("loop", leaky_loops.HEALTHY)
def test_healthy_loops_raise_no_alert_and_no_culprit(loop, tmp_path):
    run_dir = leaky_loops.train(loop, 45, tmp_path, listen=False, write_report=False,
                                ledger=False, profiler=False)
    assert events_of(run_dir, "leak_suspected") == []
    assert events_of(run_dir, "leak_culprit") == []


def test_deepcopy_of_a_monitored_model_works_and_is_not_counted(tmp_path):
    from probes import Monitor

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt, run_dir=tmp_path, listen=False, write_report=False) as mon:
        ema = copy.deepcopy(model)
        with mon.step():
            model(torch.randn(2, 4)).sum().backward()
            ema(torch.randn(2, 4))
            ema(torch.randn(2, 4))
    assert mon._micro == 1  # the copy's forward passes are not the step's micro-batches


def test_walk_names_a_closure_and_an_attribute():
    kept = []

    def keeper(t):
        kept.append(t)

    class Box:
        pass

    box = Box()
    a, b = torch.zeros(3), torch.ones(3)
    keeper(a)
    box.t = b
    del keeper
    counts = find_holders([a, b], holder_names(None, None))
    labels = " | ".join(name for name, _ in counts)
    assert "`kept`" in labels  # a local of this test function (found on the stack)
    assert "attribute `t` of " in labels or "`box`" in labels


def test_census_counts_new_tensors_by_group():
    first = take_census(0, None)
    born = [torch.zeros(7, 3, dtype=torch.float16) for _ in range(5)]
    second = take_census(1, None, before=first)
    group = next(k for k in second.ids if k.shape == (7, 3) and k.dtype == "float16")
    assert len(second.ids[group]) - len(first.ids.get(group, ())) == 5
    assert len(second.samples[group]) == 3 and second.bytes_by_group[group] >= 5 * 42
    second.release()
    del born


def test_unreachable_count_frees_nothing():
    was_on = gc.isenabled()
    gc.disable()
    try:
        class Ring:
            pass

        r1, r2 = Ring(), Ring()
        r1.other, r2.other, r1.t = r2, r1, torch.zeros(10)
        del r1, r2

        def rings():
            return sum(type(o) is Ring for o in gc.get_objects())

        found = unreachable_now()
        assert found.tensors >= 1 and found.tensor_bytes >= 40
        assert rings() == 2  # still there: counted, not freed
        gc.collect()
        assert rings() == 0  # a real collection frees them
    finally:
        if was_on:
            gc.enable()


def test_an_allocation_is_blamed_on_the_user_line_that_made_it():
    import json as stdlib_json

    import textual

    from probes.tools.frames import allocating_user_frame

    user = str(ROOT / "examples" / "leaky_loops.py")
    assert allocating_user_frame([(user, 97), (user, 120)]) == (user, 97)
    assert allocating_user_frame([(stdlib_json.__file__, 5), (user, 97)]) == (user, 97)
    assert allocating_user_frame([(textual.__file__, 5), (user, 97)]) is None  # a package's
    assert allocating_user_frame([(torch.__file__, 5), (user, 97)]) is None


def test_who_holds_through_the_socket_looks_at_the_next_boundary(tmp_path):
    from probes import Monitor
    from probes.control.unix_socket import request
    from probes.runfolder import socket_name

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept_here = []
    with Monitor(model, opt, run_dir=tmp_path, write_report=False, ledger=False,
                 profiler=False) as mon:
        assert "who_holds" in mon.session.capabilities()
        for step in range(1, 9):
            if step == 3:  # what `w` in `memtop view` sends
                answer = request(mon.run_dir / socket_name(mon.rank), {"request": "who_holds"})
                assert answer.get("ok") is not False, answer
            with mon.step() as s:
                out = model(torch.randn(4, 8))
                out.sum().backward()
                s.set(loss=out.sum())
            kept_here.append(out.detach())
    (event,) = events_of(mon.run_dir, "leak_culprit")
    assert event.data["trigger"] == "request" and event.data["first_step"] == 3  # after step 3
    top = event.data["culprits"][0]
    assert "`kept_here`" in top["holder"] and top["count_per_step"] == 1


def test_a_request_during_a_look_gets_a_look_of_its_own(tmp_path):
    from probes import Monitor
    from probes.control import Request

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt, run_dir=tmp_path, listen=False, write_report=False, ledger=False,
                 profiler=False) as mon:
        for step in range(1, 12):
            if step in (2, 3):  # the second arrives while the first look is under way
                mon.control.submit(Request("who_holds"))
            with mon.step():
                model(torch.randn(4, 8)).sum().backward()
    found = events_of(mon.run_dir, "leak_culprit")
    assert [e.data["trigger"] for e in found] == ["request", "request"]
    assert found[1].data["first_step"] == found[0].step
