"""How the bundled demo model (models/demo) was built: build.py runs the stages (corpus ->
tokenizer -> train -> export -> verify); models/demo/README.md tells the story with the numbers.

corpus.py, everyday.py, conversations.py (the training text), tokenizer.py, model_torch.py (the
model in PyTorch) with train_torch.py (training) and probe.py (the GPU probe after training),
export.py (to MLX), verify.py, evaluate.py, loops.py, samples.py, and CPU cost probes
(bench_cpu.py, engine_costs.py, shapes.py); gpu_calls.sh runs training on a GPU machine.

These files are run as scripts from this folder and import each other by bare name (``import
corpus``): the GPU machine gets this folder alone. They may import core, adapters, webapp and
scripts.checkpoints; nothing here is imported by another script package.
"""
