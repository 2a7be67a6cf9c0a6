// GRUSeq kernels (ONNX GRU, forward, gate order z, r, h, linear_before_reset = 1). The input
// projection X W^T for all steps is one GEMM done by the caller (interface.py) into an fp32
// workspace; these kernels run the recurrence. Design: ../lstm_seq/persistent_rnn.cuh.
//
// Entries per storage dtype D in {f32, f16, bf16}:
//   gru_seq_D / gru_seq_D_rg                  one block per batch group (any GPU)
//   gru_seq_cluster_D / gru_seq_cluster_D_rg  8-block cluster per batch group (sm_90+)
#include "../common.cuh"
#include "../lstm_seq/persistent_rnn.cuh"

FFRNN_SINGLE_ENTRIES(gru_seq_f32, ffrnn::kGRU, float, float)
FFRNN_SINGLE_ENTRIES(gru_seq_f16, ffrnn::kGRU, __half, float)
FFRNN_SINGLE_ENTRIES(gru_seq_bf16, ffrnn::kGRU, __nv_bfloat16, float)
FFRNN_CLUSTER_ENTRIES(gru_seq_cluster_f32, ffrnn::kGRU, float, float)
FFRNN_CLUSTER_ENTRIES(gru_seq_cluster_f16, ffrnn::kGRU, __half, float)
FFRNN_CLUSTER_ENTRIES(gru_seq_cluster_bf16, ffrnn::kGRU, __nv_bfloat16, float)
