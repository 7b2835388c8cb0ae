// SwiGLU on the GPU: gate = silu(gate) * up, silu(g) = g / (1 + e^-g), one thread per value.

extern "C" __global__ void swiglu(float* gate, const float* up, int rows) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * INTERMEDIATE_SIZE) return;
    const float g = gate[i];
    gate[i] = g / (1.0f + expf(-g)) * up[i];
}
