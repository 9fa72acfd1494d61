/*
 * cuda_device.cuh — the device-side building blocks of the kernels (each .cu that includes it compiles its
 * own copy; no device linking):
 *   load16/convert16/dequant16<T>  16 values of a weight row, for every device weight type (bytes16 /
 *                  convert16_q8: a block type's values as bytes, for the 8-bit dot products)
 *   warp_sum, warp_max, block_sum, arg_better   reductions
 *   matvec_prefetch, matvec_block<T, R>   one block's share of a decode matrix x (up to R) vectors (prologue:
 *                  input copy or fused RMSNorm, float or 8-bit blocks; products: mv_unit_float / mv_unit_q8 (dp4a);
 *                  epilogue per row: store / residual add / RoPE + KV append / SwiGLU / logits + argmax)
 *   launch         a kernel launch with or without programmatic dependent launch (host side)
 * C++ (nvcc) only; include after cuda_kernels.cuh.
 */
#ifndef KILN_CUDA_DEVICE_CUH
#define KILN_CUDA_DEVICE_CUH

#include "backend/cuda/cuda_kernels.cuh"

#include <math.h>

#include <type_traits>
#include <utility>

#define MV_THREADS 256
#define MV_WARPS (MV_THREADS / 32)

/* ------------------------------------------------------------------ programmatic dependent launch */

/* Every kernel waits for the grid before it in the stream to finish (its writes visible) before it reads
 * or writes anything shared, then lets the next grid start launching: launch latency and the weight
 * prefetch of the next kernel overlap this one's tail. No-ops before sm_90 (and without the launch
 * attribute the wait returns at once). */
static __device__ __forceinline__ void pdl_wait_then_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The two halves of pdl_wait_then_trigger, for a kernel that does independent work (its weight loads) first:
 * launch_dependents only lets the next grid start launching (its own wait still waits for this grid to
 * finish), so it may come before this grid's wait. */
static __device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

static __device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* ------------------------------------------------------------------ value decoding */

