#!/usr/bin/env bash
# Session 71 (~90 s, one call, after gpu50.sh): is a slow launch's frame one read of host memory
# later? resident_spread.py --reads (codegen.RESIDENT_POLL_COUNTS: each frame block's thread 0
# counts, per frame, the reads its poll took) over min_gru's launches, with the default polls and
# with codegen.RESIDENT_POLL_AHEAD; then the new GPU test of the histogram.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g52
for ahead in "" --poll-ahead; do
  timeout 40 python3 bench/microbench/resident_spread.py --archs min_gru --sessions 3 --launches 3 --reads $ahead \
    --out $OUT/g52/reads${ahead:+-ahead}.json 2>&1 | grep -v -e Warn -e "session = Session" | cut -c1-200 \
    | tee -a $OUT/g52/reads.log
done
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_resident.py -k frame_reads 2>&1 | tail -3 \
  | tee $OUT/g52/tests.log
echo "done $(date +%T)"
