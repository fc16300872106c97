"""Keep an idle server idle.

Gradio's queue loop checks for new events every 1 ms while nothing is queued, and its
progress loop every 10 ms (queueing.py, ``sleep_when_free`` on Linux): about 1100 wake-ups
a second, 6-9 % of a core on a 2-core box with no browser connected (0.6 % with the
values here; scripts/bench/idle_cpu.py measures it). Waking 20 times a second costs a queued
event at most 50 ms before it starts (a decode takes seconds) and nothing once it streams. The app reports no ``gr.Progress``, so the progress
loop can be slower still.
"""
from __future__ import annotations

QUEUE_POLL_S = 0.05
PROGRESS_POLL_S = 0.25


def calm_queue(demo) -> None:
    """Slow the idle polling of ``demo``'s queue (attributes it reads on every pass)."""
    queue = demo._queue
    queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_POLL_S)
    queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, PROGRESS_POLL_S)
