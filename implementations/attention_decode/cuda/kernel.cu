// Attention of one decoded token on the GPU, split over the KV length: the positions the query
// sees (the last WINDOW of 0..len; all of them without a sliding window) are cut into spans of
// ATTENTION_SPAN, and one block of 128 threads per (span, head) scores its
// span (q · k / sqrt(HEAD_DIM), two positions a thread for the default span), takes the span's
// largest score m and the sum l of e^(score − m), and the sum of the values weighted by those
// exponentials, acc[HEAD_DIM]: (m, l, acc) go to `partials`. A second kernel, one block per
// head, combines the spans: out = Σ e^(m_s − m) acc_s / Σ e^(m_s − m) l_s, m the largest m_s.
// A query head reads key/value head `head / (NUM_HEADS / NUM_KV_HEADS)`.

#define ATT_THREADS 128
#define ATTENTION_SPAN 256
#define PARTIAL (HEAD_DIM + 2)
#define ATTENTION_SPANS ((MAX_SEQ_LEN + ATTENTION_SPAN - 1) / ATTENTION_SPAN)
// A head's share of the scratch buffer, as the interface sizes it: [MAX_SEQ_LEN + HEAD_DIM + 2].
#define HEAD_SCRATCH (MAX_SEQ_LEN + HEAD_DIM + 2)
static_assert(ATTENTION_SPANS * PARTIAL <= HEAD_SCRATCH, "a head's partials fit its scratch");

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

// partials[head][span] = (m, l, acc[HEAD_DIM]) of the span's positions.
extern "C" __global__ void attention_decode_spans(float* partials, const float* q, const KV* keys, const KV* values, int len) {
    __shared__ float scores[ATTENTION_SPAN];
    __shared__ float qs[HEAD_DIM];
    __shared__ float reduce[ATT_THREADS / 32];
    const int span = blockIdx.x;
    const int head = blockIdx.y;
    // the span's positions that the query sees: the last WINDOW ones of 0..len
    const int first = max(span * ATTENTION_SPAN, len - WINDOW);
    const int count = min((span + 1) * ATTENTION_SPAN, len) - first;
    float* partial = partials + (size_t)head * HEAD_SCRATCH + span * PARTIAL;
    if (count <= 0) {  // a span wholly before the window adds nothing: e^(−∞) · 0
        for (int d = threadIdx.x; d < HEAD_DIM; d += ATT_THREADS) partial[2 + d] = 0.0f;
        if (threadIdx.x == 0) {
            partial[0] = -__int_as_float(0x7f800000);
            partial[1] = 0.0f;
        }
        return;
    }
    const int kv_head = head / (NUM_HEADS / NUM_KV_HEADS);
    for (int d = threadIdx.x; d < HEAD_DIM; d += ATT_THREADS) qs[d] = q[head * HEAD_DIM + d];
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    float largest = -__int_as_float(0x7f800000);  // −∞
    for (int i = threadIdx.x; i < count; i += ATT_THREADS) {
        const KV* kp = keys + (size_t)(first + i) * KV_DIM + kv_head * HEAD_DIM;
        float dot = 0.0f;
        for (int d = 0; d < HEAD_DIM; d++) dot += qs[d] * widen_kv(kp[d]);
        scores[i] = dot * scale;
        largest = fmaxf(largest, scores[i]);
    }
    largest = block_max(largest, reduce);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < count; i += ATT_THREADS) {
        scores[i] = expf(scores[i] - largest);
        sum += scores[i];
    }
    sum = block_sum(sum, reduce);
    for (int d = threadIdx.x; d < HEAD_DIM; d += ATT_THREADS) {
        float acc = 0.0f;
        for (int i = 0; i < count; i++) acc += scores[i] * widen_kv(values[(size_t)(first + i) * KV_DIM + kv_head * HEAD_DIM + d]);
        partial[2 + d] = acc;
    }
    if (threadIdx.x == 0) {
        partial[0] = largest;
        partial[1] = sum;
    }
}

// out[head] from the spans' partials.
extern "C" __global__ void attention_decode_combine(float* out, const float* partials, int len) {
    const int head = blockIdx.x;
    const int spans = (len + ATTENTION_SPAN - 1) / ATTENTION_SPAN;
    const float* partial = partials + (size_t)head * HEAD_SCRATCH;
    float largest = partial[0];
    for (int s = 1; s < spans; s++) largest = fmaxf(largest, partial[s * PARTIAL]);
    float total = 0.0f;
    for (int s = 0; s < spans; s++) total += expf(partial[s * PARTIAL] - largest) * partial[s * PARTIAL + 1];
    const float inv = 1.0f / total;
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < spans; s++) acc += expf(partial[s * PARTIAL] - largest) * partial[s * PARTIAL + 2 + d];
        out[head * HEAD_DIM + d] = acc * inv;
    }
}
