// RMS norm on the GPU: one block per row of HIDDEN_SIZE values.
//
// Each thread sums the squares of a strided share of the row; the warps reduce by shuffles,
// their sums meet in shared memory, and every thread then writes its share:
// out[i] = weight[i] * (x[i] * inv), inv = 1 / sqrt(mean + RMS_NORM_EPS), as the reference rounds it.

#define RMSNORM_THREADS 256

extern "C" __global__ void rmsnorm(float* out, const float* x, const float* weight, int rows) {
    __shared__ float partial[RMSNORM_THREADS / 32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * HIDDEN_SIZE;
    float* o = out + (size_t)row * HIDDEN_SIZE;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < HIDDEN_SIZE; i += RMSNORM_THREADS) sum += xr[i] * xr[i];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < RMSNORM_THREADS / 32; w++) total += partial[w];
    const float inv = 1.0f / sqrtf(total / (float)HIDDEN_SIZE + RMS_NORM_EPS);
    for (int i = threadIdx.x; i < HIDDEN_SIZE; i += RMSNORM_THREADS) o[i] = weight[i] * (xr[i] * inv);
}