/* Signed bytes of u to floats, exactly: 0x4B0000xx is 2^23 + xx. */
static __device__ __forceinline__ void s8x4_to_f(uint32_t u, float *o) {
    u ^= 0x80808080u;
    o[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - 8388736.0f;
    o[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - 8388736.0f;
    o[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - 8388736.0f;
    o[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - 8388736.0f;
}

/* Unsigned bytes of u minus off to floats. */
static __device__ __forceinline__ void u8x4_to_f(uint32_t u, float off, float *o) {
    const float c = 8388608.0f + off;
    o[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - c;
    o[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - c;
    o[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - c;
    o[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - c;
}

static __device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* The raw bits of 16 values of a row (k0 a multiple of 16), split into load16 (every global load) and
 * convert16 (arithmetic only), so that a kernel can put many loads in flight before converting any. */
template <int T> struct raw16 {
    static constexpr int NQ = T == CK_F32 ? 4 : (T == CK_F16 || T == CK_BF16 || T == CK_Q6_K) ? 2 : 1;
    uint4 q[NQ];
    uint32_t m[T == CK_Q4_K ? 4 : 2]; /* scale words */
};

/* 16-value units a lane of a matvec keeps in flight per step (the wider types take more registers). */
template <int T> static __host__ __device__ constexpr int mv_units() {
    return T == CK_F32 ? 1 : (T == CK_F16 || T == CK_BF16 || T == CK_Q6_K) ? 2 : 4;
}

/* Loads values k0..k0+15 of row `row`; values past w.in read as 0. */
template <int T>
static __device__ __forceinline__ void load16(const dev_weight &w, int row, int k0, raw16<T> &r) {
    const uint8_t *rp = w.q + (long long)row * w.row_bytes;
    if constexpr (T == CK_F32 || T == CK_F16 || T == CK_BF16) {
        constexpr int esz = T == CK_F32 ? 4 : 2;
        if (k0 + 16 <= w.in && (w.row_bytes & 15) == 0) {
#pragma unroll
            for (int i = 0; i < raw16<T>::NQ; i++) r.q[i] = __ldg((const uint4 *)(rp + (long long)k0 * esz) + i);
        } else {
            uint32_t *wd = (uint32_t *)r.q;
#pragma unroll
            for (int i = 0; i < 4 * raw16<T>::NQ; i++) wd[i] = 0;
            if constexpr (T == CK_F32) {
#pragma unroll
                for (int i = 0; i < 16; i++)
                    if (k0 + i < w.in) wd[i] = __ldg((const uint32_t *)rp + k0 + i);
            } else {
                const unsigned short *p = (const unsigned short *)rp + k0;
#pragma unroll
                for (int i = 0; i < 16; i++)
                    if (k0 + i < w.in) wd[i >> 1] |= (uint32_t)__ldg(p + i) << (16 * (i & 1));
            }
        }
    } else if constexpr (T == CK_Q8_0) {
        r.q[0] = __ldg((const uint4 *)(rp + k0));
        r.m[0] = __ldg((const unsigned short *)w.d + (long long)row * w.d_per_row + (k0 >> 5));
    } else if constexpr (T == CK_Q4_0) {
        r.q[0] = __ldg((const uint4 *)(rp + (k0 >> 5) * 16));
        r.m[0] = __ldg((const unsigned short *)w.d + (long long)row * w.d_per_row + (k0 >> 5));
    } else if constexpr (T == CK_Q4_1 || T == CK_Q5_0 || T == CK_Q5_1) {
        /* 16 nibble bytes per 32 values; the block's metadata slot: d|m (Q4_1), d|qh (Q5_0), d|m, qh (Q5_1) */
        constexpr int SLOT = ck_layout_of(T).meta_slot / 2;
        r.q[0] = __ldg((const uint4 *)(rp + (k0 >> 5) * 16));
        const __half *md = w.d + (long long)row * w.d_per_row + (k0 >> 5) * SLOT;
        if constexpr (SLOT == 2) {
            r.m[0] = __ldg((const uint32_t *)md);
        } else {
            const uint2 u = __ldg((const uint2 *)md);
            r.m[0] = u.x, r.m[1] = u.y;
        }
    } else if constexpr (T == CK_Q4_K) {
        const uint8_t *blk = rp + (k0 >> 8) * 144;
        const int idx = k0 & 255, j = idx >> 6, sub = (idx >> 4) & 1;
#pragma unroll
        for (int i = 0; i < 4; i++) r.m[i] = __ldg((const uint32_t *)blk + i);
        r.q[0] = __ldg((const uint4 *)(blk + 16 + 32 * j + 16 * sub));
    } else if constexpr (T == CK_Q6_K) {
        const int sb = k0 >> 8;
        const uint8_t *blk = rp + sb * 208;
        const int idx = k0 & 255, h = idx >> 7, r_ = idx & 127, quad = r_ >> 5, l0 = r_ & 31;
        r.q[0] = __ldg((const uint4 *)(blk + 64 * h + l0 + ((quad & 1) ? 32 : 0)));
        r.q[1] = __ldg((const uint4 *)(blk + 128 + 32 * h + l0));
        r.m[0] = __ldg((const unsigned short *)w.d + (long long)row * w.d_per_row + sb);
        r.m[1] = (uint32_t)(int32_t)(int8_t)__ldg(blk + 192 + 8 * h + (l0 >> 4) + 2 * quad);
    }
}

/* Bytes of u minus the bytes of c, each result a signed byte (every byte of u - c in -128..127), with no borrow
 * between bytes: each byte of u | 0x80808080 is at least 0x80. */
static __device__ __forceinline__ uint32_t sub_bytes(uint32_t u, uint32_t c) { return ((u | 0x80808080u) - c) ^ 0x80808080u; }

/* The 16 values load16 fetched at k0 of a block-quantized type as 4 words of bytes in order (value i in byte
 * i % 4 of w[i / 4]): value[i] = s * (byte[i] - off) + b, the bytes unsigned (0..63) except Q8_0's, which are
 * signed with off 0. */
template <int T>
static __device__ __forceinline__ void bytes16(const raw16<T> &r, int k0, uint32_t w[4], float &s, float &b, int &off) {
    const uint32_t lq[4] = {r.q[0].x, r.q[0].y, r.q[0].z, r.q[0].w};
    const int shift = (k0 & 16) ? 4 : 0; /* the 4-bit types of 32-value blocks: low nibbles, then high */
    b = 0.0f;
    off = T == CK_Q4_0 ? 8 : T == CK_Q5_0 ? 16 : T == CK_Q6_K ? 32 : 0;
    if constexpr (T == CK_Q8_0) {
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = lq[i];
        s = h2f((uint16_t)r.m[0]);
    } else if constexpr (T == CK_Q4_0 || T == CK_Q4_1) {
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = (lq[i] >> shift) & 0x0F0F0F0Fu;
        s = h2f((uint16_t)(r.m[0] & 0xFFFF));
        if constexpr (T == CK_Q4_1) b = h2f((uint16_t)(r.m[0] >> 16));
    } else if constexpr (T == CK_Q5_0 || T == CK_Q5_1) {
        /* value i of the 16: its nibble, bit 4 from bit i (first half) or 16 + i (second half) of qh */
        const uint32_t qh = T == CK_Q5_0 ? __funnelshift_r(r.m[0], r.m[1], 16) : r.m[1];
        const uint32_t hb = qh >> (k0 & 16);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            /* 4 bits of hb to bit 0 of each byte (the shifted copies do not overlap) */
            const uint32_t h = ((((hb >> (4 * i)) & 0xFu) * 0x00204081u) & 0x01010101u) << 4;
            w[i] = ((lq[i] >> shift) & 0x0F0F0F0Fu) | h;
        }
        s = h2f((uint16_t)(r.m[0] & 0xFFFF));
        if constexpr (T == CK_Q5_1) b = h2f((uint16_t)(r.m[0] >> 16));
    } else if constexpr (T == CK_Q4_K) {
        const int idx = k0 & 255, j = idx >> 6, hi = (idx >> 5) & 1;
        const float d = h2f((uint16_t)(r.m[0] & 0xFFFF)), dmin = h2f((uint16_t)(r.m[0] >> 16));
        /* the 12 scale bytes are bytes 0..11 of m[1..3]; byte i = (m[1 + i/4] >> 8*(i%4)) & 0xFF */
        const uint32_t s0 = r.m[1], s1 = r.m[2], s2 = r.m[3];
        const int is = 2 * j + hi;
        int sc, mn;
        /* is < 4: sc = q[is] & 63, mn = q[is+4] & 63; else sc = (q[is+4] & 15) | (q[is-4] >> 6) << 4,
         * mn = (q[is+4] >> 4) | (q[is] >> 6) << 4 (with is-4 in 0..3, is in 4..7, is+4 in 8..11) */
        if (is < 4) {
            sc = (int)((s0 >> (8 * is)) & 63);
            mn = (int)((s1 >> (8 * is)) & 63);
        } else {
            const int i4 = is - 4;
            const uint32_t q8 = (s2 >> (8 * i4)) & 0xFF, qlo = (s0 >> (8 * i4)) & 0xFF, qhi = (s1 >> (8 * i4)) & 0xFF;
            sc = (int)((q8 & 15) | ((qlo >> 6) << 4));
            mn = (int)((q8 >> 4) | ((qhi >> 6) << 4));
        }
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = (lq[i] >> (4 * hi)) & 0x0F0F0F0Fu;
        s = d * (float)sc;
        b = -dmin * (float)mn;
    } else if constexpr (T == CK_Q6_K) {
        const int idx = k0 & 255, quad = (idx & 127) >> 5;
        const int ns = (quad >= 2) ? 4 : 0, hs = 2 * quad;
        const uint32_t hq[4] = {r.q[1].x, r.q[1].y, r.q[1].z, r.q[1].w};
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = ((lq[i] >> ns) & 0x0F0F0F0Fu) | (((hq[i] >> hs) & 0x03030303u) << 4);
        s = h2f((uint16_t)r.m[0]) * (float)(int32_t)r.m[1];
    }
}

/* The integer dot product of 16 signed weight bytes w and 16 input levels xq, 4 to a word each (dp4a). */
static __device__ __forceinline__ int dot16_q8(const uint32_t w[4], const int4 xq) {
    int i = __dp4a((int)w[0], xq.x, 0);
    i = __dp4a((int)w[1], xq.y, i);
    i = __dp4a((int)w[2], xq.z, i);
    return __dp4a((int)w[3], xq.w, i);
}

/* The same 16 values as signed bytes: value[i] = s * byte[i] + b (for the 8-bit dot products). */
template <int T>
static __device__ __forceinline__ void convert16_q8(const raw16<T> &r, int k0, uint32_t w[4], float &s, float &b) {
    int off;
    bytes16<T>(r, k0, w, s, b, off);
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = off ? sub_bytes(w[i], 0x01010101u * (uint32_t)off) : w[i];
}

/* value[i] = s * v[i] + b for the 16 values load16 fetched at k0. */
template <int T>
static __device__ __forceinline__ void convert16(const raw16<T> &r, int k0, float v[16], float &s, float &b) {
    if constexpr (T == CK_F32 || T == CK_F16 || T == CK_BF16) {
        s = 1.0f;
        b = 0.0f;
        const uint32_t *wd = (const uint32_t *)r.q;
#pragma unroll
        for (int j = 0; j < (T == CK_F32 ? 16 : 8); j++) {
            if constexpr (T == CK_F32) {
                v[j] = __uint_as_float(wd[j]);
            } else {
                const uint16_t lo = (uint16_t)(wd[j] & 0xFFFF), hi = (uint16_t)(wd[j] >> 16);
                v[2 * j] = T == CK_F16 ? h2f(lo) : bf2f(lo);
                v[2 * j + 1] = T == CK_F16 ? h2f(hi) : bf2f(hi);
            }
        }
    } else {
        uint32_t w[4];
        int off;
        bytes16<T>(r, k0, w, s, b, off);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (T == CK_Q8_0) s8x4_to_f(w[i], v + 4 * i);
            else u8x4_to_f(w[i], (float)off, v + 4 * i);
        }
    }
}

/* The 16 values load16 fetched at k0 as 8 half2 words (values 2i, 2i + 1 in word i), each half(s v + b) as
 * convert16's floats round to half: F16 its raw words; Q8_0 / Q4_0 (b = 0) their bytes made exact halves
 * (0x6400 | byte is 1024 + byte; minus 1024 + the offset: exact) times s in half precision, one rounding of
 * the exact product as the float path's; the other types through convert16. */
template <int T>
static __device__ __forceinline__ void half16(const raw16<T> &r, int k0, uint32_t h[8]) {
    if constexpr (T == CK_F16) {
#pragma unroll
        for (int j = 0; j < 8; j++) h[j] = ((const uint32_t *)r.q)[j];
    } else if constexpr (T == CK_Q8_0 || T == CK_Q4_0) {
        uint32_t w[4];
        float s, b;
        int off;
        bytes16<T>(r, k0, w, s, b, off);
        const __half2 sh = __float2half2_rn(s);
        const __half2 base = __float2half2_rn(1024.0f + (T == CK_Q8_0 ? 128.0f : (float)off));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t u = T == CK_Q8_0 ? w[i] ^ 0x80808080u : w[i]; /* Q8_0: the signed bytes plus 128 */
            const uint32_t lo = __byte_perm(u, 0x64646464u, 0x4140), hi = __byte_perm(u, 0x64646464u, 0x4342);
            const __half2 v0 = __hmul2(__hsub2(*(const __half2 *)&lo, base), sh);
            const __half2 v1 = __hmul2(__hsub2(*(const __half2 *)&hi, base), sh);
            h[2 * i] = *(const uint32_t *)&v0, h[2 * i + 1] = *(const uint32_t *)&v1;
        }
    } else {
        float v[16], s, b;
        convert16<T>(r, k0, v, s, b);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const __half2 v2 = __floats2half2_rn(s * v[2 * i] + b, s * v[2 * i + 1] + b);
            h[i] = *(const uint32_t *)&v2;
        }
    }
}

/* Values k0..k0+15 of row `row` (k0 a multiple of 16): value[i] = s * v[i] + b. Values past w.in are 0. */
template <int T>
static __device__ __forceinline__ void dequant16(const dev_weight &w, int row, int k0, float v[16], float &s, float &b) {
    raw16<T> r;
    load16<T>(w, row, k0, r);
    convert16<T>(r, k0, v, s, b);
}

/* ------------------------------------------------------------------ reductions */

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

/* Sum over the block (all threads get it); red holds one float per warp. */
static __device__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < nw; i++) t += red[i];
    __syncthreads();
    return t;
}

/* (value, index) order for the argmax: larger value, then lower index. */
static __device__ __forceinline__ bool arg_better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

/* The best (value, index) of the warp's lanes into every lane's (bv, bi), in arg_better's order. */
static __device__ __forceinline__ void warp_argmax(float &bv, int &bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
        if (arg_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
}

/* ------------------------------------------------------------------ decode: matrix x vector */

/* Pulls into L2 the weight rows that this warp will read for pair group pg (nothing past the last pair): at
 * most 16 KiB of its stretch of each row. The weights never depend on an earlier kernel, so this may run
 * before waiting for one. */
static __device__ __forceinline__ void matvec_prefetch(const mv_args &a, int pg) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool dual = a.pair == MV_PAIR_DUAL;
    const int out = a.w0.out, n_pairs = dual ? out : (out + 1) >> 1;
    const int ks_n = a.ksplit, ppb = MV_WARPS / ks_n, slot = warp / ks_n, ks = warp - slot * ks_n;
    const long long rb = a.w0.row_bytes, b0 = rb * ks / ks_n, b1 = rb * (ks + 1) / ks_n;
    const int p = pg * ppb + slot;
    if (p >= n_pairs) return;
    const int r0 = dual ? p : 2 * p, r1 = dual ? p : 2 * p + 1;
    const uint8_t *q0 = a.w0.q + (long long)r0 * rb, *q1 = (dual ? a.w1.q : a.w0.q) + (long long)r1 * rb;
    for (long long off = b0 + lane * 128; off < b1 && off < b0 + 16384; off += 32 * 128) {
        prefetch_l2(q0 + off);
        if (r1 < out) prefetch_l2(q1 + off);
    }
}

/* Pair groups whose weights a warp of a several-row matvec pulls into L2 ahead of the one it computes. */
#define MV_AHEAD 4

/* The number of input rows of a matvec (a.nr, read as 1 when unset), at most R. */
template <int R> static __device__ __forceinline__ int mv_rows(const mv_args &a) {
    return R == 1 ? 1 : (a.nr < 1 ? 1 : a.nr > R ? R : a.nr);
}

/* The 8-bit levels of one block of 32 input values that a group of G aligned lanes holds, N each (v, in place):
 * q = round-half-even(v * 127 / amax), exact in floats, with amax over the block, as the reference engine's
 * activation blocks have them; the group's first lane stores amax and the sum of the levels at m[0], m[1]. */
template <int N, int G>
static __device__ __forceinline__ void q8_levels(float *v, float *m) {
    const int lane = threadIdx.x & 31;
    const unsigned mask = G == 32 ? 0xFFFFFFFFu : ((1u << G) - 1) << (lane & ~(G - 1));
    float amax = 0.0f, sum = 0.0f;
#pragma unroll
    for (int i = 0; i < N; i++) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int o = 1; o < G; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(mask, amax, o));
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = rintf(v[i] * id), sum += v[i];
#pragma unroll
    for (int o = 1; o < G; o <<= 1) sum += __shfl_xor_sync(mask, sum, o);
    if ((lane & (G - 1)) == 0) m[0] = amax, m[1] = sum;
}

/* Four levels (integers in -127..127 held as floats) as the signed bytes of one word, in order. */
static __device__ __forceinline__ uint32_t pack_levels(const float *e) {
    const uint32_t lo = __byte_perm((uint32_t)(int)e[0], (uint32_t)(int)e[1], 0x0040);
    const uint32_t hi = __byte_perm((uint32_t)(int)e[2], (uint32_t)(int)e[3], 0x0040);
    return __byte_perm(lo, hi, 0x5410);
}

/* The value store of the prologue: float values transposed so that lane u of a warp reading value i of its
 * unit (16 values) hits bank (i * NUP + u) % 32 (xs[(k % 16) * NUP + k / 16] = x[k]); 8-bit levels in order as
 * bytes (4 values per word: word k / 4), read 16 bytes a unit. */
template <bool Q8> struct mv_store {
    float *xr;
    int NUP;
    __device__ __forceinline__ void four(int k, const float *e) const { /* values k..k+3, k a multiple of 4 */
        if constexpr (Q8) {
            ((uint32_t *)xr)[k >> 2] = pack_levels(e);
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) xr[((k + i) & 15) * NUP + ((k + i) >> 4)] = e[i];
        }
    }
    __device__ __forceinline__ void one(int k, float e) const {
        if constexpr (Q8) ((int8_t *)xr)[k] = (int8_t)(int)e;
        else xr[(k & 15) * NUP + (k >> 4)] = e;
    }
};

