"""XLA compile options for tests whose property is bit-identity between two compiled programs.

`make test` compiles with XLA's older CPU fusion emitters (`--xla_cpu_use_fusion_emitters=false`
in the Makefile: they compile the suite's tiny programs in about 60 % of the time). Two
programs that share a computation (the trainer's composition and the simulator's, a simulator
with and without the rivals' parts) round it the same way under jaxlib 0.10's default emitters,
but not always under the older ones (differences of 1e-9 to 6e-8 were seen). Tests that assert
such a bit-identity compile both programs with `DEFAULT_EMITTERS` (`jax.jit(...,
compiler_options=DEFAULT_EMITTERS)`), what a user's run compiles with.
"""

DEFAULT_EMITTERS = {"xla_cpu_use_fusion_emitters": True}
