/*
 * cuda_attention.cu — attention over the F16 KV cache (see attn_args in cuda_kernels.cuh):
 *   k_attn_decode<MG, VEC>  decode: rows of one step, each its own sequence and length; block
 *                  (split, group of up to MG query heads of one KV head, row) over one chunk of the row's
 *                  keys (at least AD_MIN_CHUNK: the number of splits at work follows the context at run
 *                  time; its first sub-chunk's K/V rows prefetched into L2 before the PDL wait), 16-byte K/V
 *                  loads by groups of head_dim / 8 lanes (one key per group), q rounded to F16, scores in
 *                  shared memory, online softmax over sub-chunks; the last block of (row, group) combines
 *                  the partials with all its threads. A row whose keys fit one block's one pass rounds its
 *                  normalized probabilities to F16 before the V sum, as the reference's CPU attention does
 *   k_attn_prefill<HD>  prefill on the tensor cores (head_dim 64 or 128): block (64 tokens, query head), keys
 *                  in tiles of 64 through shared memory, S = Q K^T and O += P V by mma, online softmax in registers
 *   k_attention    prefill for the other head sizes: all keys of one (KV head, token) by one block of 64 threads
 * and their launchers. MG: query heads per block at most (AD_HEADS_PER_BLOCK; fewer where G is smaller);
 * VEC: head_dim % 8 == 0.
 */
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_gemm.cuh"

#include <math.h>

#define AD_THREADS 256
#define AD_WARPS (AD_THREADS / 32)
#define AD_SUB 128 /* keys whose scores are in shared memory at once */
#define AD_MIN_CHUNK 32 /* keys of a split at least: up to 32 keys one block, no partials, no combine */
#define AD_MAX_SPLIT 32 /* splits of a row at most: the combine reads every split's partial (more cost it more
                         * than they save: bench/RESULTS.md, "one query head per block") */
/* Query heads a block takes at most (the kernel's one MG; attn_groups). One: a block's work per key
 * is one dot product and one row of V, so each key pass is short; the G heads that share a KV head read its
 * keys and values G times, all but the first from L2. Measured against 2 and against all G of a KV head in one
 * block: bench/RESULTS.md, "CUDA decode attention: one query head per block". */
#define AD_HEADS_PER_BLOCK 1

/* Keys per split of a row of n_keys keys (at run time, from the position in device memory): n_keys over the
 * n_split splits of the grid, at least AD_MIN_CHUNK, a multiple of the kps keys a pass of the block covers.
 * Splits past ceil(n_keys / chunk) are idle: a short context pays for neither their work nor their combine. */
static __device__ __forceinline__ int ad_chunk(int n_keys, int n_split, int kps) {
    int chunk = (n_keys + n_split - 1) / n_split;
    chunk = chunk > AD_MIN_CHUNK ? chunk : AD_MIN_CHUNK;
    return (chunk + kps - 1) / kps * kps;
}

/* ------------------------------------------------------------------ decode */

/* This lane's 8 values of a head's row (dims 8 * li ..; zeros past hd), as floats. */
template <bool VEC>
static __device__ __forceinline__ void load8(const __half *row, int li, int hd, float f[8]) {
    if constexpr (VEC) {
        if (8 * li < hd) {
            const uint4 u = __ldcg((const uint4 *)(row + 8 * li));
            const __half2 *h = (const __half2 *)&u;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 v = __half22float2(h[e]);
                f[2 * e] = v.x, f[2 * e + 1] = v.y;
            }
            return;
        }
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = 0.0f;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = 8 * li + e < hd ? __half2float(row[8 * li + e]) : 0.0f;
    }
}

/* x rounded to the nearest F16 and back. */
static __device__ __forceinline__ float f16_round(float x) { return __half2float(__float2half_rn(x)); }

/* Output element i (of n_head * hd) of row r. */
static __device__ __forceinline__ void attn_put(const attn_args &a, int r, int i, float v) {
    if (a.out) a.out[(long long)r * a.out_stride + i] = __float2half(v);
    else a.out_f[(long long)r * a.n_head * a.head_dim + i] = v;
}

