#!/usr/bin/env bash
# session 47, GPU call 8: the torch.nn real models at T = 1 again, the resident column now the plain
# step kernel built for it where the build chose the CPU step
set -u
bash bench/h200/2026-11-28-s35/gpu_s29_rows.sh real1cpu2 real step torch_rnn_bidir,torch_lstm_bidir,torch_gru_bidir,torch_rnncell_loop,torch_mlpcell_loop,torch_lnlstm_loop 265
