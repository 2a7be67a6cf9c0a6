// GRU cell, one step (ONNX gate order z, r, h; linear_before_reset = 1, torch's GRU). Shared by the
// GRUSeq kernels and the step compiler. x* are W·x + Wb parts, h* are R·h + Rb parts.
#pragma once

namespace ff {
__device__ __forceinline__ float gru_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float gru_hidden(float xz, float hz, float xr, float hr, float xh, float hh, float h) {
    const float z = gru_sigmoid(xz + hz);
    const float r = gru_sigmoid(xr + hr);
    const float n = tanhf(xh + r * hh);
    return (1.0f - z) * n + z * h;
}
}  // namespace ff