/* The last block of (row r, heads h0 .. h0 + Gb - 1): softmax weights of the n_active partials per head (a warp
 * per head), then every output element as the weighted sum over the splits (all threads). */
template <int MG>
static __device__ void attn_combine(const attn_args &a, int r, int h0, int Gb, int n_active, float *wsm) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hd = a.head_dim, stride = hd + 2;
    const float *base = a.part + (long long)r * a.n_split * a.n_head * stride;
    for (int g = warp; g < Gb; g += AD_WARPS) {
        const int h = h0 + g;
        float mx = -INFINITY;
        for (int sp = lane; sp < n_active; sp += 32) mx = fmaxf(mx, __ldcg(base + ((long long)sp * a.n_head + h) * stride + hd));
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int sp = lane; sp < n_active; sp += 32) {
            const float *p = base + ((long long)sp * a.n_head + h) * stride;
            const float w = __expf(__ldcg(p + hd) - mx);
            wsm[sp * MG + g] = w;
            sum += w * __ldcg(p + hd + 1);
        }
        sum = warp_sum(sum);
        const float inv = 1.0f / sum;
        for (int sp = lane; sp < n_active; sp += 32) wsm[sp * MG + g] *= inv;
    }
    __syncthreads();
    for (int i = tid; i < Gb * hd; i += AD_THREADS) {
        const int g = i / hd, d = i - g * hd, h = h0 + g;
        const float *p = base + (long long)h * stride + d;
        float acc = 0.0f;
#pragma unroll 16
        for (int sp = 0; sp < n_active; sp++) acc += wsm[sp * MG + g] * __ldcg(p + (long long)sp * a.n_head * stride);
        attn_put(a, r, h0 * hd + i, acc);
    }
}

