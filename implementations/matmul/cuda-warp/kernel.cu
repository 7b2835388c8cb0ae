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
//   rows × 64 outputs from tiles of the activations and the weights staged in shared memory:
//   each weight is read once a tile of rows instead of once a row. With f32 weights each thread
//   sums 4 × 4 outputs in registers on the CUDA cores, 16 columns a stage. With bfloat16 weights
//   the tensor cores do (`mma.sync` m16n8k16, bfloat16 in, f32 sums): the activations are
//   rounded to bfloat16 (nearest, ties to even) as they are staged, 32 columns a stage, and each
//   of the 8 warps computes 16 rows × 32 outputs as four 16 × 8 fragments.

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

// The nearest bfloat16 of an f32 (ties to even; a NaN stays a NaN), as bits.
__device__ __forceinline__ unsigned int round_bf16(float v) {
    const unsigned int bits = __float_as_uint(v);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (bits >> 16) | 0x40u;
    return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

#ifndef MONOGEN_EMULATED
// d += a · b for one warp: a 16 × 16 bfloat16 fragment (row-major: lane l holds rows l / 4 and
// l / 4 + 8, columns 2 (l % 4) + {0, 1} and those + 8), b 16 × 8 (lane l holds column l / 4,
// rows 2 (l % 4) + {0, 1} and those + 8), d 16 × 8 in f32 (rows l / 4 and l / 4 + 8, columns
// 2 (l % 4) + {0, 1}). The lower half of a 32-bit register holds the lower column (or row of b).
__device__ __forceinline__ void mma_bf16_16816(float* d, const unsigned int* a, const unsigned int* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

#define MMA_K 32

// The tiles of matmul_tiles on tensor cores, for bfloat16 weights.
template <int N, int K>
__device__ void matmul_mma(float* out, const float* x, const unsigned short* w, int rows) {
    __shared__ unsigned short as[TILE_M][MMA_K + 8];  // + 8: the fragments' rows in other banks
    __shared__ unsigned short bs[TILE_N][MMA_K + 8];
    const int row0 = blockIdx.y * TILE_M;
    const int n0 = blockIdx.x * TILE_N;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int group = lane / 4;
    const int pair = 2 * (lane % 4);
    const int wm = 16 * (warp % 4);  // the warp's rows in the tile: wm..wm + 16
    const int wn = 32 * (warp / 4);  // and outputs: wn..wn + 32
    float acc[4][4];
    for (int f = 0; f < 4; f++)
        for (int e = 0; e < 4; e++) acc[f][e] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += MMA_K) {
        for (int i = threadIdx.x; i < TILE_M * MMA_K; i += 256) {
            const int m = i / MMA_K;
            const int k = i % MMA_K;
            const bool in_k = k0 + k < K;
            as[m][k] = in_k && row0 + m < rows ? (unsigned short)round_bf16(x[(size_t)(row0 + m) * K + k0 + k]) : 0;
            bs[m][k] = in_k && n0 + m < N ? w[(size_t)(n0 + m) * K + k0 + k] : 0;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MMA_K; kk += 16) {
            const int r = wm + group;
            const int c = kk + pair;
            unsigned int a[4];
            a[0] = as[r][c] | ((unsigned int)as[r][c + 1] << 16);
            a[1] = as[r + 8][c] | ((unsigned int)as[r + 8][c + 1] << 16);
            a[2] = as[r][c + 8] | ((unsigned int)as[r][c + 9] << 16);
            a[3] = as[r + 8][c + 8] | ((unsigned int)as[r + 8][c + 9] << 16);
#pragma unroll
            for (int f = 0; f < 4; f++) {
                const int n = wn + 8 * f + group;
                unsigned int b[2];
                b[0] = bs[n][c] | ((unsigned int)bs[n][c + 1] << 16);
                b[1] = bs[n][c + 8] | ((unsigned int)bs[n][c + 9] << 16);
                mma_bf16_16816(acc[f], a, b);
            }
        }
        __syncthreads();
    }
    for (int f = 0; f < 4; f++)
        for (int h = 0; h < 2; h++) {
            const int r = row0 + wm + group + 8 * h;
            if (r >= rows) continue;
            for (int e = 0; e < 2; e++) {
                const int n = n0 + wn + 8 * f + pair + e;
                if (n < N) out[(size_t)r * N + n] = acc[f][2 * h + e];
            }
        }
}

#define MATMUL_KERNEL(N, K) \
    extern "C" __global__ void matmul_##N##_##K(float* out, const float* x, const W* w, int rows) { \
        matmul_rows<N, K>(out, x, w, rows); \
    } \
    extern "C" __global__ void matmul_tiles_##N##_##K(float* out, const float* x, const W* w, int rows) { \
        if constexpr (sizeof(W) == 2) matmul_mma<N, K>(out, x, (const unsigned short*)w, rows); \
        else matmul_tiles<N, K>(out, x, w, rows); \
    }
MATMUL_SHAPES(MATMUL_KERNEL)
