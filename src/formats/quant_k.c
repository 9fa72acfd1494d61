/*
 * quant_k.c — the 256-value super-block formats Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and the activation format
 * Q8_K: dequantization, ggml's reference quantizers without an importance matrix (including their
 * iterative scale searches, reproduced step for step so the bytes match) and the scalar reference dot
 * products in the order of operations of ggml's generic kernels.
 *
 * Float expressions are never contracted into FMA here (GCC's ISO C mode; the pragma for clang), except
 * where ggml's generic kernels are (explicit fmaf), so results match ggml bit for bit.
 */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
#include <math.h>
#include <stdbool.h>

#include "formats/blocks.h"

#define F16(h) kiln_f16_to_f32(h)
#define TO_F16(f) kiln_f32_to_f16(f)
#define GROUP_MAX_EPS 1e-15f

static inline int imax(int a, int b) { return a > b ? a : b; }
static inline int imin(int a, int b) { return a < b ? a : b; }

/* ------------------------------------------------------------------------------------ dequantize */

void kiln_q2_K_to_float(const void *vx, float *y, int64_t n) {
    const block_q2_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = F16(x[i].d), min = F16(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int half = 0; half < QK_K; half += 128) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                for (int part = 0; part < 2; part++) {
                    const uint8_t sc = x[i].scales[is++];
                    const float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * (int8_t)((q[l + 16 * part] >> shift) & 3) - ml;
                }
                shift += 2;
            }
            q += 32;
        }
    }
}

void kiln_q3_K_to_float(const void *vx, float *y, int64_t n) {
    const block_q3_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d_all = F16(x[i].d);
        const uint8_t *q = x[i].qs, *hm = x[i].hmask;
        int8_t scales[16];
        kiln_q3k_scales(x[i].scales, scales);
        uint8_t m = 1;
        int is = 0;
        for (int half = 0; half < QK_K; half += 128) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                for (int part = 0; part < 2; part++) {
                    const float dl = d_all * scales[is++];
                    for (int l = 16 * part; l < 16 * part + 16; l++)
                        *y++ = dl * ((int8_t)((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                }
                shift += 2;
                m = (uint8_t)(m << 1);
            }
            q += 32;
        }
    }
}

