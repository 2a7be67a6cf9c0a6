#!/usr/bin/env bash
# Session 59 wrote it (issue 18's write-combined frame memory, and the GPU tests session 59 left
# unfinished); session 60 ran it on an H100 in one call of 289 s (results beside it: wc/, README.md),
# from the repository root, after the wheel install: bash bench/h100/2026-12-06-s60/gpu12.sh
# 1. bench/microbench/host_roundtrip.cu: the host <-> GPU round trip over mapped memory when the
#    words the GPU polls are write-back (as now) or write-combined; a word, and a 256-word frame
#    (embed 256); and the GPU's cycles a dependent load of each memory.
# 2. resident_variants.py default vs write-combined (stepkernel.RESIDENT_WRITE_COMBINED_FRAMES):
#    bit for bit over 200 frames, then Session.step p50 / p99, three rounds each (min_gru, gru, mamba).
# 3. GPU tests: the write-combined resident test (new), the selection's timing budget (new: a slow
#    candidate's fewer replays; the fast candidates of min_gru still get every call), session 58's
#    stepkernel tests that session 59's call cut (narrow weight rows, x in registers), and the
#    probe's memset case (fixed).
# Decide: if write-combined is faster in 2 on every arch (both p50 and p99, every round's order),
# turn RESIDENT_WRITE_COMBINED_FRAMES on with the numbers in its comment; else record them and leave it off.
set -u
# each step's output goes to $OUT/wc as it runs: a call cut by its limit keeps what finished; the
# least needed last (the stepkernel tests left from session 58)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/wc
echo "== host_roundtrip $(date +%T)"
(cd bench/microbench && nvcc -O3 -arch=sm_90 -o /tmp/host_roundtrip host_roundtrip.cu) && \
  timeout 120 /tmp/host_roundtrip 20000 2>&1 | tee $OUT/wc/host_roundtrip.log
echo "== resident_variants $(date +%T)"
timeout 240 python3 bench/microbench/resident_variants.py --archs min_gru,gru,mamba \
  --variants default,write-combined --rounds 3 --out $OUT/wc/resident_variants.json 2>&1 | tail -6 | tee $OUT/wc/resident_variants.log
echo "== GPU tests $(date +%T)"
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_resident.py -k write_combined -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/wc/tests.log
timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_engine_fusion_gpu.py \
  -k "fewer_replays or selection_keeps or selection_times_the_step_kernel" -p no:cacheprovider 2>&1 | tail -4 | tee -a $OUT/wc/tests.log
CUDA_MODULE_LOADING=EAGER timeout 30 python3 bench/microbench/resident_first_kernel.py --wait 10 --case memset 2>&1 | tail -3 | tee -a $OUT/wc/tests.log
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_stepkernel.py -k "narrow_weight_kernel_matches or x_in_registers" \
  -p no:cacheprovider 2>&1 | tail -4 | tee -a $OUT/wc/tests.log
echo "== done $(date +%T)"
