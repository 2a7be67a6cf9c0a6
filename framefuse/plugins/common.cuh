// Shared device helpers of every framefuse kernel. Include as `#include "../common.cuh"`.
// Compiles under nvcc and NVRTC (no host headers: NVRTC has no C library).
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace ff {

// Storage loads/stores: every kernel computes in float32 and stores in its storage dtype.
__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// Conversions on values (not pointers), e.g. for data staged through shared memory.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

// Read-only loads through the non-coherent cache (inputs a kernel never writes).
__device__ __forceinline__ float load_ro(const float* p) { return __ldg(p); }
__device__ __forceinline__ float load_ro(const __half* p) { return __half2float(__ldg(p)); }
__device__ __forceinline__ float load_ro(const __nv_bfloat16* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __bfloat162float(__ldg(p));
#else
    return __bfloat162float(*p);
#endif
}

// Math with IEEE semantics kept: NaN/Inf propagate as in the float32 reference.
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float sigmoid_precise(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
// softplus as torch.nn.functional.softplus (beta 1, threshold 20): x for x > 20 else log1p(exp(x)).
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Warp reductions over all 32 lanes.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
// Note: fmaxf returns the other operand when one is NaN, so warp_max does not propagate NaN.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}
// Sum over groups of `width` consecutive lanes (width a power of two ≤ 32); every lane gets its group's sum.
template <int width>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int offset = width / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__host__ __device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace ff
