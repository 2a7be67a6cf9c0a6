#!/usr/bin/env bash
# Session 55, GPU call 8 (~450 s), to run first next session: a one-block recurrence's input words
# taken off the cells' path. +together (codegen.RECUR_TAKE_TOGETHER): a position's words checked
# with one branch (ptxas for sm_90: ~45 cycles of fixed stalls on the cell threads' path for an
# LSTM's four words, against ~110 for four ffk_ll_take); +helpers (codegen.RECUR_INPUT_HELPERS):
# taken a position ahead into shared memory by the block's threads past the cells, so the cells
# read them with no load or branch, and each helper's loads are its only ones in flight (the
# register ring shares one scoreboard: every take waits for the newest peeks, cuobjdump).
# (1) bench/microbench/recur_position.cu again, with its +no-inputs / +staged variants (what the
# input words' loads cost a position), and bench/microbench/poll_latency.cu (a dependent load and
# a two-block round trip by load and store kind: whether another kind than ld.relaxed.gpu /
# st.relaxed.gpu would make a level's transport, issue 18's 0.8-1.0 us, cheaper); (2) device time of nn.LSTM / nn.GRU hidden 64, T = 256 with
# +together / +helpers (+helpers+aheadN: the loop unrolled by N, what the GRU's depth-8 ring gained
# from, its ring being one scoreboard deep too), the plain kernel first and last; (3) the GPU tests of the ring, together
# and helpers (40 windows) and of the build's stepkernel-384-threads-ahead-4 / -8 tactics against
# ONNX Runtime; memcheck and racecheck on a together and a helpers kernel; (4) nn.LSTM / nn.GRU
# 64 / 256 / 1 built as `framefuse build` does, cuDNN beside. If one of them is faster at both
# sizes (and never slower where it applies), make it the default. Session 56 added
# bench/microbench/level_cost.cu to (1): its new mbar mode, a level's transport inside a cluster by
# st.async and mbarriers (issue 18), against the flag-tagged words through L2 that the kernels use.
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
# eight files come back at most: the sweep's and rnn_sizes' other outputs stay in /tmp
mkdir -p build/cache $OUT/tests $OUT/rnn /tmp/sweep /tmp/rnn
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== microbench $(date +%T)"
nvcc -O3 -arch=sm_90 -ftz=true -prec-div=false -prec-sqrt=false -o /tmp/recur_position bench/microbench/recur_position.cu \
  && timeout 60 /tmp/recur_position > $OUT/microbench.log 2>&1
nvcc -O3 -arch=sm_90 -o /tmp/poll_latency bench/microbench/poll_latency.cu \
  && timeout 60 /tmp/poll_latency >> $OUT/microbench.log 2>&1
# session 56: level_cost.cu's mbar mode (st.async + mbarrier in a cluster) beside its block / cluster modes
nvcc -O3 -arch=sm_90 -o /tmp/level_cost bench/microbench/level_cost.cu \
  && timeout 90 /tmp/level_cost >> $OUT/microbench.log 2>&1; cat $OUT/microbench.log
W=rnn:LSTM/64/256/1; G=rnn:GRU/64/256/1
echo "== sweep $(date +%T)"
timeout 150 python3 bench/stepkernel.py --archs , --grids 132 --threads 256,384 --out /tmp/sweep \
  --sweep $W,$W+together,$W+helpers,$W+helpers+ahead4,$W+ahead4+together,$G,$G+together,$G+helpers,$G+helpers+ahead8,$G+ahead8,$G+ahead8+together,$W \
  > $OUT/sweep.log 2>&1; echo "rc=$? $(date +%T)"; grep -h "sweep rnn" $OUT/sweep.log
echo "== GPU tests + sanitizers $(date +%T)"
(bash tests/gpu/sanitize.sh memcheck $OUT/tests -t 100 -k "inputs_loaded and gru-5-2 and False-1" tests/gpu/test_stepkernel.py > $OUT/tests/memcheck.summary 2>&1) &
timeout 220 python3 -m pytest -m gpu -q -n 6 -p no:cacheprovider -rfE tests/gpu/test_stepkernel.py -k "inputs_loaded or ahead" > $OUT/tests/tests.log 2>&1
echo "pytest rc=$? $(date +%T)"; tail -n 4 $OUT/tests/tests.log
wait; cat $OUT/tests/memcheck.summary
bash tests/gpu/sanitize.sh racecheck $OUT/tests/race -t 100 -k "inputs_loaded and gru-5-2 and False-1" tests/gpu/test_stepkernel.py
echo "== rnn_sizes $(date +%T)"
for name in LSTM-64-256-1 GRU-64-256-1; do
  IFS=- read kind hidden seq dirs <<< "$name"
  timeout 90 python3 bench/rnn_sizes.py --kinds $kind --hidden $hidden --seq $seq --dirs $dirs --select time --out /tmp/rnn/$name \
    > /tmp/rnn/$name.log 2>&1; echo "rc=$? $(date +%T)"
  grep -h "^| $kind" /tmp/rnn/$name/rnn_sizes.md 2>/dev/null || grep -v Warn /tmp/rnn/$name.log | tail -n 5
  cp /tmp/rnn/$name/rnn_sizes.jsonl $OUT/rnn/$name.jsonl 2>/dev/null
  python3 -c "import json,sys; [print(r.get('selection'), r.get('build_s'), r.get('candidates_us')) for r in map(json.loads, open(sys.argv[1]))]" $OUT/rnn/$name.jsonl 2>/dev/null
done
# session 56, last (the call's ~600 s may cut it; the decisions above come first): resident_sms
# keeps the build's tactic (StepSource.rescheduled; it kept only the copy pieces before)
echo "== resident_sms $(date +%T)"
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_resident.py -k fewer_sms 2>&1 | tail -n 3
