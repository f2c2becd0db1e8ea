"""Fidelity rungs: nested seeded prefixes of one permutation, and rung schedules."""

import numpy as np
import pytest

from rag.errors import ConfigError
from rl.tuner.fidelity import rung_indices, rungs_for


def test_rungs_are_nested_distinct_and_seeded():
    a, b = rung_indices(200, 25), rung_indices(200, 75)
    assert a.dtype == np.int64 and len(set(a.tolist())) == 25
    assert np.array_equal(b[:25], a)  # rung 25 is a prefix of rung 75
    assert np.array_equal(rung_indices(200, 25), a)  # same seed, same queries
    assert not np.array_equal(rung_indices(200, 25, seed=1), a)
    full = rung_indices(200, 200)
    assert sorted(full.tolist()) == list(range(200))
    assert a.min() >= 0 and a.max() < 200


@pytest.mark.parametrize("n", [0, 201, -1])
def test_rung_size_out_of_range_is_an_error(n):
    with pytest.raises(ConfigError, match="rung"):
        rung_indices(200, n)


def test_rungs_for_resolves_none_and_drops_rungs_at_or_past_full():
    assert list(rungs_for(200, (25, 75, None))) == [25, 75, 200]
    assert list(rungs_for(60, (25, 75, None))) == [25, 60]
    assert list(rungs_for(75, (25, 75, None))) == [25, 75]
    assert list(rungs_for(10, (25, 75, None))) == [10]
    assert list(rungs_for(50, (10, 20))) == [10, 20, 50]  # the full split always ends it
    assert list(rungs_for(50, ())) == [50]
    assert list(rungs_for(50, (30, 10, 10, 0))) == [10, 30, 50]  # sorted, distinct, >= 1
