"""Whether a recorded cpu run shares its ops between the regions' threads: the one place that
decides it, from the runs' own times.

A session on two or more threads records its ops twice: as planned, the larger ops shared
between the regions' threads, and as a one-thread session plans them, every op on the calling
thread. Which is faster depends on the machine at the moment (where its cores sit, what else
runs on them), not on the model alone, and it changes within minutes (bench/RESULTS.md, s15).
So each recording runs one way, times its runs, and now and then runs a burst of the other:
where the burst is faster, the other way takes over.
"""
from __future__ import annotations

import collections
import time
from typing import Callable

#: the running way's last run times, whose mean stands for it
RECENT = 16
#: the other way is tried in bursts of this many runs, the first not counted: a shared run right
#: after a one-thread run pays the region worker's wake-up at every region, the next ones do not
BURST = 4
#: a burst's mean must beat the running way's by this factor to take over (run times are noisy)
MARGIN = 0.97
#: the other way is tried once this many runs (the first time: only these) and ...
EXPLORE_RUNS = 32
#: ... this many seconds have passed since its last burst: rare enough to cost little, often
#: enough to follow the machine, whose states last minutes (bench/RESULTS.md, s15). Each burst
#: that loses doubles the wait, up to ``EXPLORE_MAX_SECONDS``: a way that stalls now and then
#: (a region's thread displaced by another process) costs a burst's stalls every time it is tried.
EXPLORE_SECONDS = 1.0
EXPLORE_MAX_SECONDS = 8.0


def _mean(times) -> float:
    return sum(times) / len(times)


class SharingChoice:
    """``shared()`` says which way the next run takes (True: as planned, shared between the
    regions' threads; False: each op on the calling thread); ``note(shared, seconds)`` records
    how long it took. The running way (at first the shared one) changes only after a burst of
    the other beats its recent runs, and changes back unless its next ``RECENT`` runs bear the
    burst out. Means, not medians, compare the ways: a way that stalls in some runs (a region
    waiting for a thread another process displaced) is fast in most of them. Each run state has
    its own recordings and serves one run at a time, so a choice is never called from two
    threads at once."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.way = True  # the running way
        self._recent: collections.deque[float] = collections.deque(maxlen=RECENT)
        self._burst: list[float] = []  # the current burst's counted times
        self._burst_left = 0  # runs left in the burst of the other way
        self._previous: bool | None = None  # the way the last run took
        self._runs = 0  # runs since the last burst
        self._explored_at: float | None = None  # the clock at the last burst's end (None: none yet)
        self._wait = EXPLORE_SECONDS  # seconds from a burst's end to the next
        self._replaced: collections.deque[float] | None = None  # the way a burst replaced, on trial

    def shared(self) -> bool:
        """The way the next run takes."""
        if self._burst_left:
            return not self.way
        if (self._replaced is None and self._runs >= EXPLORE_RUNS and len(self._recent) >= BURST
                and (self._explored_at is None or self._clock() - self._explored_at >= self._wait)):
            self._burst_left = BURST
            self._burst.clear()
            return not self.way
        return self.way

    def note(self, shared: bool, seconds: float) -> None:
        """A run of way ``shared`` took ``seconds``; the first run after a change of way (and the
        very first) is not counted."""
        counted = shared == self._previous
        self._previous = shared
        if shared == self.way:
            self._runs += 1
            if counted:
                self._recent.append(seconds)
            if self._replaced is not None and len(self._recent) == RECENT:
                self._settle()
            return
        if counted:
            self._burst.append(seconds)
        self._burst_left = max(0, self._burst_left - 1)
        if self._burst_left:
            return
        if self._burst and _mean(self._burst) < MARGIN * _mean(self._recent):
            self.way, self._replaced = shared, self._recent
            self._recent = collections.deque(self._burst, maxlen=RECENT)
            self._explored(lost=False)
        else:
            self._explored(lost=True)

    def _settle(self) -> None:
        """The way a burst put in has run ``RECENT`` times: it stays if its mean is no worse than
        the way it replaced, else that way comes back and the next burst waits twice as long."""
        replaced, self._replaced = self._replaced, None
        if _mean(self._recent) <= _mean(replaced):
            self._wait, self._burst = EXPLORE_SECONDS, list(replaced)  # the other way's last times
            return
        self._burst = list(self._recent)
        self.way, self._recent = not self.way, replaced
        self._explored(lost=True)

    def _explored(self, lost: bool) -> None:
        """A comparison of the two ways has ended: the next burst comes ``EXPLORE_RUNS`` runs and
        the wait from now, twice as long a wait where the other way ``lost``."""
        self._runs, self._explored_at = 0, self._clock()
        if lost:
            self._wait = min(2 * self._wait, EXPLORE_MAX_SECONDS)

    @property
    def means(self) -> dict[str, float | None]:
        """The mean of the running way's recent times and of the other's last burst (or of its
        recent times before it stopped running), in seconds (None before any)."""
        running = _mean(self._recent) if self._recent else None
        other = self._replaced if self._replaced is not None else self._burst
        names = ("shared", "one thread") if self.way else ("one thread", "shared")
        return {names[0]: running, names[1]: _mean(other) if other else None}


class Recording:
    """A cpu recording: ``shared``, the work items as planned; ``solo``, the same ops planned for
    one thread (None where the regions run on one thread: there is nothing to choose);
    ``choice``, which of them a run takes."""

    __slots__ = ("shared", "solo", "choice")

    def __init__(self, shared: list[Callable[[], None]], solo: list[Callable[[], None]] | None) -> None:
        self.shared = shared
        self.solo = solo
        self.choice = SharingChoice() if solo is not None else None

    def next_shared(self) -> bool:
        """Whether the next run takes the shared way (the caller then sets the regions' threads:
        all of them, or one for ``solo``, whose kernels were planned for one)."""
        return self.choice is None or self.choice.shared()

    def run(self, shared: bool) -> None:
        """Every work item of one way, timed for the choice."""
        if self.choice is None:
            for fn in self.shared:
                fn()
            return
        started = time.perf_counter()
        for fn in (self.shared if shared else self.solo):
            fn()
        self.choice.note(shared, time.perf_counter() - started)
