#!/usr/bin/env bash
# Session 53's first GPU call (device time was scarce: failed starts cost 90-105 s each): the
# decisive parts of gpu1.sh and gpu2.sh in one call, with session 53's stepkernel-fewer-levels.
# The fewer-phases (256 threads) and fewer-levels tactics against ONNX Runtime (every zoo
# architecture at embed 256 over 200 chained steps, and at embed 64 launched and resident) with
# memcheck and racecheck on the small fewer-levels kernels where the schedule changes beside them;
# then device time of every zoo step kernel under baseline / fewer-phases / fewer-levels /
# replicated products alone; then Session.step p50 / p99, launched and resident, of the
# fewer-levels tactic (the fewer-phases kernel where it changes nothing) with parity over 1,000
# steps and the traces of mamba and xlstm.
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/tests $OUT/views
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ARCHS=min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm
echo "== tests + sanitizers $(date +%T)"
SAN="views_tactic and fewer-levels and (mamba or delta_net or jamba)"
(timeout 170 bash tests/gpu/sanitize.sh memcheck $OUT/tests -k "$SAN" tests/gpu/test_stepkernel.py > $OUT/tests/memcheck.summary 2>&1) &
(timeout 170 bash tests/gpu/sanitize.sh racecheck $OUT/tests -k "$SAN" tests/gpu/test_stepkernel.py > $OUT/tests/racecheck.summary 2>&1) &
timeout 170 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider -rfE tests/gpu/test_stepkernel.py -k "fewer-levels or (fewer-phases and not 384)" > $OUT/tests/tests.log 2>&1
echo "pytest rc=$? $(date +%T)"; tail -n 8 $OUT/tests/tests.log
wait; echo "sanitizers done $(date +%T)"; cat $OUT/tests/memcheck.summary $OUT/tests/racecheck.summary
echo "== variants $(date +%T)"
timeout 200 python3 bench/microbench/stepkernel_variants.py --archs $ARCHS --variants baseline,fewer-phases,fewer-levels,replicated-products,baseline \
  --out $OUT/views/variants.json > $OUT/views/variants.log 2>&1; echo "rc=$? $(date +%T)"; grep -v Warn $OUT/views/variants.log | tail -n 16
sel=stepkernel-fewer-levels
echo "== bench/stepkernel.py --select $sel $(date +%T)"
timeout 160 python3 bench/stepkernel.py --archs $ARCHS --select $sel --steps 1000 --no-plan --trace mamba,xlstm --out $OUT/views/$sel > $OUT/views/$sel.log 2>&1
echo "rc=$? $(date +%T)"; grep -E "^[a-z_]+ +[0-9]+ " $OUT/views/$sel.log | tail -n 12