/* Prologue: the nr input rows (RMSNorm'ed or not) in shared memory, row r at xs + r * 16 * NUP as mv_store
 * lays it out (times the norm weight). With NORM, nred[r][warp] receives the warp's sum of squares of row r.
 * For a type with 8-bit inputs (ck_q8_input; in a multiple of 32) the row holds each block's levels instead
 * (q8_levels of the values before the RMSNorm factor, which does not change them but in the last bit), and
 * meta + r * 2 * NB (NB = in / 32) each block's (amax, level sum); q8_finish_scales turns them into the
 * blocks' scales. Ends with a barrier. */
template <int T, int R>
static __device__ __forceinline__ void matvec_input(const mv_args &a, int NUP, float *xs, float (*nred)[MV_WARPS],
                                                    float *meta) {
    constexpr bool Q8 = ck_q8_input(T);
    const int in = a.w0.in, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nr = mv_rows<R>(a);
    const int in_pad = (in + 15) & ~15, NB = in >> 5;
    const bool norm = a.in_mode == MV_IN_NORM;
    if (R > 1 && (in & 3) == 0 && (a.x_stride & 3) == 0 && ((uintptr_t)a.x & 15) == 0 &&
        (!norm || ((uintptr_t)a.norm_w & 15) == 0)) {
        /* several rows: the same 16-byte loads of every row in flight together (rows past nr read row nr - 1
         * and are dropped), each row's sum of squares in the order of the one-row loop below */
        const int in4 = in >> 2;
        float ss[R];
#pragma unroll
        for (int r = 0; r < R; r++) ss[r] = 0.0f;
        for (int i4 = tid; i4 < in4; i4 += MV_THREADS) {
            const float4 w = norm ? __ldg((const float4 *)a.norm_w + i4) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            float4 v[R];
#pragma unroll
            for (int r = 0; r < R; r++) v[r] = __ldcg((const float4 *)(a.x + (long long)(r < nr ? r : nr - 1) * a.x_stride) + i4);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < nr) {
                    float e[4] = {v[r].x * w.x, v[r].y * w.y, v[r].z * w.z, v[r].w * w.w};
                    if constexpr (Q8) q8_levels<4, 8>(e, meta + r * 2 * NB + 2 * (i4 >> 3));
                    mv_store<Q8>{xs + r * 16 * NUP, NUP}.four(4 * i4, e);
                }
                ss[r] += v[r].x * v[r].x + v[r].y * v[r].y + v[r].z * v[r].z + v[r].w * v[r].w;
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (norm) ss[r] = warp_sum(ss[r]);
            if (norm && lane == 0 && r < nr) nred[r][warp] = ss[r];
            const mv_store<Q8> st{xs + r * 16 * NUP, NUP};
            for (int i = in + tid; r < nr && i < in_pad; i += MV_THREADS) st.one(i, 0.0f);
        }
        __syncthreads();
        return;
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r >= nr) break;
        const float *x = a.x + (long long)r * a.x_stride;
        const mv_store<Q8> st{xs + r * 16 * NUP, NUP};
        float ss = 0.0f;
        if ((in & 3) == 0 && ((uintptr_t)x & 15) == 0 && (!norm || ((uintptr_t)a.norm_w & 15) == 0)) {
            /* 16-byte loads, up to eight per thread in flight: one round trip for inputs up to 8192 values */
            const int in4 = in >> 2;
#pragma unroll 8
            for (int i4 = tid; i4 < in4; i4 += MV_THREADS) {
                const float4 v = __ldcg((const float4 *)x + i4);
                const float4 w = norm ? __ldg((const float4 *)a.norm_w + i4) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
                float e[4] = {v.x * w.x, v.y * w.y, v.z * w.z, v.w * w.w};
                if constexpr (Q8) q8_levels<4, 8>(e, meta + r * 2 * NB + 2 * (i4 >> 3));
                st.four(4 * i4, e);
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
        } else {
#pragma unroll 4
            for (int i = tid; i < in; i += MV_THREADS) {
                const float v = __ldcg(x + i), w = norm ? __ldg(a.norm_w + i) : 1.0f;
                float e = v * w;
                if constexpr (Q8) q8_levels<1, 32>(&e, meta + r * 2 * NB + 2 * (i >> 5));
                st.one(i, e);
                ss += v * v;
            }
        }
        if (norm) { /* RMSNorm: xs holds x * w; the products are scaled once, at the end */
            ss = warp_sum(ss);
            if (lane == 0) nred[r][warp] = ss;
        }
        for (int i = in + tid; i < in_pad; i += MV_THREADS) st.one(i, 0.0f);
    }
    __syncthreads();
}

