"""An inference run's setup (`memtop infer`): the tutorial's §6.3 fields, with the mode
prefill / decode kept apart (pitfall 9) and the three inference switches as the run set them."""

from __future__ import annotations

from typing import Any

from probes.analysis.report.context import SOFTWARE_KEYS, ReportContext, counted
from probes.records import switches_text
from probes.tools.tables import markdown_table


def build(ctx: ReportContext) -> dict[str, Any]:
    config, started, system = ctx.config, ctx.started, ctx.system
    return {
        "mode": "infer",
        "hardware": {"device": started.get("device"), "device_name": started.get("device_name"),
                     "gpu_name": system.get("gpu_name"), "cpu_model": system.get("cpu_model"),
                     "device_memory_bytes": started.get("device_total_bytes")},
        "software": {k: system.get(k) for k in SOFTWARE_KEYS},
        "model": {"layers": config["layers"], "dim": config["dim"], "heads": config["heads"],
                  "block_size": config.get("block_size"), "attention": config.get("attention"),
                  "params": started.get("params")},
        "input": {"batch_size": config["batch_size"], "prompt_len": config["prompt_len"],
                  "new_tokens": config["new_tokens"], "requests": config["requests"],
                  "sampling": (f"top-k {config.get('top_k')}" if config.get("top_k")
                               else "greedy")},
        "amp": ctx.amp,
    }


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    hw, sw, model, inp = (section[k] for k in ("hardware", "software", "model", "input"))
    res = report["results"]
    rows = [
        ["hardware", f"{hw['device']} {hw.get('gpu_name') or hw.get('cpu_model')}"],
        ["software", f"Python {sw['python']}, torch {sw['torch']}, CUDA {sw['cuda'] or 'none'}"
                     f", memtop {sw['memtop']}"],
        ["model", f"GPT: {counted(model['layers'], 'layer')}, dim {model['dim']}, "
                  f"{counted(model['heads'], 'head')}, "
                  f"block {model['block_size']}, {model['attention']} attention, "
                  f"{model['params']} params; weights {res['weights']}"],
        ["input", f"B={inp['batch_size']}, prompt {inp['prompt_len']}, {inp['new_tokens']} new "
                  f"tokens, {inp['requests']} requests; sampling {inp['sampling']}"],
        ["mode", "prefill / decode, reported apart"],
        ["switches", switches_text(res["switches"])],
        ["amp", section["amp"]],
        ["warmup", f"request 1 of {inp['requests']} left out of the statistics"
                   if res["warmup_requests"] else "none (a single request)"],
        ["measurement", "wall clock per step until its new tokens are on the host "
                        "(one .cpu() per step); the steps a profiler window disturbed "
                        "(traced, its table computed, the 3 after) and a memory window's "
                        "(its hooks, the step after) left out"],
    ]
    return ["## Setup", "", markdown_table(["field", "value"], rows), ""]
