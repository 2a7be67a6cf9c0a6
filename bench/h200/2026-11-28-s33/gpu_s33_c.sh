#!/usr/bin/env bash
# session 33, call C: the final code: body-loop GPU tests + sanitizers, the torch_mlpcell_loop rows, the trace
set -u
bash bench/h200/2026-11-28-s33/gpu_s33_a.sh
timeout 120 python3 bench/h200/2026-11-28-s33/trace_mlp.py 2>&1 | grep -E "threads|rolled|kernel" | tee $OUT/trace-mlpcell-T32.txt
bash bench/h200/2026-11-28-s33/gpu_s29_rows.sh mlpcell real step,sequence torch_mlpcell_loop 400