void kiln_q4_K_to_float(const void *vx, float *y, int64_t n) {
    const block_q4_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const float d = F16(x[i].d), min = F16(x[i].dmin);
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < QK_K; j += 64) {
            kiln_k4_scale_min(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            kiln_k4_scale_min(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

void kiln_q5_K_to_float(const void *vx, float *y, int64_t n) {
    const block_q5_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = F16(x[i].d), min = F16(x[i].dmin);
        int is = 0;
        uint8_t sc, m, u1 = 1, u2 = 2;
        for (int j = 0; j < QK_K; j += 64) {
            kiln_k4_scale_min(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            kiln_k4_scale_min(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 = (uint8_t)(u1 << 2);
            u2 = (uint8_t)(u2 << 2);
        }
    }
}

void kiln_q6_K_to_float(const void *vx, float *y, int64_t n) {
    const block_q6_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = F16(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int half = 0; half < QK_K; half += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

void kiln_q8_K_to_float(const void *vx, float *y, int64_t n) {
    const block_q8_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int j = 0; j < QK_K; j++) *y++ = x[i].d * x[i].qs[j];
}

/* ------------------------------------------------------------------------------ scale searches */

/* The value of largest magnitude among x[0..n) (the first one on ties, as ggml scans), with its
 * magnitude in *amax; 0 and 0 for an all-zero input. */
static float signed_absmax(int n, const float *x, float *amax) {
    float max = 0, a = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > a) {
            a = ax;
            max = x[i];
        }
    }
    *amax = a;
    return max;
}

/* Symmetric quantization of n values to [-nmax, nmax-1] (stored + nmax in L) with a weighted
 * least-squares refinement over 18 trial scales (ggml's make_qx_quants without importance weights;
 * rmse_type 1 weights each value by x^2). Returns the scale. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type) {
    float amax;
    const float max = signed_absmax(n, x, &amax);
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    if (rmse_type == 0) {
        for (int i = 0; i < n; i++) {
            const int l = kiln_nearest_int(iscale * x[i]);
            L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
        }
        return 1 / iscale;
    }
    bool return_early = false;
    if (rmse_type < 0) {
        rmse_type = -rmse_type;
        return_early = true;
    }
#define QX_WEIGHT(v) (rmse_type == 1 ? (v) * (v) : rmse_type == 2 ? 1 : rmse_type == 3 ? fabsf(v) : sqrtf(fabsf(v)))
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = kiln_nearest_int(iscale * x[i]);
        l = imax(-nmax, imin(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        const float w = QX_WEIGHT(x[i]);
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    if (return_early) return suml2 > 0 ? 0.5f * (scale + 1 / iscale) : 1 / iscale;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = kiln_nearest_int(iscale * x[i]);
            l = imax(-nmax, imin(nmax - 1, l));
            const float w = QX_WEIGHT(x[i]);
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                const int l = kiln_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
#undef QX_WEIGHT
    return scale;
}

/* Asymmetric quantization of n values to [0, nmax] with a min: starts from the plain min/max grid,
 * then tries nstep+1 scales (rmin + rdelta*is + nmax)/(max-min), each refined by a weighted least-
 * squares fit of scale and min, keeping the lowest weighted error (absolute when use_mad, squared
 * otherwise). Returns the scale; *the_min receives -min (>= 0). ggml's make_qkx2_quants. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                              uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        const int l = kiln_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)imax(0, imin(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = kiln_nearest_int(iscale * (x[i] - min));
            l = imax(0, imin(nmax, l));
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; i++) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Symmetric 3-bit quantization of n values to [-nmax, nmax-1] (stored + nmax in L); with do_rmse,
 * up to 5 passes of coordinate descent on the x^2-weighted squared error. ggml's make_q3_quants. */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L, bool do_rmse) {
    float amax;
    const float max = signed_absmax(n, x, &amax);
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    const float iscale = -nmax / max;
    if (do_rmse) {
        float sumlx = 0, suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = kiln_nearest_int(iscale * x[i]);
            l = imax(-nmax, imin(nmax - 1, l));
            L[i] = (int8_t)l;
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        for (int itry = 0; itry < 5; itry++) {
            int n_changed = 0;
            for (int i = 0; i < n; i++) {
                const float w = x[i] * x[i];
                float slx = sumlx - w * x[i] * L[i];
                if (slx > 0) {
                    float sl2 = suml2 - w * L[i] * L[i];
                    int new_l = kiln_nearest_int(x[i] * sl2 / slx);
                    new_l = imax(-nmax, imin(nmax - 1, new_l));
                    if (new_l != L[i]) {
                        slx += w * x[i] * new_l;
                        sl2 += w * new_l * new_l;
                        if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                            L[i] = (int8_t)new_l;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed++;
                        }
                    }
                }
            }
            if (!n_changed) break;
        }
        for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
        return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
    }
    for (int i = 0; i < n; i++) {
        int l = kiln_nearest_int(iscale * x[i]);
        l = imax(-nmax, imin(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
    }
    return 1 / iscale;
}

/* -------------------------------------------------------------------------------------- quantize */

/* The per-sub-block scale/min search of the K types with mins (Q2_K, Q4_K, Q5_K), scalar: n_sub
 * sub-blocks of sub_len values; weights |x| (Q2_K) or sqrt(mean x^2) + |x| (Q4_K, Q5_K). */
void kiln_search_qkx2_scalar(const float *x, int n_sub, int sub_len, int nmax, float rmin, int nstep, bool use_mad,
                             bool rms_weights, float *scales, float *mins, uint8_t *L) {
    uint8_t Laux[32];
    float weights[32];
    for (int j = 0; j < n_sub; j++) {
        const float *xs = x + sub_len * j;
        float av_x = 0;
        if (rms_weights) {
            float sum_x2 = 0;
            for (int l = 0; l < sub_len; l++) sum_x2 += xs[l] * xs[l];
            av_x = sqrtf(sum_x2 / sub_len);
        }
        for (int l = 0; l < sub_len; l++) weights[l] = rms_weights ? av_x + fabsf(xs[l]) : fabsf(xs[l]);
        scales[j] = make_qkx2_quants(sub_len, nmax, xs, weights, L + sub_len * j, &mins[j], Laux, rmin, 0.1f, nstep, use_mad);
    }
}

static void encode_q2_K(const float *x, void *vy, int64_t n, kiln_search_qkx2_fn search) {
    block_q2_K *y = vy;
    uint8_t L[QK_K];
    float mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        search(x, QK_K / 16, 16, 3, -0.5f, 15, true, false, scales, mins, L);
        for (int j = 0; j < QK_K / 16; j++) {
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (uint8_t)kiln_nearest_int(iscale * scales[j]);
            y[i].d = TO_F16(max_scale / q4scale);
        } else {
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = 0;
            y[i].d = TO_F16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; j++)
                y[i].scales[j] = (uint8_t)(y[i].scales[j] | (kiln_nearest_int(iscale * mins[j]) << 4));
            y[i].dmin = TO_F16(max_min / q4scale);
        } else {
            y[i].dmin = TO_F16(0.f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = F16(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float dm = F16(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++) {
                const int l = kiln_nearest_int((x[16 * j + ii] + dm) / d);
                L[16 * j + ii] = (uint8_t)imax(0, imin(3, l));
            }
        }
        for (int j = 0; j < QK_K; j += 128)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
}

void kiln_q2_K_from_float(const float *x, void *vy, int64_t n) { encode_q2_K(x, vy, n, kiln_search_qkx2_scalar); }
#if KILN_X86 /* the searches are in quant_k_avx2.c */
void kiln_q2_K_from_float_avx2(const float *x, void *vy, int64_t n) { encode_q2_K(x, vy, n, kiln_search_qkx2_avx2); }
#endif

void kiln_q3_K_from_float(const float *x, void *vy, int64_t n) {
    block_q3_K *y = vy;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j, true);
            const float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(y[i].scales, 0, 12);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                int8_t l = (int8_t)kiln_nearest_int(iscale * scales[j]);
                l = (int8_t)(imax(-32, imin(31, l)) + 32);
                if (j < 8) y[i].scales[j] = (uint8_t)(l & 0xF);
                else y[i].scales[j - 8] = (uint8_t)(y[i].scales[j - 8] | ((l & 0xF) << 4));
                l = (int8_t)(l >> 4);
                y[i].scales[j % 4 + 8] = (uint8_t)(y[i].scales[j % 4 + 8] | (l << (2 * (j / 4))));
            }
            y[i].d = TO_F16(1 / iscale);
        } else {
            y[i].d = TO_F16(0.f);
        }
        int8_t sc[16];
        kiln_q3k_scales(y[i].scales, sc);
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = F16(y[i].d) * sc[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                int l = kiln_nearest_int(x[16 * j + ii] / d);
                l = imax(-4, imin(3, l));
                L[16 * j + ii] = (int8_t)(l + 4);
            }
        }
        memset(y[i].hmask, 0, QK_K / 8);
        /* high bit of value j goes to hmask[j % 32], bit j / 32 */
        int m = 0;
        uint8_t hm = 1;
        for (int j = 0; j < QK_K; j++) {
            if (L[j] > 3) {
                y[i].hmask[m] |= hm;
                L[j] = (int8_t)(L[j] - 4);
            }
            if (++m == QK_K / 8) {
                m = 0;
                hm = (uint8_t)(hm << 1);
            }
        }
        for (int j = 0; j < QK_K; j += 128)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
}

