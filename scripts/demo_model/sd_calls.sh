#!/bin/bash
# GPU calls of the acceptance sweep 4 (see models/demo/README.md, "Levers tried"); each stage fits
# one ~9.5-minute device call and packs its results into $OUT.  Inputs travel as carried paths:
# artifacts/demo/{data,carry,tokenizer} and artifacts/demo/corpus/eval_prompts.jsonl.
#
#   STAGE joint_gen  (in parallel) self_distill.py gen on M1's trunk (eval replies + replies to the
#                    training prompts at T=0.6 and greedy) and three joint runs of the M1 recipe,
#                    equal time: J0 control (L12), J1 KL at T=0.6, J2 L16 trunk; then held-out loss.
#   STAGE gen        only the replies to the training prompts (T=0.6 for 105 s, greedy for 45 s).
#   STAGE head       head-only self-distillation variants on M1 (trunk frozen), in parallel.
#
# What ran (sweep 4, 30 device minutes): joint_gen (the joint runs and the eval replies; its
# training-prompt generation was cut by the time limit), gen, then SECS=120 head.  The eval
# replies of joint_gen (artifacts/demo/sd/eval_replies.json) must be carried into later calls
# if the machine went cold in between.
#   STAGE final      chosen head-only recipes, longer: sd_calls.sh final "F1|args" "F2|args" ...
#   STAGE trunk      sweep 5: trunk + head fine-tuned together on the trunk's own replies from RUN
#                    (default the shipped S5), anchored to the starting trunk; then held-out loss,
#                    and the shards of the two best by held-back acceptance within KEEP_LOSS
#                    nats of the start come back:  RUN=... sd_calls.sh trunk "T1|args" ...
#   STAGE onpolicy   sweep 6: the co-trained model (carry7/U3, int8-packed by shards_q8.py) answers
#                    the training prompts itself, then trains on those replies, anchored to the
#                    trunk before co-training (carry7/S5): the anchor now sees the repetition loops
#                    the co-trained trunk falls into.  KEEP="V2 V3" names the shards that come back.
#
#   bash scripts/demo_model/sd_calls.sh joint_gen
set -u
STAGE=$1; shift
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=2
OUTDIR=${OUT:-artifacts/demo/out}
D=scripts/demo_model
M1=artifacts/demo/carry/M1
GEN=${GEN:-artifacts/demo/sd}
mkdir -p "$OUTDIR" artifacts/demo/sd artifacts/demo/gpu
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
RECIPE="--depth 2 --mtp-w 1.0 --depth-w 0.5 --distill 0.5 --lr 2e-3 --batch 64 --seq 512 --variant post_norm --micro-batch 32"
SD="python3 $D/self_distill.py"

run_paths() {  # "name|args" ... -> the shard prefix of each run, one per line
  for spec in "$@"; do echo "artifacts/demo/sd/${spec%%|*}"; done
}

