"""Child seeds and generators derived from a run seed and labels with numpy's SeedSequence.

Every seed a run derives from its run seed comes through `derive_seed` / `derive_rng`, never
from arithmetic such as `seed * k + i`, which overflows the sampler's uint32 for large run seeds
(the random model's weights and the reasoning-gym pool take the run seed itself). SeedSequence
hashes its words, so the result is the same on every machine and numpy version, and distinct
labels give independent streams. Seeds live in [0, 2**31): a valid JAX key, numpy seed,
`random.Random` seed and uint32 alike.
"""

from __future__ import annotations

import numbers
import zlib

import numpy as np

SEED_LIMIT = 2**31  # run seeds and derived seeds lie in [0, SEED_LIMIT)
_WORD_LIMIT = 2**32  # an int label is one SeedSequence word


def check_seed(value: object, name: str = "seed") -> int:
    """`value` as an int in [0, 2**31); a ValueError naming it otherwise (floats and bools too)."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or not 0 <= value < SEED_LIMIT):
        raise ValueError(f"{name}={value!r}: use an integer in [0, {SEED_LIMIT - 1}]")
    return int(value)


def _entropy(parent: int, labels: tuple[int | str, ...]) -> list[int]:
    """The SeedSequence words: the parent seed, then one word per label (a str by its CRC-32)."""
    words = [check_seed(parent, "parent seed")]
    for label in labels:
        if isinstance(label, str):
            words.append(zlib.crc32(label.encode()))
        elif (isinstance(label, numbers.Integral) and not isinstance(label, bool)
              and 0 <= label < _WORD_LIMIT):
            words.append(int(label))
        else:
            raise ValueError(f"seed label {label!r}: use a str or an integer in [0, 2**32)")
    return words


def derive_seed(parent: int, *labels: int | str) -> int:
    """The child seed in [0, 2**31) of `parent` for `labels` (same inputs, same seed)."""
    state = np.random.SeedSequence(_entropy(parent, labels)).generate_state(1)
    return int(state[0] & (SEED_LIMIT - 1))


def derive_rng(parent: int, *labels: int | str) -> np.random.Generator:
    """A numpy Generator seeded by `parent` and `labels` (independent per distinct labels)."""
    return np.random.default_rng(np.random.SeedSequence(_entropy(parent, labels)))