/* Packs 8 six-bit scales and mins into the 12-byte Q4_K / Q5_K layout. */
static void pack_k4_scales(uint8_t *out, const float *scales, const float *mins, float inv_scale, float inv_min) {
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = (uint8_t)kiln_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)kiln_nearest_int(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            out[j] = ls;
            out[j + 4] = lm;
        } else {
            out[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            out[j - 4] = (uint8_t)(out[j - 4] | ((ls >> 4) << 6));
            out[j - 0] = (uint8_t)(out[j - 0] | ((lm >> 4) << 6));
        }
    }
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): per 32-value sub-block scale/min search, the 6-bit
 * packing, then the final levels against the rounded scales. L receives the levels. */
static void quantize_k4_superblock(const float *x, uint16_t *d_out, uint16_t *dmin_out, uint8_t *scales_out,
                                   uint8_t *L, int nmax, float rmin, int nstep, kiln_search_qkx2_fn search) {
    float mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    search(x, QK_K / 32, 32, nmax, rmin, nstep, false, true, scales, mins, L);
    for (int j = 0; j < QK_K / 32; j++) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    pack_k4_scales(scales_out, scales, mins, inv_scale, inv_min);
    *d_out = TO_F16(max_scale / 63.f);
    *dmin_out = TO_F16(max_min / 63.f);
    uint8_t sc, m;
    for (int j = 0; j < QK_K / 32; j++) {
        kiln_k4_scale_min(j, scales_out, &sc, &m);
        const float d = F16(*d_out) * sc;
        if (!d) continue;
        const float dm = F16(*dmin_out) * m;
        for (int ii = 0; ii < 32; ii++) {
            const int l = kiln_nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, l));
        }
    }
}

