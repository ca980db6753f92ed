// Shared by every frugal kernel source (prepended by `cuda::ptx`, so no file includes another
// and NVRTC needs no CUDA headers): 2-byte float conversions that round exactly as the CPU
// backend's `half` crate (round to nearest even), index types and warp reductions.
#define NEG_INF __int_as_float(0xff800000)
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }

__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u); // NaN stays quiet NaN
    u32 lsb = (u >> 16) & 1u;
    return (u16)((u + 0x7fffu + lsb) >> 16);
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_f16(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

// 0: f32, 1: bf16, 2: f16 (the `dtype` argument of kernels that read several formats).
__device__ __forceinline__ float load_as_f32(const void* p, u64 i, int dtype) {
    if (dtype == 0) return ((const float*)p)[i];
    u16 b = ((const u16*)p)[i];
    return dtype == 1 ? bf16_to_f32(b) : f16_to_f32(b);
}

__device__ __forceinline__ void store_from_f32(void* p, u64 i, int dtype, float x) {
    if (dtype == 0) ((float*)p)[i] = x;
    else ((u16*)p)[i] = dtype == 1 ? f32_to_bf16(x) : f32_to_f16(x);
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ double warp_sum_f64(double x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// A block's sum (MAX false) or max (MAX true); blockDim.x a multiple of 32, at most 1024; every
// thread gets it.
template <bool MAX>
__device__ float block_reduce(float x) {
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = MAX ? warp_max(x) : warp_sum(x);
    __syncthreads();
    if (lane == 0) part[warp] = x;
    __syncthreads();
    if (warp == 0) {
        float y = lane < (int)(blockDim.x >> 5) ? part[lane] : (MAX ? NEG_INF : 0.0f);
        y = MAX ? warp_max(y) : warp_sum(y);
        if (lane == 0) total = y;
    }
    __syncthreads();
    return total;
}

__device__ float block_sum(float x) { return block_reduce<false>(x); }
__device__ float block_max(float x) { return block_reduce<true>(x); }

#define GRID_STRIDE(i, n) for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < (n); i += (u64)blockDim.x * gridDim.x)
