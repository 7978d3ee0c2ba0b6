"""What several benchmarks share beyond common.py (the machine line, the /proc readers, the
interleaved pairs with their A/A noise, the RESULTS.md writer) and terminal.py (the tmux pane,
memtop's command lines): ``runs`` runs `memtop train` as a measured process and reads its run
folder while it writes. Imported by bare name like common.py (``from harness.runs import ...``):
the scripts run as ``python benchmarks/X.py``, with benchmarks/ first on sys.path.
"""
