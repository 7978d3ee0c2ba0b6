"""Reading what the exporter serves, for the tests of probes/export/ (test_export.py,
test_export_endpoint.py): exposition text to values, a collector scraped once, a run folder in
progress written row by row."""

from __future__ import annotations

import json

from factories import record_line
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from probes import records as R
from probes.records import Event
from probes.runfolder import METRICS


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Exposition text -> {(sample name, labels): value}, read by prometheus_client's parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def scrape(collector) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def value(found: dict, name: str, **labels: str) -> float | None:
    hits = [v for (n, ls), v in found.items()
            if n == name and all((k, want) in ls for k, want in labels.items())]
    assert len(hits) <= 1, f"{name} {labels}: {len(hits)} series"
    return hits[0] if hits else None


def append(run_dir, *records) -> None:
    with open(run_dir / METRICS, "ab") as fh:
        for record in records:
            fh.write(record_line(record))


def open_run(path, **started):
    """A run folder with run_started and no end yet (a run in progress, or a killed one)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"layers": 1, "dim": 32}))
    append(path, Event(R.RUN_STARTED, 0, 0.0, {"device": "cpu", "amp": "bf16", "params": 10,
                                               "host": "trainhost", **started}))
    return path
