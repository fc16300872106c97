"""GPU probes and the GPU benchmark, for a machine with MLX CUDA (docs/gpu.md).

gpu_bench.sh runs the stages (gpu_env.sh sets up MLX CUDA and the web stack from carried wheels;
web_wheels.sh downloads the web stack's); gpu_make_checkpoint.py writes the 9B / 35B-A3B /
Next-80B-A3B shaped random checkpoints; gpu_exact.py, gpu_check.py,
gpu_qmv.py, gpu_attention.py, gpu_fused_gdn.py, gpu_prefill.py, gpu_profile.py and gpu_nan.py probe
exactness, kernels and cost; gpu_report.py folds their outputs into one JSON.

May import core, adapters and scripts.checkpoints; not webapp, scripts.bench or scripts.demo_model.
"""
