"""What was measured, and how: hardware, software, model, input, precision, warmup and the
measurement's rules (the tutorial's experiment-report fields, docs/ARCHITECTURE.md)."""

from __future__ import annotations

from typing import Any

from probes.analysis.report.context import (
    SOFTWARE_KEYS,
    ReportContext,
    counted,
    is_gpt_config,
    warmup_steps,
)
from probes.records import STEP_CLOCK_CUDA
from probes.records.values import finite_num
from probes.tools.tables import markdown_table
from probes.tools.units import format_bytes

CPU_SYNC_RULE = ("none needed: on CPU every op has finished when it returns, so the step's wall "
                 "time is its work; the loss, gradient norm and scale are read once at the "
                 "step's end (probes/monitor/stepvalues.py)")
SYNC_RULE = ("one wait for the device per step, after the optimizer step: loss, gradient norm "
             "and GradScaler scale copied into pinned host slots and read together after one "
             "stream synchronize (probes/monitor/stepvalues.py);"
             " memtop's trainer uses fused AdamW on CUDA, so GradScaler.step passes found-inf to "
             "the kernel instead of reading it (a non-fused optimizer adds that .item()); the "
             "allocator counters and NVML are host reads; no explicit synchronize")
TIMING = "wall clock per step, batch fetch to optimizer update (time.perf_counter)"
CUDA_TIMING = ("device clock per step, batch fetch to optimizer update: CUDA events at the "
               "step's start and end (the step split's), read once done, never synchronised; "
               "a row whose step's events were not done yet is on the host's wall clock "
               "(run_started step_clock; probes/instruments/phases.py)")


def timing_rule(started: Any) -> str:
    """Which clock the run's step times are on (run_started's step_clock, issue 45)."""
    clock = started.get("step_clock") if hasattr(started, "get") else None
    return CUDA_TIMING if clock == STEP_CLOCK_CUDA else TIMING


def sync_rule(device: Any) -> str:
    """The sync rule that held on the run's device: the CUDA one only where there is a device
    to wait for."""
    return SYNC_RULE if str(device or "").startswith("cuda") else CPU_SYNC_RULE


def _model_and_input(ctx: ReportContext) -> tuple[dict, dict]:
    """What the model and its input were: memtop's GPT by its shape, any other model by name."""
    config, started = ctx.config, ctx.started
    model_info = (ctx.last_ledger or {}).get("model") or {}
    compute = {"bf16": "bfloat16 (autocast)",
               "fp16": "float16 (autocast + GradScaler)"}.get(ctx.amp, "float32")
    param_dtype = model_info.get("param_dtype") or "float32"
    if is_gpt_config(config):
        model = {"kind": "GPT", "layers": config["layers"], "dim": config["dim"],
                 "heads": config["heads"], "vocab": model_info.get("vocab_size") or 256,
                 "block_size": config.get("block_size"), "attention": config.get("attention"),
                 "params": started.get("params")}
        inp = {"batch_size": config["batch_size"], "seq_len": config["seq_len"],
               "tokens_per_step": config["batch_size"] * config["seq_len"],
               "token_dtype": "int64", "param_dtype": param_dtype, "compute_dtype": compute}
        return model, inp
    mon = config.get("monitor") if isinstance(config.get("monitor"), dict) else {}
    model = {"kind": str(mon.get("model") or "a model of the training loop's own"),
             "params": started.get("params")}
    inp = {"tokens_per_step": started.get("tokens_per_step"),
           "samples_per_step": started.get("samples_per_step"),
           "counted_per_step": _counted(ctx.steps), "param_dtype": param_dtype,
           "compute_dtype": compute}
    return model, inp


def build(ctx: ReportContext) -> dict[str, Any]:
    started, system, config = ctx.started, ctx.system, ctx.config
    model, inp = _model_and_input(ctx)
    return {
        "hardware": {
            "device": started.get("device") or config.get("resolved_device"),
            "device_name": started.get("device_name"),
            "device_memory_bytes": started.get("device_total_bytes"),
            "gpu_name": system.get("gpu_name"), "gpu_capability": system.get("gpu_capability"),
            "cpu_model": system.get("cpu_model"), "cpu_count": system.get("cpu_count"),
            "ram_bytes": system.get("ram_bytes"),
        },
        "software": {k: system.get(k) for k in SOFTWARE_KEYS},
        "model": model,
        "input": inp,
        "mode": "train",
        "amp": ctx.amp,
        "warmup_steps": warmup_steps(config),
        **(_probe(ctx) if ctx.mode == "fit" else {}),
        "measurement": {
            "steps": len(ctx.steps), "steps_planned": config.get("steps"),
            "sync_rule": sync_rule(started.get("device") or config.get("resolved_device")),
            "timing": timing_rule(started),
            "counters": started.get("counters"), "driver_counter": started.get("driver_counter"),
            "seed": config.get("seed"),
        },
    }


