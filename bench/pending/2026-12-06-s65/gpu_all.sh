#!/usr/bin/env bash
# The whole GPU suite (`pytest -m gpu`, ~900 cases; last run whole before session 60) in parts that
# each fit one device call (a call may run 600 s; each part stops itself at 540 s, and a part cut
# there says so: split it further, STEP_SHARDS=8). One part a call:
#   PART=ops       the fused ops' kernels against their references (attention, scans, RNNs, ...)
#   PART=engine    engines, fusion, precision, Session, the TensorRT plugins' enqueue
#   PART=resident  tests/gpu/test_resident.py
#   PART=step1..stepN  tests/gpu/test_stepkernel.py in STEP_SHARDS (4) shards, every N-th case
# Each part writes $OUT/gpuall/<part>.log with the 25 slowest cases (for the next split plan).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/gpuall
PART=${PART:?PART=ops|engine|resident|step1..stepN}
SHARDS=${STEP_SHARDS:-4}
OPS="test_adding_an_op_gpu test_attention test_compiler_runtime test_delta_rule_scan test_gated_delta_rule_scan
 test_gru_seq test_linear_scan test_liquid_scan test_lstm_seq test_mlstm_scan test_selective_scan test_wkv_scan"
ENGINE="test_engine test_engine_fusion_gpu test_precision_gpu test_session test_tensorrt_plugin_enqueue"
case "$PART" in
  ops) ARGS=$(for f in $OPS; do echo tests/gpu/$f.py; done) ;;
  engine) ARGS=$(for f in $ENGINE; do echo tests/gpu/$f.py; done) ;;
  resident) ARGS=tests/gpu/test_resident.py ;;
  step*)
    i=${PART#step}
    ARGS=$(python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/gpu/test_stepkernel.py 2>/dev/null \
      | grep "::" | awk -v n="$SHARDS" -v i="$i" '(NR - 1) % n == i - 1') ;;
  *) echo "unknown PART=$PART" >&2; exit 2 ;;
esac
echo "== $PART: $(echo "$ARGS" | wc -l) files or cases $(date +%T)"
timeout 540 python3 -m pytest -q -m gpu -rfE --durations=25 -p no:cacheprovider $ARGS > $OUT/gpuall/$PART.log 2>&1
rc=$?
[ $rc = 124 ] && echo "cut at 540 s: split this part further"
echo "rc=$rc $(date +%T)"; grep -E "^(FAILED|ERROR)" $OUT/gpuall/$PART.log | cut -c1-200; tail -n 1 $OUT/gpuall/$PART.log
