// Matrix product on the GPU, out[r, n] = sum over k of x[r, k] * w[n, k]: one warp per output
// value. The 32 lanes read the weight row in coalesced 16-byte loads (8 bfloat16 or 4 f32 a
// lane, 512 bytes a warp), each weight widened to f32 (`widen`: a bfloat16 is the high half of
// an f32), multiply the activations, and sum by shuffles. A row whose length is not a multiple
// of a load (K % 8 for bfloat16) is read one weight a lane instead. Every (N, K) of the forward
// pass (MATMUL_SHAPES) gets its own kernel, `matmul_N_K`, whose loops run over constants.

#define MATMUL_WARPS 8
#define MATMUL_VEC (16 / (int)sizeof(W))

template <int N, int K>
__device__ void matmul_rows(float* out, const float* x, const W* w, int rows) {
    const int n = blockIdx.x * MATMUL_WARPS + threadIdx.x / 32;
    const int r = blockIdx.y;
    const int lane = threadIdx.x % 32;
    if (n >= N || r >= rows) return;
    const W* wn = w + (size_t)n * K;
    const float* xr = x + (size_t)r * K;
    float sum = 0.0f;
    if constexpr (K % MATMUL_VEC == 0) {
#pragma unroll 4
        for (int k = lane * MATMUL_VEC; k < K; k += 32 * MATMUL_VEC) {
            W v[MATMUL_VEC];
            *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(wn + k);
#pragma unroll
            for (int j = 0; j < MATMUL_VEC; j++) sum += xr[k + j] * widen(v[j]);
        }
    } else {
        for (int k = lane; k < K; k += 32) sum += xr[k] * widen(wn[k]);
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) out[(size_t)r * N + n] = sum;
}

#define MATMUL_KERNEL(N, K) \
    extern "C" __global__ void matmul_##N##_##K(float* out, const float* x, const W* w, int rows) { \
        matmul_rows<N, K>(out, x, w, rows); \
    }
MATMUL_SHAPES(MATMUL_KERNEL)