template <int MG, bool VEC>
__global__ void __launch_bounds__(AD_THREADS) k_attn_decode(const __grid_constant__ attn_args a) {
    __shared__ float sc[MG][AD_SUB];
    __shared__ float m_sh[MG], l_sh[MG], al_sh[MG];
    static_assert(MG <= 2, "red: a row of MG heads per warp in static shared memory");
    __shared__ float red[AD_WARPS][MG * 256];
    __shared__ float wsm[CK_ATT_MAX_SPLIT * MG];
    __shared__ int is_last;
    const int split = blockIdx.x, gi = blockIdx.y, r = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* this block's query heads: h0 .. h0 + Gb - 1, sub-group sub of the G sharing KV head kvh */
    const int hd = a.head_dim, G = a.n_head / a.n_head_kv, SG = (G + MG - 1) / MG;
    const int kvh = gi / SG, sub = gi - kvh * SG, h0 = kvh * G + sub * MG, Gb = min(MG, G - sub * MG);
    int L = 1; /* lanes per key: head_dim / 8 rounded up to a power of two */
    while (8 * L < hd) L <<= 1;
    const int li = lane & (L - 1), kps = AD_THREADS / L, kq = tid / L;
    /* the row's position and sequence (copied from the host before a step's first kernel, so read before the
     * wait): independent loads, both in flight at once */
    const int pos = __ldcg(a.row_pos + r);
    const long long seq = __ldcg(a.row_seq + r);
    const int n_keys = pos + 1, chunk = ad_chunk(n_keys, a.n_split, kps);
    const int n_active = (n_keys + chunk - 1) / chunk;
    const int k0 = split * chunk, k1 = min(n_keys, k0 + chunk);
    const __half *kbase = a.k_cache + seq * a.seq_stride + kvh * hd;
    const __half *vbase = a.v_cache + seq * a.seq_stride + kvh * hd;
    if (pos >= 0) /* the first sub-chunk's K and V rows into L2 while the kernel before runs (the newest key's
                   * lines too: L2 is where its append lands) */
        for (int i = tid, nl = (hd + 63) / 64; i < 2 * nl * min(AD_SUB, k1 - k0); i += AD_THREADS) {
            const int kk = i / (2 * nl), l = i - kk * 2 * nl; /* key k0 + kk, line l of its K row then its V row */
            prefetch_l2((l < nl ? kbase : vbase) + (long long)(k0 + kk) * a.kv_dim + 64 * (l % nl)); /* 64 halves a line */
        }
    pdl_wait_then_trigger();
    if (pos < 0) { /* a padding row: zeros, nothing read */
        if (split == 0)
            for (int i = tid; i < Gb * hd; i += AD_THREADS) attn_put(a, r, h0 * hd + i, 0.0f);
        return;
    }
    if (k0 >= k1) return; /* an idle split (every split past the context's n_active) */

    float q[MG][8], acc[MG][8];
#pragma unroll
    for (int g = 0; g < MG; g++)
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int d = 8 * li + e;
            /* q rounded to F16 first, as the reference's CPU attention takes it (kiln's CPU backend too) */
            const float qv = g < Gb && d < hd ? __ldcg(a.q + (long long)r * a.q_stride + (h0 + g) * hd + d) : 0.0f;
            q[g][e] = f16_round(qv) * a.scale;
            acc[g][e] = 0.0f;
        }
    if (tid < MG) m_sh[tid] = -INFINITY, l_sh[tid] = 0.0f;
    /* a row of up to AD_MIN_CHUNK keys (every short context) has them all in one block and one pass, whatever
     * the split count: its softmax is whole before the V sum, so its probabilities are normalized and rounded to
     * F16 first, as the reference's CPU attention (and kiln's CPU backend) round them. A longer row is not
     * (a split row cannot without a second pass), so that a row's result never depends on its batch's split */
    const bool whole = n_keys <= AD_MIN_CHUNK;

    for (int kb = k0; kb < k1; kb += AD_SUB) {
        const int n = min(AD_SUB, k1 - kb);
        /* scores: a group of L lanes per key, the group's partial dot products added by shuffles */
#pragma unroll 4
        for (int st = 0; st * kps < n; st++) {
            const int kk = st * kps + kq;
            const bool ok = kk < n;
            float kf[8];
            load8<VEC>(kbase + (long long)(kb + (ok ? kk : 0)) * a.kv_dim, li, hd, kf);
            float s[MG];
#pragma unroll
            for (int g = 0; g < MG; g++) {
                s[g] = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) s[g] = fmaf(q[g][e], kf[e], s[g]);
            }
            for (int o = L >> 1; o > 0; o >>= 1)
#pragma unroll
                for (int g = 0; g < MG; g++) s[g] += __shfl_xor_sync(0xFFFFFFFFu, s[g], o);
            if (ok && li == 0)
#pragma unroll
                for (int g = 0; g < MG; g++) sc[g][kk] = s[g];
        }
        __syncthreads();
        /* online softmax: a warp per head */
        for (int g = warp; g < Gb; g += AD_WARPS) {
            float mx = -INFINITY;
            for (int j = lane; j < n; j += 32) mx = fmaxf(mx, sc[g][j]);
            const float m_old = m_sh[g], m_new = fmaxf(m_old, warp_max(mx));
            float sum = 0.0f;
            for (int j = lane; j < n; j += 32) {
                const float e = __expf(sc[g][j] - m_new);
                sc[g][j] = e;
                sum += e;
            }
            sum = warp_sum(sum);
            if (whole) {
                const float inv = 1.0f / sum;
                for (int j = lane; j < n; j += 32) sc[g][j] = f16_round(sc[g][j] * inv);
            }
            if (lane == 0) {
                const float alpha = __expf(m_old - m_new);
                l_sh[g] = l_sh[g] * alpha + sum;
                m_sh[g] = m_new;
                al_sh[g] = alpha;
            }
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < MG; g++) {
            const float al = g < Gb ? al_sh[g] : 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[g][e] *= al;
        }
