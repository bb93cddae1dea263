"""The three GDRO controllers as reusable pure JAX functions (optax style).

Each factory validates its hyperparameters and returns a NamedTuple of pure functions over a
NamedTuple state with fixed shapes and dtypes, so states can be `lax.scan` carries, `vmap`-ed,
and replicated leaves of a sharded train state.
"""

from gdro_jax.controllers._prompt_gdro import PromptGDRO, PromptGDROState, prompt_gdro

__all__ = [
    "PromptGDRO",
    "PromptGDROState",
    "prompt_gdro",
]