static void encode_q4_K(const float *x, void *vy, int64_t n, kiln_search_qkx2_fn search) {
    block_q4_K *y = vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        quantize_k4_superblock(x, &y[i].d, &y[i].dmin, y[i].scales, L, 15, -1.f, 20, search);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64) {
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
            q += 32;
        }
    }
}

static void encode_q5_K(const float *x, void *vy, int64_t n, kiln_search_qkx2_fn search) {
    block_q5_K *y = vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        quantize_k4_superblock(x, &y[i].d, &y[i].dmin, y[i].scales, L, 31, -0.5f, 15, search);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int n64 = 0; n64 < QK_K; n64 += 64) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[n64 + j];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                int l2 = L[n64 + j + 32];
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
            ql += 32;
        }
    }
}

void kiln_q4_K_from_float(const float *x, void *vy, int64_t n) { encode_q4_K(x, vy, n, kiln_search_qkx2_scalar); }
void kiln_q5_K_from_float(const float *x, void *vy, int64_t n) { encode_q5_K(x, vy, n, kiln_search_qkx2_scalar); }
#if KILN_X86 /* the searches are in quant_k_avx2.c */
void kiln_q4_K_from_float_avx2(const float *x, void *vy, int64_t n) { encode_q4_K(x, vy, n, kiln_search_qkx2_avx2); }
void kiln_q5_K_from_float_avx2(const float *x, void *vy, int64_t n) { encode_q5_K(x, vy, n, kiln_search_qkx2_avx2); }
#endif

/* The symmetric search of Q6_K, scalar: 16 sub-blocks of 16, levels + 32 in L. */
void kiln_search_qx_scalar(const float *x, float *scales, int8_t *L) {
    for (int ib = 0; ib < QK_K / 16; ib++) scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);
}

static void encode_q6_K(const float *x, void *vy, int64_t n, kiln_search_qx_fn search) {
    block_q6_K *y = vy;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        search(x, scales, L);
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const float scale = scales[ib];
            const float abs_scale = fabsf(scale);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof(block_q6_K));
            y[i].d = TO_F16(0.f);
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = TO_F16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++) y[i].scales[ib] = (int8_t)imin(127, kiln_nearest_int(iscale * scales[ib]));
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = F16(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                int l = kiln_nearest_int(x[16 * j + ii] / d);
                l = imax(-32, imin(31, l));
                L[16 * j + ii] = (int8_t)(l + 32);
            }
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
            ql += 64;
            qh += 32;
        }
    }
}

