"""Experiments and benchmarks of dasknn; each module runs as a script (see its docstring)."""