def _probe(ctx: ReportContext) -> dict[str, Any]:
    """`memtop fit`'s probe in place of one input shape and warm-up: the points it ran, in
    order (their fit_point events), each with its own warm-up steps (fit.json)."""
    from probes.analysis.fit_file import read_fit
    from probes.runfolder import RunFolderError

    try:
        doc = read_fit(ctx.run_dir) or {}
    except RunFolderError:
        doc = {}
    points = [{"batch_size": e.get("batch_size"), "seq_len": e.get("seq_len"),
               "status": e.get("status"), "role": e.get("role") or "probe"}
              for e in ctx.events if e.get("event") == "fit_point"]
    return {"mode": "fit", "probe": {"points": points,
                                     "warmup_steps": doc.get("warmup_steps"),
                                     "measured_steps": doc.get("measured_steps")}}


def _t(value: Any) -> str:
    """A recorded value as text: "n/a" where the run did not record it (never "None")."""
    return "n/a" if value is None else str(value)


def _model_text(model: dict[str, Any], params: str) -> str:
    if model.get("kind", "GPT") == "GPT":
        return (f"GPT: {counted(model['layers'], 'layer')}, dim {_t(model['dim'])}, "
                f"{counted(model['heads'], 'head')}, vocab {_t(model['vocab'])}, "
                f"{_t(model['attention'])} attention{params}")
    return f"{model['kind']} (the training loop's own model){params}"


def _counted(steps: list[dict[str, Any]]) -> str | None:
    """What the rows' throughput counts when the loop gave no fixed figure per step (a
    framework callback counts each step's batches: probes/integrations/common.py)."""
    for unit in ("tokens", "samples"):
        if any(finite_num(r.get(f"{unit}_per_s")) is not None for r in steps):
            return unit
    return None


def _input_text(inp: dict[str, Any]) -> str:
    if "seq_len" in inp:
        return (f"B={_t(inp['batch_size'])}, T={_t(inp['seq_len'])} "
                f"({_t(inp['tokens_per_step'])} tokens/step), {_t(inp['token_dtype'])} tokens, "
                f"{_t(inp['param_dtype'])} weights")
    per_step = [f"{inp[k]} {unit}/step" for k, unit in (("tokens_per_step", "tokens"),
                                                        ("samples_per_step", "samples"))
                if inp.get(k)]
    counted = inp.get("counted_per_step")
    fallback = (f"{counted} counted per step from its batches" if counted else
                "not reported by the loop (steps/s shown)")
    return (", ".join(per_step) or fallback) + f", {inp['param_dtype']} weights"


def _shape_rows(section: dict[str, Any], inp: dict[str, Any]) -> list[list[str]]:
    """Input, mode and warm-up: a training run's one shape, or `memtop fit`'s points."""
    probe = section.get("probe")
    if section["mode"] != "fit" or probe is None:
        return [["input", _input_text(inp)], ["mode", section["mode"]],
                ["warmup", f"{section['warmup_steps']} steps (peak counters reset after them)"]]
    shapes = ", ".join(f"{p['batch_size']}×{p['seq_len']}"
                       + ("" if p["role"] == "probe" else f" ({p['role']})")
                       for p in probe["points"] if p["status"] != "not run")
    return [["input", f"probe points B×T: {shapes or 'none ran'}; "
                      f"{_t(inp['token_dtype'])} tokens, {_t(inp['param_dtype'])} weights"],
            ["mode", "fit: memtop fit's probe, several shapes (no training run of one B, T; "
                     "fit.json holds the answer)"],
            ["warmup", f"{_t(probe['warmup_steps'])} steps at each point's shape, then "
                       f"{_t(probe['measured_steps'])} measured (peak reset before each)"]]


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    hw, sw, model, inp = (section[k] for k in ("hardware", "software", "model", "input"))
    meas = section["measurement"]
    ram = f"RAM {format_bytes(hw['ram_bytes'])}"
    cpu = f"{_t(hw['cpu_model'])} ({_t(hw['cpu_count'])} cores)"
    if hw["gpu_name"]:
        hardware = (f"{_t(hw['device'])} {hw['gpu_name']} "
                    f"({format_bytes(hw['device_memory_bytes'])}, sm {_t(hw['gpu_capability'])}"
                    f"); host {cpu}, {ram}")
    else:
        hardware = f"{_t(hw['device'])}: {cpu}, {ram}"
    params = f", {model['params']:,} params" if isinstance(model["params"], int) else ""
    rows = [
        ["hardware", hardware],
        ["software", f"Python {_t(sw['python'])}, torch {_t(sw['torch'])}, CUDA "
                     f"{sw['cuda'] or 'none'}, cuDNN {sw['cudnn'] or 'none'}, memtop "
                     f"{_t(sw['memtop'])}"],
        ["model", _model_text(model, params)],
        *_shape_rows(section, inp),
        ["amp", f"{section['amp']}: compute in {inp['compute_dtype']}"],
        ["measurement", f"{meas['steps']} steps recorded "
                        f"({meas['steps_planned'] or 'no limit'} planned)"],
        ["sync rule", meas["sync_rule"]],
        ["timing", meas["timing"]],
        ["counters", f"{_t(meas['counters'])}; driver level: {_t(meas['driver_counter'])}"],
    ]
    return ["## Setup", "", markdown_table(["field", "value"], rows), "",
            f"Software recorded at {_t(sw['source'])}.", ""]
