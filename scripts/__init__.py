"""Tools around the app, by job; nothing in core/, adapters/ or webapp/ imports them.

    bench/        benchmarks: lanes, the race, batching, turns, HTTP, idle CPU, the browser race
    gpu/          GPU probes and the GPU benchmark (MLX CUDA): kernels, exactness, profiles
    checkpoints/  tiny random checkpoints in the published layouts, and checkpoint inspectors
    demo_model/   how the bundled demo model (models/demo) was built: corpus, tokenizer, training
    dev/          developer tools: the mutation check

The three entry points stay here, where the README and .ci/run call them: setup.sh (the .venv),
start.sh (the web app on the demo model) and test.sh (the whole suite).

A script is run as a file from the repository root (``python scripts/gpu/gpu_check.py``) and puts
the root on sys.path itself; tests import the same files as modules (``scripts.bench.bench``).
"""