void kiln_q6_K_from_float(const float *x, void *vy, int64_t n) { encode_q6_K(x, vy, n, kiln_search_qx_scalar); }
#if KILN_X86 /* the searches are in quant_k_avx2.c */
void kiln_q6_K_from_float_avx2(const float *x, void *vy, int64_t n) { encode_q6_K(x, vy, n, kiln_search_qx_avx2); }
#endif

void kiln_q8_K_from_float(const float *x, void *vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float amax;
        const float max = signed_absmax(QK_K, x, &amax);
        if (!amax) {
            y[i].d = 0;
            memset(y[i].qs, 0, QK_K);
            memset(y[i].bsums, 0, sizeof y[i].bsums);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) y[i].qs[j] = (int8_t)imin(127, kiln_nearest_int(iscale * x[j]));
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* ------------------------------------------------------------------------------- reference dots */

void kiln_dot_q2_K_q8_K(int n, float *s, const void *vx, const void *vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        const uint8_t *q2 = x[i].qs, *sc = x[i].scales;
        const int8_t *q8 = y[i].qs;
        int summs = 0;
        for (int j = 0; j < 16; j++) summs += y[i].bsums[j] * (sc[j] >> 4);
        const float dall = y[i].d * F16(x[i].d);
        const float dmin = y[i].d * F16(x[i].dmin);
        int isum = 0, is = 0;
        for (int k = 0; k < QK_K / 128; k++) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                int d = sc[is++] & 0xF, isuml = 0;
                for (int l = 0; l < 16; l++) isuml += q8[l] * ((q2[l] >> shift) & 3);
                isum += d * isuml;
                d = sc[is++] & 0xF;
                isuml = 0;
                for (int l = 16; l < 32; l++) isuml += q8[l] * ((q2[l] >> shift) & 3);
                isum += d * isuml;
                shift += 2;
                q8 += 32;
            }
            q2 += 32;
        }
        sumf += fmaf(dall, (float)isum, -(dmin * summs));
    }
    *s = sumf;
}

/* The common tail of the Q3_K..Q6_K generic dots: a holds the 256 signed levels of the block,
 * scales one integer scale per 16 values; accumulates into 8 int32 lanes as ggml does. */
static void accumulate_16(const int8_t *a, const int8_t *q8, const int *scales16, int32_t aux32[8]) {
    int16_t aux16[8];
    for (int j = 0; j < QK_K / 16; j++) {
        for (int half = 0; half < 2; half++) {
            for (int l = 0; l < 8; l++) aux16[l] = (int16_t)(q8[l] * a[l]);
            for (int l = 0; l < 8; l++) aux32[l] += scales16[j] * aux16[l];
            q8 += 8;
            a += 8;
        }
    }
}

void kiln_dot_q3_K_q8_K(int n, float *s, const void *vx, const void *vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    int8_t aux8[QK_K], sc[16];
    int32_t aux32[8];
    int scales16[16];
    float sums[8] = {0};
    for (int i = 0; i < n / QK_K; i++) {
        const uint8_t *q3 = x[i].qs, *hm = x[i].hmask;
        memset(aux32, 0, sizeof aux32);
        int8_t *a = aux8;
        uint8_t m = 1;
        for (int j = 0; j < QK_K; j += 128) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int l = 0; l < 32; l++) a[l] = (int8_t)(((q3[l] >> shift) & 3) - (hm[l] & m ? 0 : 4));
                a += 32;
                m = (uint8_t)(m << 1);
            }
            q3 += 32;
        }
        kiln_q3k_scales(x[i].scales, sc);
        for (int j = 0; j < 16; j++) scales16[j] = sc[j];
        accumulate_16(aux8, y[i].qs, scales16, aux32);
        const float d = F16(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) sums[l] = fmaf(d, (float)aux32[l], sums[l]);
    }
    float sumf = 0;
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

