/*
 * cuda_moe.cu — the mixture-of-experts feed-forward on the CUDA backend (see cuda_moe.cuh), its kernels
 * templated on the weight type (every type the dense kernels read):
 *   k_moe_route<T>    RMSNorm of the row (its blocks store it for the experts, a share each: as floats, as 8-bit
 *                     blocks for the per-row gate_up of the 8-bit input types, and as half for the grouped GEMMs),
 *                     the router matvec (one warp per expert); the last block of a row to finish does softmax,
 *                     top-k and renormalization
 * the per-row path:
 *   k_moe_gate_up<T>  one warp per (chosen slot, hidden row): h = silu(gate . xn) * (up . xn), the expert's rows
 *                     found from the id in device memory; for the types ck_q8_input names, xn's 8-bit blocks
 *                     (quantized once by the route kernel) dotted with dp4a, as the dense decode matvec does;
 *                     for a block-quantized down matrix the block's 8 values of h also as 8-bit levels
 *   k_moe_down<T>     MOE_DOWN_SPLIT warps per output row: sum over the chosen slots of weight * (down row . h),
 *                     added to the residual; h's 8-bit levels dotted with dp4a where gate_up wrote them
 * the grouped path (after the same route):
 *   k_moe_group       one block: the (row, slot) entries sorted by expert (stable), offsets, list, positions
 *   k_moe_gemm<T>     gemm_tile (cuda_gemm.cuh) over expert blockIdx.z's entries: gate and up, or down
 *   k_moe_combine     x[row] += sum over slots j in order of wts[row, j] * y[pos(row, j)]
 * Float inputs are staged in shared memory in the matvec's transposed layout (value i of unit u at i * nup + u,
 * nup odd: the lanes of a warp reading value i of 32 consecutive units hit 32 banks); 8-bit ones as bytes in order.
 * The 8-bit h has a scale per 8 values (one gate_up block's warps): h's levels need no second pass over it, and
 * its blocks are finer than the 32 of xn's (the reference engine's are 32).
 */
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_gemm.cuh"

#include <string.h>

#include <utility>

#define MOE_THREADS 256
#define MOE_WARPS (MOE_THREADS / 32)
static_assert(16 % MOE_WARPS == 0, "a gate_up block's rows lie in one slot's F padded to 16");
#define MOE_MAX_EXPERT 512 /* the model layer's limit (llama.cpp's LLAMA_MAX_EXPERTS) */
#define MOE_MAX_USED 64
#define MOE_GROUP_THREADS 1024
#define MOE_GROUP_WARPS (MOE_GROUP_THREADS / 32)
#define MOE_MAX_ENTRIES 65535 /* rows * k of one grouped launch: the group kernel's 16-bit counts, grid.y */
#define MOE_ROUTE_UN 4 /* router units a lane keeps in flight (the router is small and F32: latency, not bytes) */
/* gate_up: units of each matrix a lane keeps in flight (at most 2; Q6_K, whose conversion needs more registers, 1),
 * in at most 64 registers (4 blocks an SM). Against 4 units at 97 registers (2 blocks an SM: 768 blocks for
 * qwen3-30b-a3b took 2.9 waves) the Q4_K kernel went from 14.3 to 12.1 us on the H200 (bench/RESULTS.md, "MoE
 * decode on 8-bit h"). */
template <int T> static __host__ __device__ constexpr int moe_gate_up_units() {
    return T == CK_Q6_K ? 1 : mv_units<T>() < 2 ? mv_units<T>() : 2;
}
/* The down kernel's warps per output row (each over 1 / MOE_DOWN_SPLIT of the chosen slots' units) and output
 * rows per block. */
#define MOE_DOWN_SPLIT 2
#define MOE_DOWN_ROWS (MOE_WARPS / MOE_DOWN_SPLIT)
/* ggml clamps the sum of the chosen weights to the smallest normal F16 before dividing by it */
#define MOE_MIN_WEIGHT_SUM 6.103515625e-5f

/* The arguments of the three kernels (w0: router / gate / down, w1: up). */
struct moe_args {
    dev_weight w0, w1;
    const float *x;       /* (rows, E) the residual stream: the route kernel's input */
    float *xres;          /* (rows, E) the same rows: the down kernel adds to them */
    const float *norm_w;
    float eps;
    int E, n_expert, k, F;
    int norm_topk;
    float *xn, *probs, *wts, *h; /* h: gate_up writes it as floats for every type (the float down's input; the
                                  * test reads it back), and with hq as 8-bit levels too */
    int8_t *xq;           /* route -> gate_up, the per-row path of 8-bit input types: xn's levels (rows, E), or NULL */
    float *xqm;           /* their blocks' (amax, level sum) pairs (rows, E / 32) */
    int8_t *hq;           /* gate_up -> down, the per-row path of block-quantized down types: h's levels (rows, k,
                           * fp = F rounded up to 16; the padding 0), or NULL */
    float *hqm;           /* their 8-value blocks' (d, d * level sum) pairs (rows, k, fp / 8) */
    int *ids;
    unsigned *counter;
    /* the grouped path */
    int n_rows, epad;
    __half *xh;           /* route: xn as half (rows, epad), or NULL (the per-row path) */
    int *offsets, *list, *pos;
    const float *y;       /* combine: (entries, E) */
};

static __device__ __forceinline__ int xs_at(int k, int nup) { return (k & 15) * nup + (k >> 4); }