/* An 8-bit input block's d = amax / 127 rounded to half as the reference engine's activation blocks store it
 * (amax: of the values after the RMSNorm factor), and its minimum term's factor s: for Q4_1 / Q5_1 the
 * half-rounded d * (sum of its levels), as the CPU's activation blocks store it; for the other types d times
 * the sum (the reference engine's Q4_K dot product; no other type uses it). */
template <int T>
static __device__ __forceinline__ void q8_block_scales(float amax, float level_sum, float &d, float &s) {
    const float d32 = amax / 127.f;
    d = __half2float(__float2half_rn(d32));
    s = T == CK_Q4_1 || T == CK_Q5_1 ? __half2float(__float2half_rn(d32 * level_sum)) : d * level_sum;
}

/* The RMSNorm factor of row r from the warps' sums of squares (1 without NORM). */
static __device__ __forceinline__ float matvec_scale(const mv_args &a, const float *nred_r) {
    if (a.in_mode != MV_IN_NORM) return 1.0f;
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < MV_WARPS; i++) tot += nred_r[i];
    return 1.0f / sqrtf(tot / (float)a.w0.in + a.eps);
}

/* The epilogue of row r for the pair (r0, r1) (p: the pair's index; has1: r1 is a row) with its two dot
 * products d0, d1 (already scaled); y0, y1: the residual values (ADD); pos, seq: row r's position and sequence
 * (QKV); best_*: row r's running argmax. */
