#!/usr/bin/env bash
# session 49, GPU call 1: session 47's host-path refactor (NativeFrameBinding, the CPU step's binding)
# checked on the GPU, then nn.LSTM / nn.GRU against cuDNN over the whole size grid on this head.
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/tests
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== session / resident / fusion GPU tests $(date +%T)"
timeout 170 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider -rfE tests/gpu/test_session.py \
  tests/gpu/test_resident.py tests/gpu/test_engine_fusion_gpu.py -k "native or state or never_answers or cpustep or session" \
  > $OUT/tests/session-resident-tests.log 2>&1; echo "rc=$? $(date +%T)"; tail -n 12 $OUT/tests/session-resident-tests.log
echo "== rnn_sizes $(date +%T)"
mkdir -p $OUT/rnn_sizes; timeout 330 python3 bench/rnn_sizes.py --hidden 64,256,1024 --out $OUT/rnn_sizes > $OUT/rnn_sizes/rnn_sizes.log 2>&1 || true
echo "rc=$? $(date +%T)"; tail -n 45 $OUT/rnn_sizes/rnn_sizes.md 2>/dev/null || tail -n 20 $OUT/rnn_sizes/rnn_sizes.log
