// LayerNorm (eps 1e-5, saving mean and rstd) and RMSNorm (saving rstd), forward and backward:
// one warp per row for the row statistics, one thread per column for the weight gradients
// (rows added in order, no atomics), as `layernorm` and `rmsnorm` in crates/kernels.

extern "C" __global__ void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                             const float* weight, const float* bias, u64 n, u64 c) {
    u64 row = blockIdx.x * (u64)(blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    const float* x = inp + row * c;
    float s = 0.0f;
    for (u64 j = lane; j < c; j += 32) s += x[j];
    float m = warp_sum(s) / (float)c;
    float v = 0.0f;
    for (u64 j = lane; j < c; j += 32) { float d = x[j] - m; v += d * d; }
    float r = 1.0f / sqrtf(warp_sum(v) / (float)c + 1e-5f);
    for (u64 j = lane; j < c; j += 32) out[row * c + j] = (x[j] - m) * r * weight[j] + bias[j];
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

extern "C" __global__ void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                                           u64 n, u64 c, float eps) {
    u64 row = blockIdx.x * (u64)(blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    const float* x = inp + row * c;
    float s = 0.0f;
    for (u64 j = lane; j < c; j += 32) s += x[j] * x[j];
    float r = 1.0f / sqrtf(warp_sum(s) / (float)c + eps);
    for (u64 j = lane; j < c; j += 32) out[row * c + j] = x[j] * r * weight[j];
    if (lane == 0) rstd[row] = r;
}

// dinp += the norm's input gradient. `mean` null: RMSNorm.
extern "C" __global__ void norm_backward_input(float* dinp, const float* dout, const float* inp,
                                               const float* weight, const float* mean, const float* rstd,
                                               u64 n, u64 c) {
    u64 row = blockIdx.x * (u64)(blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    const float* x = inp + row * c;
    const float* g = dout + row * c;
    float m = mean ? mean[row] : 0.0f, r = rstd[row];
    float a = 0.0f, b = 0.0f;
    for (u64 j = lane; j < c; j += 32) {
        float dn = weight[j] * g[j];
        a += dn;
        b += dn * (x[j] - m) * r;
    }
    a = warp_sum(a) / (float)c;
    b = warp_sum(b) / (float)c;
    if (!mean) a = 0.0f; // RMSNorm has no mean to subtract
    for (u64 j = lane; j < c; j += 32) {
        float xh = (x[j] - m) * r;
        dinp[row * c + j] += (weight[j] * g[j] - a - xh * b) * r;
    }
}

// dweight (c) += Σ_rows dout · x̂, dbias (c, may be null) += Σ_rows dout.
extern "C" __global__ void norm_backward_params(float* dweight, float* dbias, const float* dout,
                                                const float* inp, const float* mean, const float* rstd,
                                                u64 n, u64 c) {
    GRID_STRIDE(j, c) {
        float dw = 0.0f, db = 0.0f;
        for (u64 r = 0; r < n; r++) {
            float g = dout[r * c + j];
            float m = mean ? mean[r] : 0.0f;
            dw += g * (inp[r * c + j] - m) * rstd[r];
            db += g;
        }
        dweight[j] += dw;
        if (dbias) dbias[j] += db;
    }
}
