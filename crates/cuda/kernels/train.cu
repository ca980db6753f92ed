// The classifier's softmax cross-entropy over a chunk of logits (the GEMMs around it run in
// cuBLAS), and the optimizers: AdamW on f32 parameters, SGD with momentum, and AdamW on fp32
// master weights fed 2-byte gradients, writing the rounded working copy. The AdamW update is
// the CPU's expression for expression (no fused multiply-add: the module compiles with
// --fmad=false), so the same inputs give the same bits (`adamw`, `precision::master`).

// One block per row of logits (rows, v): losses[row] = lse - logit[target]; in place,
// logits := dloss (softmax - onehot(target)).
extern "C" __global__ void softmax_xent(float* logits, float* losses, const u32* targets, u64 v, float dloss) {
    u64 row = blockIdx.x;
    float* l = logits + row * v;
    float m = NEG_INF;
    for (u64 j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, l[j]);
    m = block_max(m);
    float s = 0.0f;
    for (u64 j = threadIdx.x; j < v; j += blockDim.x) s += expf(l[j] - m);
    s = block_sum(s);
    u32 tgt = targets[row];
    float lse = m + logf(s);
    if (threadIdx.x == 0) losses[row] = lse - l[tgt];
    __syncthreads();
    for (u64 j = threadIdx.x; j < v; j += blockDim.x) {
        float p = expf(l[j] - lse);
        l[j] = dloss * (p - (j == tgt ? 1.0f : 0.0f));
    }
}

struct Adam { float beta1, beta2, eps, step_size, bc2_sqrt, decay; };

__device__ __forceinline__ void adam_update(float* p, float* m, float* v, float g, Adam k) {
    float pp = *p * k.decay;
    float mm = k.beta1 * *m + (1.0f - k.beta1) * g;
    float vv = k.beta2 * *v + (1.0f - k.beta2) * g * g;
    pp -= k.step_size * mm / (sqrtf(vv) / k.bc2_sqrt + k.eps);
    *p = pp; *m = mm; *v = vv;
}

extern "C" __global__ void adamw(float* params, const float* grads, float* m, float* v, u64 n, float beta1,
                                 float beta2, float eps, float step_size, float bc2_sqrt, float decay) {
    Adam k = {beta1, beta2, eps, step_size, bc2_sqrt, decay};
    GRID_STRIDE(i, n) adam_update(&params[i], &m[i], &v[i], grads[i], k);
}

// grads (grad_dtype: bf16 or f16) times `multiplier`; working (same format) := rounded master.
extern "C" __global__ void master_adamw(float* master, float* m, float* v, const u16* grads, u16* working,
                                        int dtype, u64 n, float multiplier, float beta1, float beta2, float eps,
                                        float step_size, float bc2_sqrt, float decay) {
    Adam k = {beta1, beta2, eps, step_size, bc2_sqrt, decay};
    GRID_STRIDE(i, n) {
        float g = load_as_f32(grads, i, dtype) * multiplier;
        adam_update(&master[i], &m[i], &v[i], g, k);
        store_from_f32(working, i, dtype, master[i]);
    }
}

// `momentum` 0: plain SGD (the buffer is not read).
extern "C" __global__ void sgd(float* params, const float* grads, float* buf, u64 n, float lr, float momentum,
                               float weight_decay) {
    GRID_STRIDE(i, n) {
        if (momentum == 0.0f) {
            params[i] -= lr * (grads[i] + weight_decay * params[i]);
        } else {
            float d = grads[i] + weight_decay * params[i];
            buf[i] = momentum * buf[i] + d;
            params[i] -= lr * buf[i];
        }
    }
}
