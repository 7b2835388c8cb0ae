// x[r] += bias, rows of `dim` values (q/k/v projections' biases), one thread per value.
extern "C" __global__ void add_bias(float* x, const float* bias, int rows, int dim) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * dim) x[i] += bias[i % dim];
}
