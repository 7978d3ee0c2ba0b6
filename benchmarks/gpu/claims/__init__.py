"""The GPU claims, one module per area, one function per claim (``@claim`` of
benchmarks/gpu/registry.py, whose docstring has the rules). benchmarks/gpu/check.py imports
every module here, sorted; a new area is a new module, nothing else changes. Each claim has a
row ``gpu/<name>`` in benchmarks/RESULTS.md (NOT RUN until a GPU run records it)."""

__all__: list[str] = []
