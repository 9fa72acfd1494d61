/*
 * cuda_sample.cu — kiln_sample's math on the device, without sorting or copying the vocabulary, by passes of
 * many blocks per row over slices of the vocabulary (one SM per slice, not one SM for the row).
 *
 * The order of the candidates is the CPU sampler's: logit descending, then id ascending, i.e. the 64-bit key
 * K = (order-preserving bits of the logit) << 32 | (2^32 - 1 - id) descending; every cut of the chain is a
 * prefix of that order, so a candidate set is "K >= kmin" (plus min-p's threshold, also monotone). The walks
 * of the definition (top-k: the k-th candidate; top-p: the first where the cumulative probability reaches
 * top-p; the draw: the first where it passes u) are one primitive, select: the first candidate of the set at
 * which the cumulative weight crosses a target, found without sorting by
 *   1. a histogram of the set's weights over 2048 bins linear in the logit between the set's lowest and
 *      highest logit, a scan of the bins, the bin where the target is crossed;
 *   2. gathering that bin's candidates (at most GCAP), ranking them by K and a scan of their weights in that
 *      order — the exact crossing.
 * Weights are each candidate's probability exactly as the CPU computes it (the same float expf argument, the
 * float rounding of e / z), accumulated as 62-bit fixed point: integer sums are exact in any order, so the
 * histogram, the bin and the gathered candidates agree, and a cumulative sum differs from the CPU's double
 * sum only by its rounding (~1e-16 per term; the passes' normalizers, sums of the terms in fixed point, by
 * ~1e-12). The chosen id therefore equals kiln_sample's except where a cut or the draw lies within that
 * rounding (or CUDA's expf's 2 ulp) of a boundary.
 *
 * The passes (CK_SAMPLE_PASSES launches of k_sample, grid (slices, rows), each row independent; slices of at
 * least 1024 logits, fewer per row when many rows would exceed one wave): pass 0 applies the penalties
 * of each slice and finds its maximum; every later pass is HIST (the slices' histograms added into the row's)
 * or GATHER (the slices' members of a few bins appended to the row's list), as the row's record says. The last
 * block of a row to finish a pass (an atomic count) reads the record and runs the chain's next step with 1024
 * threads: it resolves a bin or a crossing and sets the next pass. Top-k (k <= GCAP): its count histogram, the
 * gather of every candidate up to the crossing bin, then the rest of the chain on those k in shared memory.
 * Top-k off: one HIST of every candidate's terms expf(l - mx) and expf((l - mx) / t) in 62-bit fixed point
 * (exact integer sums: the normalizers and the bins agree in any order; min-p's cut, a key, set before it).
 * The fast path: the histogram places top-p's crossing in the fixed-point terms in one bin, and the draw's in
 * a few bins whatever part of that bin the cut keeps; one GATHER of those bins, and the step decides both
 * crossings from the fixed-point terms where each lies further from its target than the exact weights can
 * differ from them (fast_margin: a few parts in 10^7, so almost always). Else the exact chain: the terms place
 * top-p's crossing (and then the draw's) within a bin of where the exact weights cross, so a GATHER of the bins
 * around it, which also sums the slices' exact weights below them, finds the exact crossing; the draw's
 * normalizer over what the cut keeps comes from the histogram. So top-p and the draw take pass 0, HIST and one
 * GATHER (the exact chain two more). What the passes do not resolve (top-k > GCAP, a
 * crowd of more than GCAP equal logits near a crossing, a crossing that rounding moved out of the gathered bins,
 * u beyond the rounded total) runs the whole chain on one block (chain_block: the same select, splitting a
 * crowded bin 2048 ways by K), as does a row that would need more passes than there are.
 */
#include "backend/cuda/cuda_sample.cuh"
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_device.cuh"

#include <math.h>
#include <stddef.h>

typedef unsigned long long u64;

