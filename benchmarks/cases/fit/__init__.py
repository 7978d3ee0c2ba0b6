"""Fit: how far `memtop fit`'s prediction of the peak reaches (2×, 4×, 8× the probe's batch size
and sequence length, each checked in a fresh process) and how long the probe itself takes.

Cases: fit_accuracy.
"""