/* Lines first, first + step, ... (of 128 bytes) of row r0 of w0 and (r1 >= 0) row r1 of w1 into L2. */
static __device__ __forceinline__ void prefetch_rows(const dev_weight &w0, const dev_weight &w1, int r0, int r1,
                                                     int first, int step) {
    for (long long off = 128LL * first; off < w0.row_bytes; off += 128LL * step) {
        prefetch_l2(w0.q + (long long)r0 * w0.row_bytes + off);
        if (r1 >= 0) prefetch_l2(w1.q + (long long)r1 * w1.row_bytes + off);
    }
}

/* A chosen slot's F hidden values padded to whole 16-value units (the padding 0): their stride in h's 8-bit
 * levels and in the down kernel's staged input; a multiple of MOE_WARPS, so a gate_up block's rows are one slot's. */
static inline __host__ __device__ int moe_fp(int F) { return (F + 15) & ~15; }

/* Floats of xs the transposed layout of n values needs. */
static inline __host__ __device__ int xs_floats(int n) { return 16 * (((n + 15) >> 4) | 1); }

static __device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

/* How units_dot's input is staged: floats (transposed), 8-bit levels with a (d, s) pair per 32 values (xn, from
 * the route kernel), or 8-bit levels with a pair per 8 values (h, from gate_up). */
enum { MOE_IN_FLOAT, MOE_IN_Q8, MOE_IN_Q8_8 };

/* Block-quantized types: the down kernel takes h as 8-bit levels (every type with a bytes16 form). */
static inline __host__ __device__ constexpr bool moe_q8_hidden(int t) { return t != CK_F32 && t != CK_F16 && t != CK_BF16; }

/* Unit k0 / 16 of raw weight r as signed bytes w with its scale s and minimum b (convert16_q8), and 8-bit input
 * unit t's 16 levels (bytes in order at xs, 16 a unit). */
template <int T>
static __device__ __forceinline__ int4 unit_q8_operands(const raw16<T> &r, int k0, const float *xs, int t, uint32_t w[4],
                                                        float &s, float &b) {
    convert16_q8<T>(r, k0, w, s, b);
    return ((const int4 *)xs)[t];
}

/* The dot product of unit k0 / 16 of raw weight r with 8-bit input unit t (each 32-value block's (d, s) pair at
 * xs + 4 * n_units): integer sums of bytes (dp4a), a minimum once per block, with its first unit. */
template <int T>
static __device__ __forceinline__ float unit_dot_q8(const raw16<T> &r, int k0, const float *xs, int n_units, int t) {
    uint32_t w[4];
    float s, b;
    const int4 xq = unit_q8_operands<T>(r, k0, xs, t, w, s, b);
    const float2 ds = ((const float2 *)(xs + 4 * n_units))[t >> 1];
    return fmaf(s * ds.x, (float)dot16_q8(w, xq), ck_has_min(T) && !(t & 1) ? b * ds.y : 0.0f);
}

/* The same against 8-bit input unit t with a (d, s) pair per 8 values (levels at xs, 16 bytes a unit; the unit's
 * two pairs as one float4, sd units of 16 bytes after its levels): the two halves' integer sums scaled apart. */
template <int T>
static __device__ __forceinline__ float unit_dot_q8_8(const raw16<T> &r, int k0, const float *xs, int sd, int t) {
    uint32_t w[4];
    float s, b;
    const int4 xq = unit_q8_operands<T>(r, k0, xs, t, w, s, b);
    const float4 ds = ((const float4 *)xs)[sd + t];
    const int ia = __dp4a((int)w[1], xq.y, __dp4a((int)w[0], xq.x, 0));
    const int ib = __dp4a((int)w[3], xq.w, __dp4a((int)w[2], xq.z, 0));
    const float c = s * fmaf(ds.x, (float)ia, ds.z * (float)ib);
    return ck_has_min(T) ? fmaf(b, ds.y + ds.w, c) : c;
}

/* The same against float inputs staged in the transposed layout (value i of the unit at xp[i * nup]). */
template <int T>
static __device__ __forceinline__ float unit_dot_float(const raw16<T> &r, int k0, const float *xp, int nup) {
    float v[16], s, b, d = 0.0f, sx = 0.0f;
    convert16<T>(r, k0, v, s, b);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const float xv = xp[i * nup];
        d = fmaf(v[i], xv, d);
        if constexpr (ck_has_min(T)) sx += xv;
    }
    float c = s * d;
    if constexpr (ck_has_min(T)) c += b * sx;
    return c;
}

/* This lane's share of dot products against the input staged in xs as IN says (MOE_IN_Q8 / MOE_IN_Q8_8: as
 * unit_dot_q8 / unit_dot_q8_8 read it, nup being the latter's sd; MOE_IN_FLOAT: transposed with stride nup):
 * units t = lane, lane + 32, ... < n_units, unit t being unit uw of row `row` of w0 (and, DUAL, of the same row
 * of w1; not with MOE_IN_Q8_8), its product scaled by wt, as map(t, row, uw, wt) says. UN units of each
 * matrix in flight per lane, every load unconditional (t clamped to a valid unit, the result dropped). acc0 /
 * acc1 are added to, not reduced. */
