#!/usr/bin/env bash
# Session 60 (not run yet): issue 18's frame fan-out question, and the GPU tests owed since session 59.
# One call on an H100 (~400-500 s), from the repository root, after the wheel install:
#   bash bench/pending/2026-12-06-s60/gpu13.sh
# 1. bench/microbench/host_roundtrip.cu's new `fan` rows: N blocks (1, 8, 32, all SMs) that each need
#    the whole frame, either each polling the host's words itself ("direct") or block 0 relaying them
#    through L2 ("relay", what a resident step does today: the frame's task, then a level). Decide:
#    if direct at 132 blocks is within ~0.3 us of direct at 1 block and below relay, a resident
#    kernel's frame-publish level (every zoo step's level 1, FrameConcat on one block) can go:
#    the readers poll the frame themselves (each recomputing the frame's scalars, the cost that
#    compiler/simplify.PublishFrameScalars' docstring weighs against the level). If direct grows with
#    N (PCIe reads from many SMs queue), the relay stays and the level's floor is the L2 hop.
# 2. GPU tests of session 60's build-time change (the schedule's enumerations kept across a build's
#    tactics, shared_reads, needed_ranges, the uncomposed program reused; every zoo kernel's source
#    byte for byte the same on the CPU): the selection and Session tests, which build through it.
# 3. Session 58's stepkernel tests that sessions 59 and 60 cut twice (narrow weight rows, x in
#    registers), with a limit that fits them (38+ cases at ~4 s).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g13
echo "== host_roundtrip $(date +%T)"
(cd bench/microbench && nvcc -O3 -arch=sm_90 -o /tmp/host_roundtrip host_roundtrip.cu) && \
  timeout 150 /tmp/host_roundtrip 20000 2>&1 | tee $OUT/g13/host_roundtrip.log
echo "== GPU tests $(date +%T)"
timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_engine_fusion_gpu.py tests/gpu/test_session.py \
  -p no:cacheprovider 2>&1 | tail -5 | tee $OUT/g13/tests.log
timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_stepkernel.py -k "narrow_weight_kernel_matches or x_in_registers" \
  -p no:cacheprovider 2>&1 | tail -4 | tee -a $OUT/g13/tests.log
echo "== done $(date +%T)"
