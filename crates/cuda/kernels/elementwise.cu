// Element-wise kernels: fills, conversions, the residual add, scaling, accumulation into
// 2-byte gradients, bias add and bias gradient, GELU (tanh) and SwiGLU forward and backward.
// Each mirrors the CPU kernel named beside it (crates/kernels/src).

extern "C" __global__ void fill_u32(u32* x, u64 n, u32 bits) { GRID_STRIDE(i, n) x[i] = bits; }

extern "C" __global__ void fill_u16(u16* x, u64 n, u32 bits) { GRID_STRIDE(i, n) x[i] = (u16)bits; }

// dst (dst_dtype) := src (src_dtype), rounding to nearest even into a 2-byte dst (`convert`).
extern "C" __global__ void convert(void* dst, int dst_dtype, const void* src, int src_dtype, u64 n) {
    GRID_STRIDE(i, n) store_from_f32(dst, i, dst_dtype, load_as_f32(src, i, src_dtype));
}

// out += inp (`residual::accumulate`).
extern "C" __global__ void residual_add(float* out, const float* inp, u64 n) {
    GRID_STRIDE(i, n) out[i] += inp[i];
}

extern "C" __global__ void scale(float* x, u64 n, float factor) { GRID_STRIDE(i, n) x[i] *= factor; }

// acc (acc_dtype) += x (f32), rounded once into a 2-byte acc.
extern "C" __global__ void accumulate(void* acc, int acc_dtype, const void* x, int x_dtype, u64 n) {
    GRID_STRIDE(i, n) store_from_f32(acc, i, acc_dtype, load_as_f32(acc, i, acc_dtype) + load_as_f32(x, i, x_dtype));
}

// out (n, oc) += bias (oc) broadcast over rows (after a GEMM with beta 0).
extern "C" __global__ void add_bias(float* out, const float* bias, u64 n, u64 oc) {
    GRID_STRIDE(i, n * oc) out[i] += bias[i % oc];
}

// dbias (oc) += the column sums of dout (n, oc): one thread per column, rows in order.
extern "C" __global__ void bias_grad(float* dbias, const float* dout, u64 n, u64 oc) {
    GRID_STRIDE(j, oc) {
        float s = 0.0f;
        for (u64 r = 0; r < n; r++) s += dout[r * oc + j];
        dbias[j] += s;
    }
}

#define GELU_S 0.7978846f
#define GELU_K 0.044715f

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (`gelu::forward`).
extern "C" __global__ void gelu_forward(float* out, const float* inp, u64 n) {
    GRID_STRIDE(i, n) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_S * (x + GELU_K * x * x * x)));
    }
}

// dinp += gelu'(inp) dout (`gelu::backward`).
extern "C" __global__ void gelu_backward(float* dinp, const float* inp, const float* dout, u64 n) {
    GRID_STRIDE(i, n) {
        float x = inp[i];
        float u = GELU_S * (x + GELU_K * x * x * x);
        float t = tanhf(u);
        float sech2 = 1.0f - t * t;
        float du = GELU_S * (1.0f + 3.0f * GELU_K * x * x);
        dinp[i] += (0.5f * (1.0f + t) + 0.5f * x * sech2 * du) * dout[i];
    }
}

// out (n, h) = silu(gate) * up of inp (n, 2h) = gate | up (`swiglu::forward`).
extern "C" __global__ void swiglu_forward(float* out, const float* inp, u64 n, u64 h) {
    GRID_STRIDE(i, n * h) {
        u64 r = i / h, j = i % h;
        float g = inp[r * 2 * h + j], u = inp[r * 2 * h + h + j];
        float s = 1.0f / (1.0f + expf(-g));
        out[i] = g * s * u;
    }
}

// dinp (n, 2h) += the backward of `swiglu_forward` for dout (n, h).
extern "C" __global__ void swiglu_backward(float* dinp, const float* inp, const float* dout, u64 n, u64 h) {
    GRID_STRIDE(i, n * h) {
        u64 r = i / h, j = i % h;
        float g = inp[r * 2 * h + j], u = inp[r * 2 * h + h + j], d = dout[i];
        float s = 1.0f / (1.0f + expf(-g));
        dinp[r * 2 * h + j] += d * u * s * (1.0f + g * (1.0f - s));
        dinp[r * 2 * h + h + j] += d * g * s;
    }
}

// Sum of squares in f64: each block's partial into partials[blockIdx.x] (summed on the host in
// block order, so the result does not depend on timing).
extern "C" __global__ void sum_squares(double* partials, const void* x, int dtype, u64 n) {
    double s = 0.0;
    GRID_STRIDE(i, n) {
        double v = (double)load_as_f32(x, i, dtype);
        s += v * v;
    }
    __shared__ double part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    s = warp_sum_f64(s);
    if (lane == 0) part[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += part[w];
        partials[blockIdx.x] = t;
    }
}
