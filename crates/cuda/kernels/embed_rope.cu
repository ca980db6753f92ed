// Token (+ learned position) embedding forward and backward, and rotary embeddings in Hugging
// Face Llama's rotate_half convention (`embedding`, `rope` in crates/kernels).

// out (b·t, c) = wte[tokens] (+ wpe[row % t]); `wpe` null: none.
// `dtype` the tables' format: f32, or the 2-byte working copy widened (bf16 head).
extern "C" __global__ void embedding_forward(float* out, const u32* tokens, const void* wte, const void* wpe,
                                             int dtype, u64 rows, u64 t, u64 c) {
    GRID_STRIDE(i, rows * c) {
        u64 r = i / c, j = i % c;
        float x = load_as_f32(wte, (u64)tokens[r] * c + j, dtype);
        if (wpe) x += load_as_f32(wpe, (r % t) * c + j, dtype);
        out[i] = x;
    }
}

// The 2-byte token table's gradient written directly (`kernels::embedding::backward_bf16`): one
// block per position r; the block of a token's first position sums that token's rows of dout in
// position order in f32 and adds the sum to the bf16 row with one rounding (the others return).
// Deterministic, no atomics: O(rows) token compares per block.
extern "C" __global__ void embedding_backward_bf16(u16* dwte, const float* dout, const u32* tokens, u64 rows,
                                                   u64 c) {
    u64 r = blockIdx.x;
    if (r >= rows) return;
    u32 tok = tokens[r];
    int earlier = 0;
    for (u64 q = threadIdx.x; q < r; q += blockDim.x) earlier |= tokens[q] == tok;
    if (__syncthreads_or(earlier)) return;
    for (u64 j = threadIdx.x; j < c; j += blockDim.x) {
        float s = 0.0f;
        for (u64 q = r; q < rows; q++)
            if (tokens[q] == tok) s += dout[q * c + j];
        u64 at = (u64)tok * c + j;
        dwte[at] = f32_to_bf16(bf16_to_f32(dwte[at]) + s);
    }
}

// The 2-byte position table's gradient: dwpe[p] takes the sum over the batch of dout rows at
// position p (batch order, f32) with one rounding.
extern "C" __global__ void position_backward_bf16(u16* dwpe, const float* dout, u64 rows, u64 t, u64 c) {
    GRID_STRIDE(i, t * c) {
        u64 p = i / c, j = i % c;
        float s = 0.0f;
        for (u64 r = p; r < rows; r += t) s += dout[r * c + j];
        dwpe[i] = f32_to_bf16(bf16_to_f32(dwpe[i]) + s);
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