#pragma unroll 4
        for (int st = 0; st * kps < n; st++) { /* every load unconditional (key 0 past the end, weight 0) */
            const int kk = st * kps + kq;
            const bool ok = kk < n;
            float vf[8];
            load8<VEC>(vbase + (long long)(kb + (ok ? kk : 0)) * a.kv_dim, li, hd, vf);
#pragma unroll
            for (int g = 0; g < MG; g++) {
                const float p = ok && g < Gb ? sc[g][kk] : 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) acc[g][e] = fmaf(p, vf[e], acc[g][e]);
            }
        }
        __syncthreads();
    }

    /* the key groups of a warp by shuffles, each warp's sums to red[warp], then every element as the sum over
     * the warps in order (deterministic) */
    for (int o = L; o < 32; o <<= 1)
#pragma unroll
        for (int g = 0; g < MG; g++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[g][e] += __shfl_xor_sync(0xFFFFFFFFu, acc[g][e], o);
    if (lane < L)
#pragma unroll
        for (int g = 0; g < MG; g++)
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int d = 8 * li + e;
                if (g < Gb && d < hd) red[warp][g * hd + d] = acc[g][e];
            }
    __syncthreads();
    const int stride = hd + 2;
    float *part = a.part + ((long long)r * a.n_split + split) * a.n_head * stride;
    for (int i = tid; i < Gb * hd; i += AD_THREADS) {
        float v = red[0][i];
#pragma unroll
        for (int w = 1; w < AD_WARPS; w++) v += red[w][i];
        const int g = i / hd, d = i - g * hd;
        if (n_active == 1) attn_put(a, r, h0 * hd + i, whole ? v : v / l_sh[g]);
        else part[(h0 + g) * stride + d] = v;
    }
    if (n_active == 1) return;
    if (tid < Gb) part[(h0 + tid) * stride + hd] = m_sh[tid], part[(h0 + tid) * stride + hd + 1] = l_sh[tid];
    __threadfence();
    __syncthreads();
    unsigned *cnt = a.counters + (long long)r * gridDim.y + gi;
    if (tid == 0) is_last = atomicAdd(cnt, 1u) == (unsigned)n_active - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    attn_combine<MG>(a, r, h0, Gb, n_active, wsm);
    if (tid == 0) *cnt = 0;
}

/* ------------------------------------------------------------------ prefill */

#define ATT_THREADS 64
#define ATT_MAX_D CK_ATT_MAX_D /* head_dim <= 256 */

/* Token t of one sequence (position pos0 + t) for KV head kvh over all its keys 0..pos0+t, by the block's
 * ATT_THREADS threads: a key per thread for the scores, its V row into shared memory, online softmax per 64
 * keys, the normalised output as half. */
__global__ void __launch_bounds__(ATT_THREADS) k_attention(const __grid_constant__ attn_args a) {
    constexpr int MG = CK_ATT_MAX_G;
    __shared__ float qs[MG * 256];
    __shared__ float ps[MG][ATT_THREADS];
    __shared__ float m_sh[MG], l_sh[MG], alpha_sh[MG];
    __shared__ __align__(16) __half vs[ATT_THREADS * 256];
    pdl_wait_then_trigger();
    const int kvh = blockIdx.y, t = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hd = a.head_dim, G = a.n_head / a.n_head_kv;
    for (int i = tid; i < G * hd; i += ATT_THREADS) {
        const int g = i / hd, d = i - g * hd;
        qs[i] = __ldcg(a.q + (long long)t * a.q_stride + (kvh * G + g) * hd + d) * a.scale;
    }
    const int k_end = a.pos0 + t + 1;
    if (tid < MG) m_sh[tid] = -INFINITY, l_sh[tid] = 0.0f;
    float acc[MG][ATT_MAX_D];
#pragma unroll
    for (int g = 0; g < MG; g++)
#pragma unroll
        for (int c = 0; c < ATT_MAX_D; c++) acc[g][c] = 0.0f;
    __syncthreads();
    for (int kb = 0; kb < k_end; kb += ATT_THREADS) {
        const int j = kb + tid;
        float sc[MG];
#pragma unroll
        for (int g = 0; g < MG; g++) sc[g] = 0.0f;
        if (j < k_end) {
            const __half *kr = a.k_cache + (long long)j * a.kv_dim + kvh * hd;
            const __half *vr = a.v_cache + (long long)j * a.kv_dim + kvh * hd;
            if ((hd & 7) == 0) { /* 16-byte pieces, 8 of a K and a V row in flight together */
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
                            for (int g = 0; g < MG; g++)
                                if (g < G) sc[g] += qs[g * hd + d] * kk.x + qs[g * hd + d + 1] * kk.y;
                        }
                        *(uint4 *)&vs[tid * hd + d0 + 8 * c] = vv[c];
                    }
                }
            } else {
                for (int d = 0; d < hd; d += 2) {
                    const float2 kk = __half22float2(*(const __half2 *)(kr + d));
#pragma unroll
                    for (int g = 0; g < MG; g++)
                        if (g < G) sc[g] += qs[g * hd + d] * kk.x + qs[g * hd + d + 1] * kk.y;
                    *(__half2 *)&vs[tid * hd + d] = *(const __half2 *)(vr + d);
                }
            }