template <int T, bool DUAL, int IN, int UN = mv_units<T>(), class Map>
static __device__ __forceinline__ void units_dot(const dev_weight &w0, const dev_weight &w1, const float *xs, int nup,
                                                 int n_units, int lane, Map map, float &acc0, float &acc1) {
    static_assert(!(DUAL && IN == MOE_IN_Q8_8), "h's 8-bit levels feed one matrix (down)");
    constexpr int UD = DUAL ? UN : 1;
    for (int t0 = lane; t0 < n_units; t0 += 32 * UN) {
        raw16<T> ra[UN], rb[UD];
        int uw[UN];
        float wt[UN];
#pragma unroll
        for (int k = 0; k < UN; k++) {
            const int t = t0 + 32 * k, tc = t < n_units ? t : t0;
            int row;
            map(tc, row, uw[k], wt[k]);
            load16<T>(w0, row, 16 * uw[k], ra[k]);
            if constexpr (DUAL) load16<T>(w1, row, 16 * uw[k], rb[k]);
        }
#pragma unroll
        for (int k = 0; k < UN; k++) {
            const int t = t0 + 32 * k, tc = t < n_units ? t : t0;
            const bool ok = t < n_units;
            float c0, c1 = 0.0f;
            if constexpr (IN == MOE_IN_Q8) {
                c0 = unit_dot_q8<T>(ra[k], 16 * uw[k], xs, n_units, tc);
                if constexpr (DUAL) c1 = unit_dot_q8<T>(rb[k], 16 * uw[k], xs, n_units, tc);
            } else if constexpr (IN == MOE_IN_Q8_8) {
                c0 = unit_dot_q8_8<T>(ra[k], 16 * uw[k], xs, nup, tc);
            } else {
                c0 = unit_dot_float<T>(ra[k], 16 * uw[k], xs + tc, nup);
                if constexpr (DUAL) c1 = unit_dot_float<T>(rb[k], 16 * uw[k], xs + tc, nup);
            }
            acc0 += ok ? wt[k] * c0 : 0.0f;
            if constexpr (DUAL) acc1 += ok ? wt[k] * c1 : 0.0f;
        }
    }
}

/* The routing of one row by one warp: probs holds the router logits; softmax over the experts (max, exp, a
 * double sum, times 1/sum as the CPU does), then k rounds of argmax over the experts not yet taken (the larger
 * probability, the lower id on ties), then the renormalization of the chosen weights (a double sum in the
 * order of the choice, clamped below). PL: experts per lane, n_expert <= 32 * PL. */
template <int PL>
static __device__ void route_row(const moe_args &a, int row, int lane) {
    const int X = a.n_expert, K = a.k;
    float *pr = a.probs + (long long)row * X;
    float p[PL];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PL; i++) {
        const int e = lane + 32 * i;
        p[i] = e < X ? __ldcg(pr + e) : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    mx = warp_max(mx);
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < PL; i++)
        if (lane + 32 * i < X) p[i] = expf(p[i] - mx), sum += p[i];
    const float inv = (float)(1.0 / warp_sum_d(sum));
#pragma unroll
    for (int i = 0; i < PL; i++) {
        const int e = lane + 32 * i;
        if (e < X) p[i] *= inv, pr[e] = p[i];
    }
    /* k rounds of one warp maximum of the probabilities as unsigned keys (a probability's bits + 1: floats >= +0
     * order as their bits; 0: taken or past the experts), then one warp minimum of the ids holding it */
    unsigned key[PL];
#pragma unroll
    for (int i = 0; i < PL; i++) key[i] = lane + 32 * i < X ? __float_as_uint(p[i]) + 1u : 0u;
    /* choice j is kept by lane j % 32 (K <= 64), and the sum of the chosen weights (in the order of the choice)
     * by every lane, so that the renormalization and the stores happen in parallel */
    int id0 = 0, id1 = 0;
    float w0 = 0.0f, w1 = 0.0f;
    double acc = 0.0;
    for (int j = 0; j < K; j++) {
        unsigned bk = 0;
#pragma unroll
        for (int i = 0; i < PL; i++) bk = max(bk, key[i]);
        bk = __reduce_max_sync(0xFFFFFFFFu, bk);
        int bi = 0x7FFFFFFF;
#pragma unroll
        for (int i = PL - 1; i >= 0; i--)
            if (key[i] == bk) bi = lane + 32 * i; /* this lane's lowest id with the key */
        bi = __reduce_min_sync(0xFFFFFFFFu, bi);
#pragma unroll
        for (int i = 0; i < PL; i++)
            if (lane + 32 * i == bi) key[i] = 0; /* taken */
        const float wv = __uint_as_float(bk - 1u);
        acc += wv;
        if (j == lane) id0 = bi, w0 = wv;
        else if (j == lane + 32) id1 = bi, w1 = wv;
    }
    float s = (float)acc;
    if (s < MOE_MIN_WEIGHT_SUM) s = MOE_MIN_WEIGHT_SUM;
    int *ids = a.ids + (long long)row * K;
    float *w = a.wts + (long long)row * K;
    if (lane < K) ids[lane] = id0, w[lane] = a.norm_topk ? w0 / s : w0;
    if (lane + 32 < K) ids[lane + 32] = id1, w[lane + 32] = a.norm_topk ? w1 / s : w1;
}

/* Grid (ceil(n_expert / MOE_WARPS), rows): RMSNorm of the row into shared memory (the row's blocks also store
 * it in xn, a share each), one warp per router row, then the last block of the row routes it and resets its
 * counter. */