static __device__ __forceinline__ void matvec_epilogue(const mv_args &a, int r, int r0, int r1, int p, bool has1,
                                                       float d0, float d1, float y0, float y1, int pos, int seq,
                                                       float &best_v, int &best_i) {
    float *y = a.y + (long long)r * a.y_stride;
    switch (a.epi) {
    case MV_EPI_STORE:
        y[r0] = d0;
        if (has1) y[r1] = d1;
        break;
    case MV_EPI_ADD:
        y[r0] = y0 + d0;
        if (has1) y[r1] = y1 + d1;
        break;
    case MV_EPI_SWIGLU:
        y[p] = d0 / (1.0f + expf(-d0)) * d1;
        break;
    case MV_EPI_QKV: {
        const int gr = a.row_offset + r0;
        const long long kv_row = (long long)seq * a.seq_stride + (long long)pos * a.kv_dim;
        if (gr < a.nq + a.nk) {
            const int i = (gr < a.nq ? gr : gr - a.nq) % a.head_dim;
            if (i < a.n_rot) {
                float sn, cs;
                sincosf((float)pos * a.rope_freq[i >> 1], &sn, &cs);
                const float x0 = d0, x1 = d1;
                d0 = x0 * cs - x1 * sn;
                d1 = x0 * sn + x1 * cs;
            }
            if (gr < a.nq) {
                float *q = a.q_out + (long long)r * a.y_stride;
                q[gr] = d0;
                q[gr + 1] = d1;
            } else {
                __half *k = a.k_cache + kv_row + (gr - a.nq);
                k[0] = __float2half(d0);
                k[1] = __float2half(d1);
            }
        } else {
            __half *v = a.v_cache + kv_row + (gr - a.nq - a.nk);
            v[0] = __float2half(d0);
            v[1] = __float2half(d1);
        }
        break;
    }
    case MV_EPI_LOGITS:
        y[r0] = d0;
        if (arg_better(d0, r0, best_v, best_i)) best_v = d0, best_i = r0;
        if (has1) {
            y[r1] = d1;
            if (arg_better(d1, r1, best_v, best_i)) best_v = d1, best_i = r1;
        }
        break;
    }
}

