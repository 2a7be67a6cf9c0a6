// LiquidScan kernels (CfC closed-form liquid cell). xg [B,T,4H] (input projection plus biases,
// computed by the graph) is read directly in its storage dtype; these kernels run the recurrence
// g_t = xg_t + R h_{t-1}. Design: ../lstm_seq/persistent_rnn.cuh.
//
// Entries per storage dtype D in {f32, f16, bf16}:
//   liquid_scan_D / liquid_scan_D_rg                  one block per batch group (any GPU)
//   liquid_scan_cluster_D / liquid_scan_cluster_D_rg  8-block cluster per batch group (sm_90+)
#include "../common.cuh"
#include "../lstm_seq/persistent_rnn.cuh"

FFRNN_SINGLE_ENTRIES(liquid_scan_f32, ffrnn::kLiquid, float, float)
FFRNN_SINGLE_ENTRIES(liquid_scan_f16, ffrnn::kLiquid, __half, __half)
FFRNN_SINGLE_ENTRIES(liquid_scan_bf16, ffrnn::kLiquid, __nv_bfloat16, __nv_bfloat16)
FFRNN_CLUSTER_ENTRIES(liquid_scan_cluster_f32, ffrnn::kLiquid, float, float)
FFRNN_CLUSTER_ENTRIES(liquid_scan_cluster_f16, ffrnn::kLiquid, __half, __half)
FFRNN_CLUSTER_ENTRIES(liquid_scan_cluster_bf16, ffrnn::kLiquid, __nv_bfloat16, __nv_bfloat16)
