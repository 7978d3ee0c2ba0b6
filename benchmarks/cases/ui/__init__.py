"""UI: what the dashboard costs while it draws, how fast it answers a key, what it keeps growing,
and `memtop view` opening and following a run.

Cases: dashboard_overhead, ui_latency (its runs: ui_latency_runs.py, its probes:
ui_latency_probes.py), ui_growth, view_cost.
"""
