#!/usr/bin/env bash
# Prepared in the twenty-first session (2026-12-04, GPU.md "Next GPU session") for the next one: what
# a draft costs a cycle. The MTP step timed alone is 0.18-0.21 AR steps (target 0.15),
# but the lane never runs it alone: a cycle hands its drafts to the device and builds the verify
# meanwhile (core/decoders.py). gpu_long.py now times greedy cycles at depths 1-3 in that order,
# taking turns with the forwards and the head's step: less the verify of depth + 1, what each draft
# costs a cycle, and the projection from whole cycles. Three runs at context 64, one at 8k; then
# gpu_trace with its fix (the AR step and the verify stopped at the primitive count in section 21);
# then the oracle once more, for real cycles beside the projection. Then the norm-prologue trial
# (written in the twenty-first session: a layer's input and post-attention RMSNorms computed inside
# the row kernel that reads them, 2 launches fewer a layer): its load check, greedy MTP == AR with
# it, step costs taking turns with the default, AR against mlx_lm, and real cycles. ~700 s in all.
# Wheels in four calls: .whl/c1 .. .whl/c4 (scripts/gpu/carry_wheels.sh). Say lines hold no quotes.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
G="grep -v 'regex pattern'"
say warm-up with the PTX cache from the repository
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 --no-mlx-lm 2>&1 | $G | tail -n 2" 240
for k in 1 2 3; do
  say step and cycle costs at context 64, run $k
  T "$PY scripts/gpu/gpu_long.py --model $C --context 64 --json $O/long64_$k.json 2>&1 | $G | tail -n 1" 100
done
say step and cycle costs at context 8k
T "$PY scripts/gpu/gpu_long.py --model $C --context 8192 --json $O/long8k.json 2>&1 | $G | tail -n 1" 150
say the calls traced: kernels, primitives and Python build of each call
T "$PY scripts/gpu/gpu_trace.py --model $C --json $O/trace.json 2>&1 | $G | grep -v '^  ' | tail -n 8" 120
say real cycles at the Qwythos acceptance
T "$PY scripts/gpu/gpu_oracle.py --model $C --tokens 256 --repeats 2 --json $O/oracle.json 2>&1 | $G | tail -n 3" 120
say the norm-prologue trial: its load check, then greedy MTP == AR with it
N="MTP_CHAT_GPU_TRIALS=norm-prologue"
T "$N $PY -c 'from adapters import load_adapter; print(load_adapter(\"$C\").backend.note)' 2>&1 | $G | tail -n 3" 120
T "$N $PY scripts/gpu/gpu_exact.py --model $C --tokens 256 --skip sampled costs --json $O/exact_norm.json 2>&1 | $G | tail -n 6" 300
say step costs with and without it, taking turns
for k in 1 2; do
  T "$PY scripts/gpu/gpu_long.py --model $C --context 64 --json $O/long64_pair_default$k.json 2>&1 | $G | tail -n 1" 100
  T "$N $PY scripts/gpu/gpu_long.py --model $C --context 64 --json $O/long64_pair_norm$k.json 2>&1 | $G | tail -n 1" 100
done
say AR against mlx_lm and real cycles with it
T "$N $PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 64 --repeats 2 --json $O/q9b_norm.json 2>&1 | $G | tail -n 2" 150
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 64 --repeats 2 --json $O/q9b_default.json 2>&1 | $G | tail -n 2" 150
T "$N $PY scripts/gpu/gpu_oracle.py --model $C --tokens 256 --repeats 2 --json $O/oracle_norm.json 2>&1 | $G | tail -n 3" 120
say all done
