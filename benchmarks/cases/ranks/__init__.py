"""Ranks: memtop's per-rank cost under DDP, `memtop train --nproc 2` against a plain 2-rank
loop, separate torchrun launches interleaved.

Cases: ranks_overhead.
"""
