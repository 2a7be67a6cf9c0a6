#!/usr/bin/env bash
# Session 65, issue 18 (~420 s): should codegen.TAGGED_OUTPUTS be the default? Session 62 found
# it faster at p50 everywhere but mamba's resident p99 1-2 us worse; session 65's first call
# (g19) had mamba's p99 better with it (19.3 against 19.8). The rule set before the run: on by
# default only if faster at p50 and p99, launched and resident, on every zoo architecture.
# 1. resident_variants.py, the 11 zoo architectures, default vs tagged-outputs, 3 interleaved
#    rounds (outputs bit for bit the launched plain kernel over 200 frames).
# 2. The tagged-outputs GPU tests (bit for bit over 2,000 frames, both frame paths).
# 3. Traces of attention's, xlstm's and min_gru's fewer-phases kernels (the builds' choice): why
#    attention's and xlstm's levels cost 1.6-1.8 us against ~1.0 for the others.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g21
ARCHS=${ARCHS:-min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm}
echo "== resident variants $(date +%T)"
timeout 380 python3 bench/microbench/resident_variants.py --archs $ARCHS --rounds 3 \
  --variants default,tagged-outputs --out $OUT/g21/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g21/resident.log
echo "== tagged-outputs GPU tests $(date +%T)"
timeout 150 python3 -m pytest -q -m gpu -k tagged tests/gpu/test_resident.py -p no:cacheprovider 2>&1 | tail -n 8 | tee $OUT/g21/tests.log
echo "== traces $(date +%T)"
timeout 90 python3 bench/stepkernel.py --archs , --trace attention,xlstm,min_gru --select stepkernel-384-threads-fewer-phases \
  --out /tmp/trace-fp 2>&1 | grep -E "trace (attention|xlstm|min_gru)" | tee $OUT/g21/traces.log
echo "done $(date +%T)"
