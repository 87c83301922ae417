"""Jitted programs shared by every object of a process that would build the same one.

`jax.jit` caches a program's traces and executables on the jitted function object, so two
samplers of one model with the same settings, each jitting its own closure, would trace,
lower and compile (or load from the persistent cache) every program twice. Keyed by
everything that determines the jitted function and its shardings, `shared_jit` hands both
the same function object: the second one's calls are in-memory cache hits. A new sampler for
evaluation, a notebook cell run again, a test building its own sampler: none recompiles.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import jax

# Jitted functions kept, least recently used dropped first: each holds its compiled
# executables, so the bound keeps a process that builds many differently shaped objects (the
# test suite) from holding all of them.
SHARED_JIT_LIMIT = 256

_functions: OrderedDict[Hashable, Callable] = OrderedDict()


def shared_jit(key: Hashable, build: Callable[[], Callable]) -> Callable:
    """The jitted function `build()` returns, built once per `key` in this process. `key`
    must determine the function, its static arguments, shardings and compiler options;
    `build` must not capture mutable state (such as the object asking), which the shared
    function would keep alive and read stale."""
    if key in _functions:
        _functions.move_to_end(key)
        return _functions[key]
    function = _functions[key] = build()
    if len(_functions) > SHARED_JIT_LIMIT:
        _functions.popitem(last=False)
    return function


def tree_key(tree) -> tuple:
    """A hashable key of a pytree of hashable leaves (shardings): its structure and leaves."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple(leaves)
