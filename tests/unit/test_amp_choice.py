"""--amp auto (issue 28): bf16 only on a CPU with native bf16, fp32 elsewhere, and why;
MEMTOP_CPU_BF16=native|emulated stands in for the CPU's flags (issue 38)."""

from __future__ import annotations

import pytest
from factories import in_thread, run_cli

from probes.counters.host import (
    bf16_emulated_why,
    cpu_bf16_override,
    cpu_flags,
    read_cpu_flags,
)
from probes.instruments.hints import cpu_bf16_problem
from probes.runfolder import read_metrics
from trainer.config import auto_amp
from tui.format import amp_short_reason, header_text

SAPPHIRE = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
EPYC_ZEN2 = {"avx2", "fma", "sse4_2"}  # no avx512 at all
SKYLAKE_SP = {"avx2", "avx512f", "avx512bw"}  # avx512 but not its bf16 extension


def test_auto_picks_bf16_only_where_it_is_native():
    assert auto_amp("cpu", SAPPHIRE) == (
        "bf16", "auto: native bf16; this CPU has amx_bf16, avx512_bf16")
    mode, why = auto_amp("cpu", SKYLAKE_SP)
    assert mode == "off" and why.startswith("auto: fp32, no native bf16;")
    assert "has avx512f but neither avx512_bf16 nor amx_bf16" in why and "--amp bf16" in why
    assert "has avx2 but" in auto_amp("cpu", EPYC_ZEN2)[1]
    assert auto_amp("cpu", {"fp", "asimd", "bf16"})[0] == "bf16"  # aarch64's Features flag
    mode, why = auto_amp("cpu", set())  # not Linux: flags unknown, no guess of native
    assert mode == "off" and "cannot be read" in why
    assert auto_amp("cuda", set())[0] == "fp16"
    assert auto_amp("cuda", EPYC_ZEN2)[0] == "fp16"  # the host CPU does not matter on CUDA


def test_flags_are_read_from_x86_and_aarch64_cpuinfo():
    assert cpu_flags("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n") == {
        "fpu", "avx2", "avx512_bf16"}
    assert cpu_flags("processor\t: 0\nFeatures\t: fp asimd bf16\n") == {"fp", "asimd", "bf16"}
    assert cpu_flags("model name: ?\n") == set()


def test_the_header_says_why_only_for_an_auto_fp32():
    _mode, why = auto_amp("cpu", SKYLAKE_SP)
    assert amp_short_reason("off", why) == "auto: fp32, no native bf16"
    assert amp_short_reason("off", "asked for: --amp off") is None
    assert amp_short_reason("bf16", auto_amp("cpu", SAPPHIRE)[1]) is None
    text = header_text(device_name="CPU", device_total=None, amp="off", batch=4, seq=16,
                       params=1000, step=3, elapsed_s=1.0, state="running", width=200,
                       amp_reason=why)
    assert "amp off (auto: fp32, no native bf16)" in text


def test_a_run_on_this_machine_records_its_choice_and_the_reason(tiny_config):
    from probes.runfolder import create_run_dir
    from trainer.loop import Trainer

    flags, override = read_cpu_flags(), cpu_bf16_override()
    expected_mode, expected_why = auto_amp("cpu", flags, override)
    emulated = bf16_emulated_why(flags, override)
    forced_why = (f"asked for: --amp bf16, emulated; {emulated}, so it runs slower than fp32"
                  if emulated else "asked for: --amp bf16")
    cfg = tiny_config(steps=3)
    forced = tiny_config(steps=3, amp="bf16")
    for config, mode, why in ((cfg, expected_mode, expected_why),
                              (forced, "bf16", forced_why)):
        run_dir = create_run_dir(config.run_dir)
        trainer = Trainer(config, run_dir, freeze_gc=False, listen=False)
        assert in_thread(trainer.run) == 0
        steps, events, _bad = read_metrics(run_dir / "metrics.jsonl")
        started = next(e for e in events if e["event"] == "run_started")
        assert started["amp"] == mode and started["amp_reason"] == why
        assert {s["amp"] for s in steps} == {mode}


def test_the_variable_stands_in_for_the_flags_and_says_so():
    assert cpu_bf16_override({}) is None and cpu_bf16_override({"MEMTOP_CPU_BF16": " "}) is None
    assert cpu_bf16_override({"MEMTOP_CPU_BF16": "Native"}) == "native"
    assert cpu_bf16_override({"MEMTOP_CPU_BF16": "emulated"}) == "emulated"
    with pytest.raises(ValueError, match="MEMTOP_CPU_BF16='yes' is not one of native, emulated"):
        cpu_bf16_override({"MEMTOP_CPU_BF16": "yes"})
    mode, why = auto_amp("cpu", EPYC_ZEN2, "native")  # a VM that hides avx512_bf16
    assert mode == "bf16" and why.startswith("auto: bf16, MEMTOP_CPU_BF16=native;")
    mode, why = auto_amp("cpu", SAPPHIRE, "emulated")
    assert mode == "off" and why.startswith("auto: fp32, MEMTOP_CPU_BF16=emulated;")
    assert auto_amp("cuda", EPYC_ZEN2, "native")[0] == "fp16"  # a CPU variable, not CUDA's
    # the header names it whichever way it chose; the bf16 hint follows it too
    assert amp_short_reason("bf16", auto_amp("cpu", EPYC_ZEN2, "native")[1]) == (
        "auto: bf16, MEMTOP_CPU_BF16=native")
    assert amp_short_reason("off", auto_amp("cpu", SAPPHIRE, "emulated")[1]) == (
        "auto: fp32, MEMTOP_CPU_BF16=emulated")
    assert cpu_bf16_problem("bf16", EPYC_ZEN2, "native") is None
    assert "MEMTOP_CPU_BF16=emulated" in cpu_bf16_problem("bf16", SAPPHIRE, "emulated")
    assert cpu_bf16_problem("off", SAPPHIRE, "emulated") is None


def test_a_bad_value_is_bad_input():
    result = run_cli("train", "--headless", "--steps", "1", env={"MEMTOP_CPU_BF16": "maybe"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == ("memtop train: MEMTOP_CPU_BF16='maybe' is not one of "
                                     "native, emulated (or unset, to read the CPU's flags)")


@pytest.mark.parametrize("bf16", ["emulated", "native"])
def test_infer_amp_bf16_where_bf16_is_emulated_gives_train_s_hint(tmp_path, monkeypatch, bf16):
    """`memtop infer --amp bf16` on a CPU without native bf16 gave no hint (train does, issue
    44): the same cpu_bf16_emulated hint row, and none where bf16 is native."""
    from factories import run_infer

    monkeypatch.setenv("MEMTOP_CPU_BF16", bf16)
    code, _run_dir, _steps, events = run_infer(tmp_path, amp="bf16", requests=1,
                                               new_tokens=2, baseline_tokens=0)
    assert code == 0
    hints = [e for e in events if e["event"] == "hint"]
    started = next(e for e in events if e["event"] == "run_started")
    if bf16 == "emulated":
        assert [h["hint"] for h in hints] == ["cpu_bf16_emulated"]
        assert "MEMTOP_CPU_BF16=emulated" in hints[0]["detail"]
        assert "emulated" in started["amp_reason"]
    else:
        assert hints == [] and started["amp_reason"] == "asked for: --amp bf16"
