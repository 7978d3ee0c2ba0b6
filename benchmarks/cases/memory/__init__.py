"""Memory soak: memtop's own RSS over long runs (a 100,000-step headless run, a 10-minute
dashboard run with keys pressed), growth after warm-up against the target.

Cases: memory_soak.
"""