/* LOGITS tail: each row's argmax over the block into arg_val / arg_idx[r * n_blocks + block]; the last block
 * to finish reduces the blocks' results of row r in warp r into arg_out[r] and re-arms the counter. */
template <int R>
static __device__ __forceinline__ void matvec_argmax(const mv_args &a, int block, int n_blocks, const float *best_v,
                                                     const int *best_i) {
    __shared__ float red[R][MV_WARPS];
    __shared__ int redi[R][MV_WARPS];
    __shared__ int last_block;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nr = mv_rows<R>(a);
#pragma unroll
    for (int r = 0; r < R; r++)
        if (lane == 0 && r < nr) red[r][warp] = best_v[r], redi[r][warp] = best_i[r];
    __syncthreads();
    if (tid < nr) {
        float bv = red[tid][0];
        int bi = redi[tid][0];
        for (int i = 1; i < MV_WARPS; i++)
            if (arg_better(red[tid][i], redi[tid][i], bv, bi)) bv = red[tid][i], bi = redi[tid][i];
        a.arg_val[tid * n_blocks + block] = bv;
        a.arg_idx[tid * n_blocks + block] = bi;
        __threadfence(); /* visible to the last block before the counter says this block is done */
    }
    __syncthreads();
    if (tid == 0) {
        last_block = atomicAdd(a.counter, 1u) == (unsigned)n_blocks - 1;
    }
    __syncthreads();
    if (!last_block || warp >= nr) return;
    __threadfence();
    float bv = -INFINITY;
    int bi = 0x7FFFFFFF;
    for (int i = lane; i < n_blocks; i += 32) {
        const float v = ((volatile float *)a.arg_val)[warp * n_blocks + i];
        const int id = ((volatile int *)a.arg_idx)[warp * n_blocks + i];
        if (arg_better(v, id, bv, bi)) bv = v, bi = id;
    }
    warp_argmax(bv, bi);
    if (lane == 0) {
        a.arg_out[warp] = bi == 0x7FFFFFFF ? 0 : bi;
        if (warp == 0) *a.counter = 0;
    }
}

/* Q8: each block's (amax, level sum) of each row in meta (pairs, row r's NB at meta + 2 * r * NB) becomes its
 * (d, s) (q8_block_scales, with the row's RMSNorm factor in d). Ends with a barrier. */
template <int T, int R>
static __device__ __forceinline__ void q8_finish_scales(const mv_args &a, float *meta, float (*nred)[MV_WARPS]) {
    const int NB = a.w0.in >> 5, nr = mv_rows<R>(a);
    for (int i = threadIdx.x; i < nr * NB; i += MV_THREADS) {
        const int r = i / NB;
        float2 *m = (float2 *)meta + i;
        float d, s;
        q8_block_scales<T>(m->x * matvec_scale(a, nred[r]), m->y, d, s);
        *m = make_float2(d, s);
    }
    __syncthreads();
}

/* Unit uc (16 values) of two weight rows (raw ra, rb) against every input row (rows past nr: row nr - 1's,
 * dropped by the caller): c0[r], c1[r] their dot products with input row r, float inputs (transposed in xs). */
template <int T, int R>
static __device__ __forceinline__ void mv_unit_float(const raw16<T> &ra, const raw16<T> &rb, int uc, const float *xs,
                                                     int NUP, int nr, float *c0, float *c1) {
    float v0[16], v1[16], s0, b0, s1, b1;
    convert16<T>(ra, 16 * uc, v0, s0, b0);
    convert16<T>(rb, 16 * uc, v1, s1, b1);
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float *xp = xs + (r < nr ? r : nr - 1) * 16 * NUP + uc; /* value i at xp[i * NUP] */
        float d0 = 0.0f, d1 = 0.0f, sx = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const float xv = xp[i * NUP];
            d0 = fmaf(v0[i], xv, d0);
            d1 = fmaf(v1[i], xv, d1);
            if constexpr (ck_has_min(T)) sx += xv;
        }
        c0[r] = s0 * d0, c1[r] = s1 * d1;
        if constexpr (ck_has_min(T)) c0[r] += b0 * sx, c1[r] += b1 * sx;
    }
}

/* The same with 8-bit inputs (their bytes in order in xs, 16 a unit; block (d, s) pairs in meta): integer dot
 * products of the signed weight bytes (dp4a), scaled by the weight's and the input block's scales; a type with
 * a minimum adds it once per 32-value block, with the block's first unit. */
