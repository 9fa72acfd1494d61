/* cpu_repack.c — Q8_0 weights in groups of 16 interleaved rows (cpu_repack.h): the copy made at open, the
 * scalar reference of the kernels over it, and the choice of which weights a backend repacks. */
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
    return w && w->type == KILN_TYPE_Q8_0 && w->interleave == 0 && w->ne[2] == 1 && w->ne[1] > 0 &&
           w->ne[1] % CPU_R16 == 0 && w->ne[0] > 0 && w->ne[0] % 64 == 0 && w->ne[0] <= (1u << 24);
}

void cpu_repack_q8_0_r16(const kiln_weight *w, uint8_t *dst, int g0, int g1) {
    const int nb = (int)(w->ne[0] / QK8_0);
    const size_t row = (size_t)nb * sizeof(block_q8_0);
    for (int g = g0; g < g1; g++) {
        const block_q8_0 *x[CPU_R16];
        for (int i = 0; i < CPU_R16; i++)
            x[i] = (const block_q8_0 *)((const uint8_t *)w->data + ((size_t)g * CPU_R16 + (size_t)i) * row);
        uint8_t *grp = dst + (size_t)g * CPU_R16 * row;
        for (int ib = 0; ib < nb; ib++) {
            uint16_t *d = (uint16_t *)(grp + cpu_r16_d(ib));
            uint8_t *qs = grp + cpu_r16_qs(ib);
            for (int i = 0; i < CPU_R16; i++) d[i] = x[i][ib].d;
            for (int k = 0; k < R16_STEPS; k++)
                for (int i = 0; i < CPU_R16; i++, qs += 4) { /* the row's 4 bytes, each plus 128 */
                    uint32_t v;
                    memcpy(&v, x[i][ib].qs + 4 * k, sizeof v);
                    v ^= 0x80808080u;
                    memcpy(qs, &v, sizeof v);
                }
        }
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
        if (a < b) cpu_repack_q8_0_r16(j->src[i], (uint8_t *)j->r->w[i].data, a - j->first[i], b - j->first[i]);
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
