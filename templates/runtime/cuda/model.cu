// The forward pass's own small kernels, beside the chosen ones: the embedding lookup and the
// residual sum.

// x[r] = table[ids[r]], widened to f32: rows of HIDDEN_SIZE, one thread per value.
extern "C" __global__ void embed(float* x, const W* table, const unsigned int* ids, int rows) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * HIDDEN_SIZE) return;
    const int r = i / HIDDEN_SIZE;
    x[i] = widen(table[(size_t)ids[r] * HIDDEN_SIZE + i % HIDDEN_SIZE]);
}

// x += y, one thread per value.
extern "C" __global__ void add(float* x, const float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}
