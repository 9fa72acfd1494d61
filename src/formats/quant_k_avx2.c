/*
 * quant_k_avx2.c — the scale searches of the K-type reference quantizers (make_qkx2_quants for Q2_K /
 * Q4_K / Q5_K, make_qx_quants for Q6_K), run on eight sub-blocks at once: lane j of every vector holds
 * sub-block j, and each lane performs exactly the float operations of the scalar search in quant_k.c in
 * the same order (no FMA contraction, IEEE division and square root, the same round-to-nearest trick), with
 * branches turned into per-lane selects. The results, and so the quantized bytes, are identical to the
 * scalar reference (tested on the reference vectors and random data); only the speed differs.
 * Callers check kiln_cpu_has_avx2() first.
 */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
#include <immintrin.h>
#include <math.h>

#include "base/error.h"
#include "formats/blocks.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* ggml's nearest_int, per lane: add 1.5*2^23, keep the low mantissa bits. */
AVX2 static inline __m256i nearest_int8(__m256 f) {
    const __m256i bits = _mm256_castps_si256(_mm256_add_ps(f, _mm256_set1_ps(12582912.f)));
    return _mm256_sub_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x00400000));
}

AVX2 static inline __m256i clamp_epi32(__m256i v, int lo, int hi) {
    return _mm256_min_epi32(_mm256_max_epi32(v, _mm256_set1_epi32(lo)), _mm256_set1_epi32(hi));
}

AVX2 static inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

/* Eight sub-blocks of make_qkx2_quants (see quant_k.c), lanes = sub-blocks. xt[i] / wt[i] hold value i of
 * every sub-block; Lt[i] receives the levels. */
AVX2 static void qkx2_lanes(int n, int nmax, const __m256 *xt, const __m256 *wt, __m256i *Lt, __m256 *scale_out,
                            __m256 *the_min_out, float rmin, float rdelta, int nstep, bool use_mad) {
    __m256i Laux[32];
    __m256 min = xt[0], max = xt[0];
    __m256 sum_w = wt[0];
    __m256 sum_x = _mm256_mul_ps(sum_w, xt[0]);
    for (int i = 1; i < n; i++) {
        min = _mm256_blendv_ps(min, xt[i], _mm256_cmp_ps(xt[i], min, _CMP_LT_OQ));
        max = _mm256_blendv_ps(max, xt[i], _mm256_cmp_ps(xt[i], max, _CMP_GT_OQ));
        sum_w = _mm256_add_ps(sum_w, wt[i]);
        sum_x = _mm256_add_ps(sum_x, _mm256_mul_ps(wt[i], xt[i]));
    }
    const __m256 zero = _mm256_setzero_ps();
    min = _mm256_blendv_ps(min, zero, _mm256_cmp_ps(min, zero, _CMP_GT_OQ));
    const __m256 degenerate = _mm256_cmp_ps(max, min, _CMP_EQ_OQ);
    __m256 iscale = _mm256_div_ps(_mm256_set1_ps((float)nmax), _mm256_sub_ps(max, min));
    __m256 scale = _mm256_div_ps(_mm256_set1_ps(1.0f), iscale);
    __m256 best_error = zero;
    for (int i = 0; i < n; i++) {
        const __m256i l = clamp_epi32(nearest_int8(_mm256_mul_ps(iscale, _mm256_sub_ps(xt[i], min))), 0, nmax);
        Lt[i] = l;
        __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(l)), min), xt[i]);
        diff = use_mad ? abs_ps(diff) : _mm256_mul_ps(diff, diff);
        best_error = _mm256_add_ps(best_error, _mm256_mul_ps(wt[i], diff));
    }
    for (int is = 0; is <= nstep; is++) {
        const float c = rmin + rdelta * is + nmax;
        /* max - min with the current min: the search moves min as it goes, as the scalar one does */
        iscale = _mm256_div_ps(_mm256_set1_ps(c), _mm256_sub_ps(max, min));
        __m256 sum_l = zero, sum_l2 = zero, sum_xl = zero;
        for (int i = 0; i < n; i++) {
            const __m256i l = clamp_epi32(nearest_int8(_mm256_mul_ps(iscale, _mm256_sub_ps(xt[i], min))), 0, nmax);
            Laux[i] = l;
            const __m256 wl = _mm256_mul_ps(wt[i], _mm256_cvtepi32_ps(l));
            sum_l = _mm256_add_ps(sum_l, wl);
            sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, _mm256_cvtepi32_ps(l)));
            sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, xt[i]));
        }
        const __m256 D = _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_l2), _mm256_mul_ps(sum_l, sum_l));
        const __m256 d_pos = _mm256_cmp_ps(D, zero, _CMP_GT_OQ);
        if (_mm256_movemask_ps(d_pos) == 0) continue;
        __m256 this_scale = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_w, sum_xl), _mm256_mul_ps(sum_x, sum_l)), D);
        __m256 this_min = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_l2, sum_x), _mm256_mul_ps(sum_l, sum_xl)), D);
        const __m256 min_pos = _mm256_cmp_ps(this_min, zero, _CMP_GT_OQ);
        this_min = _mm256_blendv_ps(this_min, zero, min_pos);
        this_scale = _mm256_blendv_ps(this_scale, _mm256_div_ps(sum_xl, sum_l2), min_pos);
        __m256 cur_error = zero;
        for (int i = 0; i < n; i++) {
            __m256 diff =
                _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(this_scale, _mm256_cvtepi32_ps(Laux[i])), this_min), xt[i]);
            diff = use_mad ? abs_ps(diff) : _mm256_mul_ps(diff, diff);
            cur_error = _mm256_add_ps(cur_error, _mm256_mul_ps(wt[i], diff));
        }
        const __m256 upd = _mm256_and_ps(d_pos, _mm256_cmp_ps(cur_error, best_error, _CMP_LT_OQ));
        if (_mm256_movemask_ps(upd) == 0) continue;
        const __m256i updi = _mm256_castps_si256(upd);
        for (int i = 0; i < n; i++) Lt[i] = _mm256_blendv_epi8(Lt[i], Laux[i], updi);
        best_error = _mm256_blendv_ps(best_error, cur_error, upd);
        scale = _mm256_blendv_ps(scale, this_scale, upd);
        min = _mm256_blendv_ps(min, this_min, upd);
    }
    /* a constant sub-block: levels 0, scale 0, the min as is */
    const __m256i degi = _mm256_castps_si256(degenerate);
    for (int i = 0; i < n; i++) Lt[i] = _mm256_andnot_si256(degi, Lt[i]);
    *scale_out = _mm256_blendv_ps(scale, zero, degenerate);
    *the_min_out = _mm256_xor_ps(min, _mm256_set1_ps(-0.0f));
}

