#!/usr/bin/env bash
# session 33, call D: the GPU tests not run since session 31 (fused ops' kernels, engine, precision, TensorRT plugin enqueue), on the H200
set -u
timeout 320 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 -rfE \
  tests/gpu/test_attention.py tests/gpu/test_delta_rule_scan.py tests/gpu/test_gated_delta_rule_scan.py tests/gpu/test_gru_seq.py \
  tests/gpu/test_linear_scan.py tests/gpu/test_liquid_scan.py tests/gpu/test_lstm_seq.py tests/gpu/test_mlstm_scan.py \
  tests/gpu/test_selective_scan.py tests/gpu/test_wkv_scan.py tests/gpu/test_engine.py tests/gpu/test_precision_gpu.py \
  tests/gpu/test_tensorrt_plugin_enqueue.py > $OUT/gpu-tests-ops-engine-precision.log 2>&1; echo "rc=$?"
tail -15 $OUT/gpu-tests-ops-engine-precision.log
