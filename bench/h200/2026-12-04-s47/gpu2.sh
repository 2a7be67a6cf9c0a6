#!/usr/bin/env bash
# session 47, GPU call 2: the committed head checked for issue 16's parity target: every zoo
# architecture's step kernel (launched and resident) against ONNX Runtime over 1,000 chained steps
# at embed 256 (bench/stepkernel.py), then the step kernel's GPU tests.
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache
git log --oneline -1 2>/dev/null
echo "== stepkernel.py $(date +%T)"
timeout 330 python3 bench/stepkernel.py --steps 1000 --no-plan --out $OUT/sk 2>&1 | grep -v Warning | grep -E "parity|resident step|step p50|error|Error|Traceback" ; echo "rc=$? $(date +%T)"
echo "== test_stepkernel + test_compiler_runtime $(date +%T)"
timeout 220 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider tests/gpu/test_stepkernel.py tests/gpu/test_compiler_runtime.py > $OUT/stepkernel-tests.log 2>&1; echo "rc=$? $(date +%T)"; tail -n 8 $OUT/stepkernel-tests.log