#pragma unroll
            for (int g = 0; g < MG; g++)
                if (g < G) ps[g][tid] = sc[g];
        } else {
#pragma unroll
            for (int g = 0; g < MG; g++)
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
        for (int g = 0; g < MG; g++)
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
                    for (int g = 0; g < MG; g++)
                        if (g < G) acc[g][c] += ps[g][jj] * vv;
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int g = 0; g < MG; g++) {
        if (g >= G) break;
        const int h = kvh * G + g;
        const float inv = 1.0f / l_sh[g];
#pragma unroll
        for (int c = 0; c < ATT_MAX_D; c++) {
            const int d = tid + ATT_THREADS * c;
            if (d < hd) a.out[(long long)t * a.out_stride + h * hd + d] = __float2half(acc[g][c] * inv);
        }
    }
}

/* ------------------------------------------------------------------ prefill on the tensor cores */

#define FA_ROWS 64   /* tokens of a block: 4 warps of 16 */
#define FA_KEYS 64   /* keys of a tile */
#define FA_THREADS 128
static_assert(FA_ROWS <= FA_KEYS, "Q is staged through Ks");

/* Prefill attention for head_dim HD (64 or 128): block (x, h) computes tokens 64 x .. 64 x + 63 (of n_tok, at
 * positions pos0 + t, all of one sequence) of query head h over keys 0 .. pos0 + t, flash-attention style. Q
 * (scaled, as halves) stays in registers as mma A fragments; per tile of 64 keys K and V arrive in shared memory
 * by cp.async (keys past the block's last position zero-filled: never read from the cache), each warp computes
 * its 16 x 64 scores S = Q K^T, masks the keys past each row's position, updates its rows' running maximum and
 * sum (online softmax; the probabilities as halves, which the tensor cores then read as A fragments straight from
 * the score registers), and O += P V with V's B fragments by transposed ldmatrix. O / sum to out as halves. */
