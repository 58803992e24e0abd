#!/usr/bin/env bash
# The H200 session: three calls of at most 9 minutes, each its own: run from the repo root on the device
#
#   bash benchmarks/h200_session.sh 1    # the DM frame in float16: tensor cores by hand (TC_OPT=2) and by BEAM=2, against torch's float16 peers
#   bash benchmarks/h200_session.sh 2    # the DM frame in float32: TF32 tensor cores (ALLOW_TF32=1) by hand and by BEAM=2, against torch.compile
#                                        #   in float32 (TF32 convolutions, torch's default) and torch's strict float32 CUDA graph; then a model
#                                        #   switch's warm-up in the shadow at 20 Hz (benchmarks/bench_shadow, full stand-ins)
#   bash benchmarks/h200_session.sh 3    # the driving frame at float16 and float32 (BEAM=2, and as one CUDA graph) against torch.compile alone;
#                                        #   the roofline of every frame built so far; then DEV=CUDA pytest tests/runtime/test_cuda.py if time is left
#   bash benchmarks/h200_session.sh 4    # a short check of outputs: the driving frame (float16, no search) against torch's float16 graph and compile
#
# What each answers (the goals):
#   call 1  goal 1, float16: is the fused DM frame at least as fast as torch.compile max-autotune (float16 ONNX, model.half()), outputs within
#           twice float16_bound? f16_tc: every conv on mma.sync m16n8k16 (hand-coded opts, TC_OPT=2 pads the 360/180/90-wide maps);
#           f16_b2: what BEAM=2 picks when TC actions compete with upcasts/locals. Then their rooflines (H200 datasheet peaks by kernel arithmetic).
#   call 2  goal 1, float32: torch's float32 convs are TF32 by default (cudnn.allow_tf32): tf32_tc / tf32_b2 round to TF32 the same way
#           (checked with float16's tolerance), f32_b2 is the strict float32 baseline (2.587 ms earlier); the strict torch CUDA graph says
#           what float32 without TF32 costs torch. Then their rooflines.
#   call 3  goal 2: torch.compile alone / fused split alone >= 8x at float16 and float32 (f16 first: f32_b2 alone was 7.1x before);
#           *_1graph replays the same bundles as one CUDA graph (JIT_BATCH_SIZE=0). Goal 3: the DM frames' rooflines beside the driving ones'.
#
# Estimates (H200, full stand-ins; reckoned, not measured: a conv kernel's BEAM=2 search ~4-8 rounds of ~2 s, about a hundred candidates a round
# lowered by tinygrad's Python in 16 workers, compiled by NVRTC and timed; torch.compile of the DM stand-in: a run that built it beside the other
# peers did not end in 250 s). Setup 20-40 s on a fresh machine, 5 s on a warm one.
#   call 1: f16_tc ~30 s, f16_b2 ~170 s, torch graph ~15 s, torch.compile ~200 s, two timings ~20 s each, roofline ~30 s       ~500 s
#   call 2: tf32_tc ~30 s, tf32_b2 ~170 s, strict graph ~15 s, torch.compile ~200 s, timings ~40 s, roofline ~30 s;
#           f32_b2 (~150 s, the strict baseline measured before at 2.587 ms) only where the budget still holds it                 ~500 s
#   call 3: f16_b2 ~180 s, torch.compile (float16) ~90 s, timing ~20 s; f32_b2 ~180 s (its warps' searches shared) and its
#           torch.compile ~90 s only if they still fit (likely not: then run call 3 again on the warm machine, f16 reused);
#           roofline ~40 s, pytest ~60 s if left                                                                               ~530 s
# Each sweep has --budget-s from the time left in the call: a variant or peer whose estimate does not fit is dropped with a line
# ("dropping ..."), a build running into the time kept for timing is stopped, every table is written as soon as it is done. Run a call again
# to finish what it dropped: on the same (warm) machine the variants built are reused (out/*_sweep/<variant>/built.json), tinygrad's BEAM
# caches (out/*_sweep/cache/) and torch's Inductor cache (out/torchinductor) too.
#
# Needs: python3 (3.12) with torch, onnx, onnxruntime and pytest; wheels/ at the repo root holding tinygrad==0.14.0, msgq-ipc, pycapnp and zstandard
# (and pytest, pluggy, iniconfig, packaging for the last step; carry wheels/ if git ignores it there); $OUT, the folder that comes back.
set -u
cd "$(dirname "$0")/.."
CALL=${1:?"usage: bash benchmarks/h200_session.sh 1|2|3|4"}
OUT=${OUT:?"OUT: the folder whose files come back"}
LIMIT=${H200_CALL_S:-530}  # seconds this call may take: 9 minutes less a margin for the machine's own start and transfers
START=$SECONDS
PY=${H200_PY:-python3}
SITE=out/site-h200
export DEV=${H200_DEV:-CUDA}  # H200_DEV=CPU with H200_PY: a dry run of the script's steps elsewhere
export PYTHONPATH=$PWD:$PWD/out/site-h200 TORCHINDUCTOR_CACHE_DIR=$PWD/out/torchinductor
mkdir -p "$OUT" out

