/*
 * cuda_kernels.cu — every kernel of the CUDA backend and its host launcher:
 *   dequant16<T>   16 values of a weight row, for every device weight type (see cuda_kernels.cuh)
 *   k_matvec<T>    decode matrix x vector; its prologue builds the input (copy or fused RMSNorm), its epilogue stores / adds to the residual / applies RoPE
 *                  and appends K,V to the cache / applies SwiGLU / writes logits and the argmax
 *   k_attention    attention over the F16 KV cache, split across blocks with the last block of each KV
 *                  head combining the splits (decode), or whole (prefill)
 *   k_gemm<T>      prefill matrix x matrix on tensor cores (WMMA, F16 in, F32 accumulate)
 *   k_embed<T>, k_rmsnorm_rows, k_rope_store, k_swiglu_*, k_repack   the small pieces
 */
#include "backend/cuda/cuda_kernels.cuh"

#include <cuda_bf16.h>
#include <math.h>
#include <mma.h>
#include <string.h>

#include <utility>

using namespace nvcuda;

#define MV_THREADS 256
#define MV_WARPS (MV_THREADS / 32)
#define ATT_THREADS 64
#define ATT_MAX_G CK_ATT_MAX_G
#define ATT_MAX_D CK_ATT_MAX_D /* head_dim <= 256 */

/* ------------------------------------------------------------------ programmatic dependent launch */

/* Every kernel waits for the grid before it in the stream to finish (its writes visible) before it reads
 * or writes anything shared, then lets the next grid start launching: launch latency and the weight
 * prefetch of the next kernel overlap this one's tail. No-ops before sm_90 (and without the launch
 * attribute the wait returns at once). */
__device__ __forceinline__ void pdl_wait_then_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* ------------------------------------------------------------------ value decoding */