template <int HD>
__global__ void __launch_bounds__(FA_THREADS) k_attn_prefill(const __grid_constant__ attn_args a, int n_tok) {
    constexpr int LD = HD + 8; /* halves: 16-byte row groups of an ldmatrix phase in distinct banks */
    __shared__ __align__(16) __half Ks[FA_KEYS][LD];
    __shared__ __align__(16) __half Vs[FA_KEYS][LD];
    pdl_wait_then_trigger();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q4 = lane & 3;
    const int h = blockIdx.y, kvh = h / (a.n_head / a.n_head_kv), m0 = blockIdx.x * FA_ROWS;
    const int rows = min(FA_ROWS, n_tok - m0);

    /* Q of the block's rows, scaled, through Ks into this warp's A fragments (rows past n_tok: zeros) */
    for (int i = tid; i < FA_ROWS * HD / 2; i += FA_THREADS) {
        const int r = i / (HD / 2), d = 2 * (i % (HD / 2));
        float x0 = 0.0f, x1 = 0.0f;
        if (r < rows) {
            const float *qp = a.q + (long long)(m0 + r) * a.q_stride + h * HD + d;
            x0 = __ldcg(qp) * a.scale, x1 = __ldcg(qp + 1) * a.scale;
        }
        *(__half2 *)&Ks[r][d] = __floats2half2_rn(x0, x1);
    }
    __syncthreads();
    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) ldsm_x4(qf[kk], &Ks[16 * warp + (lane & 15)][16 * kk + 8 * (lane >> 4)]);

    float o[HD / 8][4];
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f}; /* rows g and g + 8: max, this lane's sum */
    const int pos_g = a.pos0 + m0 + 16 * warp + g;                 /* position of row g (g + 8: + 8) */
    const int k_last = a.pos0 + m0 + rows - 1;                      /* the last key of the block's last row */
    for (int kb = 0; kb <= k_last; kb += FA_KEYS) {
        __syncthreads(); /* every warp is done with the tile before (and with Q in Ks) */
        for (int i = tid; i < FA_KEYS * HD / 8; i += FA_THREADS) {
            const int r = i / (HD / 8), c = 8 * (i % (HD / 8)), j = kb + r;
            const bool ok = j <= k_last;
            const long long off = (long long)(ok ? j : 0) * a.kv_dim + kvh * HD + c;
            cp_async16(&Ks[r][c], a.k_cache + off, ok);
            cp_async16(&Vs[r][c], a.v_cache + off, ok);
        }
        asm volatile("cp.async.commit_group;\n\tcp.async.wait_all;" ::: "memory");
        __syncthreads();

        float sc[FA_KEYS / 8][4]; /* S: 8 tiles of 8 keys; rows g (0, 1) and g + 8 (2, 3), keys 2 q4, + 1 */
#pragma unroll
        for (int nt = 0; nt < FA_KEYS / 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int np = 0; np < FA_KEYS / 16; np++) {
                uint32_t r[4];
                ldsm_x4(r, &Ks[16 * np + (lane & 7) + 8 * (lane >> 4)][16 * kk + 8 * ((lane >> 3) & 1)]);
                mma_16816(sc[2 * np], qf[kk], r[0], r[1]);
                mma_16816(sc[2 * np + 1], qf[kk], r[2], r[3]);
            }

        float mx[2] = {mrow[0], mrow[1]};
#pragma unroll
        for (int nt = 0; nt < FA_KEYS / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = kb + 8 * nt + 2 * q4 + (e & 1);
                if (key > pos_g + 8 * (e >> 1)) sc[nt][e] = -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], sc[nt][e]);
            }
        float alpha[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 2));
            alpha[i] = __expf(mrow[i] - mx[i]); /* the first tile: exp(-inf) = 0 (key 0 is every row's) */
            mrow[i] = mx[i];
            lrow[i] *= alpha[i];
        }
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[nt][e] *= alpha[e >> 1];

        /* O += P V, 16 keys a step: P's A fragment from the score tiles 2 kp and 2 kp + 1 */
#pragma unroll
        for (int kp = 0; kp < FA_KEYS / 16; kp++) {
            float p[8];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p[e] = __expf(sc[2 * kp][e] - mx[e >> 1]);
                p[4 + e] = __expf(sc[2 * kp + 1][e] - mx[e >> 1]);
                lrow[e >> 1] += p[e] + p[4 + e];
            }
            const __half2 h0 = __floats2half2_rn(p[0], p[1]), h1 = __floats2half2_rn(p[2], p[3]);
            const __half2 h2 = __floats2half2_rn(p[4], p[5]), h3 = __floats2half2_rn(p[6], p[7]);
            const uint32_t pa[4] = {*(const uint32_t *)&h0, *(const uint32_t *)&h1, *(const uint32_t *)&h2,
                                    *(const uint32_t *)&h3};
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t r[4];
                ldsm_x4_trans(r, &Vs[16 * kp + (lane & 7) + 8 * ((lane >> 3) & 1)][16 * dp + 8 * (lane >> 4)]);
                mma_16816(o[2 * dp], pa, r[0], r[1]);
                mma_16816(o[2 * dp + 1], pa, r[2], r[3]);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        lrow[i] += __shfl_xor_sync(0xFFFFFFFFu, lrow[i], 1);
        lrow[i] += __shfl_xor_sync(0xFFFFFFFFu, lrow[i], 2);
        const int t = m0 + 16 * warp + g + 8 * i;
        if (t >= n_tok) continue;
        const float inv = 1.0f / lrow[i];
        __half *dst = a.out + (long long)t * a.out_stride + h * HD + 2 * q4;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++)
            *(__half2 *)(dst + 8 * nt) = __floats2half2_rn(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
    }
}

