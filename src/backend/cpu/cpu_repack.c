/* cpu_repack.c — Q8_0 and Q4_K weights in groups of 16 interleaved rows (cpu_repack.h): the copies made at open,
 * the scalar references of the kernels over them, and the choice of which weights a backend repacks. */
#include "backend/cpu/cpu_repack.h"

#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "formats/blocks.h"
#include "formats/formats.h"

#define R16_STEPS (QK8_0 / 4) /* 4-byte steps of a block */
#define REPACK_ALIGN (2u << 20)   /* the copies' buffer on huge-page bounds */

bool cpu_repack_fits(const kiln_weight *w) {
    return w && (w->type == KILN_TYPE_Q4_K || (w->type == KILN_TYPE_Q8_0 && w->ne[0] % 64 == 0)) && w->interleave == 0 &&
           w->ne[2] == 1 && w->ne[1] > 0 && w->ne[1] % CPU_R16 == 0 && w->ne[0] > 0 && w->ne[0] <= (1u << 24);
}

/* One group: its 16 rows of the file (rows[i], nb blocks each) into grp, the group's place in the copy. */
static void group_q8_0(const uint8_t *const *rows, uint8_t *grp, int nb) {
    for (int ib = 0; ib < nb; ib++) {
        uint16_t *d = (uint16_t *)(grp + cpu_r16_d(ib));
        uint8_t *qs = grp + cpu_r16_qs(ib);
        for (int i = 0; i < CPU_R16; i++) d[i] = ((const block_q8_0 *)rows[i])[ib].d;
        for (int k = 0; k < R16_STEPS; k++)
            for (int i = 0; i < CPU_R16; i++, qs += 4) { /* the row's 4 bytes, each plus 128 */
                uint32_t v;
                memcpy(&v, ((const block_q8_0 *)rows[i])[ib].qs + 4 * k, sizeof v);
                v ^= 0x80808080u;
                memcpy(qs, &v, sizeof v);
            }
    }
}

static void group_q4_K(const uint8_t *const *rows, uint8_t *grp, int nb) {
    for (int ib = 0; ib < nb; ib++, grp += CPU_R16_K4_BLOCK) {
        uint16_t *d = (uint16_t *)grp;
        uint32_t *u = (uint32_t *)(grp + CPU_R16_K4_U);
        uint8_t *qs = grp + CPU_R16_K4_QS;
        for (int i = 0; i < CPU_R16; i++) {
            const block_q4_K *x = (const block_q4_K *)rows[i] + ib;
            d[i] = x->d;
            d[CPU_R16 + i] = x->dmin;
            for (int k = 0; k < 3; k++) memcpy(&u[k * CPU_R16 + i], x->scales + 4 * k, 4);
        }
        for (int jk = 0; jk < QK_K / 2 / 4; jk++) /* run j = jk / 8, step k = jk % 8: qs[4 jk..] */
            for (int i = 0; i < CPU_R16; i++, qs += 4) memcpy(qs, ((const block_q4_K *)rows[i])[ib].qs + 4 * jk, 4);
    }
}

void cpu_repack_r16(const kiln_weight *w, uint8_t *dst, int g0, int g1) {
    KILN_ASSERT(cpu_repack_fits(w));
    const bool k4 = w->type == KILN_TYPE_Q4_K;
    const size_t row = kiln_row_bytes(w->type, w->ne[0]);
    const int nb = (int)(w->ne[0] / (k4 ? QK_K : QK8_0));
    for (int g = g0; g < g1; g++) {
        const uint8_t *rows[CPU_R16];
        for (int i = 0; i < CPU_R16; i++) rows[i] = (const uint8_t *)w->data + ((size_t)g * CPU_R16 + (size_t)i) * row;
        (k4 ? group_q4_K : group_q8_0)(rows, dst + (size_t)g * CPU_R16 * row, nb);
    }
}