template <int T>
__global__ void __launch_bounds__(MOE_THREADS) k_moe_route(const __grid_constant__ moe_args a) {
    extern __shared__ float xs[];
    __shared__ float red[MOE_WARPS];
    __shared__ int last;
    const int row = blockIdx.y, E = a.E, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (row == 0) /* the router does not depend on the kernel before (the other rows read it from L2) */
        for (int e = blockIdx.x * MOE_WARPS + warp; e < a.n_expert; e += gridDim.x * MOE_WARPS)
            prefetch_rows(a.w0, a.w0, e, -1, lane, 32);
    pdl_wait_then_trigger();
    const int nu = (E + 15) >> 4, nup = nu | 1;
    const float *x = a.x + (long long)row * E;
    float ss = 0.0f;
    for (int i = tid; i < E; i += MOE_THREADS) {
        const float v = __ldcg(x + i);
        ss += v * v;
    }
    const float scale = 1.0f / sqrtf(block_sum(ss, red) / (float)E + a.eps);
    /* the row's blocks share the stores for the experts: block b those of values i with (i / 32) % blocks == b
     * (a warp's 32 values; with xq, E is a multiple of 32: they are one 8-bit block) */
    for (int i = tid; i < 16 * nu; i += MOE_THREADS) {
        const float v = i < E ? __ldcg(x + i) * scale * a.norm_w[i] : 0.0f;
        xs[xs_at(i, nup)] = v;
        const bool mine = (i >> 5) % gridDim.x == blockIdx.x;
        if (mine && i < E) a.xn[(long long)row * E + i] = v;
        if (mine && a.xq && i < E) {
            float e = v;
            q8_levels<1, 32>(&e, a.xqm + 2 * ((long long)row * (E >> 5) + (i >> 5)));
            a.xq[(long long)row * E + i] = (int8_t)(int)e;
        }
    }
    __syncthreads();
    if (a.xh)
        for (int i = tid; i < a.epad; i += MOE_THREADS)
            if ((i >> 5) % gridDim.x == blockIdx.x)
                a.xh[(long long)row * a.epad + i] = __float2half(i < E ? xs[xs_at(i, nup)] : 0.0f);
    for (int e = blockIdx.x * MOE_WARPS + warp; e < a.n_expert; e += gridDim.x * MOE_WARPS) {
        float acc = 0.0f, none = 0.0f;
        units_dot<T, false, MOE_IN_FLOAT, MOE_ROUTE_UN>(a.w0, a.w0, xs, nup, nu, lane,
                                          [&](int t, int &r, int &uw, float &wt) { r = e, uw = t, wt = 1.0f; }, acc, none);
        acc = warp_sum(acc);
        if (lane == 0) a.probs[(long long)row * a.n_expert + e] = acc;
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(a.counter + row, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last || warp != 0) return;
    __threadfence();
    if (a.n_expert <= 128) route_row<4>(a, row, lane);
    else if (a.n_expert <= 256) route_row<8>(a, row, lane);
    else route_row<MOE_MAX_EXPERT / 32>(a, row, lane);
    if (lane == 0) a.counter[row] = 0;
}

/* Grid (k * fp / MOE_WARPS, rows), fp = F rounded up to 16: warp p computes hidden row r = p % fp of chosen slot
 * j = p / fp (rows r >= F are the padding: 0). With a.hq, the block's MOE_WARPS values (one slot's) also become
 * 8-bit levels with their (d, d * level sum) pair, for the down kernel. */
template <int T>
__global__ void __launch_bounds__(MOE_THREADS, 4) k_moe_gate_up(const __grid_constant__ moe_args a) {
    extern __shared__ float xs[];
    __shared__ float hv[MOE_WARPS];
    pdl_wait_then_trigger();
    const int row = blockIdx.y, E = a.E, F = a.F, K = a.k, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nu = (E + 15) >> 4, nup = nu | 1, fp = moe_fp(F);
    const int p = blockIdx.x * MOE_WARPS + warp, j = p / fp, r = p - j * fp;
    const bool live = r < F;
    const int e = min(max(__ldcg(a.ids + (long long)row * K + j), 0), a.n_expert - 1);
    const int wrow = e * F + min(r, F - 1);
    if (live) prefetch_rows(a.w0, a.w1, wrow, wrow, lane, 32); /* while the input is staged */
    constexpr bool Q8 = ck_q8_input(T); /* the route kernel wrote the 8-bit levels (E a multiple of 32) */
    if constexpr (Q8) {
        const int4 *q = (const int4 *)(a.xq + (long long)row * E);
        for (int i = tid; i < E / 16; i += MOE_THREADS) ((int4 *)xs)[i] = __ldcg(q + i);
        const float2 *m = (const float2 *)a.xqm + (long long)row * (E >> 5);
        for (int i = tid; i < E / 32; i += MOE_THREADS) {
            const float2 am = __ldcg(m + i);
            float d, sm;
            q8_block_scales<T>(am.x, am.y, d, sm);
            ((float2 *)(xs + E / 4))[i] = make_float2(d, sm);
        }
    } else {
        const float *xn = a.xn + (long long)row * E;
        for (int i = tid; i < 16 * nu; i += MOE_THREADS) xs[xs_at(i, nup)] = i < E ? __ldcg(xn + i) : 0.0f;
    }
    __syncthreads();
    float v = 0.0f;
    if (live) {
        float g = 0.0f, u = 0.0f;
        units_dot<T, true, Q8 ? MOE_IN_Q8 : MOE_IN_FLOAT, moe_gate_up_units<T>()>(
            a.w0, a.w1, xs, nup, nu, lane, [&](int t, int &rr, int &uw, float &wt) { rr = wrow, uw = t, wt = 1.0f; }, g, u);
        g = warp_sum(g);
        u = warp_sum(u);
        v = g / (1.0f + expf(-g)) * u;
        if (lane == 0) a.h[((long long)row * K + j) * F + r] = v;
    }
    if (!a.hq) return;
    if (lane == 0) hv[warp] = v;
    __syncthreads();
    if (warp != 0 || lane >= MOE_WARPS) return;
    float q = hv[lane], m[2] = {0.0f, 0.0f};
    q8_levels<1, MOE_WARPS>(&q, m);
    const long long at = ((long long)row * K + j) * fp + r + lane; /* the block's value `lane` (r: warp 0's row) */
    a.hq[at] = (int8_t)(int)q;
    if (lane == 0) {
        const float d = m[0] / 127.f;
        ((float2 *)a.hqm)[at / MOE_WARPS] = make_float2(d, d * m[1]);
    }
}

/* Grid (ceil(E / MOE_DOWN_ROWS), rows): output row c by MOE_DOWN_SPLIT warps, each over its share of the units of
 * the k chosen slots (each slot's hidden values a segment of F padded to whole units), their sums added in order
 * and to the residual. h: 8-bit levels where gate_up wrote them (a.hq), else floats. */
template <int T>
__global__ void __launch_bounds__(MOE_THREADS) k_moe_down(const __grid_constant__ moe_args a) {
    extern __shared__ float xs[];
    __shared__ int sid[MOE_MAX_USED];
    __shared__ float swt[MOE_MAX_USED];
    __shared__ float part[MOE_WARPS];
    const int row = blockIdx.y, E = a.E, F = a.F, K = a.k, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int fp = moe_fp(F), nue = fp >> 4, nu = K * nue, nup = nu | 1;
    const int share = warp % MOE_DOWN_SPLIT, c = blockIdx.x * MOE_DOWN_ROWS + warp / MOE_DOWN_SPLIT, cc = min(c, E - 1);
    const int t0 = nu * share / MOE_DOWN_SPLIT, t1 = nu * (share + 1) / MOE_DOWN_SPLIT; /* this warp's units */
    /* its rows of those experts into L2 while gate_up runs: the ids are the route kernel's, which completed
     * before gate_up passed its wait and let this grid launch (a stale id would only prefetch other rows) */
    for (int j = t0 / nue + lane; j <= (t1 - 1) / nue; j += 32)
        prefetch_rows(a.w0, a.w0, min(max(__ldcg(a.ids + (long long)row * K + j), 0), a.n_expert - 1) * E + cc, -1, 0, 1);
    pdl_wait_then_trigger();
    constexpr bool Q8 = moe_q8_hidden(T); /* the host sets a.hq exactly for these types */
    if constexpr (Q8) { /* levels: nu units of 16 bytes; pairs: 2 a unit, one float4 */
        const int4 *q = (const int4 *)(a.hq + (long long)row * K * fp);
        const float4 *m = (const float4 *)a.hqm + (long long)row * nu;
        for (int i = tid; i < nu; i += MOE_THREADS) {
            ((int4 *)xs)[i] = __ldcg(q + i);
            ((float4 *)xs)[nu + i] = __ldcg(m + i);
        }
    } else {
        const float *h = a.h + (long long)row * K * F;
        for (int i = tid; i < K * fp; i += MOE_THREADS) {
            const int j = i / fp, r = i - j * fp;
            xs[xs_at(i, nup)] = r < F ? __ldcg(h + (long long)j * F + r) : 0.0f;
        }
    }
    for (int j = tid; j < K; j += MOE_THREADS) {
        sid[j] = min(max(__ldcg(a.ids + (long long)row * K + j), 0), a.n_expert - 1);
        swt[j] = __ldcg(a.wts + (long long)row * K + j);
    }
    __syncthreads();
    float acc = 0.0f, none = 0.0f;
    auto map = [&](int t, int &rr, int &uw, float &wt) {
        const int u = t0 + t, j = u / nue;
        rr = sid[j] * E + cc, uw = u - j * nue, wt = swt[j];
    };
    if constexpr (Q8) units_dot<T, false, MOE_IN_Q8_8>(a.w0, a.w0, xs + 4 * t0, nu, t1 - t0, lane, map, acc, none);
    else units_dot<T, false, MOE_IN_FLOAT>(a.w0, a.w0, xs + t0, nup, t1 - t0, lane, map, acc, none);
    acc = warp_sum(acc);
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (share != 0 || lane != 0 || c >= E) return;
    for (int i = 1; i < MOE_DOWN_SPLIT; i++) acc += part[warp + i];
    a.xres[(long long)row * E + c] = __ldcg(a.xres + (long long)row * E + c) + acc;
}

/* ------------------------------------------------------------------ the grouped path */

/* The lanes of this warp whose entry has the same expert (e < 0: a lane past the end, grouped with those). */
static __device__ __forceinline__ unsigned same_expert(int e) { return __match_any_sync(0xFFFFFFFFu, e); }

/* One block of MOE_GROUP_THREADS: the n = n_rows * k entries (row, slot) (entry i = row * k + slot, expert
 * ids[i]) sorted by expert, stably: each warp takes a segment of consecutive entries, counts its experts
 * (hist[warp][e], then in place the count of e in the warps before), the experts' offsets are the exclusive
 * sum of their counts, and each warp walks its segment again placing entry i at offsets[e] + (e's entries of
 * the warps before) + (e's entries before i in this warp's segment). */
__global__ void __launch_bounds__(MOE_GROUP_THREADS) k_moe_group(const __grid_constant__ moe_args a) {
    __shared__ unsigned short hist[MOE_GROUP_WARPS * MOE_MAX_EXPERT];
    __shared__ int off[MOE_MAX_EXPERT + 1];
    pdl_wait_then_trigger();
    const int X = a.n_expert, K = a.k, n = a.n_rows * K, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int i = tid; i < MOE_GROUP_WARPS * X; i += MOE_GROUP_THREADS) hist[i] = 0;
    __syncthreads();
    const int seg = (n + MOE_GROUP_WARPS - 1) / MOE_GROUP_WARPS, b0 = warp * seg, b1 = min(n, b0 + seg);
    unsigned short *h = hist + warp * X;
    auto expert_of = [&](int i) { return i < b1 ? min(max(__ldcg(a.ids + i), 0), X - 1) : -1; };
    for (int c = b0; c < b1; c += 32) { /* warp-uniform bounds: every lane takes part in the match */
        const int i = c + lane, e = expert_of(i);
        const unsigned peers = same_expert(e);
        if (e >= 0 && lane == __ffs(peers) - 1) h[e] += (unsigned short)__popc(peers);
        __syncwarp();
    }
    __syncthreads();
    for (int e = tid; e < X; e += MOE_GROUP_THREADS) {
        int sum = 0;
        for (int w = 0; w < MOE_GROUP_WARPS; w++) {
            const int c = hist[w * X + e];
            hist[w * X + e] = (unsigned short)sum;
            sum += c;
        }
        off[e] = sum;
    }
    __syncthreads();
    if (warp == 0) { /* exclusive sum of the counts, 32 experts at a time */
        int carry = 0;
        for (int e0 = 0; e0 < X; e0 += 32) {
            const int e = e0 + lane, c = e < X ? off[e] : 0;
            int v = c;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int t = __shfl_up_sync(0xFFFFFFFFu, v, o);
                if (lane >= o) v += t;
            }
            if (e < X) off[e] = carry + v - c;
            carry += __shfl_sync(0xFFFFFFFFu, v, 31);
        }
        if (lane == 0) off[X] = carry;
    }
    __syncthreads();
    for (int c = b0; c < b1; c += 32) {
        const int i = c + lane, e = expert_of(i);
        const unsigned peers = same_expert(e);
        if (e >= 0) {
            const int p = off[e] + h[e] + __popc(peers & ((1u << lane) - 1u));
            a.list[p] = i / K;
            a.pos[i] = p;
        }
        __syncwarp();
        if (e >= 0 && lane == __ffs(peers) - 1) h[e] += (unsigned short)__popc(peers);
        __syncwarp();
    }
    for (int e = tid; e <= X; e += MOE_GROUP_THREADS) a.offsets[e] = off[e];
}

