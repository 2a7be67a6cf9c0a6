#!/usr/bin/env bash
# session 46, GPU call 1: tagged resident frames (codegen.RESIDENT_TAGGED_FRAMES switched on in the
# device's copy of the tree only) through the resident GPU tests, then timed against the default
# resident kernel and the launched one; the host's per-call costs. Caches under build/ (ignored,
# kept on a warm machine between calls).
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 bench/microbench/host_calls.py --out $OUT/host_calls.json | tr -d '\n'; echo
sed -i 's/^RESIDENT_TAGGED_FRAMES = False/RESIDENT_TAGGED_FRAMES = True/' framefuse/compiler/codegen.py
grep -n '^RESIDENT_TAGGED_FRAMES' framefuse/compiler/codegen.py
echo "== tests $(date +%T)"
timeout ${T1:-280} python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_resident.py -k "not 10000" > $OUT/resident-tagged.log 2>&1; echo "rc=$? $(date +%T)"
tail -n 15 $OUT/resident-tagged.log | grep -vE '^\s*$'
echo "== variants $(date +%T)"
timeout ${T2:-240} python3 bench/microbench/resident_variants.py --archs ${ARCHS:-lstm,gru,min_gru,min_lstm,attention} --variants default,tagged-frames --rounds 3 --out $OUT/resident_variants.json 2>&1 | grep -v Warning; echo "rc=$? $(date +%T)"
