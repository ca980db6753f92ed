// Causal GQA flash attention over fused q|k|v rows (N, (NH + 2 NKV) HD), keeping only the
// log-sum-exp (B, NH, T): one warp per (batch, head, query position), an online softmax over
// the keys the query sees (a sliding window skips keys before t + 1 - window), each lane holding
// head elements lane, lane + 32, ... (HD <= 256). The backward recomputes each probability from
// the LSE, in two passes with one writer per gradient row. Same formulas as `flash` in crates/kernels.

#define MAXD 8

struct Shape { u64 b, t, nh, nkv, hd, window; };

// The query row a warp handles: its batch, head and position, its kv head, the packed row
// width, its batch's first qkv row and its q head. False for a warp past the last row.
struct QueryRow { u64 bb, h, i, g, width; const float* base; const float* q; };

__device__ __forceinline__ bool query_row(Shape s, const float* qkv, QueryRow* r) {
    u64 w = blockIdx.x * (u64)(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (w >= s.b * s.nh * s.t) return false;
    r->i = w % s.t; r->h = (w / s.t) % s.nh; r->bb = w / (s.t * s.nh);
    r->width = (s.nh + 2 * s.nkv) * s.hd;
    r->g = r->h / (s.nh / s.nkv);
    r->base = qkv + r->bb * s.t * r->width;
    r->q = r->base + r->i * r->width + r->h * s.hd;
    return true;
}

extern "C" __global__ void flash_forward(float* out, float* lse, const float* qkv, u64 b, u64 t, u64 nh,
                                         u64 nkv, u64 hd, u64 window) {
    QueryRow r;
    if (!query_row(Shape{b, t, nh, nkv, hd, window}, qkv, &r)) return;
    u64 bb = r.bb, h = r.h, i = r.i, g = r.g, width = r.width;
    const float *base = r.base, *q = r.q;
    int lane = threadIdx.x & 31;
    float scale = 1.0f / sqrtf((float)hd);
    float qr[MAXD], o[MAXD];
    for (int k = 0; k < MAXD; k++) {
        u64 d = lane + 32 * k;
        qr[k] = d < hd ? q[d] : 0.0f;
        o[k] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    u64 start = window > i ? 0 : i + 1 - window;
    for (u64 j = start; j <= i; j++) {
        const float* kr = base + j * width + (nh + g) * hd;
        const float* vr = base + j * width + (nh + nkv + g) * hd;
        float dot = 0.0f;
        for (int k = 0; k < MAXD; k++) { u64 d = lane + 32 * k; if (d < hd) dot += qr[k] * kr[d]; }
        float sc = scale * warp_sum(dot);
        float mn = fmaxf(m, sc);
        float corr = expf(m - mn), p = expf(sc - mn);
        l = l * corr + p;
        for (int k = 0; k < MAXD; k++) { u64 d = lane + 32 * k; if (d < hd) o[k] = o[k] * corr + p * vr[d]; }
        m = mn;
    }
    float* orow = out + (bb * t + i) * nh * hd + h * hd;
    for (int k = 0; k < MAXD; k++) { u64 d = lane + 32 * k; if (d < hd) orow[d] = o[k] / l; }
    if (lane == 0) lse[(bb * nh + h) * t + i] = m + logf(l);
}

// The backward of `flash_forward` for dout (N, NH HD), in two kernels with one writer per
// gradient row (no atomics, so the sums do not depend on timing): dQ with one warp per
// (batch, head, query) over the keys it saw, dK and dV with one warp per (batch, kv head, key)
// over the queries of every head of its group that saw it. Both recompute p = exp(s − lse) and
// D = rowsum(dO ∘ O).
extern "C" __global__ void flash_backward_dq(float* dqkv, const float* dout, const float* out, const float* lse,
                                             const float* qkv, u64 b, u64 t, u64 nh, u64 nkv, u64 hd, u64 window) {
    QueryRow r;
    if (!query_row(Shape{b, t, nh, nkv, hd, window}, qkv, &r)) return;
    u64 bb = r.bb, h = r.h, i = r.i, g = r.g, width = r.width;
    const float *base = r.base, *q = r.q;
    int lane = threadIdx.x & 31;
    const float* go = dout + (bb * t + i) * nh * hd + h * hd;
    const float* orow = out + (bb * t + i) * nh * hd + h * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float qr[MAXD], gr[MAXD], dq[MAXD];
    float dd = 0.0f;
    for (int k = 0; k < MAXD; k++) {
        u64 d = lane + 32 * k;
        qr[k] = d < hd ? q[d] : 0.0f;
        gr[k] = d < hd ? go[d] : 0.0f;
        dq[k] = 0.0f;
        if (d < hd) dd += gr[k] * orow[d];
    }
    float D = warp_sum(dd);
    float L = lse[(bb * nh + h) * t + i];
    u64 start = window > i ? 0 : i + 1 - window;
    for (u64 j = start; j <= i; j++) {
        const float* kr = base + j * width + (nh + g) * hd;
        const float* vr = base + j * width + (nh + nkv + g) * hd;
        float dot = 0.0f, dpv = 0.0f;
        for (int k = 0; k < MAXD; k++) {
            u64 d = lane + 32 * k;
            if (d < hd) { dot += qr[k] * kr[d]; dpv += gr[k] * vr[d]; }
        }
        float p = expf(scale * warp_sum(dot) - L);
        float ds = scale * p * (warp_sum(dpv) - D);
        for (int k = 0; k < MAXD; k++) { u64 d = lane + 32 * k; if (d < hd) dq[k] += ds * kr[d]; }
    }
    float* dqr = dqkv + bb * t * width + i * width + h * hd;
    for (int k = 0; k < MAXD; k++) { u64 d = lane + 32 * k; if (d < hd) dqr[d] += dq[k]; }
}

extern "C" __global__ void flash_backward_dkv(float* dqkv, const float* dout, const float* out, const float* lse,
                                              const float* qkv, u64 b, u64 t, u64 nh, u64 nkv, u64 hd, u64 window) {
    u64 w = blockIdx.x * (u64)(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (w >= b * nkv * t) return;
    u64 j = w % t, g = (w / t) % nkv, bb = w / (t * nkv);
    int lane = threadIdx.x & 31;
    u64 width = (nh + 2 * nkv) * hd, group = nh / nkv;
    const float* base = qkv + bb * t * width;
    const float* kr = base + j * width + (nh + g) * hd;
    const float* vr = base + j * width + (nh + nkv + g) * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float kk[MAXD], vv[MAXD], dk[MAXD], dv[MAXD];
    for (int k = 0; k < MAXD; k++) {
        u64 d = lane + 32 * k;
        kk[k] = d < hd ? kr[d] : 0.0f;
        vv[k] = d < hd ? vr[d] : 0.0f;
        dk[k] = 0.0f;
        dv[k] = 0.0f;
    }
    // Queries i >= j that see key j: i < j + window.
    u64 end = window >= t - j ? t : j + window;
    for (u64 i = j; i < end; i++) {
        for (u64 h = g * group; h < (g + 1) * group; h++) {
            const float* q = base + i * width + h * hd;
            const float* go = dout + (bb * t + i) * nh * hd + h * hd;
            const float* orow = out + (bb * t + i) * nh * hd + h * hd;
            float dot = 0.0f, dpv = 0.0f, dd = 0.0f;
            for (int k = 0; k < MAXD; k++) {
                u64 d = lane + 32 * k;
                if (d < hd) { dot += q[d] * kk[k]; dpv += go[d] * vv[k]; dd += go[d] * orow[d]; }
            }
            float p = expf(scale * warp_sum(dot) - lse[(bb * nh + h) * t + i]);
            float ds = scale * p * (warp_sum(dpv) - warp_sum(dd));
            for (int k = 0; k < MAXD; k++) {
                u64 d = lane + 32 * k;
                if (d < hd) { dk[k] += ds * q[d]; dv[k] += p * go[d]; }
            }
        }
    }
    float* dkr = dqkv + bb * t * width + j * width + (nh + g) * hd;
    float* dvr = dqkv + bb * t * width + j * width + (nh + nkv + g) * hd;
    for (int k = 0; k < MAXD; k++) {
        u64 d = lane + 32 * k;
        if (d < hd) { dkr[d] += dk[k]; dvr[d] += dv[k]; }
    }
}
