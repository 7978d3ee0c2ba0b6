"""A memory attribution window read back: the report's section, `memtop compare`'s per-module
deltas (`memtop train --headless --attribute-at` end to end: tests/integration/
test_attribution_cli.py)."""

from __future__ import annotations

import json

import torch

from probes import Monitor
from probes.analysis.compare.compare import compare_runs
from probes.analysis.compare.modules import module_lines
from probes.analysis.compare.text import render_markdown
from probes.analysis.report import build_report, write_report
from trainer.model import GPT, GPTConfig


def gpt_run(tmp_path, seq: int = 16, attribute: bool = True, name: str = "runs"):
    """A real loop over the mini-GPT (2 blocks) with a window at step 3."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=32))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 256, (2, seq))
    with Monitor(model, opt, run_dir=tmp_path / name, warmup_steps=1, listen=False,
                 max_steps=6, attribute_at=[3] if attribute else (),
                 config={"layers": 2, "heads": 2, "dim": 32, "seq_len": seq,
                         "batch_size": 2}) as mon:
        for _ in range(6):
            with mon.step() as s:
                _, loss = model(x, x)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                s.set(loss=loss)
    return mon.run_dir


def test_the_report_has_the_section_with_the_table_the_check_and_the_hints(tmp_path):
    run = gpt_run(tmp_path)
    md = write_report(run).read_text()
    section = md.split("## Which module holds the memory")[1].split("\n## ")[0]
    assert "| transformer.h.0 " in section and "| transformer.h.*.attn (×2) " in section
    assert "params equal" in section and "within 5%" in section
    assert "- checkpointing transformer.h.0–1 would free" in section
    report = json.loads((run / "report.json").read_text())
    assert report["attribution_windows"] == 1
    assert report["attribution"]["steps"] == [4]
    ours, theirs = report["attribution_ledger_check"]["activations"]
    assert ours == theirs
    assert md.index("## Memory ledger") < md.index("## Which module") < md.index("## Profiler")


def test_a_run_without_a_window_has_no_section(tmp_path):
    run = gpt_run(tmp_path, attribute=False)
    assert "attribution" not in build_report(run)
    assert "Which module" not in write_report(run).read_text()


def test_compare_shows_which_module_a_longer_sequence_moved(tmp_path):
    a, b = gpt_run(tmp_path, 16, name="a"), gpt_run(tmp_path, 32, name="b")
    result = compare_runs([a, b])
    modules = result["comparisons"][0]["modules"]
    totals = modules["totals"]
    assert totals["params_total_bytes"]["delta"] == 0
    assert totals["activations_total_bytes"]["delta"] > 0
    by_name = {m["module"]: m for m in modules["modules"]}
    blocks = by_name["transformer.h.0"]["activations_bytes"]
    assert blocks["delta"] == blocks["b"] - blocks["a"] > 0
    attn = by_name["transformer.h.*.attn (×2)"]
    assert attn["activations_bytes"]["b"] > 2 * attn["activations_bytes"]["a"]  # scores ∝ T²
    md = render_markdown(result)
    assert "- Modules (last memory window of each; exact bytes, B − A): parameters =" in md
    assert "  - transformer.h.0: activations +" in md
    alone = compare_runs([a, gpt_run(tmp_path, 16, attribute=False, name="c")])
    assert alone["comparisons"][0]["modules"] is None
    assert module_lines(None)[0].startswith("- Modules: n/a")
