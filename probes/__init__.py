"""memtop probes: samplers, sample records and sinks usable from any training loop.

This package imports no Textual; the UI lives in ``tui/``.
"""
