"""spade_jax: SPADE self-play RL (Environment Designer + Reasoning Agent) in JAX."""

from __future__ import annotations

__all__ = ["load_policy"]


def __getattr__(name: str):
    # Lazy, so `import spade_jax.<submodule>` does not pay for transformers and the loaders.
    if name == "load_policy":
        from spade_jax.policy import load_policy

        return load_policy
    raise AttributeError(f"module 'spade_jax' has no attribute {name!r}")