/* ------------------------------------------------------------------ table and launchers */

#define AD_ENTRY(MG, VEC) {(const void *)k_attn_decode<MG, VEC>, "attn_decode<" #MG "," #VEC ">"},
static const struct {
    const void *fn;
    const char *name;
} attn_table[] = {
    AD_ENTRY(AD_HEADS_PER_BLOCK, true) AD_ENTRY(AD_HEADS_PER_BLOCK, false)
    {(const void *)k_attention, "attention"},
    {(const void *)k_attn_prefill<64>, "attn_prefill<64>"},
    {(const void *)k_attn_prefill<128>, "attn_prefill<128>"},
};
#define N_ATTN ((int)(sizeof attn_table / sizeof attn_table[0]))
int ck_attn_kernel_count(void) { return N_ATTN; }
const void *ck_attn_kernel_at(int i) { return attn_table[i].fn; }
const char *ck_attn_kernel_name(int i) { return attn_table[i].name; }

/* Blocks of a decode row for each split: a KV head's G query heads in groups of at most AD_HEADS_PER_BLOCK. */
static int attn_groups(int n_head, int n_head_kv) {
    const int G = n_head / n_head_kv, hb = G < AD_HEADS_PER_BLOCK ? G : AD_HEADS_PER_BLOCK;
    return n_head_kv * ((G + hb - 1) / hb);
}

int ck_attn_splits(int n_rows, int n_head, int n_head_kv, int n_ctx, int n_sm) {
    const int blocks = n_rows * attn_groups(n_head, n_head_kv);
    int s = (4 * n_sm + blocks - 1) / blocks;
    if (s > AD_MAX_SPLIT) s = AD_MAX_SPLIT;
    if (s > (n_ctx + AD_MIN_CHUNK - 1) / AD_MIN_CHUNK) s = (n_ctx + AD_MIN_CHUNK - 1) / AD_MIN_CHUNK; /* never used */
    return s < 1 ? 1 : s;
}

void ck_attention(const attn_args &a, int n_tok, cudaStream_t st) {
    const dim3 fa_grid((unsigned)((n_tok + FA_ROWS - 1) / FA_ROWS), (unsigned)a.n_head);
    if (a.head_dim == 64)
        launch(k_attn_prefill<64>, fa_grid, dim3(FA_THREADS), 0, st, true, a, n_tok);
    else if (a.head_dim == 128)
        launch(k_attn_prefill<128>, fa_grid, dim3(FA_THREADS), 0, st, true, a, n_tok);
    else
        launch(k_attention, dim3(1, a.n_head_kv, n_tok), dim3(ATT_THREADS), 0, st, true, a);
}

void ck_attn_decode(const attn_args &a, int n_rows, cudaStream_t st) {
    const dim3 grid(a.n_split, attn_groups(a.n_head, a.n_head_kv), n_rows), block(AD_THREADS);
    if (a.head_dim % 8 == 0) launch(k_attn_decode<AD_HEADS_PER_BLOCK, true>, grid, block, 0, st, true, a);
    else launch(k_attn_decode<AD_HEADS_PER_BLOCK, false>, grid, block, 0, st, true, a);
}
