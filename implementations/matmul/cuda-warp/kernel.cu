// Matrix product on the GPU, out[r, n] = sum over k of x[r, k] * w[n, k]: one warp per output
// value. The 32 lanes read the weight row (and the activation row) in coalesced strides, each
// weight widened to f32 (`widen`: a bfloat16 is the high half of an f32), and sum by shuffles.
// Every (N, K) of the forward pass (MATMUL_SHAPES) gets its own kernel, `matmul_N_K`, whose
// loops run over constants.

#define MATMUL_WARPS 8

template <int N, int K>
__device__ void matmul_rows(float* out, const float* x, const W* w, int rows) {
    const int n = blockIdx.x * MATMUL_WARPS + threadIdx.x / 32;
    const int r = blockIdx.y;
    const int lane = threadIdx.x % 32;
    if (n >= N || r >= rows) return;
    const W* wn = w + (size_t)n * K;
    const float* xr = x + (size_t)r * K;
    float sum = 0.0f;
    for (int k = lane; k < K; k += 32) sum += xr[k] * widen(wn[k]);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) out[(size_t)r * N + n] = sum;
}

#define MATMUL_KERNEL(N, K) \
    extern "C" __global__ void matmul_##N##_##K(float* out, const float* x, const W* w, int rows) { \
        matmul_rows<N, K>(out, x, w, rows); \
    }
MATMUL_SHAPES(MATMUL_KERNEL)