template <int T, int R>
static __device__ __forceinline__ void mv_unit_q8(const raw16<T> &ra, const raw16<T> &rb, int uc, const float *xs,
                                                  int NUP, const float *meta, int NB, int nr, float *c0, float *c1) {
    uint32_t w0[4], w1[4];
    float s0, b0, s1, b1;
    convert16_q8<T>(ra, 16 * uc, w0, s0, b0);
    convert16_q8<T>(rb, 16 * uc, w1, s1, b1);
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int rr = r < nr ? r : nr - 1;
        const int4 xq = ((const int4 *)(xs + rr * 16 * NUP))[uc];
        const float2 ds = ((const float2 *)meta)[rr * NB + (uc >> 1)];
        const int i0 = dot16_q8(w0, xq), i1 = dot16_q8(w1, xq);
        const float sm = (uc & 1) ? 0.0f : ds.y;
        c0[r] = fmaf(s0 * ds.x, (float)i0, ck_has_min(T) ? b0 * sm : 0.0f);
        c1[r] = fmaf(s1 * ds.x, (float)i1, ck_has_min(T) ? b1 * sm : 0.0f);
    }
}

/* One block's share of a decode matrix x nr vectors (nr = a.nr <= R) over `n_blocks` blocks (this is block
 * `block`): the weights' first rows are prefetched before the previous kernel is waited for (PDL; several
 * rows also load their first step and let the next kernel launch before that wait), the prologue
 * builds the inputs in xs (dynamic shared memory of ck_matvec_smem_rows(in, nr) bytes); then the block's
 * pairs of rows, every weight value loaded once and applied to all nr inputs, and the epilogue of a.epi per
 * input row. Every thread of the block (MV_THREADS) calls it. Row r's arithmetic is the same whatever nr and
 * R are, so its results are bit-identical to a 1-row call on that row. Activations are read with
 * L2-coherent loads (the previous kernel in the stream wrote them). */
