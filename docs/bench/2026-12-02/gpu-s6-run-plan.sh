#!/usr/bin/env bash
# Sixth session's detached run: a snapshot of the tree, the checkpoint and a compile warm-up while
# demo v3 trains beside it (untimed), then, once training is done, one stage after another.
R=/tmp/repo; O=/tmp/gb; C=/tmp/mtp_chat_q9b; PY=python3
mkdir -p $R $O
tar --exclude=./.whl --exclude=./artifacts --exclude=./.venv -cf - . | tar -xf - -C $R; cd $R
t0=$(date +%s); say() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
T() { timeout ${2:-420} bash -c "$1"; }
git rev-parse HEAD 2>/dev/null; git status --short | head
say checkpoint
[ -f $C/config.json ] || $PY scripts/gpu/gpu_make_checkpoint.py --out $C
say warm-up compile, beside the training, untimed
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 2>&1 | grep -v 'regex pattern' | tail -n 6" 400
T "$PY scripts/bench/bench_batch.py --model $C --requests 4 --tokens 8 --long-prompt 0 --streams 0 --json /tmp/warm_batch.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 300
say waiting for the training to end
n=0; while ! grep -q "stage train done" /tmp/v3_out/calls.log 2>/dev/null && [ $n -lt 600 ]; do sleep 2; n=$((n+2)); done
sleep 3; nvidia-smi --query-compute-apps=pid,used_memory --format=csv; say training over
say checks
T "$PY scripts/gpu/gpu_fused_gdn.py --model $C --json $O/fused_gdn.json" 240
T "$PY scripts/gpu/gpu_attention.py --json $O/attention.json" 300
say batch
T "$PY scripts/bench/bench_batch.py --model $C --requests 1 2 4 --tokens 64 --long-prompt 0 --streams 0 --json $O/batch_9b.json 2>&1 | grep -v 'regex pattern' | tail -n 30" 360
say long
T "$PY scripts/gpu/gpu_long.py --model $C --json $O/long_9b.json --context 64 --context 8192 --context 32768 --context 131072 2>&1 | grep -v 'regex pattern'" 400
say parity32k
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
T "$PY scripts/gpu/gpu_exact.py --model $C --json $O/exact_32k.json --tokens 256 --parity-context 32768 --skip parity prefix sampled costs 2>&1 | grep -v 'regex pattern'" 420
say profile
T "$PY scripts/gpu/gpu_profile.py --model $C --only default submit-off --repeats 2 --json $O/profile.json 2>&1 | grep -v 'regex pattern'" 420
say parts
T "$PY scripts/gpu/gpu_step_parts.py --model $C --env-variants --json $O/step_parts.json 2>&1 | grep -v 'regex pattern'" 420
say batch_graph
T "$PY scripts/bench/batch_graph.py --model $C --json $O/batch_graph_9b.json 2>&1 | grep -v 'regex pattern' | tail -n 30" 240
say d2
T "$PY scripts/bench/bench.py --model $C --depth 2 --temperature 0 --top-p 1 --top-k 0 --min-p 0 --max-tokens 128 --repeats 3 --json $O/bench_d2.json 2>&1 | grep -v 'regex pattern' | tail -n 14" 240
say all done
#!/usr/bin/env bash
# Second start of the sixth session's stages (the first lacked pydantic: web1 not carried).
R=/tmp/repo; O=/tmp/gb; C=/tmp/mtp_chat_q9b; PY=python3
cd $R; t0=$(date +%s); say() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
T() { timeout ${2:-420} bash -c "$1"; }
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
say checks
T "$PY scripts/gpu/gpu_fused_gdn.py --model $C --json $O/fused_gdn.json" 200
T "$PY scripts/gpu/gpu_attention.py --json $O/attention.json" 200
say batch
T "$PY scripts/bench/bench_batch.py --model $C --requests 1 2 4 --tokens 64 --long-prompt 0 --streams 0 --json $O/batch_9b.json 2>&1 | grep -v 'regex pattern' | tail -n 30" 300
say long
T "$PY scripts/gpu/gpu_long.py --model $C --json $O/long_9b.json --context 64 --context 8192 --context 32768 --context 131072 2>&1 | grep -v 'regex pattern'" 300
say parity32k
T "$PY scripts/gpu/gpu_exact.py --model $C --json $O/exact_32k.json --tokens 256 --parity-context 32768 --skip parity prefix sampled costs 2>&1 | grep -v 'regex pattern'" 300
say all done
