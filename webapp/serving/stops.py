"""Per-session stop events: the Stop button and closing the tab set the engine's stop event.

A request is *armed* when it is submitted (the un-queued first step of the chain), so a
Stop pressed while the request still waits in the model queue stops it as soon as it
starts; the queued step then *claims* that event. Requests that arrive without the armed
step (API clients) claim a fresh event. Stop after a request has finished does nothing.
Keys are ``"<session>:<lane>"`` (one per tab: chat, race), so one tab's Stop never stops
the other's request. Clear and Undo *withdraw* a request: they stop it and mark its reply as
taken back, so it shows nothing more.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, Optional

CLOSED_KEPT = 4096   # sessions remembered as closed: bounded, so a closed tab leaves nothing for good


def _session(key: Optional[str]) -> str:
    """The session of a key ``"<session>:<lane>"``."""
    return (key or "").split(":", 1)[0]


class StopEvent(threading.Event):
    """The engine's stop event; ``withdrawn`` once Clear or Undo took the reply back."""
    withdrawn = False


@dataclass
class _Entry:
    event: StopEvent = field(default_factory=StopEvent)
    claimed: bool = False


class StopRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: Dict[str, _Entry] = {}
        # Closed tabs' sessions, newest last: a queued request the page's queue had not yet
        # dropped when the tab closed starts stopped instead of running for nobody.
        self._closed: "OrderedDict[str, None]" = OrderedDict()
        self.closing: Optional[str] = None    # why everything was stopped (shutdown), once it was

    def arm(self, session: Optional[str]) -> StopEvent:
        with self._lock:
            entry = _Entry()
            self._current[session or ""] = entry
            self._closed.pop(_session(session), None)   # a page arming is open
            return entry.event

    def claim(self, session: Optional[str]) -> StopEvent:
        with self._lock:
            key = session or ""
            entry = self._current.get(key)
            if entry is None or entry.claimed:
                entry = _Entry()
                self._current[key] = entry
            entry.claimed = True
            if self.closing or _session(key) in self._closed:
                entry.event.set()
            return entry.event

    def stop(self, session: Optional[str], take_back: bool = False) -> Optional[StopEvent]:
        """Set the session's current stop event (`take_back`: Clear/Undo withdraw its reply too);
        that event, or None when there was none to set."""
        with self._lock:
            entry = self._current.get(session or "")
            if entry is None:
                return None
            if take_back:
                entry.event.withdrawn = True
            entry.event.set()
            return entry.event

    def stop_session(self, session: Optional[str]) -> int:
        """Set every stop event of a session (all its tabs' keys ``session:...``): tab closed.
        A running request still releases its own entry when it ends; a queued one never starts
        (the queue drops a closed page's waiting events), so nothing would release it: dropped here."""
        prefix = (session or "") + ":"
        with self._lock:
            self._closed[session or ""] = None
            while len(self._closed) > CLOSED_KEPT:
                self._closed.popitem(last=False)
            hits = [(k, e) for k, e in self._current.items() if k.startswith(prefix)]
            for k, e in hits:
                e.event.set()
                if not e.claimed:
                    del self._current[k]
            return len(hits)

    def stop_all(self, reason: str) -> int:
        """Set every stop event, now and for requests that start later (shutdown);
        returns how many requests were running."""
        with self._lock:
            self.closing = reason
            for e in self._current.values():
                e.event.set()
            return sum(1 for e in self._current.values() if e.claimed)

    def release(self, session: Optional[str], event: threading.Event) -> None:
        with self._lock:
            key = session or ""
            entry = self._current.get(key)
            if entry is not None and entry.event is event:
                del self._current[key]

    def holds(self, session: Optional[str], event: threading.Event) -> bool:
        """True while `event`'s request is still the session's (not yet released)."""
        with self._lock:
            entry = self._current.get(session or "")
            return entry is not None and entry.event is event

    def busy(self, session: Optional[str]) -> bool:
        """True while a request of this key is armed (queued) or running."""
        with self._lock:
            return (session or "") in self._current

    def active(self) -> int:
        with self._lock:
            return sum(1 for e in self._current.values() if e.claimed)
