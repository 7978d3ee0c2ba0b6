"""GPU claims about the Prometheus exporter (probes/export/): on a CUDA run the series carry the
CUDA counters under memtop's names, with HELP saying so, and a ``gpu_uuid`` label equal to the
UUID that NVML (and so dcgm-exporter and nvitop-exporter) and torch give the device; the
in-process endpoint answers during the run with the same labels."""

from __future__ import annotations

import urllib.request
from typing import Any

from benchmarks.gpu.registry import Ctx, Outcome, claim


def _scrape_text(collector: Any) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text)
            for s in f.samples]


def _nvml_uuids() -> list[str]:
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            out.append(uuid.decode() if isinstance(uuid, bytes) else str(uuid))
        return out
    finally:
        pynvml.nvmlShutdown()


@claim(group="export", needs_s=25, priority=55)
def metrics_cuda_names_and_gpu_uuid(ctx: Ctx) -> Outcome:
    """memtop metrics over a CUDA run folder: every series has device cuda:N and gpu_uuid equal
    to NVML's UUID of the device (and GPU- + torch's props.uuid); memtop_allocated_bytes /
    reserved / peak / driver equal the last row's, and HELP names the CUDA counter"""
    import torch

    from probes.export import FolderCollector

    run = ctx.train("export_cuda", ctx.config(steps=12))
    text = _scrape_text(FolderCollector([run.run_dir]))
    rows = _samples(text)
    last = run.steps()[-1]
    props = torch.cuda.get_device_properties(ctx.torch_device)
    torch_uuid = f"GPU-{props.uuid}"
    nvml = _nvml_uuids()
    uuids = {labels.get("gpu_uuid") for _, labels, _ in rows}
    devices = {labels.get("device") for _, labels, _ in rows}

    def val(name: str) -> float | None:
        return next((v for n, _, v in rows if n == name), None)

    checks = {
        "one gpu_uuid on every series": len(uuids) == 1 and None not in uuids,
        "gpu_uuid is NVML's": uuids <= set(nvml),
        "gpu_uuid is GPU- + torch's uuid": uuids == {torch_uuid},
        "device label": devices == {last.device},
        "allocated": val("memtop_allocated_bytes") == last.allocated_bytes,
        "reserved": val("memtop_reserved_bytes") == last.reserved_bytes,
        "peak": val("memtop_peak_allocated_bytes") == last.peak_allocated_bytes,
        "driver (NVML)": last.driver_used_bytes is None
        or val("memtop_driver_used_bytes") == last.driver_used_bytes,
        "HELP names CUDA": "# HELP memtop_allocated_bytes CUDA caching allocator" in text,
    }
    failed = [k for k, ok in checks.items() if not ok]
    return Outcome.check(not failed, "all hold" if not failed else f"failed: {failed}",
                         gpu_uuid=sorted(u for u in uuids if u), nvml_uuids=nvml,
                         torch_uuid=torch_uuid, checks=checks)


@claim(group="export", needs_s=25, priority=55)
def metrics_in_process_on_cuda(ctx: Ctx) -> Outcome:
    """memtop train --metrics-port on CUDA: the in-process endpoint answers during the run with
    the run's step and allocated bytes, labelled device cuda:N and the device's gpu_uuid"""
    from probes import records as R
    from probes.records import Event, StepSample

    seen: dict[str, Any] = {}

    def sink(record: Any) -> None:  # on the training thread, after row 6 is published
        if isinstance(record, Event) and record.event == R.RUN_STARTED:
            seen["url"] = record.data.get("metrics_url")
        elif isinstance(record, StepSample) and record.step == 6 and seen.get("url"):
            with urllib.request.urlopen(seen["url"], timeout=10) as resp:
                seen["text"] = resp.read().decode()

    run = ctx.train("export_in_process", ctx.config(steps=10, metrics_port=0), sinks=[sink])
    if "text" not in seen:
        return Outcome.check(False, f"no scrape (url {seen.get('url')})")
    rows = _samples(seen["text"])
    steps = next((v for n, _, v in rows if n == "memtop_steps_total"), None)
    labels = next((ls for n, ls, _ in rows if n == "memtop_allocated_bytes"), {})
    row = next((s for s in run.steps() if steps is not None and s.step == int(steps)), None)
    ok = (row is not None and labels.get("device", "").startswith("cuda")
          and labels.get("gpu_uuid", "").startswith("GPU-")
          and next(v for n, _, v in rows if n == "memtop_allocated_bytes")
          == row.allocated_bytes)
    return Outcome.check(ok, f"scraped step {steps}, labels {labels}", labels=labels)
