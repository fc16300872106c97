#!/usr/bin/env bash
# Back on the CPU after a demo v3 training call (issue 35; V3_PLAN.md sections 3 and 11), in one go:
# the returned parts joined and checked, unpacked, exported in the Qwythos layout, verified against
# the run, then judged and evaluated through the app's engine, each result written as JSON.
#
#   bash scripts/demo_model/after_v3.sh <files_at of the call> <variant> [<name>]
#     variant   v3e (artifacts/demo/v3e: its tokenizer and corpus); name (default: the variant) names
#               the outputs, e.g. v3e-more for a RESUME_DIR call: artifacts/demo/<variant>/<name>/
#               {V3.q8.safetensors, runs/, model/} and docs/bench/<today>/demo-<name>-*.json
#   CONFIG=scripts/demo_model/configs/v3.json   the trained shape (as gpu_v3.sh's CONFIG)
#   PARTS="judge eval tools held alone paired"  which measures to run (all six by default; paired
#                                               takes ~10 minutes: MTP/AR against models/demo's, in one process)
#
# export.py and verify.py need PyTorch, which the project does not depend on: it is installed into
# .venv for them (from /opt/wheels when a CPU wheel is there, else PyPI's CPU index) and removed after.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
FILES=${1:?the files_at folder of the training call}
V=${2:?the variant, e.g. v3e}
NAME=${3:-$V}
CONFIG=${CONFIG:-scripts/demo_model/configs/v3.json}
PARTS=${PARTS:-judge eval tools held alone paired}
PY=.venv/bin/python
A=artifacts/demo/$V
D=$A/$NAME
B=docs/bench/$(date +%F)
say() { echo "[after_v3 $(date +%T)] $*"; }
[ -d "$A/tokenizer" ] && [ -f "$A/corpus/tools_eval.jsonl" ] || {
  echo "$A has no tokenizer/ or corpus/: prepare it first (python scripts/demo_model/prepare_v3.py --variant $V)" >&2; exit 2; }
ls "$FILES"/V3.q8.part-* > /dev/null 2>&1 || { echo "$FILES holds no V3.q8.part-*: is it the training call's files_at?" >&2; exit 2; }
mkdir -p "$D" "$B"

say "joining $(ls "$FILES"/V3.q8.part-* | wc -l) parts"
cat "$FILES"/V3.q8.part-* > "$D/V3.q8.safetensors"
sha256sum -c <(sed "s#  .*#  $D/V3.q8.safetensors#" "$FILES/V3.q8.sha256")
cp "$FILES/V3.json" "$D/train.json" 2>/dev/null || true

had_torch=1
$PY -c "import torch" 2>/dev/null || had_torch=0
if [ $had_torch = 0 ]; then
  wheel=$(ls /opt/wheels/torch-*cpu*-cp311-*.whl 2>/dev/null | head -1 || true)
  say "installing torch for the export (${wheel:-PyPI CPU index}; removed after)"
  if [ -n "$wheel" ]; then $PY -m uv pip install -q --python $PY "$wheel"
  else $PY -m uv pip install -q --python $PY torch --index-url https://download.pytorch.org/whl/cpu; fi
fi
drop_torch() { [ $had_torch = 1 ] || $PY -m uv pip uninstall -q --python $PY torch; had_torch=1; }
trap drop_torch EXIT
$PY scripts/demo_model/shards_q8.py unpack "$D/V3.q8.safetensors" "$D/runs/V3"
rm -rf "$D/model"
$PY scripts/demo_model/export.py --run "$D/runs/V3" --text-config "$CONFIG" --tokenizer "$A/tokenizer" --out "$D/model" \
  --trunk-bits 8 --mtp-bits 8
$PY scripts/demo_model/verify.py --model "$D/model" --run "$D/runs/V3" --text-config "$CONFIG"
say "model: $D/model ($(du -sh "$D/model" | cut -f1))"
drop_torch   # the engine's measures run in .venv as a user's is

for part in $PARTS; do
  case $part in
  judge) $PY scripts/demo_model/judge.py "$D/model" --json "$B/demo-$NAME-judge.json" | tail -n 8 ;;
  eval)  mkdir -p artifacts/demo/corpus && cp "$A/corpus/tools_eval.jsonl" artifacts/demo/corpus/
         $PY scripts/demo_model/evaluate.py "$D/model" --depth 1 --json "$B/demo-$NAME-eval.json" | tail -n 8 ;;
  tools) $PY scripts/demo_model/eval_v3.py "$D/model" --tools-eval "$A/corpus/tools_eval.jsonl" \
           --json "$B/demo-$NAME-eval-v3.json" | tail -n 8 ;;
  # the tool calls as the API serves them (tool_choice auto holds a call the model opens to the
  # offered tools' names and arguments): what a client sees
  held)  $PY scripts/demo_model/eval_v3.py "$D/model" --parts tools --hold-calls --tools-eval "$A/corpus/tools_eval.jsonl" \
           --json "$B/demo-$NAME-eval-v3-held.json" | tail -n 2 ;;
  # the dictionary offered alone, as a client with one tool offers it (V3_PLAN section 30: v3 0 of 50)
  alone) $PY scripts/demo_model/eval_v3.py "$D/model" --parts tools --hold-calls --dictionary-alone \
           --tools-eval "$A/corpus/tools_eval.jsonl" --json "$B/demo-$NAME-eval-v3-alone-held.json" | tail -n 2 ;;
  # the done-when's CPU line: this model's MTP/AR over the bundled demo's, paired (V3_PLAN section 21)
  paired) $PY scripts/bench/bench_models.py --model models/demo --model "$D/model" \
            --prompts-file scripts/demo_model/race_prompts.txt --max-tokens 128 --temperature 0.6 --top-p 0.95 \
            --top-k 20 --depth 2 --repeats 64 --json "$B/demo-$NAME-paired-cpu.json" 2>/dev/null | tail -n 24 ;;
  *) echo "unknown part $part (judge, eval, tools, held, alone, paired)" >&2; exit 2 ;;
  esac
done
say "done: $D/model; results in $B/demo-$NAME-*.json"
