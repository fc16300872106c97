"""Fair time-sharing of one device between race lanes.

Each lane wraps a stream generator and times every ``next()`` of it on its own clock
(``perf_counter`` around the call), so a lane is never charged for the other's work.
The scheduler always advances the lane whose own clock is behind. At a snapshot, the
shared time ``t`` is the clock of the lane that is behind (every unfinished lane has had
at least ``t`` seconds of compute), and each lane is shown with exactly the events it had
committed by ``t`` on its own clock: on screen both lanes have had the same compute time.

When the device switches from one lane to the other, and before each snapshot is handed out
for rendering, the lane just run is *settled*: the device work it left queued (an AR lane
evaluates its next step asynchronously before it yields) is waited for and charged to it,
not to the other lane's next step nor done for free while the app renders.

Nothing here knows about models or Gradio: lanes are any iterators of events.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple


@dataclass
class TimedLane:
    """One lane: an iterator advanced one event at a time, timed on its own clock."""

    name: str
    stream: Iterator[Any]
    clock: float = 0.0                       # own accumulated compute seconds
    steps: int = 0
    done: bool = False
    error: Optional[BaseException] = None
    events: List[Tuple[float, Any]] = field(default_factory=list)  # (own clock at commit, record)
    settled: float = 0.0                     # of the clock: queued device work waited for at a switch
    switches: int = 0                        # times the device left this lane for another
    timer: Callable[[], float] = time.perf_counter
    # What to keep of each event (called off the clock): engines reuse one mutable stats
    # object, so a lane that needs per-event stats copies them here.
    record: Callable[[Any], Any] = lambda ev: ev

    def step(self) -> None:
        """Advance by one event; the time spent inside ``next()`` is added to the clock
        (or, for a stream with ``timed_next()``, the compute time it measured itself)."""
        if self.done:
            return
        timed_next = getattr(self.stream, "timed_next", None)
        t0 = self.timer()
        dt = None
        try:
            if timed_next is not None:      # the stream times its own compute (see worker.py)
                ev, dt = timed_next()
            else:
                ev = next(self.stream)
        except StopIteration:
            ev = None
        except Exception as exc:  # a failing lane stops; the caller reports it
            ev = None
            self.error = exc
        if ev is None:
            self.done = True
        self.clock += dt if dt is not None else self.timer() - t0
        self.steps += 1
        if ev is not None:
            self.events.append((self.clock, self.record(ev)))
            if getattr(ev, "finished", False):
                self.done = True

    def settle(self) -> None:
        """Charge this lane for device work it left queued (streams with ``settle()``);
        called when the device switches to another lane."""
        settle = getattr(self.stream, "settle", None)
        if settle is not None:
            try:
                dt = settle()
            except Exception:
                return
            self.clock += dt
            self.settled += dt

    def events_until(self, t: float) -> List[Any]:
        """The events this lane had committed by own-clock time ``t``."""
        return [ev for (c, ev) in self.events if c <= t]

    def close(self) -> None:
        close = getattr(self.stream, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                pass


@dataclass
class Snapshot:
    """What to show: the shared compute time and, per lane, its events committed by then."""

    t: float
    lanes: Sequence[TimedLane]
    final: bool
    stopped: bool = False

    def view(self, i: int) -> List[Any]:
        return self.lanes[i].events_until(self.t)

    def clock(self, i: int) -> float:
        """Own compute time lane ``i`` is shown at (its final clock once it has finished)."""
        return min(self.lanes[i].clock, self.t)


def shared_time(lanes: Sequence[TimedLane]) -> float:
    """The time every lane has had: the clock of the unfinished lane that is behind,
    or the largest clock once all are done."""
    running = [l.clock for l in lanes if not l.done]
    if running:
        return min(running)
    return max((l.clock for l in lanes), default=0.0)


def run_fair(
    lanes: Sequence[TimedLane],
    update_interval: float = 0.1,
    stop: Optional[threading.Event] = None,
    wall: Callable[[], float] = time.monotonic,
    quantum: float = 0.0,
) -> Iterator[Snapshot]:
    """Advance ``lanes`` fairly; yield a :class:`Snapshot` at most every ``update_interval``
    wall seconds and always once at the end. The device stays on a lane until its clock is
    ``quantum`` seconds ahead of the one behind (0: switch whenever it is ahead): what is shown
    does not change (each lane at the shared time), but fewer switches cost less. Closing this
    generator (or setting ``stop``) closes every lane's stream."""
    last = wall()
    t_stop = None
    previous: Optional[TimedLane] = None     # stepped last and not settled since
    stepped: Optional[TimedLane] = None      # stepped last
    try:
        while True:
            running = [l for l in lanes if not l.done]
            if not running:
                break
            if stop is not None and stop.is_set():
                # Show both at the compute time they had both reached; then resume each lane
                # once so an engine lane sees the stop and ends with its 'stopped' event.
                t_stop = shared_time(lanes)
                for l in running:
                    l.step()
                break
            lane = min(running, key=lambda l: l.clock)   # ties: the first listed
            if stepped is not None and not stepped.done and stepped.clock - lane.clock < quantum:
                lane = stepped
            if previous is not None and previous is not lane:
                previous.settle()     # its queued work is its own, not the next lane's
                previous = None
                continue              # its clock moved: choose again
            if stepped is not None and stepped is not lane:
                stepped.switches += 1
            lane.step()
            previous = stepped = lane
            now = wall()
            if now - last >= update_interval:
                # The app renders while we are away: nothing of a lane may run uncharged then.
                previous.settle()
                previous = None
                last = now
                yield Snapshot(shared_time(lanes), lanes, final=False)
        if t_stop is not None:
            yield Snapshot(t_stop, lanes, final=True, stopped=True)
        else:
            yield Snapshot(shared_time(lanes), lanes, final=True)
    finally:
        for l in lanes:
            if not l.done:
                l.close()