/* Signed bytes of u to floats, exactly: 0x4B0000xx is 2^23 + xx. */
__device__ __forceinline__ void s8x4_to_f(uint32_t u, float *o) {
    u ^= 0x80808080u;
    o[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - 8388736.0f;
    o[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - 8388736.0f;
    o[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - 8388736.0f;
    o[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - 8388736.0f;
}

/* Unsigned bytes of u minus off to floats. */
__device__ __forceinline__ void u8x4_to_f(uint32_t u, float off, float *o) {
    const float c = 8388608.0f + off;
    o[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - c;
    o[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - c;
    o[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - c;
    o[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - c;
}

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* The raw bits of 16 values of a row (k0 a multiple of 16), split into load16 (every global load) and
 * convert16 (arithmetic only), so that a kernel can put many loads in flight before converting any. */
template <int T> struct raw16 {
    static constexpr int NQ = T == CK_F32 ? 4 : (T == CK_F16 || T == CK_BF16 || T == CK_Q6_K) ? 2 : 1;
    uint4 q[NQ];
    uint32_t m[T == CK_Q4_K ? 4 : 2]; /* scale words */
};

/* Loads values k0..k0+15 of row `row`; values past w.in read as 0. */
template <int T>
__device__ __forceinline__ void load16(const dev_weight &w, int row, int k0, raw16<T> &r) {
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

/* value[i] = s * v[i] + b for the 16 values load16 fetched at k0. */
template <int T>
__device__ __forceinline__ void convert16(const raw16<T> &r, int k0, float v[16], float &s, float &b) {
    s = 1.0f;
    b = 0.0f;
    if constexpr (T == CK_F32) {
        const uint32_t *wd = (const uint32_t *)r.q;
#pragma unroll
        for (int i = 0; i < 16; i++) v[i] = __uint_as_float(wd[i]);
    } else if constexpr (T == CK_F16 || T == CK_BF16) {
        const uint32_t *wd = (const uint32_t *)r.q;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint16_t lo = (uint16_t)(wd[j] & 0xFFFF), hi = (uint16_t)(wd[j] >> 16);
            v[2 * j] = T == CK_F16 ? h2f(lo) : bf2f(lo);
            v[2 * j + 1] = T == CK_F16 ? h2f(hi) : bf2f(hi);
        }
    } else if constexpr (T == CK_Q8_0) {
        s8x4_to_f(r.q[0].x, v), s8x4_to_f(r.q[0].y, v + 4), s8x4_to_f(r.q[0].z, v + 8), s8x4_to_f(r.q[0].w, v + 12);
        s = h2f((uint16_t)r.m[0]);
    } else if constexpr (T == CK_Q4_0) {
        const int shift = (k0 & 16) ? 4 : 0;
        const uint4 u = r.q[0];
        u8x4_to_f((u.x >> shift) & 0x0F0F0F0Fu, 8.0f, v), u8x4_to_f((u.y >> shift) & 0x0F0F0F0Fu, 8.0f, v + 4);
        u8x4_to_f((u.z >> shift) & 0x0F0F0F0Fu, 8.0f, v + 8), u8x4_to_f((u.w >> shift) & 0x0F0F0F0Fu, 8.0f, v + 12);
        s = h2f((uint16_t)r.m[0]);
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
        const int shift = 4 * hi;
        const uint4 u = r.q[0];
        u8x4_to_f((u.x >> shift) & 0x0F0F0F0Fu, 0.0f, v), u8x4_to_f((u.y >> shift) & 0x0F0F0F0Fu, 0.0f, v + 4);
        u8x4_to_f((u.z >> shift) & 0x0F0F0F0Fu, 0.0f, v + 8), u8x4_to_f((u.w >> shift) & 0x0F0F0F0Fu, 0.0f, v + 12);
        s = d * (float)sc;
        b = -dmin * (float)mn;
    } else if constexpr (T == CK_Q6_K) {
        const int idx = k0 & 255, quad = (idx & 127) >> 5;
        const int ns = (quad >= 2) ? 4 : 0, hs = 2 * quad;
        const uint32_t lq[4] = {r.q[0].x, r.q[0].y, r.q[0].z, r.q[0].w}, hq[4] = {r.q[1].x, r.q[1].y, r.q[1].z, r.q[1].w};
#pragma unroll
        for (int i = 0; i < 4; i++)
            u8x4_to_f(((lq[i] >> ns) & 0x0F0F0F0Fu) | (((hq[i] >> hs) & 0x03030303u) << 4), 32.0f, v + 4 * i);
        s = h2f((uint16_t)r.m[0]) * (float)(int32_t)r.m[1];
    }
}

/* Values k0..k0+15 of row `row` (k0 a multiple of 16): value[i] = s * v[i] + b. Values past w.in are 0. */
template <int T>
__device__ __forceinline__ void dequant16(const dev_weight &w, int row, int k0, float v[16], float &s, float &b) {
    raw16<T> r;
    load16<T>(w, row, k0, r);
    convert16<T>(r, k0, v, s, b);
}

/* ------------------------------------------------------------------ reductions */

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

/* Sum over the block (all threads get it); red holds one float per warp. */
__device__ float block_sum(float v, float *red) {
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
__device__ __forceinline__ bool arg_better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

/* ------------------------------------------------------------------ decode: matrix x vector */

template <int T>
__global__ void __launch_bounds__(MV_THREADS, 2) k_matvec(const mv_args a) {
    extern __shared__ float xs[];
    __shared__ float red[MV_WARPS];
    __shared__ int redi[MV_WARPS];
    __shared__ int last_block;
    __shared__ float kpart[MV_WARPS][2];
    __shared__ float nred[MV_WARPS];
    const int in = a.w0.in, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int in_pad = (in + 15) & ~15, NU = in_pad >> 4, NUP = NU | 1; /* odd stride: no bank conflicts */
    const bool dual = a.pair == MV_PAIR_DUAL;
    const int out = a.w0.out;
    const int n_pairs = dual ? out : (out + 1) >> 1;
    /* ksplit warps share a pair, each over its own stretch of units [ub, ue); a block holds ppb pairs */
    const int ks_n = a.ksplit, ppb = MV_WARPS / ks_n, slot = warp / ks_n, ks = warp - slot * ks_n;
    const int ub = (int)((long long)NU * ks / ks_n), ue = (int)((long long)NU * (ks + 1) / ks_n);

    /* the weights do not depend on the previous kernel: start pulling this warp's first rows into L2 */
    {
        const int p = blockIdx.x * ppb + slot;
        if (p < n_pairs) {
            const int r0 = dual ? p : 2 * p, r1 = dual ? p : 2 * p + 1;
            const long long rb = a.w0.row_bytes, b0 = rb * ks / ks_n, b1 = rb * (ks + 1) / ks_n;
            const uint8_t *q0 = a.w0.q + (long long)r0 * rb;
            const uint8_t *q1 = (dual ? a.w1.q : a.w0.q) + (long long)r1 * rb;
            for (long long off = b0 + lane * 128; off < b1 && off < b0 + 16384; off += 32 * 128) {
                prefetch_l2(q0 + off);
                if (r1 < out) prefetch_l2(q1 + off);
            }
        }
    }
    pdl_wait_then_trigger();

    /* prologue: the input vector (RMSNorm'ed or not) in shared memory, transposed so that lane u of a warp
     * reading value i of its unit (16 values) hits bank (i * NUP + u) % 32: xs[(k % 16) * NUP + k / 16] = x[k] */
#define XS(k) xs[((k) & 15) * NUP + ((k) >> 4)]
    const bool norm = a.in_mode == MV_IN_NORM;
    float ss = 0.0f;
    if ((in & 3) == 0 && ((uintptr_t)a.x & 15) == 0 && (!norm || ((uintptr_t)a.norm_w & 15) == 0)) {
        /* 16-byte loads, up to eight per thread in flight: one round trip for inputs up to 8192 values */
        const int in4 = in >> 2;
#pragma unroll 8
        for (int i4 = tid; i4 < in4; i4 += MV_THREADS) {
            const float4 v = __ldg((const float4 *)a.x + i4);
            const float4 w = norm ? __ldg((const float4 *)a.norm_w + i4) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            const int i = 4 * i4;
            XS(i) = v.x * w.x, XS(i + 1) = v.y * w.y, XS(i + 2) = v.z * w.z, XS(i + 3) = v.w * w.w;
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
#pragma unroll 4
        for (int i = tid; i < in; i += MV_THREADS) {
            const float v = __ldg(a.x + i), w = norm ? __ldg(a.norm_w + i) : 1.0f;
            XS(i) = v * w;
            ss += v * v;
        }
    }
    if (norm) { /* RMSNorm: xs holds x * w; the products are scaled once, at the end */
        ss = warp_sum(ss);
        if (lane == 0) nred[warp] = ss;
    }
    for (int i = in + tid; i < in_pad; i += MV_THREADS) XS(i) = 0.0f;
#undef XS
    __syncthreads();
    float scale = 1.0f;
    if (norm) {
        float tot = 0.0f;
#pragma unroll
        for (int i = 0; i < MV_WARPS; i++) tot += nred[i];
        scale = 1.0f / sqrtf(tot / (float)in + a.eps);
    }

    /* the second row's matrix: w1 (same type and shape) in dual mode, else w0; built from scalars so that
     * the selection stays in registers */
    dev_weight w1 = a.w0;
    w1.q = dual ? a.w1.q : a.w0.q;
    w1.d = dual ? a.w1.d : a.w0.d;
    float best_v = -INFINITY;
    int best_i = 0x7FFFFFFF;

    for (int pg = blockIdx.x; pg * ppb < n_pairs; pg += gridDim.x) { /* the same trip count in every warp */
        const bool valid = pg * ppb + slot < n_pairs;
        const int p = valid ? pg * ppb + slot : n_pairs - 1;
        const int r0 = dual ? p : 2 * p, r1 = dual ? p : 2 * p + 1;
        const bool has1 = r1 < out;
        const bool lead = valid && ks == 0 && lane == 0; /* the thread that finishes this pair */
        float acc0 = 0.0f, acc1 = 0.0f, y0 = 0.0f, y1 = 0.0f;
        if (a.epi == MV_EPI_ADD && lead) { /* the residual rows, fetched while the weights stream */
            y0 = a.y[r0];
            if (has1) y1 = a.y[r1];
        }
        /* UN units per lane per step, every load unconditional (rows and units clamped to valid ones, their
         * results dropped) so that all of a step's loads are in flight together */
        constexpr int UN = T == CK_F32 ? 1 : (T == CK_F16 || T == CK_BF16 || T == CK_Q6_K) ? 2 : 4;
        const int r1c = has1 ? r1 : r0;
        for (int u0 = ub + lane; u0 < ue; u0 += 32 * UN) {
            raw16<T> ra[UN], rb[UN];
#pragma unroll
            for (int k = 0; k < UN; k++) {
                const int u = u0 + 32 * k, uc = u < ue ? u : u0;
                load16<T>(a.w0, r0, 16 * uc, ra[k]);
                load16<T>(w1, r1c, 16 * uc, rb[k]);
            }
#pragma unroll
            for (int k = 0; k < UN; k++) {
                const int u = u0 + 32 * k;
                const bool ok = u < ue;
                const int uc = ok ? u : u0;
                const float *xp = xs + uc; /* value i of this unit at xp[i * NUP] */
                float v0[16], v1[16], s0, b0, s1, b1;
                convert16<T>(ra[k], 16 * uc, v0, s0, b0);
                convert16<T>(rb[k], 16 * uc, v1, s1, b1);
                float d0 = 0.0f, d1 = 0.0f, sx = 0.0f;
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    const float xv = xp[i * NUP];
                    d0 = fmaf(v0[i], xv, d0);
                    d1 = fmaf(v1[i], xv, d1);
                    if constexpr (T == CK_Q4_K) sx += xv;
                }
                float c0 = s0 * d0, c1 = s1 * d1;
                if constexpr (T == CK_Q4_K) c0 += b0 * sx, c1 += b1 * sx;
                acc0 += ok ? c0 : 0.0f;
                acc1 += ok ? c1 : 0.0f;
            }
        }
        acc0 = warp_sum(acc0);
        acc1 = warp_sum(acc1);
        if (ks_n > 1) { /* the pair's warps add their stretches */
            if (lane == 0) kpart[warp][0] = acc0, kpart[warp][1] = acc1;
            __syncthreads();
            if (lead)
                for (int k = 1; k < ks_n; k++) acc0 += kpart[warp + k][0], acc1 += kpart[warp + k][1];
            __syncthreads();
        }
        if (!lead) continue;
        acc0 *= scale;
        acc1 *= scale;
        switch (a.epi) {
        case MV_EPI_STORE:
            a.y[r0] = acc0;
            if (has1) a.y[r1] = acc1;
            break;
        case MV_EPI_ADD:
            a.y[r0] = y0 + acc0;
            if (has1) a.y[r1] = y1 + acc1;
            break;
        case MV_EPI_SWIGLU:
            a.y[p] = acc0 / (1.0f + expf(-acc0)) * acc1;
            break;
        case MV_EPI_QKV: {
            const int pos = *a.pos, gr = a.row_offset + r0;
            if (gr < a.nq + a.nk) {
                const int i = (gr < a.nq ? gr : gr - a.nq) % a.head_dim;
                if (i < a.n_rot) {
                    float sn, cs;
                    sincosf((float)pos * a.rope_freq[i >> 1], &sn, &cs);
                    const float x0 = acc0, x1 = acc1;
                    acc0 = x0 * cs - x1 * sn;
                    acc1 = x0 * sn + x1 * cs;
                }
                if (gr < a.nq) {
                    a.q_out[gr] = acc0;
                    a.q_out[gr + 1] = acc1;
                } else {
                    __half *k = a.k_cache + (long long)pos * a.kv_dim + (gr - a.nq);
                    k[0] = __float2half(acc0);
                    k[1] = __float2half(acc1);
                }
            } else {
                __half *v = a.v_cache + (long long)pos * a.kv_dim + (gr - a.nq - a.nk);
                v[0] = __float2half(acc0);
                v[1] = __float2half(acc1);
            }
            break;
        }
        case MV_EPI_LOGITS:
            a.y[r0] = acc0;
            if (arg_better(acc0, r0, best_v, best_i)) best_v = acc0, best_i = r0;
            if (has1) {
                a.y[r1] = acc1;
                if (arg_better(acc1, r1, best_v, best_i)) best_v = acc1, best_i = r1;
            }
            break;
        }
    }

    if (a.epi != MV_EPI_LOGITS) return;
    /* argmax: per block, then the last block to finish reduces the blocks' results */
    if (lane == 0) red[warp] = best_v, redi[warp] = best_i;
    __syncthreads();
    if (tid == 0) {
        float bv = red[0];
        int bi = redi[0];
        for (int i = 1; i < MV_WARPS; i++)
            if (arg_better(red[i], redi[i], bv, bi)) bv = red[i], bi = redi[i];
        a.arg_val[blockIdx.x] = bv;
        a.arg_idx[blockIdx.x] = bi;
        __threadfence();
        last_block = atomicAdd(a.counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last_block || warp != 0) return;
    __threadfence();
    float bv = -INFINITY;
    int bi = 0x7FFFFFFF;
    for (int i = lane; i < (int)gridDim.x; i += 32) {
        const float v = ((volatile float *)a.arg_val)[i];
        const int id = ((volatile int *)a.arg_idx)[i];
        if (arg_better(v, id, bv, bi)) bv = v, bi = id;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
        if (arg_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) {
        *a.arg_out = bi == 0x7FFFFFFF ? 0 : bi;
        *a.counter = 0;
    }
}

/* ------------------------------------------------------------------ attention */

__global__ void __launch_bounds__(ATT_THREADS) k_attention(const attn_args a) {
    __shared__ float qs[ATT_MAX_G * 256];
    __shared__ float ps[ATT_MAX_G][ATT_THREADS];
    __shared__ __align__(16) __half vs[ATT_THREADS * 256]; /* the V rows of the current 64 keys */
    __shared__ float m_sh[ATT_MAX_G], l_sh[ATT_MAX_G], alpha_sh[ATT_MAX_G];
    __shared__ int is_last;
    const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int hd = a.head_dim, G = a.n_head / a.n_head_kv;
    pdl_wait_then_trigger();
    /* the position and the queries are independent loads: both in flight before either is used */
    const int pos0 = a.pos_dev ? *a.pos_dev : a.pos0;
    for (int i = tid; i < G * hd; i += ATT_THREADS) {
        const int g = i / hd, d = i - g * hd;
        qs[i] = a.q[(long long)t * a.q_stride + (kvh * G + g) * hd + d] * a.scale;
    }
    const int n_keys = pos0 + t + 1;
    const int n_active = (n_keys + a.chunk - 1) / a.chunk;
    const int k_begin = split * a.chunk;
    const int k_end = min(n_keys, k_begin + a.chunk);
    if (k_begin >= k_end) return; /* an idle split (the whole block leaves together) */
    if (tid < ATT_MAX_G) m_sh[tid] = -INFINITY, l_sh[tid] = 0.0f;
    float acc[ATT_MAX_G][ATT_MAX_D];
#pragma unroll
    for (int g = 0; g < ATT_MAX_G; g++)
#pragma unroll
        for (int c = 0; c < ATT_MAX_D; c++) acc[g][c] = 0.0f;
    __syncthreads();

    for (int kb = k_begin; kb < k_end; kb += ATT_THREADS) {
        const int j = kb + tid;
        float sc[ATT_MAX_G];
#pragma unroll
        for (int g = 0; g < ATT_MAX_G; g++) sc[g] = 0.0f;
        if (j < k_end) {
            /* this thread's key: its K row for the scores and its V row into shared memory, 64 dims at a
             * time with every load of a chunk in flight together */
            const __half *kr = a.k_cache + (long long)j * a.kv_dim + kvh * hd;
            const __half *vr = a.v_cache + (long long)j * a.kv_dim + kvh * hd;
            if ((hd & 7) == 0) {
                for (int d0 = 0; d0 < hd; d0 += 64) {
                    uint4 kv[8], vv[8];
#pragma unroll
                    for (int c = 0; c < 8; c++)
                        if (d0 + 8 * c < hd) kv[c] = *(const uint4 *)(kr + d0 + 8 * c), vv[c] = *(const uint4 *)(vr + d0 + 8 * c);
#pragma unroll
                    for (int c = 0; c < 8; c++) {
                        if (d0 + 8 * c >= hd) break;
                        const __half2 *h2 = (const __half2 *)&kv[c];
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float2 kk = __half22float2(h2[e]);
                            const int d = d0 + 8 * c + 2 * e;
#pragma unroll
                            for (int g = 0; g < ATT_MAX_G; g++)
                                if (g < G) sc[g] += qs[g * hd + d] * kk.x + qs[g * hd + d + 1] * kk.y;
                        }
                        *(uint4 *)&vs[tid * hd + d0 + 8 * c] = vv[c];
                    }
                }
            } else {
                for (int d = 0; d < hd; d += 2) {
                    const float2 kk = __half22float2(*(const __half2 *)(kr + d));
#pragma unroll
                    for (int g = 0; g < ATT_MAX_G; g++)
                        if (g < G) sc[g] += qs[g * hd + d] * kk.x + qs[g * hd + d + 1] * kk.y;
                    *(__half2 *)&vs[tid * hd + d] = *(const __half2 *)(vr + d);
                }
            }
#pragma unroll
            for (int g = 0; g < ATT_MAX_G; g++)
                if (g < G) ps[g][tid] = sc[g];
        } else {
#pragma unroll
            for (int g = 0; g < ATT_MAX_G; g++)
                if (g < G) ps[g][tid] = -INFINITY;
        }
        __syncthreads();
        for (int g = warp; g < G; g += ATT_THREADS / 32) {
            const float v0 = ps[g][lane], v1 = ps[g][lane + 32];
            const float m_old = m_sh[g];
            const float m_new = fmaxf(m_old, warp_max(fmaxf(v0, v1)));
            const float e0 = __expf(v0 - m_new), e1 = __expf(v1 - m_new);
            ps[g][lane] = e0;
            ps[g][lane + 32] = e1;
            const float sum = warp_sum(e0 + e1);
            if (lane == 0) {
                const float alpha = __expf(m_old - m_new);
                l_sh[g] = l_sh[g] * alpha + sum;
                m_sh[g] = m_new;
                alpha_sh[g] = alpha;
            }
        }
        __syncthreads();
        const int nk = min(ATT_THREADS, k_end - kb);
#pragma unroll
        for (int g = 0; g < ATT_MAX_G; g++)
            if (g < G)
#pragma unroll
                for (int c = 0; c < ATT_MAX_D; c++) acc[g][c] *= alpha_sh[g];
#pragma unroll 4
        for (int jj = 0; jj < nk; jj++) {
#pragma unroll
            for (int c = 0; c < ATT_MAX_D; c++) {
                const int d = tid + ATT_THREADS * c;
                if (d < hd) {
                    const float vv = __half2float(vs[jj * hd + d]);
#pragma unroll
                    for (int g = 0; g < ATT_MAX_G; g++)
                        if (g < G) acc[g][c] += ps[g][jj] * vv;
                }
            }
        }
        __syncthreads();
    }

    if (a.out || n_active == 1) {
        /* the only split (or prefill): normalise and write */
#pragma unroll
        for (int g = 0; g < ATT_MAX_G; g++) {
            if (g >= G) break;
            const int h = kvh * G + g;
            const float inv = 1.0f / l_sh[g];
#pragma unroll
            for (int c = 0; c < ATT_MAX_D; c++) {
                const int d = tid + ATT_THREADS * c;
                if (d >= hd) continue;
                if (a.out) a.out[(long long)t * a.out_stride + h * hd + d] = __float2half(acc[g][c] * inv);
                else a.out_f[h * hd + d] = acc[g][c] * inv;
            }
        }
        return;
    }

    /* several splits: write this one's partial; the last block of this KV head to finish combines them */
#pragma unroll
    for (int g = 0; g < ATT_MAX_G; g++) {
        if (g >= G) break;
        float *p = a.part + ((long long)split * a.n_head + kvh * G + g) * (hd + 2);
#pragma unroll
        for (int c = 0; c < ATT_MAX_D; c++) {
            const int d = tid + ATT_THREADS * c;
            if (d < hd) p[d] = acc[g][c];
        }
        if (tid == 0) p[hd] = m_sh[g], p[hd + 1] = l_sh[g];
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) is_last = atomicAdd(&a.counters[kvh], 1u) == (unsigned)n_active - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    float Mx[ATT_MAX_G], Lx[ATT_MAX_G];
#pragma unroll
    for (int g = 0; g < ATT_MAX_G; g++) {
        Mx[g] = -INFINITY, Lx[g] = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_MAX_D; c++) acc[g][c] = 0.0f;
    }
#pragma unroll 4
    for (int sp = 0; sp < n_active; sp++) {
#pragma unroll
        for (int g = 0; g < ATT_MAX_G; g++) {
            if (g >= G) break;
            const float *p = a.part + ((long long)sp * a.n_head + kvh * G + g) * (hd + 2);
            const float ms = __ldcg(p + hd), ls = __ldcg(p + hd + 1);
            const float mn = fmaxf(Mx[g], ms);
            const float f_old = __expf(Mx[g] - mn), f_new = __expf(ms - mn);
            Lx[g] = Lx[g] * f_old + ls * f_new;
#pragma unroll
            for (int c = 0; c < ATT_MAX_D; c++) {
                const int d = tid + ATT_THREADS * c;
                if (d < hd) acc[g][c] = acc[g][c] * f_old + __ldcg(p + d) * f_new;
            }
            Mx[g] = mn;
        }
    }
#pragma unroll
    for (int g = 0; g < ATT_MAX_G; g++) {
        if (g >= G) break;
        const float inv = 1.0f / Lx[g];
#pragma unroll
        for (int c = 0; c < ATT_MAX_D; c++) {
            const int d = tid + ATT_THREADS * c;
            if (d < hd) a.out_f[(kvh * G + g) * hd + d] = acc[g][c] * inv;
        }
    }
    if (tid == 0) a.counters[kvh] = 0;
}

/* ------------------------------------------------------------------ prefill: matrix x matrix */

#define GB_M 64
#define GB_N 64
#define GB_K 32
#define G_LD (GB_K + 8)
#define C_LD (GB_N + 4)

template <int T>
__global__ void __launch_bounds__(128) k_gemm(const dev_weight w, const __half *A, int lda, int n_tok, float *C,
                                              int ldc, int col_off, int add) {
    __shared__ __align__(128) unsigned char smem[GB_M * C_LD * 4];
    pdl_wait_then_trigger();
    __half(*As)[G_LD] = (__half(*)[G_LD])smem;
    __half(*Bs)[G_LD] = (__half(*)[G_LD])(smem + GB_M * G_LD * 2);
    float(*Cs)[C_LD] = (float(*)[C_LD])smem;
    const int tid = threadIdx.x, warp = tid >> 5;
    const int m0 = blockIdx.y * GB_M, n0 = blockIdx.x * GB_N;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const int K = w.in, k_tiles = (K + GB_K - 1) / GB_K;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    /* this thread's pieces of a tile: two 8-half chunks of A, one 16-value unit of W */
    const int ar0 = tid >> 2, ac = (tid & 3) * 8, ar1 = ar0 + 32;
    const int br = tid >> 1, bh = tid & 1;
    uint4 ra0, ra1;
    float rb[16], rs, rbias;

    auto load = [&](int kt) {
        const int k = kt * GB_K;
        const uint4 z = make_uint4(0, 0, 0, 0);
        ra0 = m0 + ar0 < n_tok ? *(const uint4 *)(A + (long long)(m0 + ar0) * lda + k + ac) : z;
        ra1 = m0 + ar1 < n_tok ? *(const uint4 *)(A + (long long)(m0 + ar1) * lda + k + ac) : z;
        const int k0 = k + 16 * bh;
        if (n0 + br < w.out && k0 < K) {
            dequant16<T>(w, n0 + br, k0, rb, rs, rbias);
        } else {
#pragma unroll
            for (int i = 0; i < 16; i++) rb[i] = 0.0f;
            rs = 0.0f, rbias = 0.0f;
        }
    };

    load(0);
    for (int kt = 0; kt < k_tiles; kt++) {
        *(uint4 *)&As[ar0][ac] = ra0;
        *(uint4 *)&As[ar1][ac] = ra1;
        __half2 hv[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            hv[i] = __floats2half2_rn(rs * rb[2 * i] + rbias, rs * rb[2 * i + 1] + rbias);
        *(uint4 *)&Bs[br][16 * bh] = *(const uint4 *)&hv[0];
        *(uint4 *)&Bs[br][16 * bh + 8] = *(const uint4 *)&hv[4];
        __syncthreads();
        if (kt + 1 < k_tiles) load(kt + 1);
#pragma unroll
        for (int kk = 0; kk < GB_K; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], &As[wm + 16 * i][kk], G_LD);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], &Bs[wn + 16 * j][kk], G_LD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&Cs[wm + 16 * i][wn + 16 * j], acc[i][j], C_LD, wmma::mem_row_major);
    __syncthreads();
    for (int e = tid; e < GB_M * GB_N; e += 128) {
        const int r = e / GB_N, c = e % GB_N, t = m0 + r, n = n0 + c;
        if (t < n_tok && n < w.out) {
            float *dst = C + (long long)t * ldc + col_off + n;
            *dst = add ? *dst + Cs[r][c] : Cs[r][c];
        }
    }
}

/* ------------------------------------------------------------------ small pieces */

template <int T>
__global__ void __launch_bounds__(128) k_embed(const dev_weight w, const int *ids, float *x) {
    pdl_wait_then_trigger();
    const int t = blockIdx.x, row = ids[t], n = w.in;
    for (int u = threadIdx.x; u < (n + 15) / 16; u += blockDim.x) {
        float v[16], s, b;
        dequant16<T>(w, row, 16 * u, v, s, b);
#pragma unroll
        for (int i = 0; i < 16; i++)
            if (16 * u + i < n) x[(long long)t * n + 16 * u + i] = s * v[i] + b;
    }
}

__global__ void __launch_bounds__(256) k_rmsnorm_rows(const float *x, const float *w, float eps, int n, __half *out,
                                                      int out_stride) {
    __shared__ float red[8];
    pdl_wait_then_trigger();
    const float *xr = x + (long long)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    const float scale = 1.0f / sqrtf(block_sum(ss, red) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        out[(long long)blockIdx.x * out_stride + i] = __float2half((xr[i] * scale) * w[i]);
}

__global__ void k_rope_store(float *qkv, int stride, int pos0, int nq, int nk, int head_dim, int n_rot,
                             const float *rope_freq, __half *k_cache, __half *v_cache, int kv_dim) {
    pdl_wait_then_trigger();
    const int t = blockIdx.x, pos = pos0 + t;
    float *row = qkv + (long long)t * stride;
    for (int pr = threadIdx.x; pr < (nq + nk) / 2; pr += blockDim.x) {
        const int gr = 2 * pr;
        float x0 = row[gr], x1 = row[gr + 1];
        const int i = (gr < nq ? gr : gr - nq) % head_dim;
        if (i < n_rot) {
            float sn, cs;
            sincosf((float)pos * rope_freq[i >> 1], &sn, &cs);
            const float y0 = x0 * cs - x1 * sn, y1 = x0 * sn + x1 * cs;
            x0 = y0, x1 = y1;
        }
        if (gr < nq) {
            row[gr] = x0, row[gr + 1] = x1;
        } else {
            k_cache[(long long)pos * kv_dim + gr - nq] = __float2half(x0);
            k_cache[(long long)pos * kv_dim + gr - nq + 1] = __float2half(x1);
        }
    }
    for (int i = threadIdx.x; i < nk; i += blockDim.x)
        v_cache[(long long)pos * kv_dim + i] = __float2half(row[nq + nk + i]);
}

__global__ void k_swiglu_rows(const float *g, const float *u, int n, __half *out, int out_stride) {
    pdl_wait_then_trigger();
    const int i = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (i >= n) return;
    const float gv = g[(long long)t * n + i];
    out[(long long)t * out_stride + i] = __float2half(gv / (1.0f + expf(-gv)) * u[(long long)t * n + i]);
}

__global__ void k_swiglu_vec(const float *g, const float *u, int n, float *out) {
    pdl_wait_then_trigger();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

__global__ void k_repack(const uint8_t *src, long long n_blocks, int block_bytes, int d_off, int q_off, int q_len,
                         uint8_t *dst_q, __half *dst_d) {
    pdl_wait_then_trigger();
    const long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const uint8_t *s = src + b * block_bytes;
    uint8_t *q = dst_q + b * q_len;
    for (int i = 0; i < q_len; i++) q[i] = s[q_off + i];
    dst_d[b] = __ushort_as_half((uint16_t)(s[d_off] | (s[d_off + 1] << 8)));
}

/* ------------------------------------------------------------------ kernel table and launchers */

#define KTYPES(X) X(CK_F32) X(CK_F16) X(CK_BF16) X(CK_Q8_0) X(CK_Q4_0) X(CK_Q4_K) X(CK_Q6_K)

static const struct {
    const void *fn;
    const char *name;
} kernel_table[] = {
#define MV_ENTRY(T) {(const void *)k_matvec<T>, "matvec<" #T ">"},
#define GEMM_ENTRY(T) {(const void *)k_gemm<T>, "gemm<" #T ">"},
#define EMB_ENTRY(T) {(const void *)k_embed<T>, "embed<" #T ">"},
    KTYPES(MV_ENTRY) KTYPES(GEMM_ENTRY) KTYPES(EMB_ENTRY)
    {(const void *)k_attention, "attention"},
    {(const void *)k_rmsnorm_rows, "rmsnorm_rows"},
    {(const void *)k_rope_store, "rope_store"},
    {(const void *)k_swiglu_rows, "swiglu_rows"},
    {(const void *)k_swiglu_vec, "swiglu_vec"},
    {(const void *)k_repack, "repack"},
};

static bool g_pdl = false;
void ck_set_pdl(bool on) { g_pdl = on; }

/* Launches k with the programmatic-serialization attribute when PDL is on (and `pdl` for this launch). */
template <typename... KArgs, typename... Args>
static void launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, bool pdl,
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
    cfg.numAttrs = g_pdl && pdl ? 1 : 0;
    cudaLaunchKernelEx(&cfg, k, std::forward<Args>(args)...);
}

int ck_kernel_count(void) { return (int)(sizeof kernel_table / sizeof kernel_table[0]); }
const void *ck_kernel_at(int i) { return kernel_table[i].fn; }
const char *ck_kernel_name(int i) { return kernel_table[i].name; }

size_t ck_matvec_smem(int n) { return (size_t)(((n + 15) & ~15) + 16) * sizeof(float); }

cudaError_t ck_set_matvec_smem(size_t bytes) {
    cudaError_t e = cudaSuccess;
#define MV_ATTR(T) \
    if (e == cudaSuccess) e = cudaFuncSetAttribute(k_matvec<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    KTYPES(MV_ATTR)
#undef MV_ATTR
    return e;
}

int ck_matvec_plan(mv_args &a, int n_sm) {
    const int n_pairs = a.pair == MV_PAIR_DUAL ? a.w0.out : (a.w0.out + 1) / 2;
    const int n_units = (a.w0.in + 15) / 16;
    /* split each pair's units over 2..8 warps while there are too few pairs to give every warp slot of
     * one wave (two blocks per SM) its own, and every lane keeps at least one unit */
    const int slots = 2 * n_sm * MV_WARPS;
    int ks = 1;
    while (ks < MV_WARPS && n_pairs * ks * 2 <= slots && n_units / (ks * 2) >= 32) ks *= 2;
    a.ksplit = ks;
    const int ppb = MV_WARPS / ks;
    int blocks = (n_pairs + ppb - 1) / ppb;
    const int cap = n_sm * 2; /* what fits at once (two blocks per SM): one wave, one prologue per slot */
    return blocks < cap ? blocks : cap;
}

#define DISPATCH(type, LAUNCH)              \
    switch (type) {                         \
    case CK_F32: LAUNCH(CK_F32); break;     \
    case CK_F16: LAUNCH(CK_F16); break;     \
    case CK_BF16: LAUNCH(CK_BF16); break;   \
    case CK_Q8_0: LAUNCH(CK_Q8_0); break;   \
    case CK_Q4_0: LAUNCH(CK_Q4_0); break;   \
    case CK_Q4_K: LAUNCH(CK_Q4_K); break;   \
    case CK_Q6_K: LAUNCH(CK_Q6_K); break;   \
    default: break;                         \
    }

void ck_matvec(const mv_args &a, int n_blocks, cudaStream_t st) {
    const size_t smem = ck_matvec_smem(a.w0.in);
#define L(T) launch(k_matvec<T>, dim3(n_blocks), dim3(MV_THREADS), smem, st, true, a)
    DISPATCH(a.w0.type, L)
#undef L
}

void ck_attention(const attn_args &a, int n_split, int n_tok, cudaStream_t st) {
    launch(k_attention, dim3(n_split, a.n_head_kv, n_tok), dim3(ATT_THREADS), 0, st, true, a);
}

void ck_embed(const dev_weight &w, const int *ids, float *x, int n_tok, cudaStream_t st) {
#define L(T) launch(k_embed<T>, dim3(n_tok), dim3(128), 0, st, false, w, ids, x)
    DISPATCH(w.type, L)
#undef L
}

void ck_rmsnorm_rows(const float *x, const float *w, float eps, int n, int n_tok, __half *out, int out_stride,
                     cudaStream_t st) {
    launch(k_rmsnorm_rows, dim3(n_tok), dim3(256), 0, st, true, x, w, eps, n, out, out_stride);
}

void ck_gemm(const dev_weight &w, const __half *A, int lda, int n_tok, float *C, int ldc, int col_off, bool add,
             cudaStream_t st) {
    const dim3 grid((w.out + GB_N - 1) / GB_N, (n_tok + GB_M - 1) / GB_M);
#define L(T) launch(k_gemm<T>, grid, dim3(128), 0, st, true, w, A, lda, n_tok, C, ldc, col_off, add ? 1 : 0)
    DISPATCH(w.type, L)
#undef L
}

void ck_rope_store(float *qkv, int stride, int n_tok, int pos0, int nq, int nk, int head_dim, int n_rot,
                   const float *rope_freq, __half *k_cache, __half *v_cache, int kv_dim, cudaStream_t st) {
    launch(k_rope_store, dim3(n_tok), dim3(256), 0, st, true, qkv, stride, pos0, nq, nk, head_dim, n_rot, rope_freq,
           k_cache, v_cache, kv_dim);
}

void ck_swiglu_rows(const float *g, const float *u, int n, int n_tok, __half *out, int out_stride, cudaStream_t st) {
    launch(k_swiglu_rows, dim3((n + 255) / 256, n_tok), dim3(256), 0, st, true, g, u, n, out, out_stride);
}

void ck_swiglu_vec(const float *g, const float *u, int n, float *out, cudaStream_t st) {
    launch(k_swiglu_vec, dim3((n + 255) / 256), dim3(256), 0, st, true, g, u, n, out);
}

void ck_repack(const uint8_t *src, long long n_blocks, int block_bytes, int d_off, int q_off, int q_len,
               uint8_t *dst_q, __half *dst_d, cudaStream_t st) {
    if (n_blocks <= 0) return;
    k_repack<<<(unsigned)((n_blocks + 255) / 256), 256, 0, st>>>(src, n_blocks, block_bytes, d_off, q_off, q_len,
                                                                  dst_q, dst_d);
}
