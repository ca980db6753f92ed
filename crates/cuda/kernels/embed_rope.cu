// Token (+ learned position) embedding forward and backward, and rotary embeddings in Hugging
// Face Llama's rotate_half convention (`embedding`, `rope` in crates/kernels).

// out (b·t, c) = wte[tokens] (+ wpe[row % t]); `wpe` null: none.
extern "C" __global__ void embedding_forward(float* out, const u32* tokens, const float* wte, const float* wpe,
                                             u64 rows, u64 t, u64 c) {
    GRID_STRIDE(i, rows * c) {
        u64 r = i / c, j = i % c;
        float x = wte[(u64)tokens[r] * c + j];
        if (wpe) x += wpe[(r % t) * c + j];
        out[i] = x;
    }
}

// dwte[tokens[r]] += dout[r] (atomic: repeated tokens), dwpe[r % t] += dout[r]. The one reduction
// here whose order depends on timing (as PyTorch's embedding backward on CUDA): equal within rounding,
// not bit-stable from run to run.
extern "C" __global__ void embedding_backward(float* dwte, float* dwpe, const float* dout, const u32* tokens,
                                              u64 rows, u64 t, u64 c) {
    GRID_STRIDE(i, rows * c) {
        u64 r = i / c, j = i % c;
        float g = dout[i];
        atomicAdd(&dwte[(u64)tokens[r] * c + j], g);
        if (dwpe) atomicAdd(&dwpe[(r % t) * c + j], g);
    }
}

// Rotates the first `heads` heads (hd each) of each row of `row_width` by the row's position
// (row % seq); `sign` -1 turns back (the backward, on the gradient).
extern "C" __global__ void rope(float* x, u64 rows, u64 seq, u64 heads, u64 hd, u64 row_width, float theta,
                                float sign) {
    u64 half = hd / 2;
    GRID_STRIDE(i, rows * heads * half) {
        u64 k = i % half, h = (i / half) % heads, r = i / (half * heads);
        float pos = (float)(r % seq);
        float inv_freq = 1.0f / powf(theta, (float)(2 * k) / (float)hd);
        float angle = pos * inv_freq;
        float c = cosf(angle), s = sign * sinf(angle);
        float* head = x + r * row_width + h * hd;
        float x1 = head[k], x2 = head[k + half];
        head[k] = x1 * c - x2 * s;
        head[k + half] = x2 * c + x1 * s;
    }
}
