"""The culprit finder: at a leak alert (or on request: the ``w`` key, ``who_holds`` through
the socket) it looks at what is alive, looks again ``gap_steps`` steps later, and writes one
``leak_culprit`` event naming what grew and what holds it.

Both looks run at a step boundary on the training thread. Between looks tracemalloc runs (and
on CUDA nothing more: the allocator history is a GPU claim, benchmarks/gpu/claims/culprits.py);
at other times the hook does nothing but read a dict's length at the end of each step. The first
look writes ``leak_look``: from it to ``leak_culprit`` (and the step after) the steps are
disturbed, left out of the leak detector, timing and peaks (probes/records/disturbed.py).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from probes import records as R
from probes.instruments.culprits.census import Census, hook_counts, hook_functions, take_census
from probes.instruments.culprits.cudawindow import CudaWindow
from probes.instruments.culprits.holders import find_holders, function_label, holder_names
from probes.instruments.culprits.hostgrowth import HostWindow, gc_is_off, unreachable_now
from probes.instruments.hooks import RunContext, StepHook, StepTensors
from probes.records import Event, StepSample
from probes.records.culprits import FIXES, NO_WALK

MIN_HOST_BYTES_PER_STEP = 16 * 1024  # slower growth of one line is Python's own bookkeeping
MAX_CULPRITS = 6


class CulpritFinder(StepHook):
    """Names the leak's holder; ``leak`` is the run's LeakWatch (its alerts start a look)."""

    # not batched (probes/instruments/hooks.py): its two looks at the live process must be
    # steps apart in time, and a batch would run both at once

    def __init__(self, leak: Any = None, gap_steps: int = 3, sample_per_group: int = 8) -> None:
        if gap_steps < 1:
            raise ValueError(f"gap_steps must be at least 1, got {gap_steps}")
        self.leak = leak
        self.gap_steps = gap_steps
        self.sample_per_group = sample_per_group
        self.first: Census | None = None
        self.trigger = ""
        self.looks = 0
        self.events: list[Event] = []
        self._alerts_seen: set[int] = set()
        self._host = HostWindow()
        self._cuda = CudaWindow()
        self._first_s = 0.0
        self._guess: str | None = None
        self.refrozen = 0  # objects gc.freeze() had frozen at the last walk
        self._requested = False  # a who_holds came while a look was under way
        self._workers_at_look: int | None = None  # the workers' private bytes at a first look

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        if ctx.offer is not None:
            ctx.offer("who_holds", self.look_on_request)

    def look_on_request(self, step: int) -> None:
        """``who_holds`` at the boundary before ``step``: the first look, now (or as soon as
        the look under way has answered)."""
        if self.first is not None:
            self._requested = True
            return
        self._guess = None  # no alert behind this look: no rate to guess from
        self.look_first(step - 1, "request")

    def end_step(self, step: int, tensors: StepTensors, sample: StepSample) -> None:
        if self.first is None:
            alerts = self.leak.alerts if self.leak is not None else None
            if alerts and any(id(a) not in self._alerts_seen for a in alerts.values()):
                new = [a for a in alerts.values() if id(a) not in self._alerts_seen]
                self._alerts_seen.update(id(a) for a in alerts.values())
                for alert in (a for a in new if a.get("counter") == R.WORKERS_COUNTER):
                    self.answer_workers(step, alert)
                new = [a for a in new if a.get("counter") != R.WORKERS_COUNTER]
                if not new:
                    return  # the workers grow, not the trainer: its objects hold nothing new
                self._guess = new[0].get("hint")
                self.look_first(step, R.LEAK_SUSPECTED)
            return
        if step >= self.first.step + self.gap_steps:
            self.look_second(step)
            if self._requested:  # asked for during that look: a look of its own
                self._requested = False
                self.look_on_request(step + 1)

    def answer_workers(self, step: int, alert: dict[str, Any]) -> Event:
        """A leak of the DataLoader workers: what memtop knows of them from /proc, said at
        once, without a look at the trainer's objects (theirs live in other processes)."""
        data: dict[str, Any] = {"trigger": R.LEAK_SUSPECTED,
                                "steps": max(1, step - int(alert.get("since_step") or step)),
                                "culprits": [workers_culprit(self.ctx.workers, alert)],
                                "note": NO_WALK}
        event = Event(R.LEAK_CULPRIT, step, self.ctx.elapsed_s(), data)
        self.events.append(event)
        self.ctx.emit(event)
        return event

    def look_first(self, step: int, trigger: str) -> None:
        """The census to compare with, and tracemalloc on until the second look."""
        try:
            self._look_first(step, trigger)
        except Exception as exc:  # never the user's loop's failure
            self._failed(step, exc)

    def look_second(self, step: int) -> Event | None:
        """What grew since the first look, what holds it: one leak_culprit event."""
        try:
            return self._look_second(step)
        except Exception as exc:
            self._failed(step, exc)
            return None

    def _failed(self, step: int, exc: Exception) -> None:
        self.first = None
        self._host.cancel()
        self._cuda.cancel()
        self.ctx.emit(Event(R.LEAK_CULPRIT, step, self.ctx.elapsed_s(), {
            "trigger": self.trigger, "error": f"the culprit finder failed: "
                                              f"{type(exc).__name__}: {exc}"}))

    def _look_first(self, step: int, trigger: str) -> None:
        t0 = time.perf_counter()
        self.trigger = trigger
        self.first = take_census(step, self.ctx.model)
        latest = self.ctx.workers.latest if self.ctx.workers is not None else None
        self._workers_at_look = latest.private_bytes if latest is not None else None
        self._host.start()
        self._cuda.start(self.ctx.device, already_on=not self.ctx.memory_history.startswith("off"))
        self._first_s = time.perf_counter() - t0
        # the look's steps, to its leak_culprit, and the one after are disturbed: tracemalloc
        # and the censuses grow the heap (probes/records/disturbed.py; issue 38)
        self.ctx.emit(Event(R.LEAK_LOOK, step, self.ctx.elapsed_s(), {"trigger": trigger}))

    def _look_second(self, step: int) -> Event:
        first, self.first = self.first, None
        assert first is not None
        t0 = time.perf_counter()
        second = take_census(step, self.ctx.model, before=first,
                             sample_per_group=self.sample_per_group)
        steps = max(1, step - first.step)
        host_lines = self._host.stop(MIN_HOST_BYTES_PER_STEP * steps)
        sites = self._cuda.stop(self.ctx.device)
        culprits = self._hooks(first, second, steps)
        gc_off = gc_is_off()
        if gc_off:
            culprits += self._unreachable()
        self.refrozen = 0
        culprits += self._tensors(first, second, steps)
        culprits += [{"kind": "host", "holder": "", "where": line.where, "bytes": line.bytes,
                      "bytes_per_step": line.bytes / steps, "count": line.blocks,
                      "fix": FIXES["host"]} for line in host_lines]
        culprits += [{"kind": "cuda", "holder": "", "where": site.where, "bytes": site.bytes,
                      "bytes_per_step": site.bytes / steps, "count": site.blocks,
                      "fix": FIXES["cuda"]}
                     for site in sites if site.bytes >= MIN_HOST_BYTES_PER_STEP * steps]
        workers = self._workers_between(first.step, step, steps)
        named = [c for c in culprits if c["kind"] != "tensors" or c.get("holder")]
        unnamed = [c for c in culprits if c not in named]
        self.looks += 1
        data: dict[str, Any] = {
            "trigger": self.trigger, "first_step": first.step, "steps": steps,
            "look_s": round(self._first_s + time.perf_counter() - t0, 4),
            "objects_scanned": second.objects_scanned, "gc_enabled": not gc_off,
            "culprits": (named + unnamed)[:MAX_CULPRITS]}
        if self._cuda.cost_s:
            data["cuda_history_s"] = round(self._cuda.cost_s, 4)
        if not data["culprits"] and self._guess:
            data["guess"] = self._guess
        notes = []
        if workers is not None:  # the workers' line goes last: the trainer's holders first
            data["culprits"] = data["culprits"][:MAX_CULPRITS - 1] + [workers]
            notes.append(NO_WALK)
        if self.refrozen:
            notes.append(f"gc.freeze() was in effect: {self.refrozen} frozen objects were "
                         "unfrozen for the walk and frozen again, with the objects born since")
        if gc_off:
            notes.append("gc is off: its garbage was counted by one collection that freed "
                         "nothing (gc.DEBUG_SAVEALL); weak references to it were cleared")
        if notes:
            data["note"] = "; ".join(notes)
        event = Event(R.LEAK_CULPRIT, step, self.ctx.elapsed_s(), data)
        self.events.append(event)
        self.ctx.emit(event)
        return event

    def _workers_between(self, first_step: int, step: int, steps: int) -> dict[str, Any] | None:
        """The DataLoader workers between the looks, when the loop has any: their private bytes
        and how much they grew (from /proc: memtop cannot walk their objects)."""
        sampler = self.ctx.workers
        reading = sampler.latest if sampler is not None else None
        if reading is None or not reading.workers:
            return None
        before, self._workers_at_look = self._workers_at_look, None
        grown = (reading.private_bytes - before) if (
            before is not None and reading.private_bytes is not None) else None
        return workers_culprit(sampler, {"bytes_per_step": grown / steps if grown is not None
                                         else None, "workers": reading.workers})

    def _hooks(self, first: Census, second: Census, steps: int) -> list[dict[str, Any]]:
        out = []
        for key, count in second.hooks.items():
            grown = count - first.hooks.get(key, 0)
            if grown < steps:
                continue
            module, _, attr = key.rpartition(" ")
            fns = hook_functions(self.ctx.model, key)
            out.append({"kind": "hooks", "holder": module, "what": attr.replace("_", " "),
                        "count": count, "count_per_step": grown / steps,
                        "where": function_label(fns[-1]) if fns else "?",
                        "fix": FIXES["hooks"]})
        return out

    def _unreachable(self) -> list[dict[str, Any]]:
        found = unreachable_now()
        if not found.tensors and found.objects < 1000:
            return []
        return [{"kind": "gc", "holder": "unreachable cycles", "what": found.top_type or "?",
                 "count": found.objects, "tensors": found.tensors,
                 "bytes": found.tensor_bytes, "fix": FIXES["gc"]}]

    def _tensors(self, first: Census, second: Census, steps: int) -> list[dict[str, Any]]:
        grown = {key: len(ids) - len(first.ids.get(key, ()))
                 for key, ids in second.ids.items()}
        grown = {k: n for k, n in grown.items() if n >= steps}
        if not grown:
            second.release()
            return []
        names = holder_names(self.ctx.model, self.ctx.optimizer)
        ignore = {id(second.samples), *(id(v) for v in second.samples.values())}
        out = []
        self.refrozen = gc.get_freeze_count()  # gc.freeze() hides holders from the walk
        if self.refrozen:
            gc.unfreeze()
        try:
            holders_by_group = {key: find_holders(second.samples[key], names, ignore=ignore)
                                for key in grown if second.samples.get(key)}
        finally:
            if self.refrozen:
                gc.freeze()  # frozen again: with what was born since the user's freeze
        for key, n in sorted(grown.items(), key=lambda kv: -second.bytes_by_group[kv[0]]):
            holders = holders_by_group.get(key)
            (holder, container), _ = (holders.most_common(1)[0] if holders
                                      else (("", ""), 0))
            count = len(second.ids[key])
            kind = "graph" if key.grad_fn else "tensors"
            out.append({"kind": "tensors", "holder": holder, "container": container,
                        "what": key.label(), "count": count, "count_per_step": n / steps,
                        "bytes": second.bytes_by_group[key],
                        "bytes_per_step": second.bytes_by_group[key] / count * n / steps,
                        "fix": FIXES[kind]})
        second.release()
        del names
        return out

    def close(self) -> None:
        self._host.cancel()
        self._cuda.cancel()
        self.first = None


def workers_culprit(sampler: Any, alert: dict[str, Any]) -> dict[str, Any]:
    """The DataLoader workers as a culprit line (probes/records/culprits.py culprit_line): how
    many, what they hold of their own, how fast it grows and the pattern the leak watch saw."""
    reading = sampler.latest if sampler is not None else None
    return {"kind": "workers", "holder": "DataLoader workers",
            "what": alert.get("likely_cause") or "growth seen from /proc",
            "count": reading.workers if reading is not None else alert.get("workers"),
            "bytes": reading.private_bytes if reading is not None else None,
            "bytes_per_step": alert.get("bytes_per_step"), "fix": FIXES["workers"]}


def hook_count_total(model: Any) -> int:
    """All hooks on the model's modules (what a test or a benchmark compares)."""
    return sum(hook_counts(model).values())


__all__ = ["CulpritFinder", "hook_count_total", "workers_culprit"]
