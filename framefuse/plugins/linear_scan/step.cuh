// LinearScan, one step: h_t = a_t * h_{t-1} + b_t. Shared by linear_scan.cu and the step compiler.
#pragma once

namespace ff {
__device__ __forceinline__ float linear_scan_step(float a, float b, float h) { return a * h + b; }
}  // namespace ff
