"""Profiler: what a profiler window costs the training and the UI, how long its C++ calls hold
the GIL, and the step split's clock against the profiler's.

Cases: profiler_window, profiler_gil_holds, split_vs_profiler.
"""
