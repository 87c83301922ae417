"""Golden values for the Agent's per-environment z-score advantages."""

import math

import numpy as np
import pytest

from spade_jax.rl.advantages import group_zscore_advantages, zscore_group


def test_zscore_golden():
    np.testing.assert_allclose(zscore_group([1, 0, 0, 1]), [1, -1, -1, 1], rtol=1e-7)
    # mean 0.25, population std sqrt(0.1875)
    std = math.sqrt(0.1875)
    expected = [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std]
    np.testing.assert_allclose(zscore_group([1, 0, 0, 0]), expected, rtol=1e-7)
    # the reference's eps 1e-8 beside the std: a spread of 2e-8 has std 1e-8, so z = +-0.5
    np.testing.assert_allclose(zscore_group([0.0, 2e-8]), [-0.5, 0.5], rtol=1e-6)


def test_zero_variance_groups_are_exactly_zero():
    assert zscore_group([1, 1, 1]).tolist() == [0.0, 0.0, 0.0]
    assert zscore_group([0.3, 0.3, 0.3]).tolist() == [0.0, 0.0, 0.0]


def test_group_counts():
    result = group_zscore_advantages([[1, 0, 0, 1], [1, 1, 1], [0, 0], [-1, 0]])
    assert result.n_groups == 4
    assert result.n_zero_variance == 2
    assert result.n_all_positive == 1
    assert result.n_all_nonpositive == 2
    assert [a.shape for a in result.advantages] == [(4,), (3,), (2,), (2,)]
    np.testing.assert_allclose(result.advantages[3], [-1, 1], rtol=1e-7)


def test_bad_groups():
    with pytest.raises(ValueError, match="empty"):
        zscore_group([])
    with pytest.raises(ValueError, match="non-finite"):
        zscore_group([1.0, math.inf])
