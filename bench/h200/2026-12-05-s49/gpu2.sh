#!/usr/bin/env bash
# session 49, GPU call 2: the state hand-over between host and device frames (any candidate, the
# CPU step's launches counted as replays), the two rnn_sizes rows that tied cuDNN in call 1 built
# as `framefuse build` does (--select time), then the transformers real models at T = 1 and the
# three bidirectional torch.nn models at T = 32, every peer in the same run.
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/tests $OUT/rnn_time
echo "== session GPU tests $(date +%T)"
timeout 150 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider -rfE tests/gpu/test_session.py \
  -k "device_frames or allocates or cupy or driver_replay or native_host" \
  > $OUT/tests/session-tests.log 2>&1; echo "rc=$? $(date +%T)"; tail -n 6 $OUT/tests/session-tests.log
echo "== rnn_sizes ties, --select time $(date +%T)"
timeout 60 python3 bench/rnn_sizes.py --kinds LSTM --hidden 1024 --seq 32 --dirs 2 --select time --out /tmp/rnn_a > $OUT/rnn_time/rnn_time.log 2>&1; echo "rc=$?"
timeout 50 python3 bench/rnn_sizes.py --kinds LSTM --hidden 64 --seq 256 --dirs 1 --select time --out /tmp/rnn_b >> $OUT/rnn_time/rnn_time.log 2>&1; echo "rc=$?"
grep -h "^| LSTM" /tmp/rnn_[ab]/rnn_sizes.md; cat /tmp/rnn_[ab]/rnn_sizes.jsonl > $OUT/rnn_time/rnn_sizes.jsonl
bash bench/h200/2026-11-28-s35/gpu_s29_rows.sh real1t real step gpt2_sdpa,llama_gqa_sdpa,mamba,jamba 275
