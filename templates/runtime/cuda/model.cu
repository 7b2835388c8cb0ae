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

// picked[0] = the first index of the largest of the VOCAB_SIZE logits, as the host sampler picks
// at temperature 0: one block, each thread scanning a strided share in order, then the threads'
// picks combined (a larger logit wins, and of equal ones the smaller index).
#define ARGMAX_THREADS 1024

__device__ void argmax_combine(float& value, int& index, float other_value, int other_index) {
    if (other_index < 0) return;
    if (index < 0 || other_value > value || (other_value == value && other_index < index)) {
        value = other_value;
        index = other_index;
    }
}

extern "C" __global__ void argmax(unsigned int* picked, const float* logits) {
    __shared__ float values[ARGMAX_THREADS / 32];
    __shared__ int indices[ARGMAX_THREADS / 32];
    float value = 0.0f;
    int index = -1;  // none yet
    for (int i = threadIdx.x; i < VOCAB_SIZE; i += ARGMAX_THREADS) {
        if (index < 0 || logits[i] > value) {
            value = logits[i];
            index = i;
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const float other_value = __shfl_xor_sync(0xffffffffu, value, offset);
        const int other_index = __shfl_xor_sync(0xffffffffu, index, offset);
        argmax_combine(value, index, other_value, other_index);
    }
    if (threadIdx.x % 32 == 0) {
        values[threadIdx.x / 32] = value;
        indices[threadIdx.x / 32] = index;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / 32; w++) argmax_combine(value, index, values[w], indices[w]);
        picked[0] = (unsigned int)index;
    }
}
