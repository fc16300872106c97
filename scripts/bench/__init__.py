"""Benchmarks: each script measures one thing and writes a JSON record (docs/bench/ holds them).

bench.py (AR / MTP / mlx_lm lanes, paired), bench_race.py (the race vs the lanes alone),
bench_batch.py, batch_graph.py (the graph a batch step builds on the host, per sequence),
bench_turns.py, bench_disk_cache.py, bench_constrained.py, bench_waterfall.py, bench_distributed.py,
bench_http_latency.py, bench_checkouts.py (two checkouts against each other),
bench_models.py (checkpoints' MTP/AR paired in one process),
family_bench.py (every family's tiny checkpoint), race_in_browser.py and idle_cpu.py (a real
browser), api_conversation.py (a multi-turn chat through the HTTP API), agent_session.py (an
agent's session through /v1/messages: does each turn prefill only its new tokens, warm and after a
restart).

May import core, adapters, webapp, scripts.checkpoints and the tests' helpers (tests/_*.py: a
benchmark serves the app the way the tests do); not scripts.gpu, scripts.demo_model or scripts.dev.
"""
