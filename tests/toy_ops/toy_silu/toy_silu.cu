// ToySilu: y = x * sigmoid(x), one thread an element; fp32 arithmetic for every storage dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__device__ void toy_silu(const T* __restrict__ x, T* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = to_f32(x[i]);
        y[i] = from_f32<T>(v / (1.0f + __expf(-v)));
    }
}

extern "C" __global__ void toy_silu_f32(const float* x, float* y, long long n) { toy_silu(x, y, n); }
extern "C" __global__ void toy_silu_f16(const __half* x, __half* y, long long n) { toy_silu(x, y, n); }
extern "C" __global__ void toy_silu_bf16(const __nv_bfloat16* x, __nv_bfloat16* y, long long n) { toy_silu(x, y, n); }
