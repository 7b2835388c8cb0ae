// Matrix product on the GPU, out[r, n] = sum over k of x[r, k] * w[n, k], f32 sums of f32
// activations and weights widened to f32 (`widen`: a bfloat16 is the high half of an f32). Every
// (N, K) of the forward pass (MATMUL_SHAPES) gets its own kernels, whose loops run over
// constants:
//
// - `matmul_N_K`, for a few rows (a decode step): one warp per output value. The 32 lanes read
//   the weight row in coalesced 16-byte loads (8 bfloat16 or 4 f32 a lane, 512 bytes a warp),
//   multiply the activations and sum by shuffles; a row whose length is not a multiple of a
//   load (K % 8 for bfloat16) is read one weight a lane instead. Each weight is read once a row.
// - `matmul_tiles_N_K`, for many rows (prefill): a block of 256 threads computes a tile of 64
//   rows × 64 outputs, each thread 4 × 4 of them in registers, from tiles of 16 columns of the
//   activations and the weights staged in shared memory: each weight is read once a tile of
//   rows instead of once a row.

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

#define TILE_M 64
#define TILE_N 64
#define TILE_K 16

template <int N, int K>
__device__ void matmul_tiles(float* out, const float* x, const W* w, int rows) {
    __shared__ float xs[TILE_K][TILE_M];
    __shared__ float ws[TILE_K][TILE_N];
    const int row0 = blockIdx.y * TILE_M;
    const int n0 = blockIdx.x * TILE_N;
    const int tx = threadIdx.x % 16;  // this thread's outputs: n0 + tx + 16 j
    const int ty = threadIdx.x / 16;  // and rows row0 + ty + 16 i
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE_K) {
        // 64 × 16 values of each, 4 a thread, zero past the edges
        for (int i = threadIdx.x; i < TILE_M * TILE_K; i += 256) {
            const int m = i / TILE_K;
            const int k = i % TILE_K;
            const bool in_k = k0 + k < K;
            xs[k][m] = in_k && row0 + m < rows ? x[(size_t)(row0 + m) * K + k0 + k] : 0.0f;
            ws[k][m] = in_k && n0 + m < N ? widen(w[(size_t)(n0 + m) * K + k0 + k]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE_K; k++) {
            float a[4];
            float b[4];
            for (int i = 0; i < 4; i++) a[i] = xs[k][ty + 16 * i];
            for (int j = 0; j < 4; j++) b[j] = ws[k][tx + 16 * j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
        const int r = row0 + ty + 16 * i;
        if (r >= rows) continue;
        for (int j = 0; j < 4; j++) {
            const int n = n0 + tx + 16 * j;
            if (n < N) out[(size_t)r * N + n] = acc[i][j];
        }
    }
}

#define MATMUL_KERNEL(N, K) \
    extern "C" __global__ void matmul_##N##_##K(float* out, const float* x, const W* w, int rows) { \
        matmul_rows<N, K>(out, x, w, rows); \
    } \
    extern "C" __global__ void matmul_tiles_##N##_##K(float* out, const float* x, const W* w, int rows) { \
        matmul_tiles<N, K>(out, x, w, rows); \
    }
MATMUL_SHAPES(MATMUL_KERNEL)
