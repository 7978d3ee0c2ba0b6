"""Inference: `memtop infer --headless` on its defaults as a user runs it: the whole command's
wall time, TTFT and decode latency, the KV cache against its formula.

Cases: inference.
"""
