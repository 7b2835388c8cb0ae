// The KV cache on the GPU: a layer's keys and values are two buffers of MAX_SEQ_LEN rows of
// KV_DIM values (KV: f32, or bfloat16 rounded to nearest, ties to even: `to_kv`); a step stores
// its rows at its positions, one thread per value.

extern "C" __global__ void kv_store(KV* keys, KV* values, const float* k, const float* v, int start, int rows) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * KV_DIM) return;
    keys[(size_t)start * KV_DIM + i] = to_kv(k[i]);
    values[(size_t)start * KV_DIM + i] = to_kv(v[i]);
}
