#!/usr/bin/env bash
# session 29: e2e rows with persistent compile caches under build/ (kept on the held machine between calls)
# usage: gpu_s29_rows.sh NAME SECTION FORMS ITEMS TIMEOUT [NAME SECTION FORMS ITEMS TIMEOUT ...]
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache
while [ $# -ge 5 ]; do
  name=$1; section=$2; forms=$3; items=$4; limit=$5; shift 5
  flag=--archs; [ "$section" = real ] && flag=--models
  mkdir -p $OUT/$name
  echo "== $name $(date +%T) section=$section forms=$forms $flag $items limit=$limit"
  timeout $limit python3 bench/e2e.py --section $section --forms $forms $flag $items --time-budget $((limit-20)) --out $OUT/$name > $OUT/$name/$name.log 2>&1; echo "rc=$? $(date +%T)"
  grep -E "T=(1|32) " $OUT/$name/$name.log | grep -E "framefuse  |mapped floor|max-autotune|cuDNN|eager \+|ONNX|reduce" | tail -24
  tail -2 $OUT/$name/$name.log
done
du -sh build/cache/* 2>/dev/null
