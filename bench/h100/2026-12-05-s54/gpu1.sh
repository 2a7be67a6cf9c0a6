#!/usr/bin/env bash
# GPU call 1 (written in sessions 51-52, which got no GPU): sessions 50-52's code on a GPU for the
# first time. The new step-kernel tactics (stepkernel-lanes, stepkernel-512-threads,
# stepkernel-views, stepkernel-fewer-phases, stepkernel-384-threads-fewer-phases) against ONNX
# Runtime and under compute-sanitizer memcheck / racecheck (the fewer-phases kernels include the
# views); the selection's frame-gap check, the state hand-over and
# the native host path (hostpath.c's atomic bell) and the resident kernel; then the lanes kernel's
# device time beside the plain one's.
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/tests $OUT/sweep
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
NEW="lanes or size_tactics or views_tactic"
echo "== sanitizers + GPU tests in parallel $(date +%T)"
(timeout 330 bash tests/gpu/sanitize.sh memcheck $OUT/tests -k "lanes or size_tactics or (views_tactic and fewer)" tests/gpu/test_stepkernel.py > $OUT/tests/memcheck.summary 2>&1) &
(timeout 330 bash tests/gpu/sanitize.sh racecheck $OUT/tests -k "lanes or (size_tactics and GRU) or (views_tactic and fewer)" tests/gpu/test_stepkernel.py > $OUT/tests/racecheck.summary 2>&1) &
timeout 300 python3 -m pytest -m gpu -q -n 6 -p no:cacheprovider -rfE tests/gpu/test_stepkernel.py tests/gpu/test_session.py tests/gpu/test_resident.py \
  -k "$NEW or stepkernel-views or fewer-phases or frame_gap or device_frames or native_host or test_resident" > $OUT/tests/tests.log 2>&1; echo "pytest rc=$? $(date +%T)"; tail -n 15 $OUT/tests/tests.log
wait; echo "sanitizers done $(date +%T)"; cat $OUT/tests/memcheck.summary $OUT/tests/racecheck.summary
echo "== sweep $(date +%T)"
timeout 150 python3 bench/stepkernel.py --archs , --sweep rnn:LSTM/64/256/1,rnn:LSTM/64/256/1+lanes,rnn:GRU/64/256/1,rnn:GRU/64/256/1+lanes \
  --grids 132 --threads 256,384 --out $OUT/sweep > $OUT/sweep/sweep.log 2>&1; echo "rc=$? $(date +%T)"; grep -v Warn $OUT/sweep/sweep.log | tail -n 20