AVX2 void kiln_search_qkx2_avx2(const float *x, int n_sub, int sub_len, int nmax, float rmin, int nstep, bool use_mad,
                                bool rms_weights, float *scales, float *mins, uint8_t *L) {
    KILN_ASSERT(n_sub % 8 == 0 && sub_len <= 32 && nstep >= 1);
    __m256 xt[32], wt[32];
    __m256i Lt[32];
    for (int g = 0; g < n_sub; g += 8) {
        const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(sub_len));
        const float *base = x + g * sub_len;
        __m256 sum_x2 = _mm256_setzero_ps();
        for (int i = 0; i < sub_len; i++) {
            xt[i] = _mm256_i32gather_ps(base + i, idx, 4);
            sum_x2 = _mm256_add_ps(sum_x2, _mm256_mul_ps(xt[i], xt[i]));
        }
        const __m256 av_x = _mm256_sqrt_ps(_mm256_div_ps(sum_x2, _mm256_set1_ps((float)sub_len)));
        for (int i = 0; i < sub_len; i++) wt[i] = rms_weights ? _mm256_add_ps(av_x, abs_ps(xt[i])) : abs_ps(xt[i]);
        __m256 sc, mn;
        qkx2_lanes(sub_len, nmax, xt, wt, Lt, &sc, &mn, rmin, 0.1f, nstep, use_mad);
        _mm256_storeu_ps(scales + g, sc);
        _mm256_storeu_ps(mins + g, mn);
        int32_t lv[32][8];
        for (int i = 0; i < sub_len; i++) _mm256_storeu_si256((__m256i *)lv[i], Lt[i]);
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < sub_len; i++) L[(g + j) * sub_len + i] = (uint8_t)lv[i][j];
    }
}

