#!/usr/bin/env bash
# session 46, GPU call 2: tagged resident frames on by default (codegen.RESIDENT_TAGGED_FRAMES) and
# Session.step's hot path as one call of hostpath.c's extension module: the GPU tests of both,
# Session.step's host work by path (extension / ctypes / Python), and compute-sanitizer on the
# tagged resident kernels. Caches under build/ (ignored, kept on a warm machine).
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/san
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 bench/microbench/host_calls.py --out $OUT/host_calls.json | tr -d '\n'; echo
echo "== session tests $(date +%T)"
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_session.py -k "native_host or nonfinite or allocates" > $OUT/session-tests.log 2>&1; echo "rc=$? $(date +%T)"; tail -n 4 $OUT/session-tests.log
echo "== resident tests $(date +%T)"
timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_resident.py -k "not 10000" > $OUT/resident-tests.log 2>&1; echo "rc=$? $(date +%T)"; tail -n 6 $OUT/resident-tests.log
echo "== session_host $(date +%T)"
timeout 120 python3 bench/microbench/session_host.py --archs lstm,attention,min_gru --iters 3000 --rounds 3 --out $OUT/sh 2>&1 | grep -v Warning; echo "rc=$? $(date +%T)"
echo "== sanitizers $(date +%T)"
export FRAMEFUSE_RESIDENT_TIMEOUT_S=120
timeout 90 bash tests/gpu/sanitize.sh memcheck $OUT/san -k "matches_onnxruntime_over_chained and (lstm or attention or mamba or xlstm)" tests/gpu/test_resident.py; echo "rc=$? $(date +%T)"
timeout 90 bash tests/gpu/sanitize.sh racecheck $OUT/san -k "matches_onnxruntime_over_chained and (lstm or attention or mamba)" tests/gpu/test_resident.py; echo "rc=$? $(date +%T)"
