"""The header's and the state word's text (tui/format.py header_text, state_text): what fits at
80 and 120 columns, the amp mode and why auto chose it, B/T and the override; without an App."""

from __future__ import annotations

from tui import format as f


def test_state_text_shows_what_a_key_press_is_waiting_for():
    assert f.state_text("running", None, False, False) == "running"
    assert f.state_text("running", None, True, False) == "pausing"
    assert f.state_text("running", "active 2/3", False, False) == "profiling"
    assert f.state_text("paused", None, True, False) == "paused"
    assert f.state_text("running", None, False, True) == "stopping"
    assert f.state_text("failed", None, False, True) == "failed"


def test_header_text_fits_80_columns_and_keeps_the_essentials():
    kw = dict(device_name="NVIDIA GeForce RTX 4090", device_total=24 * 1024**3, amp="fp16",
              batch=16, seq=128, params=842496, step=123456, elapsed_s=3725, state="PROFILING")
    for width in (80, 120):
        text = f.header_text(width=width, **kw)
        assert len(text) <= width
        assert "step 123456" in text and "1:02:05" in text and "PROFILING" in text
    assert "memtop" in f.header_text(width=120, **kw)
    assert "24.0 GiB │" in f.header_text(width=120, **kw)  # a GPU's own memory
    cpu = f.header_text(width=80, **dict(kw, device_name="CPU", device_total=24 * 1024**3))
    assert "CPU 24.0 GiB RAM" in cpu and len(cpu) <= 80  # the host's memory, said so


def test_header_at_80_columns_keeps_the_amp_mode_and_why_auto_chose_it():
    """README: the header says `amp off (auto: fp32, no native bf16)`; at 80 columns it gave
    way to params and the clock ("25.1k params step 12 0:03 RUNNING", issue 38)."""
    why = "auto: fp32, no native bf16; this CPU has avx2 but neither avx512_bf16 nor amx_bf16"
    kw = dict(device_name="CPU", device_total=24 * 1024**3, amp="off", amp_reason=why,
              batch=4, seq=16, params=25056, state="running")
    for step, clock in ((12, 3.0), (123456, 3725.0)):
        text = f.header_text(width=80, step=step, elapsed_s=clock, **kw)
        assert len(text) <= 80
        assert "amp off (auto: fp32, no native bf16)" in text, text
        assert f"step {step}" in text and "RUNNING" in text
    assert "B4 T16" in f.header_text(width=80, step=12, elapsed_s=3.0, **kw)
    wide = f.header_text(width=120, step=12, elapsed_s=3.0, **kw)
    assert "CPU 24.0 GiB RAM" in wide and "25.1k params" in wide


def test_header_keeps_b_t_and_the_override_beside_the_amp_mode_at_80_and_120_columns():
    """With MEMTOP_CPU_BF16 set, the amp reason grew past 80 columns and B/T fell off the
    header (CI saw the inference dashboard wait for "B2 T32" in vain); at 80 the reason keeps
    the variable alone, at 120 an inference run's fixed switches stay too."""
    for amp, why in (("off", "auto: fp32, MEMTOP_CPU_BF16=emulated; the variable says so"),
                     ("bf16", "auto: bf16, MEMTOP_CPU_BF16=native; the variable says so")):
        kw = dict(device_name="CPU", device_total=24 * 1024**3, amp=amp, amp_reason=why,
                  batch=16, seq=128, params=840000, state="running", elapsed_s=754.0)
        for step in (32, 12345):
            text = f.header_text(width=80, step=step, **kw)
            assert len(text) <= 80 and "B16 T128" in text, text
            assert f"amp {amp} (MEMTOP_CPU_BF16=" in text and f"step {step}" in text
        wide = f.header_text(width=120, step=32, switches="eval·inference_mode·no scaler", **kw)
        assert "eval·inference_mode·no scaler" in wide and "B16 T128" in wide, wide
        assert "MEMTOP_CPU_BF16" in wide and len(wide) <= 120
