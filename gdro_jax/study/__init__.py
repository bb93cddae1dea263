"""Studies that compare the methods: the miniature study of `make demo` (warm start, equal-compute
RL per method, a held-out table and plots)."""

from gdro_jax.study._demo import format_comparison, run_demo

__all__ = ["format_comparison", "run_demo"]
