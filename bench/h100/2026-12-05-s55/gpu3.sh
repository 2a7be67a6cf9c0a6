#!/usr/bin/env bash
# sessions 51-52, GPU call 3: the rnn_sizes configurations that tied cuDNN (and GRU's hidden 1024 two
# directions, where stepkernel-512-threads is built too), built as `framefuse build` does
# (--select time: every candidate timed, the lanes and 512-thread tactics among them), cuDNN in the
# same process.
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/rnn_time
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for cfg in LSTM:64:256:1:90 LSTM:1024:32:2:200 GRU:1024:32:2:200; do
  IFS=: read kind hidden seq dirs limit <<< "$cfg"; name=$kind-$hidden-$seq-$dirs
  echo "== $name $(date +%T)"
  timeout $limit python3 bench/rnn_sizes.py --kinds $kind --hidden $hidden --seq $seq --dirs $dirs --select time --out $OUT/rnn_time/$name > $OUT/rnn_time/$name.log 2>&1; echo "rc=$? $(date +%T)"
  grep -h "^| $kind" $OUT/rnn_time/$name/rnn_sizes.md 2>/dev/null || grep -v Warn $OUT/rnn_time/$name.log | tail -n 5
  python3 -c "import json,sys; [print(r.get('selection'), r.get('build_s'), r.get('candidates_us')) for r in map(json.loads, open(sys.argv[1]))]" $OUT/rnn_time/$name/rnn_sizes.jsonl 2>/dev/null
done
