/*
 * cuda_sample.cu — kiln_sample's math on the device, one block of 1024 threads per row, without sorting or
 * copying the vocabulary.
 *
 * The order of the candidates is the CPU sampler's: logit descending, then id ascending, i.e. the 64-bit key
 * K = (order-preserving bits of the logit) << 32 | (2^32 - 1 - id) descending; every cut of the chain is a
 * prefix of that order, so a candidate set is "K >= kmin" (plus min-p's threshold, also monotone). The walks
 * of the definition (top-k: the k-th candidate; top-p: the first where the cumulative probability reaches
 * top-p; the draw: the first where it passes u) are one primitive, select: the first candidate of the set at
 * which the cumulative weight crosses a target, found without sorting by
 *   1. a histogram of the set's weights over 2048 bins linear in the logit between the set's lowest and
 *      highest logit (a pass over the logits, which sit in L2 after the logits matvec), a block scan of the
 *      bins, the bin where the target is crossed;
 *   2. if that bin holds at most GCAP candidates: gathering them into shared memory, ranking them by K and a
 *      scan of their weights in that order — the exact crossing; else 2048-way splits of the bin's K range
 *      (integer bins, exact edges) until a bin is small enough (many equal logits; each split divides the
 *      range by 2048, so it ends).
 * Weights are each candidate's probability exactly as the CPU computes it (the same float expf argument, the
 * float rounding of e / z), accumulated as 62-bit fixed point: integer sums are exact in any order, so the
 * histogram, the bin and the gathered candidates agree, and a cumulative sum differs from the CPU's double
 * sum only by its rounding (~1e-16 per term). The chosen id therefore equals kiln_sample's except where a
 * cut or the draw lies within that rounding (or CUDA's expf's 2 ulp) of a boundary. A set of at most GCAP
 * candidates (top-k, or what top-p keeps of a peaked distribution) is kept sorted in shared memory and the
 * rest of the chain runs there.
 */
#include "backend/cuda/cuda_sample.cuh"

#include <math.h>

typedef unsigned long long u64;