say() { echo "== $*" | tee -a "$OUT/session.txt"; }
left() { echo $((LIMIT - (SECONDS - START))); }

# step NAME CAP COMMAND...: at most CAP seconds and never past the call's end; its output in $OUT/NAME.txt (and here)
step() {
  local name=$1 cap=$2 t rc t0=$SECONDS
  shift 2
  t=$(left); ((t > cap)) && t=$cap
  if ((t < 20)); then say "$name: skipped, ${t}s left in this call"; return 0; fi
  say "$name: at most ${t}s: $*"
  timeout -k 10 "$t" "$@" 2>&1 | tee "$OUT/$name.txt"
  rc=${PIPESTATUS[0]}
  say "$name: exit $rc after $((SECONDS - t0))s$([ "$rc" = 124 ] && echo ' (stopped at its time limit)')"
}

setup() {
  # the machine's python3 holds torch, onnx and onnxruntime (a venv of its own): the missing packages go beside it into a folder on the path
  if [ ! -d "$SITE/tinygrad" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --target "$SITE" wheels/tinygrad-*.whl \
      wheels/msgq_ipc-*.whl wheels/pycapnp-*.whl wheels/zstandard-*.whl wheels/cryptography-*.whl wheels/cffi-*.whl wheels/pycparser-*.whl || return 1
    # openpilot-logging (the schema the daemons speak on a PC) comes as its source archive
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --disable-pip-version-check --target "$SITE" wheels/openpilot_logging-*.tar.gz || return 1
  fi
  # tinygrad compiles CUDA kernels with NVRTC: where the system has none, the one torch's wheels ship
  if ! $PY -c "from tinygrad import Tensor; assert (Tensor([1.0]) + 1).tolist() == [2.0]" >/dev/null 2>&1; then
    NVRTC_PATH=$($PY -c "import glob, os, nvidia; print(sorted(f for d in nvidia.__path__ for f in glob.glob(os.path.join(d, '**', 'libnvrtc.so*'), recursive=True))[-1])" 2>/dev/null)
    export NVRTC_PATH
    $PY -c "from tinygrad import Tensor; assert (Tensor([1.0]) + 1).tolist() == [2.0]" || { say "tinygrad cannot run on CUDA here (NVRTC_PATH=$NVRTC_PATH)"; return 1; }
  fi
  { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    $PY -c "import sys, torch; from importlib.metadata import version as v; print(sys.version.split()[0], 'tinygrad', v('tinygrad'), 'torch', torch.__version__, \
'cudnn.allow_tf32', torch.backends.cudnn.allow_tf32, 'onnxruntime', v('onnxruntime'), 'onnx', v('onnx'))"
    git log --oneline -1; nproc; } > "$OUT/env_call$CALL.txt" 2>&1
  cat "$OUT/env_call$CALL.txt"
}

say "call $CALL on $(hostname), $(date -u +%FT%TZ)"
setup || { say "setup failed: nothing else runs"; exit 2; }

# a sweep step: its --budget-s is the step's time less a margin for the tables it writes after the last build or peer
sweep() {
  local name=$1 cap=$2 module=$3 t
  shift 3
  t=$(left); ((t > cap)) && t=$cap
  step "$name" "$cap" $PY -m "benchmarks.$module" --budget-s $((t - 25)) --json "$OUT/$name.json" "$@"
}

case $CALL in
  1)
    sweep dm_f16 480 bench_dm_sweep --variants f16_tc,f16_b2 --frames 60 --torch-modes graph,compile --workdir out/dm_sweep
    step roofline_dm_f16 60 $PY -m benchmarks.bench_roofline dm_f16_tc=out/dm_sweep/f16_tc dm_f16_b2=out/dm_sweep/f16_b2 --peaks h200 --top 10 \
      --json "$OUT/roofline_dm_f16.json"
    ;;
  2)
    sweep dm_f32 330 bench_dm_sweep --variants tf32_tc,tf32_b2 --frames 60 --torch-modes graph-strict,compile --workdir out/dm_sweep
    step roofline_dm_f32 40 $PY -m benchmarks.bench_roofline dm_tf32_tc=out/dm_sweep/tf32_tc dm_tf32_b2=out/dm_sweep/tf32_b2 \
      --peaks h200 --top 10 --json "$OUT/roofline_dm_f32.json"
    # a model switch's warm-up in the shadow at 20 Hz with full stand-ins (issue: a model change never hands the car a model without its past)
    step shadow 150 $PY -m benchmarks.bench_shadow --model full --before 60 --after 40 --runs 1 --json "$OUT/shadow.json"
    ;;
  3)
    sweep driving 450 bench_driving_sweep --variants f16_b2,f16_b2_1graph,f32_b2,f32_b2_1graph --frames 200 --torch-modes compile \
      --workdir out/driving_sweep
    frames=()  # every frame built on this machine so far, the DM ones of calls 1 and 2 where the machine stayed warm
    for v in driving_sweep/f32_b2 driving_sweep/f16_b2 dm_sweep/f16_tc dm_sweep/f16_b2 dm_sweep/tf32_tc dm_sweep/tf32_b2 dm_sweep/f32_b2; do
      [ -f "out/$v/built.json" ] && frames+=("${v/_sweep\//_}=out/$v")
    done
    ((${#frames[@]})) && step roofline 60 $PY -m benchmarks.bench_roofline "${frames[@]}" --peaks h200 --top 10 --json "$OUT/roofline.json"
    if $PY -c "import pytest" 2>/dev/null; then step test_cuda 120 $PY -m pytest tests/runtime/test_cuda.py -q -p no:cacheprovider
    else say "test_cuda: skipped: pytest is not installed (its wheels in wheels/: pytest, pluggy, iniconfig, packaging)"; fi
    ;;
  4)
    # outputs only (no goal): the driving frame against torch.compile's float16 peer over 20 frames, each path from zeroed states
    sweep check 300 bench_driving_sweep --variants f16 --frames 20 --torch-modes graph,compile --workdir out/driving_sweep
    ;;
  *) echo "usage: bash benchmarks/h200_session.sh 1|2|3|4" >&2; exit 2 ;;
esac
say "call $CALL done in $((SECONDS - START))s; goals:"
grep -h -E "goal [0-9.]+x|dropping|cannot|failed|skipping" --exclude='env_*' --exclude=session.txt "$OUT"/*.txt 2>/dev/null | grep -v "^== " | sort -u \
  | tee -a "$OUT/session.txt"