/* Q4_K / Q5_K share everything but the level unpacking. */
static void dot_k4_tail(const int8_t *aux8, const uint8_t *packed_scales, uint16_t xd, uint16_t xdmin,
                        const block_q8_K *y, float sums[8], float *sumf) {
    int scales16[16];
    int32_t aux32[8] = {0};
    uint8_t sc[8], mn[8];
    kiln_k4_scales_mins(packed_scales, sc, mn);
    int sumi = 0;
    for (int j = 0; j < QK_K / 16; j++) sumi += y->bsums[j] * mn[j / 2];
    for (int j = 0; j < 16; j++) scales16[j] = sc[j / 2];
    accumulate_16(aux8, y->qs, scales16, aux32);
    const float d = F16(xd) * y->d;
    for (int l = 0; l < 8; l++) sums[l] = fmaf(d, (float)aux32[l], sums[l]);
    const float dmin = F16(xdmin) * y->d;
    *sumf = fmaf(-dmin, (float)sumi, *sumf);
}

void kiln_dot_q4_K_q8_K(int n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    int8_t aux8[QK_K];
    float sums[8] = {0}, sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        const uint8_t *q4 = x[i].qs;
        int8_t *a = aux8;
        for (int j = 0; j < QK_K / 64; j++) {
            for (int l = 0; l < 32; l++) a[l] = (int8_t)(q4[l] & 0xF);
            a += 32;
            for (int l = 0; l < 32; l++) a[l] = (int8_t)(q4[l] >> 4);
            a += 32;
            q4 += 32;
        }
        dot_k4_tail(aux8, x[i].scales, x[i].d, x[i].dmin, &y[i], sums, &sumf);
    }
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

void kiln_dot_q5_K_q8_K(int n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    int8_t aux8[QK_K];
    float sums[8] = {0}, sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        const uint8_t *q4 = x[i].qs, *hm = x[i].qh;
        int8_t *a = aux8;
        uint8_t m = 1;
        for (int j = 0; j < QK_K / 64; j++) {
            for (int l = 0; l < 32; l++) a[l] = (int8_t)((q4[l] & 0xF) + (hm[l] & m ? 16 : 0));
            a += 32;
            m = (uint8_t)(m << 1);
            for (int l = 0; l < 32; l++) a[l] = (int8_t)((q4[l] >> 4) + (hm[l] & m ? 16 : 0));
            a += 32;
            m = (uint8_t)(m << 1);
            q4 += 32;
        }
        dot_k4_tail(aux8, x[i].scales, x[i].d, x[i].dmin, &y[i], sums, &sumf);
    }
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

void kiln_dot_q6_K_q8_K(int n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    int8_t aux8[QK_K];
    int32_t aux32[8];
    int scales16[16];
    float sums[8] = {0};
    for (int i = 0; i < n / QK_K; i++) {
        const uint8_t *q4 = x[i].ql, *qh = x[i].qh;
        memset(aux32, 0, sizeof aux32);
        int8_t *a = aux8;
        for (int j = 0; j < QK_K; j += 128) {
            for (int l = 0; l < 32; l++) {
                a[l + 0] = (int8_t)((q4[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                a[l + 32] = (int8_t)((q4[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                a[l + 64] = (int8_t)((q4[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                a[l + 96] = (int8_t)((q4[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            }
            a += 128;
            q4 += 64;
            qh += 32;
        }
        for (int j = 0; j < 16; j++) scales16[j] = x[i].scales[j];
        accumulate_16(aux8, y[i].qs, scales16, aux32);
        const float d = F16(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) sums[l] = fmaf(d, (float)aux32[l], sums[l]);
    }
    float sumf = 0;
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}
