// LSTMSeq kernels (ONNX LSTM, forward, gate order i, o, f, c). The input projection X W^T for all
// steps is one GEMM done by the caller (interface.py) into an fp32 workspace; these kernels run
// the recurrence. Design and shared-memory layout: persistent_rnn.cuh.
//
// Entries per storage dtype D in {f32, f16, bf16}:
//   lstm_seq_D / lstm_seq_D_rg                  one block per batch group (any GPU)
//   lstm_seq_cluster_D / lstm_seq_cluster_D_rg  8-block cluster per batch group (sm_90+)
// (_rg: R read from global memory each step, for slices too large for shared memory)
#include "../common.cuh"
#include "persistent_rnn.cuh"

FFRNN_SINGLE_ENTRIES(lstm_seq_f32, ffrnn::kLSTM, float, float)
FFRNN_SINGLE_ENTRIES(lstm_seq_f16, ffrnn::kLSTM, __half, float)
FFRNN_SINGLE_ENTRIES(lstm_seq_bf16, ffrnn::kLSTM, __nv_bfloat16, float)
FFRNN_CLUSTER_ENTRIES(lstm_seq_cluster_f32, ffrnn::kLSTM, float, float)
FFRNN_CLUSTER_ENTRIES(lstm_seq_cluster_f16, ffrnn::kLSTM, __half, float)
FFRNN_CLUSTER_ENTRIES(lstm_seq_cluster_bf16, ffrnn::kLSTM, __nv_bfloat16, float)
