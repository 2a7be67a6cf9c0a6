#!/usr/bin/env bash
# Session 54, GPU call 6 (~330 s), to run first next session: does loading a one-block
# recurrence's inputs several positions ahead (codegen.RECUR_INPUTS_AHEAD, 1 today) take the L2
# round trip off its positions? nn.LSTM / nn.GRU hidden 64, T = 256, one direction (where the plain
# kernel ties cuDNN: ~0.52 us a position on the H100, ~900 cycles for two barriers and 64
# multiply-adds a thread), device time by depth 1 / 2 / 4 / 8 (nvcc 13, sm_90: no spills at 4; at 8 the
# LSTM's kernel spills 32 bytes at 384 threads, 206 registers at 256), the lanes loop too; then the GPU tests
# of the ring against ONNX Runtime, memcheck and racecheck on one of them; then the racecheck that
# crashed in session 54 (xlstm's small fewer-levels kernel), alone.
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/sweep $OUT/tests
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=rnn:LSTM/64/256/1; G=rnn:GRU/64/256/1
echo "== sweep $(date +%T)"
timeout 150 python3 bench/stepkernel.py --archs , --grids 132 --threads 256,384 --out $OUT/sweep \
  --sweep $W,$W+ahead2,$W+ahead4,$W+ahead8,$W+lanes+ahead4,$G,$G+ahead2,$G+ahead4,$G+ahead8,$W \
  > $OUT/sweep/sweep.log 2>&1; echo "rc=$? $(date +%T)"; grep -h "sweep rnn" $OUT/sweep/sweep.log
echo "== GPU tests + sanitizers $(date +%T)"
(bash tests/gpu/sanitize.sh memcheck $OUT/tests -t 140 -k "inputs_loaded and gru-5-2" tests/gpu/test_stepkernel.py > $OUT/tests/memcheck.summary 2>&1) &
timeout 120 python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider -rfE tests/gpu/test_stepkernel.py -k "inputs_loaded" > $OUT/tests/tests.log 2>&1
echo "pytest rc=$? $(date +%T)"; tail -n 4 $OUT/tests/tests.log
wait; cat $OUT/tests/memcheck.summary
bash tests/gpu/sanitize.sh racecheck $OUT/tests/ahead -t 100 -k "inputs_loaded and gru-5-2-False" tests/gpu/test_stepkernel.py
bash tests/gpu/sanitize.sh racecheck $OUT/tests/xlstm -t 100 -k "views_tactic and xlstm-stepkernel-fewer-levels" tests/gpu/test_stepkernel.py
grep -h "Segmentation" $OUT/tests/xlstm/*.log | head -n 3
