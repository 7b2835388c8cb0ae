// Rotary position embedding on the GPU, rotate-half layout: element i of every head pairs with
// element i + HEAD_DIM / 2, and the pair turns by the angle of the row's position (the tables
// hold its cos and sin, [positions, HEAD_DIM / 2]). One thread per pair, the queries' and the
// keys' heads of a row in one block.

#define HALF (HEAD_DIM / 2)
#define ROPE_PAIRS ((NUM_HEADS + NUM_KV_HEADS) * HALF)

extern "C" __global__ void rope(float* q, float* k, const float* cos, const float* sin, int start, int rows) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* c = cos + (size_t)(start + r) * HALF;
    const float* s = sin + (size_t)(start + r) * HALF;
    for (int pair = threadIdx.x; pair < ROPE_PAIRS; pair += blockDim.x) {
        const int head = pair / HALF;
        const int i = pair % HALF;
        float* x = head < NUM_HEADS ? q + (size_t)r * Q_DIM + head * HEAD_DIM
                                    : k + (size_t)r * KV_DIM + (head - NUM_HEADS) * HEAD_DIM;
        const float a = x[i];
        const float b = x[i + HALF];
        x[i] = a * c[i] - b * s[i];
        x[i + HALF] = b * c[i] + a * s[i];
    }
}