template <int T, int R>
static __device__ __forceinline__ void matvec_block(const mv_args &a, int block, int n_blocks, float *xs) {
    __shared__ float kpart[MV_WARPS][2 * R];
    __shared__ float nred[R][MV_WARPS];
    const int in = a.w0.in, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nr = mv_rows<R>(a);
    const int in_pad = (in + 15) & ~15, NU = in_pad >> 4, NUP = NU | 1; /* odd stride: no bank conflicts */
    const bool dual = a.pair == MV_PAIR_DUAL;
    const int out = a.w0.out;
    const int n_pairs = dual ? out : (out + 1) >> 1;
    /* ksplit warps share a pair, each over its own stretch of units [ub, ue); a block holds ppb pairs */
    const int ks_n = a.ksplit, ppb = MV_WARPS / ks_n, slot = warp / ks_n, ks = warp - slot * ks_n;
    const int ub = (int)((long long)NU * ks / ks_n), ue = (int)((long long)NU * (ks + 1) / ks_n);
    /* the second row's matrix: w1 (same type and shape) in dual mode, else w0; built from scalars so that
     * the selection stays in registers */
    dev_weight w1 = a.w0;
    w1.q = dual ? a.w1.q : a.w0.q;
    w1.d = dual ? a.w1.d : a.w0.d;
    /* UN units per lane per step, every load unconditional (rows and units clamped to valid ones, their
     * results dropped) so that all of a step's loads are in flight together */
    constexpr int UN = mv_units<T>();
    /* the rows of pair group pg for this warp: p clamped to a valid pair (`valid` says whether it is one),
     * r1c: r1 clamped to a valid row */
#define MV_ROWS_OF(pg)                                              \
    const bool valid = (pg) * ppb + slot < n_pairs;                 \
    const int p = valid ? (pg) * ppb + slot : n_pairs - 1;          \
    const int r0 = dual ? p : 2 * p, r1 = dual ? p : 2 * p + 1;     \
    const int r1c = r1 < out ? r1 : r0;
    /* one step's loads: units u0, u0 + 32, ... of rows r0 (w0) and r1c (w1) */
#define MV_LOAD_STEP(u0, ra, rb)                                    \
    _Pragma("unroll") for (int k = 0; k < UN; k++) {               \
        const int u = (u0) + 32 * k, uc = u < ue ? u : (u0);        \
        load16<T>(a.w0, r0, 16 * uc, ra[k]);                        \
        load16<T>(w1, r1c, 16 * uc, rb[k]);                         \
    }

    /* The weights do not depend on the previous kernel, so their first pair group is pulled into L2 before
     * waiting for it. One row stops there (main's order): loading the first step into registers before the
     * wait, with L2 prefetches MV_AHEAD groups ahead and the next kernel let launch first, measured 7-8% slower
     * decode on llama-3.2-1b (bench/RESULTS.md). Several rows (measured correct that way) do all of it. */
    constexpr bool EARLY = R > 1;
    for (int i = 0; i < (EARLY ? MV_AHEAD : 1); i++) matvec_prefetch(a, block + i * n_blocks);
    raw16<T> ra[UN], rb[UN];
    if constexpr (EARLY) {
        pdl_trigger();
        MV_ROWS_OF(block)
        (void)valid;
        if (ub + lane < ue) MV_LOAD_STEP(ub + lane, ra, rb)
        pdl_wait();
    } else {
        pdl_wait_then_trigger();
    }
    constexpr bool Q8 = ck_q8_input(T);
    const int NB = in >> 5;
    float *meta = xs + nr * 16 * NUP; /* Q8: the blocks' (amax, level sum), then (d, s) (matvec_input) */
    matvec_input<T, R>(a, NUP, xs, nred, meta);
    if constexpr (Q8) q8_finish_scales<T, R>(a, meta, nred);
    bool first = EARLY; /* the step in ra, rb is the first one */

    float best_v[R];
    int best_i[R];
#pragma unroll
    for (int r = 0; r < R; r++) best_v[r] = -INFINITY, best_i[r] = 0x7FFFFFFF;

    for (int pg = block; pg * ppb < n_pairs; pg += n_blocks) { /* the same trip count in every warp */
        MV_ROWS_OF(pg)
        if (EARLY) matvec_prefetch(a, pg + MV_AHEAD * n_blocks);
        const bool has1 = r1 < out;
        const bool lead = valid && ks == 0 && lane == 0; /* the thread that finishes this pair */
        float acc0[R], acc1[R], y0[R], y1[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            acc0[r] = acc1[r] = y0[r] = y1[r] = 0.0f;
            if (a.epi == MV_EPI_ADD && lead && r < nr) { /* the residual rows, fetched while the weights stream */
                y0[r] = __ldcg(a.y + (long long)r * a.y_stride + r0);
                if (has1) y1[r] = __ldcg(a.y + (long long)r * a.y_stride + r1);
            }
        }
        /* one step: the dot products of units u0, u0 + 32, ... (loaded into ra, rb) with every input row,
         * added to acc0[r], acc1[r] */
#define MV_DOT_STEP(u0, ra, rb, TAIL)                                           \
    _Pragma("unroll") for (int k = 0; k < UN; k++) {                           \
        const int u = (u0) + 32 * k;                                            \
        const bool ok = u < ue;                                                 \
        if (TAIL && !ok) break; /* this lane's later units too (loads made) */  \
        const int uc = ok ? u : (u0);                                           \
        float c0[R], c1[R];                                                     \
        if constexpr (Q8) mv_unit_q8<T, R>(ra[k], rb[k], uc, xs, NUP, meta, NB, nr, c0, c1); \
        else mv_unit_float<T, R>(ra[k], rb[k], uc, xs, NUP, nr, c0, c1);       \
        _Pragma("unroll") for (int r = 0; r < R; r++) {                        \
            acc0[r] += ok ? c0[r] : 0.0f;                                       \
            acc1[r] += ok ? c1[r] : 0.0f;                                       \
        }                                                                       \
    }
        for (int u0 = ub + lane; u0 < ue; u0 += 32 * UN) {
            if (!first) MV_LOAD_STEP(u0, ra, rb)
            first = false;
            /* a step where every lane has all UN units runs without branches (the units' arithmetic
             * interleaves); the last, partial one stops each lane at its last unit (small matrices: most of
             * a step's units are past the stretch) */
            if (u0 - lane + 32 * UN <= ue) {
                MV_DOT_STEP(u0, ra, rb, false)
            } else {
                MV_DOT_STEP(u0, ra, rb, true)
            }
        }
#undef MV_DOT_STEP
#pragma unroll
        for (int r = 0; r < R; r++) { /* every row without a branch, so that the rows' shuffles interleave */
            acc0[r] = warp_sum(acc0[r]);
            acc1[r] = warp_sum(acc1[r]);
        }
        if (ks_n > 1) { /* the pair's warps add their stretches */
#pragma unroll
            for (int r = 0; r < R; r++)
                if (lane == 0 && r < nr) kpart[warp][2 * r] = acc0[r], kpart[warp][2 * r + 1] = acc1[r];
            __syncthreads();
            if (lead)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (r >= nr) break;
                    for (int k = 1; k < ks_n; k++) acc0[r] += kpart[warp + k][2 * r], acc1[r] += kpart[warp + k][2 * r + 1];
                }
            __syncthreads();
        }
        if (!lead) continue;
        int pos[R], seq[R]; /* QKV: every row's position and sequence, loaded together */
#pragma unroll
        for (int r = 0; r < R; r++) {
            const bool qkv = a.epi == MV_EPI_QKV && r < nr;
            pos[r] = qkv ? a.pos[r] : 0;
            seq[r] = qkv && a.seq ? a.seq[r] : 0;
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r >= nr) break;
            const float scale = Q8 ? 1.0f : matvec_scale(a, nred[r]); /* Q8: in the blocks' scales */
            matvec_epilogue(a, r, r0, r1, p, has1, acc0[r] * scale, acc1[r] * scale, y0[r], y1[r], pos[r], seq[r],
                            best_v[r], best_i[r]);
        }
    }
#undef MV_ROWS_OF
#undef MV_LOAD_STEP
    if (a.epi == MV_EPI_LOGITS) matvec_argmax<R>(a, block, n_blocks, best_v, best_i);
}

/* ------------------------------------------------------------------ host: launches */

/* Launches k, with the programmatic-serialization attribute when pdl. */
template <typename... KArgs, typename... Args>
static void launch_pdl(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, bool pdl,
                       Args &&...args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    cudaLaunchKernelEx(&cfg, k, std::forward<Args>(args)...);
}

/* f(std::integral_constant<int, T>{}) for the CK_* type T equal to `type` (nothing for a type without kernels):
 * a kernel template instantiated for the type a weight has at run time. */
template <class F> static void ck_with_type(int type, F &&f) {
    switch (type) {
#define CK_WITH_CASE(T) case T: f(std::integral_constant<int, T>{}); break;
        CK_TYPES(CK_WITH_CASE)
#undef CK_WITH_CASE
    default: break;
    }
}

/* Launches k with the programmatic-serialization attribute when PDL is on for this thread (ck_set_pdl) and
 * `pdl` for this launch. */
template <typename... KArgs, typename... Args>
static void launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, bool pdl,
                   Args &&...args) {
    launch_pdl(k, grid, block, smem, st, ck_pdl_on() && pdl, std::forward<Args>(args)...);
}

#endif
