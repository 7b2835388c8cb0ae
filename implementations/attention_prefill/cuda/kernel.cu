// Causal attention of a chunk of prompt rows on the GPU, in the flash style: one block of 4
// warps per (tile of 16 query rows, head), each warp 4 of the rows. The keys and values of the
// positions the tile sees pass through shared memory 32 positions at a time; lane j scores
// position j of a key tile against a row (q · k / sqrt(HEAD_DIM)), and the warp keeps, for each
// of its rows, the running largest score m, the running sum l of e^(score − m) and the running
// weighted sum of the values acc (HEAD_DIM values spread over the lanes), rescaling l and acc
// by e^(m_old − m_new) when m grows (online softmax). The scores never leave the registers, and
// the shared memory does not grow with the sequence. A query head reads key/value head
// `head / (NUM_HEADS / NUM_KV_HEADS)`.

#define FA_ROWS 16
#define FA_WARPS 4
#define FA_ROWS_PER_WARP (FA_ROWS / FA_WARPS)
#define FA_TILE 32
#define FA_PER_LANE ((HEAD_DIM + 31) / 32)

extern "C" __global__ void attention_prefill(float* out, const float* q, const KV* keys, const KV* values, int start, int rows) {
    __shared__ float qs[FA_ROWS][HEAD_DIM];
    __shared__ float ks[FA_TILE][HEAD_DIM + 1];  // + 1: lane j reads row j, in its own bank
    __shared__ float vs[FA_TILE][HEAD_DIM];
    const float minus_infinity = -__int_as_float(0x7f800000);
    const int first_row = blockIdx.x * FA_ROWS;
    const int head = blockIdx.y;
    const int kv_head = head / (NUM_HEADS / NUM_KV_HEADS);
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    for (int i = threadIdx.x; i < FA_ROWS * HEAD_DIM; i += blockDim.x) {
        const int r = i / HEAD_DIM;
        const int d = i % HEAD_DIM;
        qs[r][d] = first_row + r < rows ? q[(size_t)(first_row + r) * Q_DIM + head * HEAD_DIM + d] : 0.0f;
    }
    float m[FA_ROWS_PER_WARP];
    float l[FA_ROWS_PER_WARP];
    float acc[FA_ROWS_PER_WARP][FA_PER_LANE];
    for (int j = 0; j < FA_ROWS_PER_WARP; j++) {
        m[j] = minus_infinity;
        l[j] = 0.0f;
        for (int c = 0; c < FA_PER_LANE; c++) acc[j][c] = 0.0f;
    }
    // The tile's last row sees positions 0..end.
    const int end = start + min(rows, first_row + FA_ROWS);
    for (int t0 = 0; t0 < end; t0 += FA_TILE) {
        __syncthreads();  // the last tile is read (and the queries are stored)
        for (int i = threadIdx.x; i < FA_TILE * HEAD_DIM; i += blockDim.x) {
            const int p = i / HEAD_DIM;
            const int d = i % HEAD_DIM;
            const bool seen = t0 + p < end;
            const size_t at = (size_t)(t0 + p) * KV_DIM + kv_head * HEAD_DIM + d;
            ks[p][d] = seen ? widen_kv(keys[at]) : 0.0f;
            vs[p][d] = seen ? widen_kv(values[at]) : 0.0f;
        }
        __syncthreads();
        for (int j = 0; j < FA_ROWS_PER_WARP; j++) {
            const int r = warp * FA_ROWS_PER_WARP + j;
            if (first_row + r >= rows) continue;  // the whole warp's row
            const int position = start + first_row + r;
            const int p = t0 + lane;
            // the positions the row sees: the last WINDOW up to its own (all without a window)
            const bool seen = p <= position && p > position - WINDOW;
            float score = minus_infinity;
            if (seen) {
                float dot = 0.0f;
                for (int d = 0; d < HEAD_DIM; d++) dot += qs[r][d] * ks[lane][d];
                score = dot * scale;
            }
            float tile_max = score;
            for (int offset = 16; offset > 0; offset /= 2) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
            const float m_new = fmaxf(m[j], tile_max);
            if (m_new == minus_infinity) continue;  // the row sees none of these positions yet
            const float e = seen ? expf(score - m_new) : 0.0f;
            const float correction = expf(m[j] - m_new);
            float e_sum = e;
            for (int offset = 16; offset > 0; offset /= 2) e_sum += __shfl_xor_sync(0xffffffffu, e_sum, offset);
            l[j] = l[j] * correction + e_sum;
            for (int c = 0; c < FA_PER_LANE; c++) acc[j][c] *= correction;
            for (int i = 0; i < FA_TILE; i++) {
                const float ei = __shfl_sync(0xffffffffu, e, i);
                for (int c = 0; c < FA_PER_LANE; c++) {
                    const int d = lane + 32 * c;
                    if (d < HEAD_DIM) acc[j][c] += ei * vs[i][d];
                }
            }
            m[j] = m_new;
        }
    }
    for (int j = 0; j < FA_ROWS_PER_WARP; j++) {
        const int row = first_row + warp * FA_ROWS_PER_WARP + j;
        if (row >= rows) continue;
        for (int c = 0; c < FA_PER_LANE; c++) {
            const int d = lane + 32 * c;
            if (d < HEAD_DIM) out[(size_t)row * Q_DIM + head * HEAD_DIM + d] = acc[j][c] / l[j];
        }
    }
}