head_runs() {  # SECS, then "name|args" ...
  local secs=$1; shift
  local pids=()
  for spec in "$@"; do
    name=${spec%%|*}; args=${spec#*|}
    $SD train --run "${RUN:-$M1}" --gen "$GEN" --out artifacts/demo/sd --name "$name" --seconds "$secs" $args \
      > "artifacts/demo/sd/$name.stdout" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
  for spec in "$@"; do name=${spec%%|*}; grep -E "init|step (1|[0-9]*000) |trained|val|accept|Error|error" "artifacts/demo/sd/$name.stdout" | grep -v args | tail -12; done
}

case $STAGE in
joint_gen)
  SECS=${SECS:-270}
  timeout 545 $SD gen --run $M1 --out artifacts/demo/sd > artifacts/demo/sd/gen.stdout 2>&1 &
  G=$!
  pids=()
  for spec in "J0_L12|--text-config $D/configs/h256_L12_i2.json" \
              "J1_L12_dT06|--text-config $D/configs/h256_L12_i2.json --distill-temp 0.6" \
              "J2_L16|--text-config $D/configs/h256_L16_i2.json"; do
    name=${spec%%|*}; args=${spec#*|}
    python3 $D/train_torch.py --out artifacts/demo/gpu --name "$name" --seconds "$SECS" $RECIPE $args \
      > "artifacts/demo/gpu/$name.stdout" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
  $SD loss --runs $M1 artifacts/demo/gpu/J0_L12 artifacts/demo/gpu/J1_L12_dT06 \
    artifacts/demo/gpu/J2_L16:$D/configs/h256_L16_i2.json --json artifacts/demo/gpu/heldout_loss.json 2>&1 | grep heldout
  wait $G
  grep -vE "done,|falling" artifacts/demo/sd/gen.stdout | tail -8
  for n in J0_L12 J1_L12_dT06 J2_L16; do grep -E "trained|acceptance|Error" artifacts/demo/gpu/$n.stdout | tail -6; done
  cp artifacts/demo/sd/gen.npz artifacts/demo/sd/eval_replies.json "$OUTDIR/" 2>/dev/null
  tar czf "$OUTDIR/call1_logs.tgz" artifacts/demo/gpu/*.json artifacts/demo/gpu/*.stdout artifacts/demo/sd/*.log \
    artifacts/demo/sd/*.stdout 2>/dev/null
  ;;
gen)  # the training-prompt replies alone (in joint_gen they did not finish: the probe-style eval
      # replies took 330 s next to three training runs); largest prompt-length groups first
  $SD gen --run $M1 --out artifacts/demo/sd --skip-eval --gen-batch 8192 --gen-seconds 105 45 \
    > artifacts/demo/sd/gen3.stdout 2>&1
  grep -vE "done,|falling" artifacts/demo/sd/gen3.stdout | tail -4
  cp artifacts/demo/sd/gen.npz "$OUTDIR/"
  ;;
head)
  SECS=${SECS:-120}
  head_runs "$SECS" \
    "S1_kl_tv|--eval-init" \
    "S2_kl|--w-tv 0" \
    "S3_klT1|--tau 1.0 --kl-full --w-tv 0 --w-am 0 --w-ce 1.0" \
    "S4_kl_tv_corpus|--corpus-frac 0.5" \
    "S5_kl_tv_lr15|--lr 1.5e-3"
  tar czf "$OUTDIR/call2.tgz" artifacts/demo/sd/S*.json artifacts/demo/sd/S*.stdout artifacts/demo/sd/S*.head.safetensors
  ;;
final)
  SECS=${SECS:-480}
  head_runs "$SECS" "$@"
  tar czf "$OUTDIR/call3.tgz" artifacts/demo/sd/F*.json artifacts/demo/sd/F*.stdout artifacts/demo/sd/F*.head.safetensors
  ;;
onpolicy)
  D7=artifacts/demo/sd7
  python3 $D/shards_q8.py unpack artifacts/demo/carry7/U3.q8.safetensors $D7/U3
  python3 $D/shards_q8.py unpack artifacts/demo/carry7/S5.q8.safetensors $D7/S5
  cp artifacts/demo/carry7/eval_replies.json $D7/
  $SD gen --run $D7/U3 --out $D7 --skip-eval --gen-batch 8192 --gen-seconds ${GEN_SECS:-75 25} ${GEN_ARGS:-} > $D7/gen.stdout 2>&1
  grep -vE "done,|falling" $D7/gen.stdout | tail -4
  RUN=$D7/U3 GEN=$D7 head_runs "${SECS:-240}" "$@"
  mapfile -t names < <(run_paths "$@")
  $SD loss --runs $D7/U3 $D7/S5 "${names[@]}" --json artifacts/demo/sd/onpolicy_loss.json 2>&1 | grep heldout
  for n in ${KEEP:-}; do cp artifacts/demo/sd/$n-00.safetensors artifacts/demo/sd/$n-01.safetensors "$OUTDIR/" 2>/dev/null; done
  tar czf "$OUTDIR/call_onpolicy.tgz" artifacts/demo/sd/V*.json artifacts/demo/sd/V*.stdout artifacts/demo/sd/onpolicy_loss.json $D7/gen.log
  ;;
trunk)
  SECS=${SECS:-330}
  head_runs "$SECS" "$@"
  mapfile -t names < <(run_paths "$@")
  $SD loss --runs "$RUN" "${names[@]}" --json artifacts/demo/sd/trunk_loss.json 2>&1 | grep heldout
  python3 - "$RUN" "${KEEP_LOSS:-0.05}" "$OUTDIR" "${names[@]}" <<'PY'
import json, shutil, sys
run, keep, out, names = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4:]
loss = json.load(open("artifacts/demo/sd/trunk_loss.json"))
rows = []
for n in names:
    val = json.load(open(n + ".json"))["val"]
    rows.append((loss[n] - loss[run] <= keep, val["T0.6"]["d1"], n))
    print(n, "loss", loss[n], "val", json.dumps(val))
for ok, acc, n in sorted(rows, reverse=True)[:2]:
    for part in ("-00", "-01"):
        shutil.copy(n + part + ".safetensors", out)
    print("kept", n, ok, acc)
PY
  tar czf "$OUTDIR/call_trunk.tgz" artifacts/demo/sd/T*.json artifacts/demo/sd/T*.stdout artifacts/demo/sd/trunk_loss.json
  ;;
esac
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader || true
