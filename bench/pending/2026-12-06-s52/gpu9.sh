#!/usr/bin/env bash
# Session 57, GPU call 9 (~250 s): after gpu8.sh's sweep (bench/h100/2026-12-06-s57/gpu8/) turned
# codegen.RECUR_INPUT_HELPERS and RECUR_TAKE_TOGETHER on: (1) nn.LSTM / nn.GRU 64 / 256 / 1 built as
# `framefuse build` does (every tactic timed; the ahead-4 / -8 tactics are now the helpers' loop
# unrolled), cuDNN beside; (2) the GPU tests of every window with a recurrence under the new
# defaults (the zoo's lstm / gru / liquid / xlstm windows, the rnn_sizes windows and tactics);
# (3) tests/gpu/test_resident.py -k fewer_sms ran past 100 s with no output in gpu8.sh (and past 120
# alone): in a fresh process torch's fill / sum kernels were first used while the resident kernel ran,
# and CUDA's lazy loading may synchronize the context to load them (the suspected cause; the test now
# runs them first and the session warns). Here: the test again (faulthandler dumps the stacks at 50 s
# if it still hangs), bench/microbench/resident_first_kernel.py under LAZY (expected: still waiting)
# and the GPU test of the remedy (EAGER: finishes).
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/rnn /tmp/rnn
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== rnn_sizes $(date +%T)"
for name in LSTM-64-256-1 GRU-64-256-1; do
  IFS=- read kind hidden seq dirs <<< "$name"
  timeout 60 python3 bench/rnn_sizes.py --kinds $kind --hidden $hidden --seq $seq --dirs $dirs --select time --out /tmp/rnn/$name \
    > /tmp/rnn/$name.log 2>&1; echo "rc=$? $(date +%T)"
  grep -h "^| $kind" /tmp/rnn/$name/rnn_sizes.md 2>/dev/null || grep -v Warn /tmp/rnn/$name.log | tail -n 5
  cp /tmp/rnn/$name/rnn_sizes.jsonl $OUT/rnn/$name.jsonl 2>/dev/null
  python3 -c "import json,sys; [print(r.get('selection'), r.get('build_s'), r.get('candidates_us')) for r in map(json.loads, open(sys.argv[1]))]" $OUT/rnn/$name.jsonl 2>/dev/null
done
echo "== GPU tests $(date +%T)"
timeout 130 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider -rfE tests/gpu/test_stepkernel.py \
  -k "(sequence_window and (lstm or gru or liquid or xlstm)) or rnn_size_tactics or wide_or_long_rnn" > $OUT/tests.log 2>&1
echo "pytest rc=$? $(date +%T)"; tail -n 6 $OUT/tests.log
echo "== resident_sms $(date +%T)"
timeout 200 python3 -m pytest -m gpu -q -s -p no:cacheprovider -o faulthandler_timeout=50 tests/gpu/test_resident.py \
  -k "fewer_sms or first_used_beside" > $OUT/resident_sms.log 2>&1; echo "rc=$? $(date +%T)"
grep -v "^\s*$" $OUT/resident_sms.log | grep -E "File \"/|Thread|Timeout|passed|failed|Error|Warning" | head -n 40
CUDA_MODULE_LOADING=LAZY timeout 90 python3 bench/microbench/resident_first_kernel.py --wait 20 2>&1 | grep -v Warn | tail -n 3
