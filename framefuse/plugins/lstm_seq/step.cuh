// LSTM cell, one step (ONNX gate order i, o, f, c). Shared by the LSTMSeq kernels and the step compiler.
#pragma once

namespace ff {
__device__ __forceinline__ float lstm_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// c' = σ(f)·c + σ(i)·tanh(g) from the gate pre-activations
__device__ __forceinline__ float lstm_cell(float i, float f, float g, float c) {
    return lstm_sigmoid(f) * c + lstm_sigmoid(i) * tanhf(g);
}
// h' = σ(o)·tanh(c')
__device__ __forceinline__ float lstm_hidden(float o, float c_new) { return lstm_sigmoid(o) * tanhf(c_new); }
}  // namespace ff