/* make_qx_quants(16, 32, x, L, rmse_type 1) on the 16 sub-blocks of a Q6_K super-block, 8 at a time. */
AVX2 void kiln_search_qx_avx2(const float *x, float *scales, int8_t *L) {
    const int n = 16, nmax = 32;
    const __m256 zero = _mm256_setzero_ps();
    __m256 xt[16], w[16], wx[16];
    __m256i Lt[16], Ltmp[16];
    for (int g = 0; g < QK_K / 16; g += 8) {
        const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(n));
        __m256 amax = zero, max = zero;
        for (int i = 0; i < n; i++) {
            xt[i] = _mm256_i32gather_ps(x + g * n + i, idx, 4);
            const __m256 ax = abs_ps(xt[i]);
            const __m256 gt = _mm256_cmp_ps(ax, amax, _CMP_GT_OQ);
            amax = _mm256_blendv_ps(amax, ax, gt);
            max = _mm256_blendv_ps(max, xt[i], gt);
            w[i] = _mm256_mul_ps(xt[i], xt[i]);
            wx[i] = _mm256_mul_ps(w[i], xt[i]);
        }
        const __m256 tiny = _mm256_cmp_ps(amax, _mm256_set1_ps(1e-15f), _CMP_LT_OQ);
        __m256 iscale = _mm256_div_ps(_mm256_set1_ps((float)-nmax), max);
        __m256 sumlx = zero, suml2 = zero;
        for (int i = 0; i < n; i++) {
            const __m256i l = clamp_epi32(nearest_int8(_mm256_mul_ps(iscale, xt[i])), -nmax, nmax - 1);
            Lt[i] = l;
            const __m256 lf = _mm256_cvtepi32_ps(l);
            sumlx = _mm256_add_ps(sumlx, _mm256_mul_ps(wx[i], lf));
            suml2 = _mm256_add_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w[i], lf), lf));
        }
        /* scale = suml2 ? sumlx / suml2 : 0 */
        __m256 scale = _mm256_blendv_ps(_mm256_div_ps(sumlx, suml2), zero, _mm256_cmp_ps(suml2, zero, _CMP_EQ_OQ));
        __m256 best = _mm256_mul_ps(scale, sumlx);
        for (int is = -9; is <= 9; is++) {
            if (is == 0) continue;
            const float c = -(nmax + 0.1f * is);
            iscale = _mm256_div_ps(_mm256_set1_ps(c), max);
            sumlx = suml2 = zero;
            for (int i = 0; i < n; i++) {
                const __m256i l = clamp_epi32(nearest_int8(_mm256_mul_ps(iscale, xt[i])), -nmax, nmax - 1);
                Ltmp[i] = l;
                const __m256 lf = _mm256_cvtepi32_ps(l);
                sumlx = _mm256_add_ps(sumlx, _mm256_mul_ps(wx[i], lf));
                suml2 = _mm256_add_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w[i], lf), lf));
            }
            const __m256 upd = _mm256_and_ps(_mm256_cmp_ps(suml2, zero, _CMP_GT_OQ),
                                             _mm256_cmp_ps(_mm256_mul_ps(sumlx, sumlx), _mm256_mul_ps(best, suml2), _CMP_GT_OQ));
            if (_mm256_movemask_ps(upd) == 0) continue;
            const __m256i updi = _mm256_castps_si256(upd);
            for (int i = 0; i < n; i++) Lt[i] = _mm256_blendv_epi8(Lt[i], Ltmp[i], updi);
            const __m256 new_scale = _mm256_div_ps(sumlx, suml2);
            scale = _mm256_blendv_ps(scale, new_scale, upd);
            best = _mm256_blendv_ps(best, _mm256_mul_ps(new_scale, sumlx), upd);
        }
        /* all-zero sub-blocks: levels 0 (not + nmax) and scale 0 */
        const __m256i tinyi = _mm256_castps_si256(tiny);
        _mm256_storeu_ps(scales + g, _mm256_blendv_ps(scale, zero, tiny));
        int32_t lv[16][8];
        for (int i = 0; i < n; i++)
            _mm256_storeu_si256((__m256i *)lv[i], _mm256_andnot_si256(tinyi, _mm256_add_epi32(Lt[i], _mm256_set1_epi32(nmax))));
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < n; i++) L[(g + j) * n + i] = (int8_t)lv[i][j];
    }
}
