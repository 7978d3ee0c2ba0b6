"""Attribution: what it costs to say where memory goes: the memory attribution window's step
(the `a` key) and the hook when no window is open, and the memory ledger's measured step.

Cases: attribution_window, ledger_cost.
"""
