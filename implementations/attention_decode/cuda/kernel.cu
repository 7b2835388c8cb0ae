// Causal attention of one decoded token on the GPU, over one layer's cache. One block per (query row,
// head): the block's threads score the positions the row sees (q · k / sqrt(HEAD_DIM), a
// strided share each) into shared memory, find the largest score and the sum of exponentials
// by block reductions, and each thread then sums its share of the output's HEAD_DIM values
// over the positions. A query head reads key/value head `head / (NUM_HEADS / NUM_KV_HEADS)`.

#define ATT_THREADS 128

__device__ float block_max(float value, float* shared) {
    for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = value;
    __syncthreads();
    float out = shared[0];
    for (int w = 1; w < ATT_THREADS / 32; w++) out = fmaxf(out, shared[w]);
    __syncthreads();
    return out;
}

__device__ float block_sum(float value, float* shared) {
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = value;
    __syncthreads();
    float out = 0.0f;
    for (int w = 0; w < ATT_THREADS / 32; w++) out += shared[w];
    __syncthreads();
    return out;
}

extern "C" __global__ void attention_decode(float* out, const float* q, const KV* keys, const KV* values, int len_) {
    __shared__ float scores[MAX_SEQ_LEN];
    __shared__ float reduce[ATT_THREADS / 32];
    const int r = blockIdx.x;
    const int head = blockIdx.y;
    const int len = len_;
    const int kv_head = head / (NUM_HEADS / NUM_KV_HEADS);
    const float* qh = q + (size_t)r * Q_DIM + head * HEAD_DIM;
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    float largest = -__int_as_float(0x7f800000);  // −∞
    for (int p = threadIdx.x; p < len; p += ATT_THREADS) {
        const KV* kp = keys + (size_t)p * KV_DIM + kv_head * HEAD_DIM;
        float dot = 0.0f;
        for (int d = 0; d < HEAD_DIM; d++) dot += qh[d] * kp[d];
        scores[p] = dot * scale;
        largest = fmaxf(largest, scores[p]);
    }
    largest = block_max(largest, reduce);
    float sum = 0.0f;
    for (int p = threadIdx.x; p < len; p += ATT_THREADS) {
        scores[p] = expf(scores[p] - largest);
        sum += scores[p];
    }
    sum = block_sum(sum, reduce);
    const float inv = 1.0f / sum;
    float* oh = out + (size_t)r * Q_DIM + head * HEAD_DIM;
    for (int d = threadIdx.x; d < HEAD_DIM; d += ATT_THREADS) {
        float acc = 0.0f;
        for (int p = 0; p < len; p++) acc += scores[p] * values[(size_t)p * KV_DIM + kv_head * HEAD_DIM + d];
        oh[d] = acc * inv;
    }
}
