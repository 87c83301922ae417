"""Token selection primitives against NumPy."""

import jax.numpy as jnp
import numpy as np

from spade_jax.sampling.sampling_fns import first_argmax


def test_first_argmax_equals_numpy_argmax_with_ties_and_nan():
    rng = np.random.default_rng(0)
    values = rng.standard_normal((6, 1000)).astype(np.float32)
    values[1, [7, 300, 999]] = 9.0  # tie: the first maximum wins
    values[2, :] = 0.0  # all tied
    values[3, -1] = 50.0  # maximum in the last position
    got = np.asarray(first_argmax(jnp.asarray(values)))
    np.testing.assert_array_equal(got, np.argmax(values, axis=-1))
    assert got.dtype == np.int32
    values[4, 5] = np.nan  # no maximum: still a valid index
    assert 0 <= int(first_argmax(jnp.asarray(values))[4]) < 1000