/* One grouped GEMM: expert e's entries [offsets[e], offsets[e + 1]) as the rows, C row = list position. */
struct moe_gemm_args {
    dev_weight w0, w1;    /* gate and up (w1 set: grid.x covers w0's tiles, then w1's), or down alone */
    float *c0, *c1;       /* (entries, n_out) each */
    int n_out;            /* rows of one expert in w0 / w1: n_ff (gate, up) or n_embd (down) */
    const __half *A;      /* lda halves per row */
    int lda;
    const int *list;      /* A row of list position p: list[p] (xh of the entry's row), or NULL: p (h) */
    const int *offsets;
};

/* Grid (tiles of n_out (of w0, then w1), ceil(most rows of an expert / GB_M), n_expert): block (x, y, e) is
 * tile (y, x) of expert e's entries; the blocks past the expert's count exit at once. */
template <int T>
__global__ void __launch_bounds__(GB_THREADS) k_moe_gemm(const __grid_constant__ moe_gemm_args g) {
    pdl_wait_then_trigger();
    const int e = blockIdx.z, base = __ldcg(g.offsets + e), cnt = __ldcg(g.offsets + e + 1) - base;
    const int m0 = blockIdx.y * GB_M, nx = (g.n_out + GB_N - 1) / GB_N;
    if (m0 >= cnt) return;
    const bool second = (int)blockIdx.x >= nx;
    const dev_weight &w = second ? g.w1 : g.w0;
    float *C = second ? g.c1 : g.c0;
    gemm_tile<T, gemm_small>(w, e * g.n_out, g.n_out, g.A, g.lda, m0, cnt, ((int)blockIdx.x - (second ? nx : 0)) * GB_N,
                             0, (w.in + GB_K - 1) / GB_K,
                             [&](int t) { return g.list ? __ldcg(g.list + base + t) : base + t; },
                             [&](int t, int n, float v) { C[(long long)(base + t) * g.n_out + n] = v; });
}

