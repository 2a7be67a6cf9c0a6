#!/usr/bin/env bash
# session 47, GPU call 1: Session.step launching the step kernel with cuLaunchKernel from hostpath.c
# (StepBinding.direct_launch) against cuGraphLaunch of its one-kernel graph: host work, step
# latency, outputs bit for bit. Caches under build/ (ignored, kept on a warm machine).
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== session_host $(date +%T)"
timeout 200 python3 bench/microbench/session_host.py --archs lstm,attention,min_gru --iters 3000 --rounds 3 --no-resident --out $OUT/sh 2>&1 | grep -v Warning; echo "rc=$? $(date +%T)"
