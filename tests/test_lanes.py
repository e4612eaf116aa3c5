"""The submit-lane pool the CUDA and Vulkan backends share (``gpumnn.backends.lanes``), against
stand-in lanes: reservations, hung lanes, staging that only grows, the drain at close, and the
weak hold on a backend's methods."""
from __future__ import annotations

import gc
import weakref

import pytest

from gpumnn.backends.lanes import LanePool


class _Lane:
    def __init__(self, n: int):
        self.n, self.staging, self.hung = n, None, False


class _Staging:
    def __init__(self, size: int):
        self.size = size


class _Backend:
    """A backend's side of the pool: it makes lanes and staging and frees staging it replaced."""

    def __init__(self):
        self.lanes_made, self.freed = 0, []
        self.pool = LanePool(self.make_lane, self.make_staging, lambda s: s.size, self.free_staging)

    def make_lane(self) -> _Lane:
        self.lanes_made += 1
        return _Lane(self.lanes_made)

    def make_staging(self, nbytes: int) -> _Staging:
        return _Staging(nbytes)

    def free_staging(self, staging: _Staging) -> None:
        self.freed.append(staging)


def test_reserve_counts_lanes_made_on_demand():
    be = _Backend()
    with be.pool.lend():
        pass  # a write before the session's run states: one lane, made on demand
    be.pool.reserve(100)  # the first run state's lane is that one
    assert be.lanes_made == 1 and be.pool.all[0].staging.size == 100
    be.pool.reserve(0)  # a second run state: a second lane, staging as large as the first's
    assert be.lanes_made == 2 and [lane.staging.size for lane in be.pool.all] == [100, 100]


def test_staging_grows_and_frees_what_it_replaces():
    be = _Backend()
    with be.pool.lend() as lane:
        small = be.pool.staging(lane, 10)
        assert be.pool.staging(lane, 5) is small and be.freed == []
        assert be.pool.staging(lane, 20).size == 20 and be.freed == [small]
        assert be.pool.staging(lane, 0) is lane.staging


def test_a_hung_lane_is_not_lent_again():
    be = _Backend()
    with be.pool.lend() as lane:
        lane.hung = True
    with be.pool.lend() as other:
        assert other is not lane and be.lanes_made == 2
    assert be.pool.take() is other


def test_drain_hands_every_lane_over_once():
    be = _Backend()
    held = be.pool.take()
    with be.pool.lend():
        pass
    assert sorted(lane.n for lane in be.pool.drain()) == [1, 2] and held.n == 1
    assert be.pool.all == [] and be.pool.drain() == []


def test_the_pool_does_not_keep_its_backend_alive():
    be = _Backend()
    with be.pool.lend():
        pass
    pool, ref = be.pool, weakref.ref(be)
    gc.disable()
    try:
        del be
        assert ref() is None  # freed by reference counting alone: no cycle through the pool
    finally:
        gc.enable()
    assert pool.take().n == 1  # an idle lane still lends
    with pytest.raises(ReferenceError):  # a new one has no backend to make it
        pool.take()