/* Grid (ceil(E / 256), rows): x[row, c] += sum over j = 0..k-1 in order of wts[row, j] * y[pos(row, j), c]. */
__global__ void __launch_bounds__(256) k_moe_combine(const __grid_constant__ moe_args a) {
    pdl_wait_then_trigger();
    const int row = blockIdx.y, c = blockIdx.x * 256 + threadIdx.x, E = a.E, K = a.k;
    if (c >= E) return;
    float acc = 0.0f;
    for (int j = 0; j < K; j++) {
        const long long i = (long long)row * K + j;
        acc = fmaf(__ldcg(a.wts + i), __ldcg(a.y + (long long)__ldcg(a.pos + i) * E + c), acc);
    }
    a.xres[(long long)row * E + c] = __ldcg(a.xres + (long long)row * E + c) + acc;
}

/* ------------------------------------------------------------------ host side */

static const struct {
    const void *fn;
    const char *name;
} moe_table[] = {
#define MOE_ENTRY(T) {(const void *)k_moe_route<T>, "moe_route<" #T ">"}, {(const void *)k_moe_gate_up<T>, "moe_gate_up<" #T ">"}, \
                     {(const void *)k_moe_down<T>, "moe_down<" #T ">"}, {(const void *)k_moe_gemm<T>, "moe_gemm<" #T ">"},
    CK_TYPES(MOE_ENTRY)
#undef MOE_ENTRY
    {(const void *)k_moe_group, "moe_group"},
    {(const void *)k_moe_combine, "moe_combine"},
};

#define N_MOE ((int)(sizeof moe_table / sizeof moe_table[0]))
int cm_kernel_count(void) { return N_MOE; }
const void *cm_kernel_at(int i) { return moe_table[i].fn; }
const char *cm_kernel_name(int i) { return moe_table[i].name; }

kiln_weight cm_flat(const kiln_weight *w) {
    kiln_weight v = *w;
    v.ne[1] = w->ne[1] * w->ne[2];
    v.ne[2] = 1;
    return v;
}

static void *carve(uint8_t *base, size_t *off, size_t n) {
    const size_t o = (*off + 255) & ~(size_t)255;
    *off = o + n;
    return base ? base + o : NULL;
}

moe_dims cm_dims(const kiln_model *m) {
    const kiln_hparams *hp = &m->hp;
    return moe_dims{hp->n_embd, hp->n_expert, hp->n_expert_used, hp->n_ff_exp};
}

int cm_group_rows(moe_dims d) {
    if (d.n_expert <= 0 || d.n_used <= 0) return 0;
    const int r = (d.n_expert + d.n_used - 1) / d.n_used;
    return r > CM_GROUP_MIN_ROWS ? r : CM_GROUP_MIN_ROWS;
}

void cm_plan_scratch(moe_scratch *s, moe_dims d, int max_rows, int group_rows, uint8_t *base, size_t *off) {
    memset(s, 0, sizeof *s);
    if (!d.n_expert) return;
    const size_t R = (size_t)max_rows, E = (size_t)d.n_embd, X = (size_t)d.n_expert, K = (size_t)d.n_used,
                 F = (size_t)d.n_ff;
    s->max_rows = max_rows, s->max_expert = d.n_expert, s->max_used = d.n_used, s->max_ff = d.n_ff;
    s->xn = (float *)carve(base, off, R * E * 4);
    s->probs = (float *)carve(base, off, R * X * 4);
    s->ids = (int *)carve(base, off, R * K * 4);
    s->wts = (float *)carve(base, off, R * K * 4);
    s->h = (float *)carve(base, off, R * K * F * 4);
    s->counter = (unsigned *)carve(base, off, R * 4);
    s->xq = (int8_t *)carve(base, off, R * E);
    s->xqm = (float *)carve(base, off, R * ((E + 31) / 32) * 8);
    const size_t FP = (size_t)moe_fp(d.n_ff);
    s->hq = (int8_t *)carve(base, off, R * K * FP);
    s->hqm = (float *)carve(base, off, R * K * (FP / 8) * 8);
    if (group_rows < 0) group_rows = cm_group_rows(d);
    const int gmax = max_rows < MOE_MAX_ENTRIES / d.n_used ? max_rows : MOE_MAX_ENTRIES / d.n_used;
    if (group_rows == 0 || group_rows > max_rows || gmax < 1) return;
    const size_t G = (size_t)gmax, N = G * K;
    s->group_rows = group_rows, s->group_max = gmax;
    s->epad = (d.n_embd + 31) & ~31, s->fpad = (d.n_ff + 31) & ~31;
    s->xh = (__half *)carve(base, off, G * s->epad * 2);
    s->offsets = (int *)carve(base, off, (X + 1) * 4);
    s->list = (int *)carve(base, off, N * 4);
    s->pos = (int *)carve(base, off, N * 4);
    s->cu = (float *)carve(base, off, N * F * 4);
    s->hh = (__half *)carve(base, off, N * s->fpad * 2); /* the padding stays zero: the arena is cleared at open */
    s->y = (float *)carve(base, off, N * E * 4);
}

/* Dynamic shared memory of the route / gate_up kernels (input n_embd) and of the down kernel (k slots of F). */
static size_t smem_in(int E) { return (size_t)xs_floats(E) * 4; }
static size_t smem_down(int k, int F) { return (size_t)xs_floats(k * moe_fp(F)) * 4; }

cudaError_t cm_setup(moe_dims d) {
    if (!d.n_expert) return cudaSuccess;
    if (d.n_expert > MOE_MAX_EXPERT || d.n_used > MOE_MAX_USED) return cudaErrorInvalidValue;
    const size_t si = smem_in(d.n_embd), sd = smem_down(d.n_used, d.n_ff);
    cudaError_t e = cudaSuccess;
#define MOE_ATTR(T)                                                                                                   \
    if (e == cudaSuccess && si > 48 * 1024)                                                                           \
        e = cudaFuncSetAttribute(k_moe_route<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)si);               \
    if (e == cudaSuccess && si > 48 * 1024)                                                                           \
        e = cudaFuncSetAttribute(k_moe_gate_up<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)si);             \
    if (e == cudaSuccess && sd > 48 * 1024)                                                                           \
        e = cudaFuncSetAttribute(k_moe_down<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sd);
    CK_TYPES(MOE_ATTR)