float cpu_dot_q8_0_r16(int n, const void *w_row, const void *y_row) {
    const block_q8_0 *x = w_row, *y = y_row;
    float acc = 0.0f;
    for (int ib = 0; ib < n / QK8_0; ib++) {
        int32_t s = 0;
        for (int i = 0; i < QK8_0; i++) s += (int32_t)x[ib].qs[i] * y[ib].qs[i];
        acc = fmaf(kiln_f16_to_f32(x[ib].d) * kiln_f16_to_f32(y[ib].d), (float)s, acc);
    }
    return acc;
}

/* Block ib's integer sums against y: scale * run sums, and min * run activation sums (sc, mn: kiln_k4_scales_mins;
 * q(v): the level of value v). */
#define K4_R16_SUMS(sc, mn, q, y, tot, msum)                                                                   \
    do {                                                                                                      \
        tot = msum = 0;                                                                                       \
        for (int s_ = 0; s_ < 8; s_++) {                                                                       \
            int32_t run = 0;                                                                                  \
            for (int l_ = 0; l_ < 32; l_++) run += (int32_t)q(32 * s_ + l_) * (y)->qs[32 * s_ + l_];           \
            tot += (int32_t)(sc)[s_] * run;                                                                   \
            msum += (int32_t)(mn)[s_] * ((y)->bsums[2 * s_] + (y)->bsums[2 * s_ + 1]);                         \
        }                                                                                                     \
    } while (0)

float cpu_dot_q4_K_r16(int n, const void *w_row, const void *y_row) {
    const block_q4_K *x = w_row;
    const block_q8_K *y = y_row;
    float acc = 0.0f, accm = 0.0f;
    for (int ib = 0; ib < n / QK_K; ib++) {
        uint8_t sc[8], mn[8];
        kiln_k4_scales_mins(x[ib].scales, sc, mn);
#define Q_FILE(v) ((x[ib].qs[32 * ((v) / 64) + (v) % 32] >> (4 * ((v) % 64 / 32))) & 15)
        int32_t tot, msum;
        K4_R16_SUMS(sc, mn, Q_FILE, &y[ib], tot, msum);
#undef Q_FILE
        acc = fmaf(kiln_f16_to_f32(x[ib].d) * y[ib].d, (float)tot, acc);
        accm = fmaf(kiln_f16_to_f32(x[ib].dmin) * y[ib].d, (float)msum, accm);
    }
    return acc - accm;
}

