"""The model host and what both front ends (webapp.ui, webapp.api) share: the one model thread
(worker.py), the host that loads, warms and decodes through it (model.py), continuous batching
(batching.py), fair interleaving of race lanes (scheduler.py), calibration, Prometheus metrics,
stop buttons (stops.py), the AR speed reference, multi-host launch (distributed.py), and the
run parameters and input checks every front end applies (params.py, inputs.py).

May import: core, adapters. Never webapp.ui, webapp.api or the top-level modules: serving sits
under both front ends.
"""