#undef MOE_ATTR
    return e;
}

/* K<type>(...) launched with launch_pdl's arguments (cuda_device.cuh). */
#define MOE_DISPATCH(type, K, ...) ck_with_type(type, [&](auto t_) { launch_pdl(K<decltype(t_)::value>, __VA_ARGS__); });

static moe_args args_of(const moe_layer &L, const moe_scratch &s, float *x, int n_embd, float eps, int n_rows) {
    moe_args a;
    memset(&a, 0, sizeof a);
    a.x = x, a.xres = x, a.norm_w = L.norm_w, a.eps = eps;
    a.E = n_embd, a.n_expert = L.n_expert, a.k = L.n_used, a.F = L.n_ff, a.norm_topk = L.norm_topk ? 1 : 0;
    a.xn = s.xn, a.probs = s.probs, a.wts = s.wts, a.h = s.h, a.ids = s.ids, a.counter = s.counter;
    a.n_rows = n_rows, a.epad = s.epad;
    a.offsets = s.offsets, a.list = s.list, a.pos = s.pos, a.y = s.y;
    return a;
}

static void route(const moe_layer &L, const moe_args &a, int n_rows, bool pdl, cudaStream_t st) {
    MOE_DISPATCH(L.router.type, k_moe_route, dim3((L.n_expert + MOE_WARPS - 1) / MOE_WARPS, (unsigned)n_rows),
                 dim3(MOE_THREADS), smem_in(a.E), st, pdl, a)
}