void cpu_gemm_q4_K_r16_ref(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {
    KILN_ASSERT(r0 % CPU_R16 == 0 && r1 % CPU_R16 == 0);
    const int nb = a->n / QK_K;
    for (int r = r0; r < r1; r += CPU_R16)
        for (int b = b0; b < b1; b++) {
            const block_q8_K *y = (const block_q8_K *)(a->y + (size_t)b * a->y_stride);
            for (int i = 0; i < CPU_R16; i++) {
                float acc = 0.0f, accm = 0.0f;
                const uint8_t *blk = a->w + (size_t)r * a->w_stride;
                for (int ib = 0; ib < nb; ib++, blk += CPU_R16_K4_BLOCK) {
                    const uint16_t *d = (const uint16_t *)blk;
                    const uint32_t *u = (const uint32_t *)(blk + CPU_R16_K4_U);
                    const uint8_t *qs = blk + CPU_R16_K4_QS;
                    uint8_t packed[12], sc[8], mn[8];
                    for (int k = 0; k < 3; k++) memcpy(packed + 4 * k, &u[k * CPU_R16 + i], 4);
                    kiln_k4_scales_mins(packed, sc, mn);
#define Q_R16(v) ((qs[((v) / 64 * 8 + (v) % 32 / 4) * 4 * CPU_R16 + i * 4 + (v) % 4] >> (4 * ((v) % 64 / 32))) & 15)
                    int32_t tot, msum;
                    K4_R16_SUMS(sc, mn, Q_R16, &y[ib], tot, msum);
#undef Q_R16
                    acc = fmaf(kiln_f16_to_f32(d[i]) * y[ib].d, (float)tot, acc);
                    accm = fmaf(kiln_f16_to_f32(d[CPU_R16 + i]) * y[ib].d, (float)msum, accm);
                }
                a->out[(size_t)b * a->out_stride + (size_t)(r + i)] = acc - accm;
            }
        }
}

void cpu_r16_act_sums(uint32_t type, const void *y, int n, int32_t *ys) {
    if (type == KILN_TYPE_Q8_0) {
        const block_q8_0 *blk = y;
        for (int ib = 0; ib < n / QK8_0; ib++) {
            int32_t sum = 0;
            for (int k = 0; k < QK8_0; k++) sum += blk[ib].qs[k];
            ys[ib] = -128 * sum;
        }
        return;
    }
    KILN_ASSERT(type == KILN_TYPE_Q4_K);
    static const int pair[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
    const block_q8_K *blk = y;
    for (int ib = 0; ib < n / QK_K; ib++)
        for (int p = 0; p < 4; p++) {
            const int s0 = pair[p][0], s1 = pair[p][1];
            const int32_t lo = blk[ib].bsums[2 * s0] + blk[ib].bsums[2 * s0 + 1], hi = blk[ib].bsums[2 * s1] + blk[ib].bsums[2 * s1 + 1];
            ys[4 * ib + p] = (int32_t)(((uint32_t)(uint16_t)(int16_t)lo) | ((uint32_t)(uint16_t)(int16_t)hi << 16));
        }
}

cpu_gemm_fn cpu_gemm_r16_select(uint32_t type) {
#if KILN_X86
    if (kiln_cpu_level() >= KILN_CPU_AVX512) return type == KILN_TYPE_Q4_K ? cpu_gemm_q4_K_r16_avx512 : cpu_gemm_q8_0_r16_avx512;
#endif
    return type == KILN_TYPE_Q4_K ? cpu_gemm_q4_K_r16_ref : cpu_gemm_q8_0_r16_ref;
}

void cpu_gemm_q8_0_r16_ref(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {
    KILN_ASSERT(r0 % CPU_R16 == 0 && r1 % CPU_R16 == 0);
    const int nb = a->n / QK8_0;
    for (int r = r0; r < r1; r += CPU_R16) {
        const uint8_t *grp = a->w + (size_t)r * a->w_stride;
        for (int b = b0; b < b1; b++) {
            const block_q8_0 *y = (const block_q8_0 *)(a->y + (size_t)b * a->y_stride);
            for (int i = 0; i < CPU_R16; i++) {
                float acc = 0.0f;
                for (int ib = 0; ib < nb; ib++) {
                    const uint8_t *qs = grp + cpu_r16_qs(ib);
                    const uint16_t *d = (const uint16_t *)(grp + cpu_r16_d(ib));
                    int32_t s = 0;
                    for (int k = 0; k < QK8_0; k++) s += ((int32_t)qs[(k / 4) * 4 * CPU_R16 + i * 4 + k % 4] - 128) * y[ib].qs[k];
                    acc = fmaf(kiln_f16_to_f32(d[i]) * kiln_f16_to_f32(y[ib].d), (float)s, acc);
                }
                a->out[(size_t)b * a->out_stride + (size_t)(r + i)] = acc;
            }
        }
    }
}

/* ---- the backend's copies ---- */

/* The weight slots of desc that may be repacked (the dense ones; never the token embedding). */
static int weight_slots(kiln_blocks *d, const kiln_weight ***slot) {
    int n = 0;
    for (int il = 0; il < d->n_block; il++) {
        kiln_block *b = &d->blocks[il];
        const kiln_weight **s[] = {&b->attn.wq, &b->attn.wk, &b->attn.wv, &b->attn.wo, &b->ffn.gate, &b->ffn.up, &b->ffn.down};
        const int ns = b->ffn.kind == KILN_FFN_DENSE_SWIGLU ? 7 : 4;
        for (int i = 0; i < ns; i++)
            if (slot) slot[n++] = s[i];
            else n++;
    }
    if (slot) slot[n] = &d->output;
    return n + 1;
}

typedef struct repack_job {
    const kiln_weight *const *src;
    const cpu_repacked *r;
    const int *first; /* weight i's groups are [first[i], first[i + 1]) of the run */
} repack_job;

static void repack_range(void *ctx, int lo, int hi, int ith) {
    const repack_job *j = ctx;
    (void)ith;
    for (int i = 0; i < j->r->n; i++) {
        const int a = lo > j->first[i] ? lo : j->first[i], b = hi < j->first[i + 1] ? hi : j->first[i + 1];
        if (a < b) cpu_repack_r16(j->src[i], (uint8_t *)j->r->w[i].data, a - j->first[i], b - j->first[i]);
    }
}

/* The whole pages inside [p, p + n): the original rows of a repacked matrix are not read again by this backend,
 * so they leave its locked, resident set (best effort; the file stays mapped for other readers). */
static void release_pages(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = ((uintptr_t)p + page - 1) & ~(page - 1),
                    hi = ((uintptr_t)p + n) & ~(page - 1);
    if (hi <= lo) return;
    munlock((void *)lo, hi - lo);
    madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

kiln_status cpu_repack_open(kiln_pool *pool, kiln_blocks *desc, cpu_repacked *out) {
    memset(out, 0, sizeof *out);
    if (kiln_cpu_level() < KILN_CPU_AVX512) return KILN_OK;
    const int ns = weight_slots(desc, NULL);
    const kiln_weight ***slot = kiln_calloc((size_t)ns, sizeof *slot);
    const kiln_weight **src = kiln_calloc((size_t)ns, sizeof *src);
    int *first = kiln_calloc((size_t)ns + 1, sizeof *first);
    kiln_status st = KILN_OK;
    if (!slot || !src || !first) { st = kiln_fail(KILN_ERR_NOMEM, "cpu backend: out of memory"); goto done; }
    weight_slots(desc, slot);
    size_t bytes = 0;
    for (int i = 0; i < ns; i++) {
        const kiln_weight *w = *slot[i];
        if (!cpu_repack_fits(w)) continue;
        bool seen = false; /* a matrix named by two slots is copied once */
        for (int k = 0; k < out->n && !seen; k++) seen = src[k] == w;
        if (seen) continue;
        src[out->n] = w;
        first[out->n + 1] = first[out->n] + (int)(w->ne[1] / CPU_R16);
        out->n++;
        bytes += (w->nbytes + 63) & ~(size_t)63;
    }
    if (out->n == 0) goto done;
    out->buf = kiln_aligned_alloc(REPACK_ALIGN, bytes);
    if (out->buf) madvise(out->buf, bytes, MADV_HUGEPAGE); /* best effort: 512 times fewer page faults here and TLB misses later */
    out->w = kiln_calloc((size_t)out->n, sizeof *out->w);
    if (!out->buf || !out->w) {
        st = kiln_fail(KILN_ERR_NOMEM, "cpu backend: cannot allocate %.1f MiB for the interleaved weights", bytes / 1048576.0);
        goto done;
    }
    size_t off = 0;
    for (int i = 0; i < out->n; i++) {
        out->w[i] = *src[i];
        out->w[i].data = out->buf + off;
        out->w[i].interleave = CPU_R16;
        off += (src[i]->nbytes + 63) & ~(size_t)63;
    }
    const repack_job job = {src, out, first};
    kiln_pool_for(pool, first[out->n], 4, repack_range, (void *)&job);
    for (int i = 0; i < ns; i++)
        for (int k = 0; k < out->n; k++)
            if (*slot[i] == src[k]) *slot[i] = &out->w[k];
    for (int k = 0; k < out->n; k++)
        if (src[k] != desc->tok_embd) release_pages(src[k]->data, src[k]->nbytes);
done:
    if (st != KILN_OK) cpu_repack_close(out);
    kiln_free(slot);
    kiln_free(src);
    kiln_free(first);
    return st;
}

void cpu_repack_close(cpu_repacked *r) {
    kiln_free(r->buf);
    kiln_free(r->w);
    memset(r, 0, sizeof *r);
}
