#!/usr/bin/env bash
# session 47, GPU call 7 (on the GPU machine's CPU and GPU): the CPU step against ONNX Runtime CPU
# (bench/microbench/cpu_step.py), then the torch.nn real models at T = 1 through bench/e2e.py with
# the CPU step among the build's candidates
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache
lscpu | grep -i "model name"
timeout 150 python3 bench/microbench/cpu_step.py --items real:torch_rnncell_loop,real:torch_mlpcell_loop,real:torch_lnlstm_loop,real:torch_rnn_bidir,real:torch_lstm_bidir,real:torch_gru_bidir,min_gru,lstm,attention --iters 2000 --rounds 4 --steps 200 --out $OUT/cpu_step.json 2>&1 | grep -v Warn
bash bench/h200/2026-11-28-s35/gpu_s29_rows.sh real1cpu real step torch_rnn_bidir,torch_lstm_bidir,torch_gru_bidir,torch_rnncell_loop,torch_mlpcell_loop,torch_lnlstm_loop 380
grep -h "selection: cpustep\|<- chosen" $OUT/real1cpu/real1cpu.log | head -30