namespace {

constexpr int ST = CK_SAMPLE_THREADS;
constexpr int NBIN = 2048;   /* histogram bins (2 per thread) */
constexpr int GCAP = 1024;   /* candidates resolved in shared memory (1 per thread) */
constexpr double FP_ONE = 4611686018427387904.0; /* 2^62: the fixed point of a probability */

static_assert(NBIN == 2 * ST && GCAP == ST, "sampling kernel: 2 bins and 1 candidate per thread");

struct smem_t {
    u64 hw[NBIN];      /* weight per bin */
    unsigned hc[NBIN]; /* candidates per bin */
    u64 gk[GCAP];      /* gathered keys */
    u64 sk[GCAP];      /* the same, sorted (K descending) */
    u64 red64[32];
    double redd[32];
    float redf[32];
    int n_gather;
    int chosen;        /* bin or candidate index of a crossing, -1 none */
    u64 c_w, c_before, c_cnt_before;
};

/* ---- keys */

__device__ __forceinline__ float clean(float l) { return l != l ? -INFINITY : l; } /* NaN never wins */

__device__ __forceinline__ u64 order_key(float l, int id) {
    l = __fadd_rn(l, 0.0f); /* -0 and +0 share a key, as they compare equal */
    unsigned u = __float_as_uint(l);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((u64)u << 32) | (u64)(0xFFFFFFFFu - (unsigned)id);
}
__device__ __forceinline__ float key_value(u64 k) {
    unsigned u = (unsigned)(k >> 32);
    u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
    return __uint_as_float(u);
}
__device__ __forceinline__ int key_id(u64 k) { return (int)(0xFFFFFFFFu - (unsigned)k); }

/* ---- the candidate set and the weights */

/* The candidates: the ids with K >= kmin among all ids (list NULL: 0..cnt-1) or among list[0..cnt) (the ids an
 * earlier cut kept, compacted into the row's scratch so that later passes read only those). */
struct cset {
    u64 kmin;
    float vmin;        /* the lowest logit the set can hold (for the bins) */
    const int *list;
    int cnt;
};

struct wfn {
    bool count;        /* weight 1 (top-k) */
    float temp;        /* else the probability (float)(expf((l - mx) / temp) / z) in fixed point */
    double zinv;       /* 1 / z */
};

/* expf((l - mx) / temp), the CPU's term (no division at temperature 1, as in the CPU's cuts). */
__device__ __forceinline__ float term(float l, float mx, float temp) {
    float d = __fsub_rn(l, mx);
    if (temp != 1.0f) d = __fdiv_rn(d, temp);
    return expf(d);
}

/* The CPU's (float)(e / z), the division done as a product with 1 / z (the same float but where e / z lies
 * within a double's rounding of a float's rounding boundary). */
__device__ __forceinline__ float prob(float l, float mx, float temp, double zinv) {
    return (float)((double)term(l, mx, temp) * zinv);
}

__device__ __forceinline__ u64 weight(const wfn &W, float mx, float l) {
    return W.count ? 1ull : (u64)((double)prob(l, mx, W.temp, W.zinv) * FP_ONE);
}

__device__ __forceinline__ bool crosses(u64 cum, u64 target, bool strict) { return strict ? cum > target : cum >= target; }

/* ---- block reductions and scans (every thread calls; the result is in every thread) */

template <class T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <class T> __device__ T block_sum_of(T v, T *red) {
    v = warp_sum(v);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < ST / 32 ? red[lane] : T(0);
    return warp_sum(v);
}
__device__ u64 block_sum_u64(u64 v, smem_t &sm) { return block_sum_of(v, sm.red64); }
__device__ double block_sum_d(double v, smem_t &sm) { return block_sum_of(v, sm.redd); }

__device__ u64 block_max_u64(u64 v, smem_t &sm) {
    for (int o = 16; o; o >>= 1) { const u64 x = __shfl_xor_sync(0xffffffffu, v, o); v = x > v ? x : v; }
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sm.red64[w] = v;
    __syncthreads();
    v = lane < ST / 32 ? sm.red64[lane] : 0;
    for (int o = 16; o; o >>= 1) { const u64 x = __shfl_xor_sync(0xffffffffu, v, o); v = x > v ? x : v; }
    return v;
}

__device__ u64 block_min_u64(u64 v, smem_t &sm) { return ~block_max_u64(~v, sm); }

__device__ float block_min_f(float v, smem_t &sm) {
    for (int o = 16; o; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sm.redf[w] = v;
    __syncthreads();
    v = lane < ST / 32 ? sm.redf[lane] : INFINITY;
    for (int o = 16; o; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Exclusive prefix sum of v over the threads in order; *total gets the sum. */
__device__ u64 block_exscan_u64(u64 v, u64 *total, smem_t &sm) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    u64 inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        const u64 x = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += x;
    }
    __syncthreads();
    if (lane == 31) sm.red64[w] = inc;
    __syncthreads();
    u64 before = 0, all = 0;
    for (int i = 0; i < ST / 32; i++) {
        const u64 x = sm.red64[i];
        before += i < w ? x : 0;
        all += x;
    }
    *total = all;
    return before + inc - v;
}

/* ---- passes over the row */

/* Sum over the set of (double)expf((l - mx) / temp), the CPU's float terms. */
__device__ double set_exp_sum(const float *lg, const cset &S, float mx, float temp, smem_t &sm) {
    double acc = 0.0;
    for (int j = threadIdx.x; j < S.cnt; j += ST) {
        const int i = S.list ? S.list[j] : j;
        const float l = clean(lg[i]);
        if (order_key(l, i) >= S.kmin) acc += (double)term(l, mx, temp);
    }
    return block_sum_d(acc, sm);
}

/* Appends the keys of the set's members with lo <= K <= hi (and bin `vb` of the value bins when vb >= 0) to
 * sm.gk (at most GCAP, which the caller's counts guarantee); returns their number. */
__device__ int gather(const float *lg, const cset &S, float mx, u64 lo, u64 hi, int vb, float vmax, float scale,
                      smem_t &sm) {
    const int lane = threadIdx.x & 31;
    if (threadIdx.x == 0) sm.n_gather = 0;
    __syncthreads();
    for (int j0 = threadIdx.x - lane; j0 < S.cnt; j0 += ST) {
        const int j = j0 + lane;
        bool q = false;
        u64 k = 0;
        if (j < S.cnt) {
            const int i = S.list ? S.list[j] : j;
            const float l = clean(lg[i]);
            k = order_key(l, i);
            q = k >= lo && k <= hi && k >= S.kmin;
            if (q && vb >= 0) {
                const float t = (vmax - l) * scale;
                q = (t < (float)NBIN ? (int)t : NBIN - 1) == vb;
            }
        }
        const unsigned m = __ballot_sync(0xffffffffu, q);
        int base = 0;
        if (lane == 0 && m) base = atomicAdd(&sm.n_gather, __popc(m));
        base = __shfl_sync(0xffffffffu, base, 0);
        const int at = base + __popc(m & ((1u << lane) - 1u));
        if (q && at < GCAP) sm.gk[at] = k;
    }
    __syncthreads();
    return sm.n_gather < GCAP ? sm.n_gather : GCAP;
}

/* Sorts sm.gk[0..n) into sm.sk by K descending (keys are distinct: rank = how many are larger). */
__device__ void rank_sort(int n, smem_t &sm) {
    if ((int)threadIdx.x < n) {
        const u64 k = sm.gk[threadIdx.x];
        int r = 0;
        for (int j = 0; j < n; j++) r += sm.gk[j] > k;
        sm.sk[r] = k;
    }
    __syncthreads();
}

struct sel_out {
    bool found;
    u64 k;         /* the crossing candidate's key */
    u64 n_incl;    /* candidates of the set up to and including it */
    u64 total;     /* the set's whole weight (valid when !found) */
};

/* The crossing among the sorted candidates sm.sk[0..n), after `before` weight and `cnt_before` candidates. */
__device__ sel_out cross_sorted(int n, const wfn &W, float mx, u64 before, u64 cnt_before, u64 target, bool strict,
                                smem_t &sm) {
    const int t = threadIdx.x;
    const u64 k = t < n ? sm.sk[t] : 0, w = t < n ? weight(W, mx, key_value(k)) : 0;
    u64 total;
    const u64 ex = before + block_exscan_u64(w, &total, sm);
    if (t == 0) sm.chosen = -1;
    __syncthreads();
    if (t < n && crosses(ex + w, target, strict) && (cnt_before + (u64)t == 0 || !crosses(ex, target, strict)))
        sm.chosen = t;
    __syncthreads();
    sel_out r = {false, 0, 0, before + total};
    if (sm.chosen >= 0) r = sel_out{true, sm.sk[sm.chosen], cnt_before + (u64)sm.chosen + 1, before + total};
    __syncthreads();
    return r;
}

/* Finds the bin (of 2048) where the cumulative weight crosses target; fills sm.chosen / c_w / c_before /
 * c_cnt_before. Bins are in sm.hw / sm.hc. */
__device__ void cross_bins(u64 before, u64 cnt_before, u64 target, bool strict, smem_t &sm) {
    __syncthreads(); /* the histogram is complete */
    const int t = threadIdx.x, b0 = 2 * t, b1 = b0 + 1;
    const u64 w0 = sm.hw[b0], w1 = sm.hw[b1], c0 = sm.hc[b0], c1 = sm.hc[b1];
    u64 tw, tc;
    const u64 exw = before + block_exscan_u64(w0 + w1, &tw, sm);
    const u64 exc = cnt_before + block_exscan_u64(c0 + c1, &tc, sm);
    if (t == 0) sm.chosen = -1;
    __syncthreads();
    if (c0 && crosses(exw + w0, target, strict) && (exc == 0 || !crosses(exw, target, strict))) {
        sm.chosen = b0, sm.c_w = exw, sm.c_before = exc;
    } else if (c1 && crosses(exw + w0 + w1, target, strict) && (exc + c0 == 0 || !crosses(exw + w0, target, strict))) {
        sm.chosen = b1, sm.c_w = exw + w0, sm.c_before = exc + c0;
    }
    __syncthreads();
}

/* The first candidate of S (K descending) at which the cumulative weight crosses target. */
__device__ sel_out select_global(const float *lg, const cset &S, const wfn &W, float mx, u64 target,
                                 bool strict, smem_t &sm) {
    /* 1. bins linear in the logit over [S.vmin, mx] */
    const float scale = mx > S.vmin ? (float)NBIN / (mx - S.vmin) : 0.0f;
    for (int b = threadIdx.x; b < NBIN; b += ST) sm.hw[b] = 0, sm.hc[b] = 0;
    __syncthreads();
    u64 mine = 0;
    for (int j = threadIdx.x; j < S.cnt; j += ST) {
        const int i = S.list ? S.list[j] : j;
        const float l = clean(lg[i]);
        const u64 k = order_key(l, i);
        if (k < S.kmin) continue;
        const float tb = (mx - l) * scale;
        const int b = tb < (float)NBIN ? (int)tb : NBIN - 1;
        const u64 w = weight(W, mx, l);
        mine += w;
        atomicAdd(&sm.hw[b], w);
        atomicAdd(&sm.hc[b], 1u);
    }
    cross_bins(0, 0, target, strict, sm);
    if (sm.chosen < 0) {
        sel_out r = {false, 0, 0, block_sum_u64(mine, sm)};
        return r;
    }
    const int vb = sm.chosen;
    u64 before = sm.c_w, cnt_before = sm.c_before, n = sm.hc[vb];
    __syncthreads();
    if (n <= GCAP) {
        const int m = gather(lg, S, mx, 0, ~0ull, vb, mx, scale, sm);
        rank_sort(m, sm);
        return cross_sorted(m, W, mx, before, cnt_before, target, strict, sm);
    }
    /* 2. the bin's K range, split 2048 ways until a piece is small (many equal logits) */
    u64 lo = ~0ull, hi = 0;
    for (int j = threadIdx.x; j < S.cnt; j += ST) {
        const int i = S.list ? S.list[j] : j;
        const float l = clean(lg[i]);
        const u64 k = order_key(l, i);
        if (k < S.kmin) continue;
        const float tb = (mx - l) * scale;
        if ((tb < (float)NBIN ? (int)tb : NBIN - 1) != vb) continue;
        lo = k < lo ? k : lo;
        hi = k > hi ? k : hi;
    }
    lo = block_min_u64(lo, sm);
    hi = block_max_u64(hi, sm);
    for (;;) {
        const u64 width = (hi - lo) / NBIN + 1;
        for (int b = threadIdx.x; b < NBIN; b += ST) sm.hw[b] = 0, sm.hc[b] = 0;
        __syncthreads();
        for (int j = threadIdx.x; j < S.cnt; j += ST) {
            const int i = S.list ? S.list[j] : j;
            const float l = clean(lg[i]);
            const u64 k = order_key(l, i);
            if (k < lo || k > hi || k < S.kmin) continue;
            const int b = (int)((hi - k) / width);
            atomicAdd(&sm.hw[b], weight(W, mx, l));
            atomicAdd(&sm.hc[b], 1u);
        }
        cross_bins(before, cnt_before, target, strict, sm);
        const int j = sm.chosen; /* >= 0: the crossing lies in this range */
        if (j < 0) { sel_out r = {false, 0, 0, 0}; return r; } /* unreachable: the bins above said so */
        before = sm.c_w, cnt_before = sm.c_before, n = sm.hc[j];
        const u64 nhi = hi - (u64)j * width, span = (u64)(j + 1) * width - 1;
        const u64 nlo = hi - lo >= span ? (hi - span > lo ? hi - span : lo) : lo;
        hi = nhi, lo = nlo;
        __syncthreads();
        if (n <= GCAP) {
            const int m = gather(lg, S, mx, lo, hi, -1, 0.0f, 0.0f, sm);
            rank_sort(m, sm);
            return cross_sorted(m, W, mx, before, cnt_before, target, strict, sm);
        }
    }
}

/* ---- the chain on a set held sorted in shared memory (sm.sk[0..n)) */

__device__ double sorted_exp_sum(int n, float mx, float temp, smem_t &sm) {
    const int t = threadIdx.x;
    const double e = t < n ? (double)term(key_value(sm.sk[t]), mx, temp) : 0.0;
    return block_sum_d(e, sm);
}

/* Gathers the whole set S (at most GCAP members) sorted into sm.sk; returns its size. */
__device__ int materialize(const float *lg, const cset &S, float mx, smem_t &sm) {
    const int m = gather(lg, S, mx, 0, ~0ull, -1, 0.0f, 0.0f, sm);
    rank_sort(m, sm);
    return m;
}

/* How many of the sorted candidates have K >= kb (a prefix). */
__device__ int sorted_at_least(int n, u64 kb, smem_t &sm) {
    const int t = threadIdx.x;
    return (int)block_sum_u64(t < n && sm.sk[t] >= kb ? 1ull : 0ull, sm);
}

/* min-p's cut as a key: the lowest logit whose p = (float)(expf(l - mx) / zn) reaches thr (p is monotone in
 * the logit), found by bisection over the order-preserving bits between -inf (fails: thr > 0) and mx
 * (passes: its p is 1 / zn >= thr); every candidate with that logit or more passes. */
__device__ u64 min_p_key(float mx, double zinv, float thr, smem_t &sm) {
    if (threadIdx.x == 0) {
        unsigned lo = (unsigned)(order_key(-INFINITY, 0) >> 32), hi = (unsigned)(order_key(mx, 0) >> 32);
        while (hi - lo > 1) {
            const unsigned mid = lo + (hi - lo) / 2;
            if (prob(key_value((u64)mid << 32), mx, 1.0f, zinv) >= thr) hi = mid;
            else lo = mid;
        }
        sm.c_w = (u64)hi << 32;
    }
    __syncthreads();
    const u64 k = sm.c_w;
    __syncthreads();
    return k;
}

/* Compacts the ids of S (from all ids) into the row's scratch; S then reads only those. */
__device__ void compact(const float *lg, cset &S, int *scratch, smem_t &sm) {
    const int lane = threadIdx.x & 31;
    if (threadIdx.x == 0) sm.n_gather = 0;
    __syncthreads();
    for (int i0 = threadIdx.x - lane; i0 < S.cnt; i0 += ST) {
        const int i = i0 + lane;
        const bool q = i < S.cnt && order_key(clean(lg[i]), i) >= S.kmin;
        const unsigned m = __ballot_sync(0xffffffffu, q);
        int base = 0;
        if (lane == 0 && m) base = atomicAdd(&sm.n_gather, __popc(m));
        base = __shfl_sync(0xffffffffu, base, 0);
        if (q) scratch[base + __popc(m & ((1u << lane) - 1u))] = i;
    }
    __syncthreads();
    S.list = scratch;
    S.cnt = sm.n_gather;
    __syncthreads();
}

/* After a cut that leaves `members` candidates (or an unknown number: > GCAP): a set of at most GCAP into shared
 * memory (returns its size), a larger one compacted (once, from all ids; returns -1). */
__device__ int narrow(const float *lg, cset &S, float mx, int *scratch, u64 members, smem_t &sm) {
    if (members <= GCAP) return materialize(lg, S, mx, sm);
    if (!S.list) compact(lg, S, scratch, sm);
    return S.cnt <= GCAP ? materialize(lg, S, mx, sm) : -1;
}

/* ---- the kernel */

__device__ void apply_penalties(const kiln_sample_spec *sp, float *lg, int V) {
    for (int i = threadIdx.x; i < sp->n_pen; i += ST) {
        const int id = sp->pen_id[i], count = sp->pen_count[i];
        if (id < 0 || id >= V) continue;
        float l = lg[id];
        l = l <= 0.0f ? __fmul_rn(l, sp->repeat) : __fdiv_rn(l, sp->repeat);
        l = __fsub_rn(l, __fadd_rn(__fmul_rn((float)count, sp->frequency), __fmul_rn((float)(count > 0), sp->presence)));
        lg[id] = l;
    }
    __syncthreads();
}

__global__ void __launch_bounds__(ST) k_sample(const kiln_sample_spec *specs, float *logits, int V, size_t stride,
                                               int *ids, int *scratch) {
    __shared__ smem_t sm;
    const kiln_sample_spec *sp = &specs[blockIdx.x];
    if (sp->mode != KILN_SPEC_SAMPLE) return;
    float *lg = logits + (size_t)blockIdx.x * stride;
    int *scr = scratch + (size_t)blockIdx.x * V;
    apply_penalties(sp, lg, V);

    /* the maximum (its key: the lowest id on ties) and the lowest finite logit */
    u64 kmax = 0;
    float fmin = INFINITY;
    for (int i = threadIdx.x; i < V; i += ST) {
        const float l = clean(lg[i]);
        const u64 k = order_key(l, i);
        kmax = k > kmax ? k : kmax;
        if (l > -INFINITY) fmin = fminf(fmin, l);
    }
    kmax = block_max_u64(kmax, sm);
    fmin = block_min_f(fmin, sm);
    const float mx = key_value(kmax), temp = sp->temperature;
    if (!(temp > 0.0f) || !(mx > -INFINITY)) { /* greedy (or nothing but -inf / NaN) */
        if (threadIdx.x == 0) ids[blockIdx.x] = key_id(kmax);
        return;
    }
    cset S = {0ull, fmin < mx ? fmin : mx, nullptr, V};
    int n = -1; /* >= 0: S is sm.sk[0..n), sorted */
    const bool top_k = sp->top_k > 0 && sp->top_k < V, top_p = sp->top_p < 1.0f, min_p = sp->min_p > 0.0f;
    if (top_k) {
        const wfn W = {true, 1.0f, 1.0};
        const sel_out r = select_global(lg, S, W, mx, (u64)sp->top_k, false, sm);
        if (r.found) S.kmin = r.k, S.vmin = key_value(r.k);
        n = narrow(lg, S, mx, scr, (u64)sp->top_k, sm);
    }
    if (top_k || top_p || min_p) {
        /* the normalizer of top-p / min-p: over the top-k candidates, else over everything (1 without top-p) */
        double zn = 1.0;
        if (top_k) zn = n >= 0 ? sorted_exp_sum(n, mx, 1.0f, sm) : set_exp_sum(lg, S, mx, 1.0f, sm);
        else if (top_p) zn = set_exp_sum(lg, S, mx, 1.0f, sm);
        const double zinv = 1.0 / zn;
        /* min-p first (its cut is a key; top-p's walk over what it keeps ends where the CPU's min(top-p, min-p)
         * does), so that top-p reads only the candidates min-p keeps */
        if (min_p) {
            const u64 kb = min_p_key(mx, zinv, __fmul_rn((float)zinv, sp->min_p), sm); /* the top p times min-p */
            if (n >= 0) n = sorted_at_least(n, kb, sm);
            else if (kb > S.kmin) {
                S.kmin = kb, S.vmin = key_value(kb);
                n = narrow(lg, S, mx, scr, ~0ull, sm);
            }
        }
        if (top_p) {
            const wfn W = {false, 1.0f, zinv};
            const u64 target = (u64)((double)sp->top_p * FP_ONE);
            if (n >= 0) {
                const sel_out r = cross_sorted(n, W, mx, 0, 0, target, false, sm);
                if (r.found) n = (int)r.n_incl;
            } else {
                const sel_out r = select_global(lg, S, W, mx, target, false, sm);
                if (r.found) {
                    S.kmin = r.k, S.vmin = key_value(r.k);
                    n = narrow(lg, S, mx, scr, r.n_incl, sm);
                }
            }
        }
    }
    /* the draw: softmax at the temperature over the set, the first candidate where the cumulative passes u */
    const double z = n >= 0 ? sorted_exp_sum(n, mx, temp, sm) : set_exp_sum(lg, S, mx, temp, sm);
    const wfn W = {false, temp, 1.0 / z};
    const u64 target = (u64)(sp->u * FP_ONE);
    sel_out r = n >= 0 ? cross_sorted(n, W, mx, 0, 0, target, true, sm) : select_global(lg, S, W, mx, target, true, sm);
    if (!r.found && r.total > 0) /* u beyond the rounded total: the last candidate with weight, as the walk ends */
        r = n >= 0 ? cross_sorted(n, W, mx, 0, 0, r.total, false, sm) : select_global(lg, S, W, mx, r.total, false, sm);
    if (threadIdx.x == 0) ids[blockIdx.x] = r.found ? key_id(r.k) : key_id(kmax);
}

} // namespace

const void *ck_sample_kernel(void) { return (const void *)k_sample; }

void ck_sample(const kiln_sample_spec *specs, float *logits, int n_vocab, size_t stride, int n_rows, int *ids,
               int *scratch, cudaStream_t stream) {
    if (n_rows > 0) k_sample<<<n_rows, ST, 0, stream>>>(specs, logits, n_vocab, stride, ids, scratch);
}
