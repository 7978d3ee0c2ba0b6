"""The GPU check: every claim memtop makes about CUDA, checked on a lent GPU machine in one
prepared run.

    bash benchmarks/gpu/run.sh --fetch-wheels       # here, once: the wheels the device lacks
    bash benchmarks/gpu/run.sh                      # there: wheels, the check, pytest, packed
    bash benchmarks/gpu/run.sh --rehearse           # here, on CPU: the same script
    python -m benchmarks.gpu.check OUT --dry-run    # the claim list, every claim NOT RUN
    python -m benchmarks record-gpu OUT/summary.json   # the claims into RESULTS.md's rows

Modules: registry (Claim, Outcome, Ctx, @claim: how to add a claim), device (what claims share
about the device), claims/<area>.py (the claims), check (runs them, summary.md / summary.json
after each), pack (the ≤ 8 files the machine returns; standard library only), record (a run's
claims into RESULTS.md), run.sh, wheels.txt. Nothing here is imported at package level:
pack.py must run where torch or memtop's imports are what broke.
"""

__all__: list[str] = []