namespace {

constexpr int ST = CK_SAMPLE_THREADS;
constexpr int NBIN = 2048;   /* histogram bins (2 per thread) */
constexpr int GCAP = 1024;   /* candidates resolved in shared memory (1 per thread) */
constexpr double FP_ONE = 4611686018427387904.0; /* 2^62: the fixed point of a probability */
constexpr int SCAN_N = 3;    /* values one block_exscan scans together at most */

static_assert(NBIN == 2 * ST && GCAP == ST, "sampling kernel: 2 bins and 1 candidate per thread");

struct smem_t {
    u64 hw[NBIN];      /* weight per bin */
    unsigned hc[NBIN]; /* candidates per bin */
    u64 gk[GCAP];      /* gathered keys */
    u64 sk[GCAP];      /* the same, sorted (K descending) */
    u64 red64[32];
    u64 scan[SCAN_N][33]; /* block_exscan: the warps' totals, then their exclusive sums and the sum */
    double redd[32];
    float redf[32];
    int n_gather;
    int is_last;       /* this block is the last of its pass to finish */
    int chosen;        /* bin or candidate index of a crossing, -1 none */
    u64 c_w, c_before;
    int fb, dlo, dhi;  /* step_hist: top-p's crossing bin, the draw's lowest and highest */
    u64 h1b, zlo, zb;  /* step_hist: the terms at 1 before fb; at the temperature before fb, in fb */
    u64 htlo, n_lo, n_hi; /* step_hist: the terms before dlo; the candidates before dlo, through dhi */
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

/* Exclusive prefix sums of N values per thread over the threads in order, in place (each warp by shuffles, then
 * warp 0 over the warps' totals); tot gets the N sums. */
template <int N> __device__ void block_exscan(u64 (&v)[N], u64 (&tot)[N], smem_t &sm) {
    static_assert(N <= SCAN_N && ST / 32 == 32, "one warp scans the warps' totals");
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    u64 inc[N];
    for (int k = 0; k < N; k++) inc[k] = v[k];
    for (int o = 1; o < 32; o <<= 1)
        for (int k = 0; k < N; k++) {
            const u64 x = __shfl_up_sync(0xffffffffu, inc[k], o);
            if (lane >= o) inc[k] += x;
        }
    __syncthreads(); /* sm.scan's earlier readers are done */
    if (lane == 31)
        for (int k = 0; k < N; k++) sm.scan[k][w] = inc[k];
    __syncthreads();
    if (w == 0)
        for (int k = 0; k < N; k++) {
            const u64 own = sm.scan[k][lane];
            u64 s = own;
            for (int o = 1; o < 32; o <<= 1) {
                const u64 x = __shfl_up_sync(0xffffffffu, s, o);
                if (lane >= o) s += x;
            }
            sm.scan[k][lane] = s - own;
            if (lane == 31) sm.scan[k][32] = s;
        }
    __syncthreads();
    for (int k = 0; k < N; k++) tot[k] = sm.scan[k][32], v[k] = sm.scan[k][w] + inc[k] - v[k];
}

/* Exclusive prefix sum of v over the threads in order; *total gets the sum. */
__device__ u64 block_exscan_u64(u64 v, u64 *total, smem_t &sm) {
    u64 a[1] = {v}, t[1];
    block_exscan<1>(a, t, sm);
    *total = t[0];
    return a[0];
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

/* Which bin of a thread's pair (weights w0, w1, counts c0, c1, after exw weight and exc candidates) is the first
 * where the cumulative weight crosses target: 0, 1, or -1 (neither). Empty bins never are; the first non-empty
 * bin is where the empty cumulative already crosses. */
__device__ __forceinline__ int pair_cross(u64 exw, u64 exc, u64 w0, u64 w1, u64 c0, u64 c1, u64 target, bool strict) {
    if (c0 && crosses(exw + w0, target, strict) && (exc == 0 || !crosses(exw, target, strict))) return 0;
    if (c1 && crosses(exw + w0 + w1, target, strict) && (exc + c0 == 0 || !crosses(exw + w0, target, strict))) return 1;
    return -1;
}

/* Finds the bin (of 2048) where the cumulative weight crosses target; fills sm.chosen / c_w / c_before. Bins are
 * in sm.hw / sm.hc. */
__device__ void cross_bins(u64 before, u64 cnt_before, u64 target, bool strict, smem_t &sm) {
    __syncthreads(); /* the histogram is complete */
    const int t = threadIdx.x, b0 = 2 * t, b1 = b0 + 1;
    const u64 w0 = sm.hw[b0], w1 = sm.hw[b1], c0 = sm.hc[b0], c1 = sm.hc[b1];
    u64 ex[2] = {w0 + w1, c0 + c1}, tot[2];
    if (t == 0) sm.chosen = -1;
    block_exscan<2>(ex, tot, sm);
    const u64 exw = before + ex[0], exc = cnt_before + ex[1];
    const int k = pair_cross(exw, exc, w0, w1, c0, c1, target, strict);
    if (k >= 0) sm.chosen = b0 + k, sm.c_w = exw + (k ? w0 : 0), sm.c_before = exc + (k ? c0 : 0);
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
 * the logit), i.e. the first passing order-preserving bits above -inf's (fails: thr > 0) up to mx's (passes: its
 * p is 1 / zn >= thr); every candidate with that logit or more passes. One round of the block over the ST bits
 * around the estimate mx + log(thr * zn) finds it where it lies among them (almost always); else one thread
 * bisects what that round leaves (near a logit of 0, where the bits are dense). */
__device__ u64 min_p_key(float mx, double zinv, float thr, smem_t &sm) {
    const unsigned lo0 = (unsigned)(order_key(-INFINITY, 0) >> 32), hi0 = (unsigned)(order_key(mx, 0) >> 32);
    const unsigned ue = (unsigned)(order_key(mx + logf(thr) - logf((float)zinv), 0) >> 32);
    unsigned a = ue - lo0 > ST / 2 ? ue - ST / 2 : lo0 + 1; /* the round's bits a .. a + ST - 1, within (lo0, hi0] */
    if (hi0 - a < ST - 1) a = hi0 - lo0 > ST - 1 ? hi0 - (ST - 1) : lo0 + 1;
    const unsigned u = a + threadIdx.x;
    if (threadIdx.x == 0) sm.chosen = ST;
    __syncthreads();
    if (u <= hi0 && prob(key_value((u64)u << 32), mx, 1.0f, zinv) >= thr) atomicMin(&sm.chosen, (int)threadIdx.x);
    __syncthreads();
    const int f = sm.chosen;
    if (threadIdx.x == 0) {
        /* lo fails, hi passes: the round's first pass and the failure before it, else what it left */
        unsigned hi = f < ST ? a + (unsigned)f : hi0;
        unsigned lo = f == ST ? a + (ST - 1) : f > 0 ? hi - 1 : lo0;
        if (lo >= hi) lo = hi - 1;
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

/* ---- the chain on one block (the whole row by one block: the fallback of the passes below) */

/* The draw over the sorted candidates sm.sk[0..n): softmax at the temperature, the first candidate where the
 * cumulative passes u (or, with u beyond the rounded total, the last one with weight). */
__device__ int draw_sorted(const kiln_sample_spec *sp, int n, float mx, u64 kmax, smem_t &sm) {
    const float temp = sp->temperature;
    const wfn W = {false, temp, 1.0 / sorted_exp_sum(n, mx, temp, sm)};
    sel_out r = cross_sorted(n, W, mx, 0, 0, (u64)(sp->u * FP_ONE), true, sm);
    if (!r.found && r.total > 0) r = cross_sorted(n, W, mx, 0, 0, r.total, false, sm);
    return r.found ? key_id(r.k) : key_id(kmax);
}

/* The chain after top-k on its n candidates held sorted in sm.sk: top-p and min-p over their softmax, then
 * the draw. */
__device__ int tail_sorted(const kiln_sample_spec *sp, int n, float mx, u64 kmax, smem_t &sm) {
    const double zinv = 1.0 / sorted_exp_sum(n, mx, 1.0f, sm);
    if (sp->min_p > 0.0f) n = sorted_at_least(n, min_p_key(mx, zinv, __fmul_rn((float)zinv, sp->min_p), sm), sm);
    if (sp->top_p < 1.0f) {
        const wfn W = {false, 1.0f, zinv};
        const sel_out r = cross_sorted(n, W, mx, 0, 0, (u64)((double)sp->top_p * FP_ONE), false, sm);
        if (r.found) n = (int)r.n_incl;
    }
    return draw_sorted(sp, n, mx, kmax, sm);
}

/* Over logits [lo, hi), in every thread of the block: kmax, the largest order key (the maximum, the lowest id on
 * ties), and fmin, the lowest finite logit (INFINITY if none). */
__device__ void block_max_min(const float *lg, int lo, int hi, u64 &kmax, float &fmin, smem_t &sm) {
    kmax = 0;
    fmin = INFINITY;
    for (int i = lo + threadIdx.x; i < hi; i += ST) {
        const float l = clean(lg[i]);
        const u64 k = order_key(l, i);
        kmax = k > kmax ? k : kmax;
        if (l > -INFINITY) fmin = fminf(fmin, l);
    }
    kmax = block_max_u64(kmax, sm);
    fmin = block_min_f(fmin, sm);
}

/* The whole chain over the row's V logits (penalties already applied) by one block; returns the id (in every
 * thread). scratch: V ints. */
__device__ int chain_block(const kiln_sample_spec *sp, const float *lg, int V, int *scratch, smem_t &sm) {
    /* the maximum (its key: the lowest id on ties) and the lowest finite logit */
    u64 kmax;
    float fmin;
    block_max_min(lg, 0, V, kmax, fmin, sm);
    const float mx = key_value(kmax), temp = sp->temperature;
    if (!(temp > 0.0f) || !(mx > -INFINITY)) return key_id(kmax); /* greedy (or nothing but -inf / NaN) */
    cset S = {0ull, fmin < mx ? fmin : mx, nullptr, V};
    int n = -1; /* >= 0: S is sm.sk[0..n), sorted */
    const bool top_k = sp->top_k > 0 && sp->top_k < V, top_p = sp->top_p < 1.0f, min_p = sp->min_p > 0.0f;
    if (top_k) {
        const wfn W = {true, 1.0f, 1.0};
        const sel_out r = select_global(lg, S, W, mx, (u64)sp->top_k, false, sm);
        if (r.found) S.kmin = r.k, S.vmin = key_value(r.k);
        n = narrow(lg, S, mx, scratch, (u64)sp->top_k, sm);
        if (n >= 0) return tail_sorted(sp, n, mx, kmax, sm);
    }
    if (top_k || top_p || min_p) {
        /* the normalizer of top-p / min-p: over the top-k candidates, else over everything (1 without top-p) */
        double zn = 1.0;
        if (top_k || top_p) zn = set_exp_sum(lg, S, mx, 1.0f, sm);
        const double zinv = 1.0 / zn;
        /* min-p first (its cut is a key; top-p's walk over what it keeps ends where the CPU's min(top-p, min-p)
         * does), so that top-p reads only the candidates min-p keeps */
        if (min_p) {
            const u64 kb = min_p_key(mx, zinv, __fmul_rn((float)zinv, sp->min_p), sm); /* the top p times min-p */
            if (kb > S.kmin) {
                S.kmin = kb, S.vmin = key_value(kb);
                n = narrow(lg, S, mx, scratch, ~0ull, sm);
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
                    n = narrow(lg, S, mx, scratch, r.n_incl, sm);
                }
            }
        }
    }
    if (n >= 0) return draw_sorted(sp, n, mx, kmax, sm);
    /* the draw: softmax at the temperature over the set, the first candidate where the cumulative passes u */
    const double z = set_exp_sum(lg, S, mx, temp, sm);
    const wfn W = {false, temp, 1.0 / z};
    const u64 target = (u64)(sp->u * FP_ONE);
    sel_out r = select_global(lg, S, W, mx, target, true, sm);
    if (!r.found && r.total > 0) /* u beyond the rounded total: the last candidate with weight, as the walk ends */
        r = select_global(lg, S, W, mx, r.total, false, sm);
    return r.found ? key_id(r.k) : key_id(kmax);
}

/* ---- the passes: G blocks per row over slices of the vocabulary, the last block of each pass to finish
 * reads what they left in the row's record and runs the chain's next step */

constexpr int SLICE = 1024; /* logits per block of a pass at least (at most GMAX blocks per row) */
constexpr int GMAX = 128;
constexpr int GRID_BLOCKS = 128; /* blocks of a pass at most (one wave: one block of 1024 threads fits an SM)
                                  * unless the rows alone are more: many rows take fewer, larger slices each
                                  * (H200, against slices of 4096 in up to two waves: sampled steps 0-24 us
                                  * shorter at 1-16 rows; bench/RESULTS.md) */
constexpr int NPASS = CK_SAMPLE_PASSES;

/* OP_IDLE: a pass that reads nothing (pass 0's fallback runs in pass 1: pass 0's blocks wrote the penalties, which
 * the last block's L1 may hold stale lines of; a new kernel reads them fresh) */
enum { OP_NONE, OP_HIST, OP_GATHER, OP_IDLE };
enum { PH_PLAN, PH_TOPK_BIN, PH_TOPK_SET, PH_HIST, PH_FAST, PH_TOPP_CUT, PH_DRAW_PICK, PH_FALLBACK };
enum { ST_DONE, ST_ISSUED, ST_FALLBACK }; /* what a step did */
/* What a HIST pass counts per value bin of the set: its candidates (top-k); and their terms at the temperature
 * (the draw); and their terms at temperature 1, with every logit's term at 1 summed per slice (top-p). */
enum { HM_COUNT, HM_DRAW, HM_TOPP };

struct part_t {    /* one block's partial of pass 0 (the maximum), of a HIST or of a GATHER */
    u64 kmax;
    u64 s;         /* HIST: the slice's terms at 1 (fixed); GATHER: the weights of the set below the bins */
    float fmin;
    int pad;
};

/* A row's record in device memory (zero before the first pass of a session; every pass leaves its counter at
 * zero): the next pass and its parameters, the chain's values carried between steps, the blocks' partials, the
 * histograms that a HIST pass fills and the keys that a GATHER pass appends. */
struct row_t {
    unsigned counter;      /* blocks of the current pass that finished */
    int op, phase;         /* the next pass (OP_*) and the step after it (PH_*) */
    int hmode;             /* HIST: HM_* */
    int n_gather, expect;  /* keys a GATHER appended / the count its bins hold */
    int glo, ghi, gb;      /* GATHER: the members of value bins glo..ghi and of bin gb (-1 none) */
    int wsum;              /* GATHER: sum the exact weights of the set's members below bin glo */
    int one_block;         /* the call's id came from chain_block (ck_sample_path_offset) */
    float mx, vmin, scale; /* bins linear in the logit over [vmin, mx] */
    float fx;              /* a term's fixed point: 2^(62 - ceil(log2 V)) */
    float wtemp;           /* the exact weights: probabilities at wtemp with 1 / z = wzinv */
    double wzinv;
    u64 kmax, kmin;        /* the maximum's key; the set is K >= kmin */
    u64 target;            /* top-k: k; otherwise the crossing's target in the exact weights */
    u64 cnt_lo;            /* the set's candidates below bin glo */
    int fb;                /* PH_FAST: top-p's crossing bin in the histogram (-1: no cut) */
    u64 z1, h1b;           /* PH_FAST: top-p's normalizer (fixed terms at 1 over all ids); h1 before bin fb */
    u64 htlo, ztlo;        /* PH_FAST: ht before bin glo; ht before bin fb (no cut: the set's whole ht) */
    part_t part[GMAX];
    u64 h1[NBIN];          /* HIST: terms at 1, terms at the temperature, candidates per bin */
    u64 ht[NBIN];
    unsigned hc[NBIN];
    u64 gk[GCAP];          /* GATHER: keys (at most GCAP kept) */
};
constexpr size_t ROW_BYTES = (sizeof(row_t) + 255) / 256 * 256;
static_assert(sizeof(u64) * 2 * GCAP == sizeof(u64) * NBIN, "a block's terms per bin alias its gathered keys");

/* Blocks per row of a pass over n_rows rows of V logits (every pass alike). */
static int n_slices(int V, int n_rows) {
    const int cap = GRID_BLOCKS / n_rows, g = (V + SLICE - 1) / SLICE;
    const int c = g < cap ? g : cap;
    return c < 1 ? 1 : c > GMAX ? GMAX : c;
}
__host__ __device__ __forceinline__ size_t row_bytes(int V) { return ROW_BYTES + ((size_t)V * 4 + 255) / 256 * 256; }

/* The value bin of logit l (the same rounding in every pass). */
__device__ __forceinline__ int vbin(float mx, float l, float scale) {
    const float t = __fmul_rn(__fsub_rn(mx, l), scale);
    return t < (float)NBIN ? (int)t : NBIN - 1;
}

/* A term e in [0, 1] in the histograms' fixed point: e * fx (exact: a power of two) rounded to an integer; the
 * terms of a row sum below 2^62, exactly in any order. */
__device__ __forceinline__ u64 fixed(float e, float fx) { return __float2ull_rn(__fmul_rn(e, fx)); }

/* The share of block g of G of zeroing the row's histograms (for the next call's HIST). */
__device__ void zero_hist(row_t *R, int g, int G) {
    const int per = (NBIN + G - 1) / G, b1 = min(NBIN, (g + 1) * per);
    for (int b = g * per + (int)threadIdx.x; b < b1; b += ST) R->h1[b] = 0, R->ht[b] = 0, R->hc[b] = 0;
}

/* pass 0: the block's share of clearing the row's histograms (the last call's), the slice's penalties, then its
 * maximum key and lowest finite logit */
__device__ void pass_stats(const kiln_sample_spec *sp, float *lg, int lo, int hi, row_t *R, smem_t &sm) {
    zero_hist(R, blockIdx.x, gridDim.x);
    for (int i = threadIdx.x; i < sp->n_pen; i += ST) {
        const int id = sp->pen_id[i], count = sp->pen_count[i];
        if (id < lo || id >= hi) continue; /* another block's (or outside the vocabulary) */
        float l = lg[id];
        l = l <= 0.0f ? __fmul_rn(l, sp->repeat) : __fdiv_rn(l, sp->repeat);
        l = __fsub_rn(l, __fadd_rn(__fmul_rn((float)count, sp->frequency), __fmul_rn((float)(count > 0), sp->presence)));
        lg[id] = l;
    }
    __syncthreads();
    u64 kmax;
    float fmin;
    block_max_min(lg, lo, hi, kmax, fmin, sm);
    if (threadIdx.x == 0) R->part[blockIdx.x].kmax = kmax, R->part[blockIdx.x].fmin = fmin;
}

/* *p += v in shared memory by 32-bit atomics (a 64-bit atomicAdd there is a compare-and-swap loop on sm_90): the
 * low word's carry goes into the high word, so the sum is exact once every add has landed. */
__device__ __forceinline__ void smem_add_u64(u64 *p, u64 v) {
    unsigned *w = (unsigned *)p; /* little-endian: w[0] the low word */
    const unsigned lo = (unsigned)v, old = atomicAdd(&w[0], lo), hi = (unsigned)(v >> 32) + (old + lo < old);
    if (hi) atomicAdd(&w[1], hi);
}

/* HIST: the slice's histograms in shared memory (as R->hmode says), then added to the row's */
__device__ void pass_hist(const kiln_sample_spec *sp, const float *lg, int lo, int hi, row_t *R, smem_t &sm) {
    const float mx = R->mx, scale = R->scale, fx = R->fx, temp = sp->temperature;
    const u64 kmin = R->kmin;
    const int mode = R->hmode;
    u64 *ht = (u64 *)sm.gk; /* gk and sk: 2 GCAP keys = NBIN terms */
    for (int b = threadIdx.x; b < NBIN; b += ST) sm.hw[b] = 0, sm.hc[b] = 0, ht[b] = 0;
    __syncthreads();
    u64 s1 = 0;
    float next = lo + (int)threadIdx.x < hi ? lg[lo + threadIdx.x] : 0.0f;
    for (int i = lo + threadIdx.x; i < hi; i += ST) {
        const float l = clean(next);
        if (i + ST < hi) next = lg[i + ST]; /* in flight during this one's atomics */
        const bool in = order_key(l, i) >= kmin;
        if (mode == HM_COUNT) {
            if (in) atomicAdd(&sm.hc[vbin(mx, l, scale)], 1u);
            continue;
        }
        const u64 f1 = mode == HM_TOPP ? fixed(term(l, mx, 1.0f), fx) : 0;
        s1 += f1;
        if (!in) continue;
        const int b = vbin(mx, l, scale);
        atomicAdd(&sm.hc[b], 1u);
        if (mode == HM_TOPP) smem_add_u64(&sm.hw[b], f1);
        smem_add_u64(&ht[b], mode == HM_TOPP && temp == 1.0f ? f1 : fixed(term(l, mx, temp), fx));
    }
    if (mode == HM_TOPP) {
        s1 = block_sum_u64(s1, sm);
        if (threadIdx.x == 0) R->part[blockIdx.x].s = s1;
    }
    __syncthreads();
    for (int b = threadIdx.x; b < NBIN; b += ST) {
        if (!sm.hc[b]) continue;
        atomicAdd(&R->hc[b], sm.hc[b]);
        if (mode == HM_TOPP) atomicAdd(&R->h1[b], sm.hw[b]);
        if (mode != HM_COUNT) atomicAdd(&R->ht[b], ht[b]);
    }
}

/* GATHER: appends the keys of the slice's members of bins glo..ghi and gb to the row's list; with wsum, the
 * slice's exact weights of the set's members below bin glo too. */
__device__ void pass_gather(const float *lg, int lo, int hi, row_t *R, smem_t &sm) {
    const float mx = R->mx, scale = R->scale;
    const u64 kmin = R->kmin;
    const int glo = R->glo, ghi = R->ghi, gb = R->gb, wsum = R->wsum, lane = threadIdx.x & 31;
    const wfn W = {false, R->wtemp, R->wzinv};
    u64 below = 0;
    float next = lo + (int)threadIdx.x < hi ? lg[lo + threadIdx.x] : 0.0f;
    for (int i0 = lo + (int)threadIdx.x - lane; i0 < hi; i0 += ST) {
        const int i = i0 + lane;
        bool q = false;
        u64 k = 0;
        const float cur = next;
        if (i + ST < hi) next = lg[i + ST]; /* in flight during this one's appends */
        if (i < hi) {
            const float l = clean(cur);
            k = order_key(l, i);
            if (k >= kmin) {
                const int b = vbin(mx, l, scale);
                q = (b >= glo && b <= ghi) || b == gb;
                if (wsum && b < glo) below += weight(W, mx, l);
            }
        }
        const unsigned m = __ballot_sync(0xffffffffu, q);
        int base = 0;
        if (lane == 0 && m) base = atomicAdd(&R->n_gather, __popc(m));
        base = __shfl_sync(0xffffffffu, base, 0);
        const int at = base + __popc(m & ((1u << lane) - 1u));
        if (q && at < GCAP) R->gk[at] = k;
    }
    if (wsum) {
        below = block_sum_u64(below, sm);
        if (threadIdx.x == 0) R->part[blockIdx.x].s = below;
    }
}

/* ---- the steps (the last block of a pass, all its threads; R's scalars from earlier steps, the blocks' results
 * of this pass through L2) */

/* Sets the next pass to HIST (mode) over K >= kmin with bins over [vlo, mx], then step `phase`. */
__device__ int issue_hist(row_t *R, int phase, int mode, u64 kmin, float vlo, u64 target) {
    __syncthreads(); /* every thread has read R's old values */
    if (threadIdx.x == 0) { /* the histograms are zero (pass 0 cleared them) */
        const float mx = R->mx;
        R->op = OP_HIST, R->phase = phase, R->hmode = mode;
        R->kmin = kmin, R->vmin = vlo, R->scale = mx > vlo ? (float)NBIN / (mx - vlo) : 0.0f;
        R->target = target;
    }
    return ST_ISSUED;
}

/* Sets the next pass to GATHER the members of bins lo..hi and of bin gb (-1: none), `expect` of them, without
 * weights. */
__device__ int issue_gather(row_t *R, int phase, int lo, int hi, int gb, int expect) {
    __syncthreads();
    if (threadIdx.x == 0) {
        R->op = OP_GATHER, R->phase = phase, R->glo = lo, R->ghi = hi, R->gb = gb;
        R->wsum = 0, R->expect = expect, R->n_gather = 0;
    }
    return ST_ISSUED;
}

__device__ int finish(row_t *R, int *out, int id) {
    __syncthreads();
    if (threadIdx.x == 0) *out = id, R->op = OP_NONE;
    return ST_DONE;
}

/* The row's histogram `h` (NULL: the counts) and its counts into sm.hw / sm.hc. */
__device__ void hist_load(const row_t *R, const u64 *h, smem_t &sm) {
    __syncthreads(); /* sm.hw's earlier readers are done */
    for (int b = threadIdx.x; b < NBIN; b += ST) {
        const unsigned c = __ldcg(&R->hc[b]);
        sm.hc[b] = c, sm.hw[b] = h ? __ldcg(&h[b]) : c;
    }
    __syncthreads();
}

/* Sum of sm.hw (or of sm.hc) over bins [lo, hi) (every thread gets it). */
__device__ u64 bins_sum(int lo, int hi, bool counts, smem_t &sm) {
    u64 s = 0;
    for (int b = lo + (int)threadIdx.x; b < hi; b += ST) s += counts ? sm.hc[b] : sm.hw[b];
    return block_sum_u64(s, sm);
}

/* Warp 0 over the blocks' partials of this pass: the largest kmax, the lowest fmin and the sum of s (into
 * sm.c_w, sm.redf[0], sm.c_before). */
__device__ void sum_parts(const row_t *R, smem_t &sm) {
    __syncthreads();
    if (threadIdx.x < 32) {
        u64 km = 0, s = 0;
        float fm = INFINITY;
        for (int g = threadIdx.x; g < (int)gridDim.x; g += 32) {
            const u64 k = __ldcg(&R->part[g].kmax);
            km = k > km ? k : km;
            fm = fminf(fm, __ldcg(&R->part[g].fmin));
            s += __ldcg(&R->part[g].s);
        }
        for (int o = 16; o; o >>= 1) {
            const u64 k = __shfl_xor_sync(0xffffffffu, km, o);
            km = k > km ? k : km;
            fm = fminf(fm, __shfl_xor_sync(0xffffffffu, fm, o));
            s += __shfl_xor_sync(0xffffffffu, s, o);
        }
        if (threadIdx.x == 0) sm.c_w = km, sm.redf[0] = fm, sm.c_before = s;
    }
    __syncthreads();
}

/* The gathered keys, sorted into sm.sk; their number, or -1 when it is not the count expected. */
__device__ int gathered_sorted(const row_t *R, smem_t &sm) {
    const int m = __ldcg(&R->n_gather);
    const u64 k = __ldcg(&R->gk[threadIdx.x]); /* with the count, not after it */
    if (m != R->expect || m > GCAP) return -1;
    if ((int)threadIdx.x < m) sm.gk[threadIdx.x] = k;
    __syncthreads();
    rank_sort(m, sm);
    return m;
}

/* after pass 0: the maximum, then the chain's histogram (min-p's cut first: the lowest logit whose term
 * expf(l - mx) reaches min-p, the CPU's p >= p_max * min-p but for rounding) */
__device__ int step_plan(const kiln_sample_spec *sp, row_t *R, int V, int *out, smem_t &sm) {
    if (threadIdx.x == 0) R->one_block = 0;
    sum_parts(R, sm);
    const u64 kmax = sm.c_w;
    const float fmin = sm.redf[0], mx = key_value(kmax), temp = sp->temperature;
    if (!(temp > 0.0f) || !(mx > -INFINITY)) return finish(R, out, key_id(kmax)); /* greedy (or no finite logit) */
    __syncthreads();
    if (threadIdx.x == 0) {
        int c = 0;
        while (c < 31 && (1u << c) < (unsigned)V) c++;
        R->kmax = kmax, R->mx = mx, R->fx = (float)(1ull << (62 - c));
    }
    __syncthreads();
    const float vmin = fmin < mx ? fmin : mx;
    if (sp->top_k > 0 && sp->top_k < V) {
        if (sp->top_k > GCAP) return ST_FALLBACK;
        return issue_hist(R, PH_TOPK_BIN, HM_COUNT, 0, vmin, (u64)sp->top_k);
    }
    u64 k0 = 0;
    float v0 = vmin;
    if (sp->min_p > 0.0f) {
        k0 = min_p_key(mx, 1.0, sp->min_p, sm);
        v0 = key_value(k0);
    }
    return issue_hist(R, PH_HIST, sp->top_p < 1.0f ? HM_TOPP : HM_DRAW, k0, v0, 0);
}

/* after top-k's count histogram: gather every candidate up to the crossing bin (a prefix of the order) */
__device__ int step_topk_bin(row_t *R, smem_t &sm) {
    hist_load(R, nullptr, sm);
    cross_bins(0, 0, R->target, false, sm);
    const int b = sm.chosen;
    if (b < 0) return ST_FALLBACK;
    const u64 p = sm.c_before + sm.hc[b];
    if (p > GCAP) return ST_FALLBACK; /* ties of more than GCAP at the top */
    return issue_gather(R, PH_TOPK_SET, 0, b, -1, (int)p);
}

/* after the top-k prefix's gather: the k candidates sorted, the rest of the chain in shared memory */
__device__ int step_topk_set(const kiln_sample_spec *sp, row_t *R, int *out, smem_t &sm) {
    const int m = gathered_sorted(R, sm);
    if (m < 0) return ST_FALLBACK;
    const float mx = R->mx;
    const wfn W = {true, 1.0f, 1.0};
    const sel_out r = cross_sorted(m, W, mx, 0, 0, R->target, false, sm);
    if (!r.found) return ST_FALLBACK;
    return finish(R, out, tail_sorted(sp, (int)r.n_incl, mx, R->kmax, sm));
}

/* The crossing of the exact weights lies near bin b of the histogram in sm.hw / sm.hc (its terms in fixed
 * point: they differ from the exact weights' cumulative only by rounding): sets the next pass to GATHER bins
 * b - 1 .. b + 1 (b alone when they hold more than GCAP) of the set K >= kmin, summing the exact weights (at
 * temp, 1 / z = zinv) of the set's members below them, then step `phase` to the target. */
__device__ int issue_near(row_t *R, int phase, int b, u64 kmin, float temp, double zinv, u64 target, smem_t &sm) {
    int lo = b > 0 ? b - 1 : 0, hi = b < NBIN - 1 ? b + 1 : NBIN - 1;
    u64 n = bins_sum(lo, hi + 1, true, sm);
    if (n > GCAP) lo = hi = b, n = sm.hc[b];
    if (n > GCAP) return ST_FALLBACK;
    const u64 cnt_lo = bins_sum(0, lo, true, sm);
    __syncthreads();
    if (threadIdx.x == 0) {
        R->op = OP_GATHER, R->phase = phase, R->glo = lo, R->ghi = hi, R->gb = -1, R->wsum = 1, R->expect = (int)n;
        R->n_gather = 0, R->kmin = kmin, R->wtemp = temp, R->wzinv = zinv, R->target = target;
        R->cnt_lo = cnt_lo;
    }
    return ST_ISSUED;
}

/* The draw over the set K >= kmin whose terms at the temperature are in sm.hw / sm.hc up to bin `last`, zt
 * their sum: gather near the bin where u of zt is crossed. */
__device__ int issue_draw(const kiln_sample_spec *sp, row_t *R, u64 kmin, u64 zt, int last, smem_t &sm) {
    if (zt == 0) return ST_FALLBACK;
    const u64 t = (u64)(sp->u * (double)zt);
    cross_bins(0, 0, t < zt ? t : zt - 1, true, sm);
    const int b = sm.chosen;
    if (b < 0 || b > last) return ST_FALLBACK;
    return issue_near(R, PH_DRAW_PICK, b, kmin, sp->temperature, (double)R->fx / (double)zt,
                      (u64)(sp->u * FP_ONE), sm);
}

/* The exact chain after the HIST, with the row's histogram of terms in sm.hw / sm.hc: b, top-p's crossing bin
 * in the fixed-point terms (-1: no cut), z1 its normalizer. Gathers near the crossing of top-p's exact weights
 * (then the draw's, step_topp_cut), or, without a cut, near the draw's. */
__device__ int exact_after_hist(const kiln_sample_spec *sp, row_t *R, int b, u64 z1, smem_t &sm) {
    if (b >= 0)
        return issue_near(R, PH_TOPP_CUT, b, R->kmin, 1.0f, (double)R->fx / (double)z1,
                          (u64)((double)sp->top_p * FP_ONE), sm);
    return issue_draw(sp, R, R->kmin, bins_sum(0, NBIN, false, sm), NBIN - 1, sm);
}

/* after the HIST of the draw or of top-p: from one scan of the row's histograms (terms at 1, at the temperature,
 * counts), top-p's crossing bin fb in the terms at 1 (its normalizer z1: the slices' sums), then the fast path:
 * one GATHER of bin fb and of the bins where the draw's crossing lies for every normalizer the cut can leave
 * (between the set's terms before fb and through it), which step_fast resolves from the fixed-point terms
 * alone; else (those bins hold more than GCAP candidates, or nothing has weight) the exact chain's gather.
 * Leaves the terms at the temperature in sm.hw and the counts in sm.hc. */
__device__ int step_hist(const kiln_sample_spec *sp, row_t *R, smem_t &sm) {
    const int t = threadIdx.x, b0 = 2 * t;
    const bool topp = R->hmode == HM_TOPP;
    const ulonglong2 ht = __ldcg((const ulonglong2 *)&R->ht[b0]); /* bins b0, b0 + 1 */
    const uint2 hc = __ldcg((const uint2 *)&R->hc[b0]);
    const ulonglong2 h1 = topp ? __ldcg((const ulonglong2 *)&R->h1[b0]) : make_ulonglong2(0, 0);
    u64 z1 = 0;
    if (topp) sum_parts(R, sm), z1 = sm.c_before;
    sm.hw[b0] = ht.x, sm.hw[b0 + 1] = ht.y, sm.hc[b0] = hc.x, sm.hc[b0 + 1] = hc.y;
    if (t == 0) sm.fb = sm.dlo = sm.dhi = -1;
    u64 ex[3] = {h1.x + h1.y, ht.x + ht.y, (u64)hc.x + hc.y}, tot[3];
    block_exscan<3>(ex, tot, sm);
    const u64 t1 = (u64)((double)sp->top_p * (double)z1);
    const int k1 = topp ? pair_cross(ex[0], ex[2], h1.x, h1.y, hc.x, hc.y, t1, false) : -1;
    if (k1 >= 0) sm.fb = b0 + k1, sm.h1b = ex[0] + (k1 ? h1.x : 0), sm.zlo = ex[1] + (k1 ? ht.x : 0), sm.zb = k1 ? ht.y : ht.x;
    __syncthreads();
    const int b = sm.fb; /* b < 0: the set (min-p's) holds less than top-p of the mass: no cut */
    const u64 zlo = b >= 0 ? sm.zlo : tot[1], zhi = b >= 0 ? zlo + sm.zb : zlo, h1b = b >= 0 ? sm.h1b : 0;
    if (zhi == 0) return exact_after_hist(sp, R, b, z1, sm);
    const u64 tlo = (u64)(sp->u * (double)zlo), thi = (u64)(sp->u * (double)zhi);
    const int kl = pair_cross(ex[1], ex[2], ht.x, ht.y, hc.x, hc.y, tlo, true);
    const int kh = pair_cross(ex[1], ex[2], ht.x, ht.y, hc.x, hc.y, thi < zhi ? thi : zhi - 1, true);
    if (kl >= 0) sm.dlo = b0 + kl, sm.htlo = ex[1] + (kl ? ht.x : 0), sm.n_lo = ex[2] + (kl ? hc.x : 0);
    if (kh >= 0) sm.dhi = b0 + kh, sm.n_hi = ex[2] + hc.x + (kh ? hc.y : 0);
    __syncthreads();
    const int dlo = sm.dlo, dhi = sm.dhi, gb = b > dhi ? b : -1;
    if (dlo < 0 || dhi < dlo || (b >= 0 && dhi > b)) return exact_after_hist(sp, R, b, z1, sm);
    const u64 n = sm.n_hi - sm.n_lo + (gb >= 0 ? sm.hc[gb] : 0);
    if (n > GCAP) return exact_after_hist(sp, R, b, z1, sm);
    const u64 htlo = sm.htlo;
    __syncthreads();
    if (t == 0) R->fb = b, R->z1 = z1, R->h1b = h1b, R->htlo = htlo, R->ztlo = zlo;
    return issue_gather(R, PH_FAST, dlo, dhi, gb, (int)n);
}

/* Over the gathered candidates (sorted) in the exact weights W after the set's members below them (the slices'
 * sums): the first where the cumulative crosses R's target; its position, or -1 none. cnt_lo: the candidates
 * of the set before the gathered (the set's first crosses a zero target). */
__device__ int near_cross(int m, const wfn &W, bool strict, smem_t &sm, const row_t *R) {
    const u64 before = sm.c_before; /* sum_parts */
    const int t = threadIdx.x;
    const u64 w = t < m ? weight(W, R->mx, key_value(sm.sk[t])) : 0;
    u64 total;
    const u64 ex = before + block_exscan_u64(w, &total, sm);
    if (t == 0) sm.chosen = -1;
    __syncthreads();
    const u64 target = R->target;
    if (t < m && crosses(ex + w, target, strict) && (R->cnt_lo + (u64)t == 0 || !crosses(ex, target, strict)))
        sm.chosen = t;
    __syncthreads();
    const int c = sm.chosen;
    __syncthreads();
    return c;
}

/* after the gather near top-p's crossing: the cut (exact), then the draw over what it keeps, from the histogram
 * of terms with the cut's bin reduced to its kept members (all of them gathered) and the bins after it empty */
__device__ int step_topp_cut(const kiln_sample_spec *sp, row_t *R, smem_t &sm) {
    sum_parts(R, sm);
    const int m = gathered_sorted(R, sm);
    if (m < 0) return ST_FALLBACK;
    const wfn W = {false, 1.0f, R->wzinv};
    const int cut = near_cross(m, W, false, sm, R);
    if (cut < 0) return ST_FALLBACK; /* the rounding moved the crossing out of the gathered bins */
    const int t = threadIdx.x;
    const float mx = R->mx, scale = R->scale;
    const u64 kcut = sm.sk[cut];
    const int last = vbin(mx, key_value(kcut), scale);
    const bool mine = t <= cut && vbin(mx, key_value(sm.sk[t]), scale) == last;
    const u64 n_last = block_sum_u64(mine ? 1 : 0, sm);
    const u64 t_last = block_sum_u64(mine ? fixed(term(key_value(sm.sk[t]), mx, sp->temperature), R->fx) : 0, sm);
    hist_load(R, R->ht, sm);
    for (int b = last + t; b < NBIN; b += ST) sm.hc[b] = b == last ? (unsigned)n_last : 0, sm.hw[b] = b == last ? t_last : 0;
    __syncthreads();
    return issue_draw(sp, R, kcut, bins_sum(0, NBIN, false, sm), last, sm);
}

/* after the gather near the draw's crossing: the drawn candidate (exact) */
__device__ int step_draw_pick(const kiln_sample_spec *sp, row_t *R, int *out, smem_t &sm) {
    sum_parts(R, sm);
    const int m = gathered_sorted(R, sm);
    if (m < 0) return ST_FALLBACK;
    const wfn W = {false, sp->temperature, R->wzinv};
    const int pick = near_cross(m, W, true, sm, R);
    if (pick < 0) return ST_FALLBACK; /* rounding, or u beyond the rounded total: the one-block chain */
    return finish(R, out, key_id(sm.sk[pick]));
}

/* How far a cumulative x (a fraction of its normalizer) in the histogram's fixed-point terms can lie from the
 * exact weights' (the float rounding of each term over the normalizer, 2^-24 relative, and the fixed points'
 * roundings, under one unit of the last place of each term): where the two cumulatives at a crossing's
 * candidate and at the one before it are both further than this from the target, the exact chain picks the
 * candidate the fixed-point terms pick. */
__device__ __forceinline__ double fast_margin(double x, int V, double z) {
    return x * 0x1p-23 + (double)V * (1.0 / z + 0x1p-61) + 0x1p-50;
}

/* Over the sorted candidates sm.sk[0..m): the first whose inclusive cumulative inc crosses target T (strict
 * or not; `eligible` its own flag, e its term), checked by margin against the exact weights' crossing of xt
 * (the exact chain's target, a fraction) with normalizer z; its position, or -1 (none, or too close to
 * call), and the chosen thread's `carry` in *carried. Every thread calls; the results are in every thread. */
__device__ int fast_cross(bool eligible, u64 inc, u64 e, u64 T, bool strict, double xt, double z, int V, u64 carry,
                          u64 *carried, smem_t &sm) {
    if (threadIdx.x == 0) sm.chosen = -1;
    __syncthreads();
    if (eligible && crosses(inc, T, strict) && !crosses(inc - e, T, strict)) {
        const double x = (double)inc / z, xp = (double)(inc - e) / z;
        const bool sure = x - fast_margin(x, V, z) > xt && xp + fast_margin(xp, V, z) < xt;
        sm.chosen = sure ? (int)threadIdx.x : -2;
        sm.c_w = carry;
    }
    __syncthreads();
    const int c = sm.chosen;
    *carried = sm.c_w;
    __syncthreads();
    return c >= 0 ? c : -1;
}

/* The fast path's decision over the gathered bins (sorted into sm.sk[0..m)): top-p's cut within bin fb by the
 * cumulative terms at 1, then the draw over what the cut keeps by the cumulative terms at the temperature
 * (their normalizer: the set's terms before fb and the kept members of fb); the id, or -1 where either
 * crossing comes too close to call (the exact chain decides). One scan serves both: the draw's cumulative
 * at the kept candidates does not depend on where the cut falls after them. */
__device__ int fast_pick(const kiln_sample_spec *sp, const row_t *R, int V, int m, smem_t &sm) {
    const int t = threadIdx.x, b = R->fb;
    const float mx = R->mx, scale = R->scale, fx = R->fx;
    const float l = t < m ? key_value(sm.sk[t]) : 0.0f;
    const int bt = t < m ? vbin(mx, l, scale) : -1;
    const u64 et = t < m ? fixed(term(l, mx, sp->temperature), fx) : 0;
    const bool in_b = b >= 0 && bt == b, in_d = bt >= R->glo && bt <= R->ghi;
    const u64 e1 = in_b ? fixed(term(l, mx, 1.0f), fx) : 0, ed = in_d ? et : 0, eb = in_b ? et : 0;
    u64 ex[3] = {e1, ed, eb}, tot[3];
    block_exscan<3>(ex, tot, sm);
    int cut = m; /* the kept candidates: positions below cut */
    u64 zt = R->ztlo, kept;
    if (b >= 0) {
        const double z1 = (double)R->z1, tp = (double)(u64)((double)sp->top_p * FP_ONE) / FP_ONE;
        const int c = fast_cross(in_b, R->h1b + ex[0] + e1, e1, (u64)((double)sp->top_p * z1), false, tp, z1, V,
                                 ex[2] + eb, &kept, sm);
        if (c < 0) return -1;
        cut = c + 1;
        zt += kept; /* fb's terms at the temperature through the cut */
    }
    const bool in = t < cut && in_d;
    const double xu = (double)(u64)(sp->u * FP_ONE) / FP_ONE;
    const int d = fast_cross(in, R->htlo + ex[1] + ed, ed, (u64)(sp->u * (double)zt), true, xu, (double)zt, V, 0,
                             &kept, sm);
    return d < 0 ? -1 : key_id(sm.sk[d]);
}

/* after the fast path's gather: the drawn candidate, else (a crossing too close to call) the exact chain from
 * the row's histograms, which nothing has cleared */
__device__ int step_fast(const kiln_sample_spec *sp, row_t *R, int V, int *out, smem_t &sm) {
    const int m = gathered_sorted(R, sm);
    const int id = m >= 0 ? fast_pick(sp, R, V, m, sm) : -1;
    if (id >= 0) return finish(R, out, id);
    hist_load(R, R->ht, sm);
    return exact_after_hist(sp, R, R->fb, R->z1, sm);
}

__device__ int step(const kiln_sample_spec *sp, row_t *R, int V, int pass, int *out, smem_t &sm) {
    switch (pass == 0 ? PH_PLAN : R->phase) {
    case PH_PLAN: return step_plan(sp, R, V, out, sm);
    case PH_TOPK_BIN: return step_topk_bin(R, sm);
    case PH_TOPK_SET: return step_topk_set(sp, R, out, sm);
    case PH_HIST: return step_hist(sp, R, sm);
    case PH_FAST: return step_fast(sp, R, V, out, sm);
    case PH_TOPP_CUT: return step_topp_cut(sp, R, sm);
    case PH_DRAW_PICK: return step_draw_pick(sp, R, out, sm);
    default: return ST_FALLBACK;
    }
}

/* ---- the kernel: pass `pass` of every sampled row, block (slice, row) */

__global__ void __launch_bounds__(ST) k_sample(const kiln_sample_spec *specs, float *logits, int V, size_t stride,
                                               int *ids, unsigned char *scratch, int pass) {
    __shared__ smem_t sm;
    pdl_wait_then_trigger();
    const int r = blockIdx.y, G = gridDim.x;
    const kiln_sample_spec *sp = &specs[r];
    if (sp->mode != KILN_SPEC_SAMPLE) return;
    row_t *R = (row_t *)(scratch + (size_t)r * row_bytes(V));
    float *lg = logits + (size_t)r * stride;
    const int op = pass == 0 ? -1 : R->op;
    if (op == OP_NONE) return; /* the row is done (or its fallback ran) */
    const int slice = (V + G - 1) / G, lo = blockIdx.x * slice, hi = min(V, lo + slice);
    if (op < 0) pass_stats(sp, lg, lo, hi, R, sm);
    else if (op == OP_HIST) pass_hist(sp, lg, lo, hi, R, sm);
    else if (op == OP_GATHER) pass_gather(lg, lo, hi, R, sm);
    /* the last block of the row to finish runs the step */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) sm.is_last = atomicAdd(&R->counter, 1u) == (unsigned)G - 1;
    __syncthreads();
    if (!sm.is_last) return;
    __threadfence();
    if (threadIdx.x == 0) R->counter = 0;
    const int s = step(sp, R, V, pass, ids + r, sm);
    if (s == ST_FALLBACK && pass == 0) {
        __syncthreads();
        if (threadIdx.x == 0) R->op = OP_IDLE, R->phase = PH_FALLBACK;
    } else if (s == ST_FALLBACK || (s == ST_ISSUED && pass == NPASS - 1)) {
        __syncthreads();
        finish(R, ids + r, chain_block(sp, lg, V, (int *)((unsigned char *)R + ROW_BYTES), sm));
        if (threadIdx.x == 0) R->one_block = 1;
    }
}
} // namespace

const void *ck_sample_kernel(void) { return (const void *)k_sample; }

size_t ck_sample_scratch_bytes(int n_vocab) { return row_bytes(n_vocab); }

size_t ck_sample_path_offset(void) { return offsetof(row_t, one_block); }

void ck_sample(const kiln_sample_spec *specs, float *logits, int n_vocab, size_t stride, int n_rows, int *ids,
               void *scratch, cudaStream_t stream) {
    if (n_rows <= 0) return;
    const dim3 grid(n_slices(n_vocab, n_rows), n_rows);
    for (int p = 0; p < NPASS; p++) /* the first pass an ordinary launch: it starts after the kernel before it */
        launch(k_sample, grid, dim3(ST), 0, stream, p > 0, specs, logits, n_vocab, stride, ids, (unsigned char *)scratch, p);
}