/* The per-row path: route, gate_up, down. */
static void ffn_rows(const moe_layer &L, const moe_scratch &s, float *x, int n_embd, float eps, int n_rows, bool pdl,
                     cudaStream_t st) {
    moe_args a = args_of(L, s, x, n_embd, eps, n_rows);
    const unsigned R = (unsigned)n_rows;
    a.w0 = L.router;
    if (ck_q8_input(L.gate.type)) a.xq = s.xq, a.xqm = s.xqm;
    if (moe_q8_hidden(L.down.type)) a.hq = s.hq, a.hqm = s.hqm;
    route(L, a, n_rows, pdl, st);
    a.w0 = L.gate, a.w1 = L.up;
    const int fp = moe_fp(L.n_ff);
    MOE_DISPATCH(L.gate.type, k_moe_gate_up, dim3(L.n_used * fp / MOE_WARPS, R), dim3(MOE_THREADS), smem_in(n_embd), st,
                 pdl, a)
    a.w0 = L.down, a.w1 = dev_weight{};
    MOE_DISPATCH(L.down.type, k_moe_down, dim3((n_embd + MOE_DOWN_ROWS - 1) / MOE_DOWN_ROWS, R), dim3(MOE_THREADS),
                 smem_down(L.n_used, L.n_ff), st, pdl, a)
}

void cm_group(const moe_scratch &s, const int *ids, int n_rows, int k, int n_expert, bool pdl, cudaStream_t st) {
    moe_args a;
    memset(&a, 0, sizeof a);
    a.ids = (int *)ids, a.n_rows = n_rows, a.k = k, a.n_expert = n_expert;
    a.offsets = s.offsets, a.list = s.list, a.pos = s.pos;
    launch_pdl(k_moe_group, dim3(1), dim3(MOE_GROUP_THREADS), 0, st, pdl, a);
}

/* The grouped path for n_rows <= s.group_max rows: route (with xh), group, gate and up GEMMs, SwiGLU, down
 * GEMM, combine. */
static void ffn_grouped(const moe_layer &L, const moe_scratch &s, float *x, int n_embd, float eps, int n_rows, bool pdl,
                        cudaStream_t st) {
    moe_args a = args_of(L, s, x, n_embd, eps, n_rows);
    a.w0 = L.router, a.xh = s.xh;
    route(L, a, n_rows, pdl, st);
    cm_group(s, s.ids, n_rows, L.n_used, L.n_expert, pdl, st);
    const int n = n_rows * L.n_used, F = L.n_ff;
    const unsigned my = (unsigned)((n_rows + GB_M - 1) / GB_M), X = (unsigned)L.n_expert;
    moe_gemm_args g = {L.gate, L.up, s.h, s.cu, F, s.xh, s.epad, s.list, s.offsets};
    MOE_DISPATCH(L.gate.type, k_moe_gemm, dim3(2 * ((F + GB_N - 1) / GB_N), my, X), dim3(GB_THREADS), 0, st, pdl, g)
    ck_swiglu_rows(s.h, s.cu, F, n, s.hh, s.fpad, st);
    g = moe_gemm_args{L.down, dev_weight{}, (float *)s.y, NULL, n_embd, s.hh, s.fpad, NULL, s.offsets};
    MOE_DISPATCH(L.down.type, k_moe_gemm, dim3((n_embd + GB_N - 1) / GB_N, my, X), dim3(GB_THREADS), 0, st, pdl, g)
    launch_pdl(k_moe_combine, dim3((n_embd + 255) / 256, (unsigned)n_rows), dim3(256), 0, st, pdl, a);
}

void cm_ffn(const moe_layer &L, const moe_scratch &s, float *x, int n_embd, float eps, int n_rows, bool pdl,
            cudaStream_t st) {
    if (s.group_rows <= 0 || n_rows < s.group_rows) {
        ffn_rows(L, s, x, n_embd, eps, n_rows, pdl, st);
        return;
    }
    for (int r0 = 0; r0 < n_rows; r0 += s.group_max) {
        const int n = n_rows - r0 < s.group_max ? n_rows - r0 : s.group_max;
        ffn_grouped(L, s, x + (size_t)r0 * n_embd, n_embd, eps, n, pdl, st);
    }
}
