"""memtop's benchmarks: what watching costs the training, measured, beside its target.

    python -m benchmarks list               # every case, what it measures, its target
    python -m benchmarks run NAME [options] # one case; its figures into RESULTS.md's rows

harness/ (what every case shares), cases/<area>/ (the cases), gpu/ (the GPU check), RESULTS.md
(one row per figure) and results/ (the dated logs): benchmarks/README.md. Nothing in probes/,
trainer/ or tui/ imports this package (pyproject.toml's import-linter contracts).
"""
