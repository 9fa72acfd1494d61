/*
 * cuda_testing.cu — single kernels run on test data for the GPU tests (kiln_cuda_test_* in cuda_api.h): a
 * matvec (one row, or several rows with any epilogue), a GEMM, attention, the MoE feed-forward, the device
 * sampler; and the matvec microbenchmark (kiln_cuda_bench_matvec). Linked into the test binaries only, never
 * into libkiln.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_sample.cuh"
extern "C" {
#include "backend/cuda/cuda_api.h"
#include "base/alloc.h"
#include "base/error.h"
#include "formats/formats.h"
}

/* ------------------------------------------------------------------ single kernels for the tests */

/* Device buffers of one test call, freed together. */
typedef struct test_bufs {
    void *p[24];
    int n;
    cudaStream_t st;
} test_bufs;

static kiln_status tb_init(test_bufs *b) {
    memset(b, 0, sizeof *b);
    kiln_cuda_device_info di;
    kiln_cuda_probe(&di);
    if (!di.present) return kiln_fail(KILN_ERR_DEVICE, "cuda: %s", di.reason);
    CU_TRY(cudaSetDevice(0), "set device");
    CU_TRY(cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking), "stream");
    return KILN_OK;
}

static void *tb_alloc(test_bufs *b, size_t n, const void *init) {
    void *p = NULL;
    if (b->n >= 24 || cudaMalloc(&p, n ? n : 1) != cudaSuccess) return NULL;
    kiln_count_device_alloc();
    b->p[b->n++] = p;
    /* on the test's stream (a non-blocking one: the legacy stream's cudaMemset / cudaMemcpy are not ordered
     * before its kernels), complete before returning (init may be freed) */
    if (init) cudaMemcpyAsync(p, init, n, cudaMemcpyHostToDevice, b->st);
    else cudaMemsetAsync(p, 0, n ? n : 1, b->st);
    if (cudaStreamSynchronize(b->st) != cudaSuccess) return NULL;
    return p;
}

static void tb_free(test_bufs *b) {
    if (b->st) cudaStreamSynchronize(b->st), cudaStreamDestroy(b->st);
    for (int i = 0; i < b->n; i++) cudaFree(b->p[i]);
}

/* Uploads GGUF rows of `type` into the device layout of the kernels. */
static kiln_status tb_weight(test_bufs *b, uint32_t type, const void *w, int in, int out, dev_weight *dw) {
    if (!type_has_kernel(type)) return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda test: type %u has no kernel", type);
    const size_t raw_row = kiln_row_bytes(type, (uint64_t)in);
    if (!raw_row) return kiln_fail(KILN_ERR_INVALID_ARG, "cuda test: %d values do not fill blocks of type %u", in, type);
    memset(dw, 0, sizeof *dw);
    dw->type = (int)type, dw->in = in, dw->out = out;
    dev_geometry(type, in, &dw->row_bytes, &dw->d_per_row);
    uint8_t *raw = (uint8_t *)tb_alloc(b, raw_row * out, w);
    if (!raw) return kiln_fail(KILN_ERR_DEVICE, "cuda test: allocation failed");
    if (!dw->d_per_row) {
        dw->q = raw;
        return KILN_OK;
    }
    uint8_t *q = (uint8_t *)tb_alloc(b, (size_t)dw->row_bytes * out, NULL);
    __half *d = (__half *)tb_alloc(b, (size_t)dw->d_per_row * out * 2, NULL);
    if (!q || !d) return kiln_fail(KILN_ERR_DEVICE, "cuda test: allocation failed");
    const ck_layout L = ck_layout_of((int)type);
    ck_repack(raw, (long long)out * (in / L.values), L, q, d, b->st);
    dw->q = q, dw->d = d;
    /* complete before any matvec: it may read weights before its PDL wait (they never change in a session) */
    CU_TRY(cudaStreamSynchronize(b->st), "weight repack");
    return KILN_OK;
}

/* Records the first CUDA failure in the local `st` and goes on (the caller frees what it holds). */
#define TB_TRY(expr, what)                                                \
    do {                                                                  \
        cudaError_t e_ = (expr);                                          \
        if (e_ != cudaSuccess && st == KILN_OK) st = cuda_fail(e_, what); \
    } while (0)

static kiln_status tb_finish(test_bufs *b, void *host, const void *dev, size_t n) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaStreamSynchronize(b->st);
    if (e == cudaSuccess && host) e = cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return cuda_fail(e, "test kernel");
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_test_matvec(uint32_t type, const void *w, int in, int out, const float *x,
                                             const float *norm_w, float *y) {
    test_bufs b;
    kiln_status st = tb_init(&b);
    dev_weight dw;
    if (st == KILN_OK) st = tb_weight(&b, type, w, in, out, &dw);
    if (st == KILN_OK) {
        float *dx = (float *)tb_alloc(&b, (size_t)in * 4, x);
        float *dn = norm_w ? (float *)tb_alloc(&b, (size_t)in * 4, norm_w) : NULL;
        float *dy = (float *)tb_alloc(&b, (size_t)out * 4, NULL);
        mv_args a = mv_base();
        a.w0 = dw;
        a.pair = MV_PAIR_ADJ;
        a.in_mode = norm_w ? MV_IN_NORM : MV_IN_PLAIN;
        a.x = dx, a.norm_w = dn, a.eps = 1e-5f;
        a.epi = MV_EPI_STORE;
        a.y = dy;
        kiln_cuda_device_info di;
        kiln_cuda_probe(&di);
        const size_t smem = ck_matvec_smem(in);
        if (smem > 48 * 1024) ck_set_matvec_smem(smem);
        {
            const int nb = ck_matvec_plan(a, di.n_sm);
            ck_matvec(a, nb, b.st);
        }
        st = tb_finish(&b, y, dy, (size_t)out * 4);
    }
    tb_free(&b);
    return st;
}

/* The device arguments of a kiln_cuda_mv_rows call (buffers in b). */
static kiln_status rows_args(test_bufs *b, const kiln_cuda_mv_rows *t, mv_args *a, size_t kv_n) {
    const bool dual = t->kind == KILN_MVB_SWIGLU, qkv = t->kind == KILN_MVB_QKV;
    dev_weight w0, w1;
    memset(&w1, 0, sizeof w1);
    kiln_status st = tb_weight(b, t->type, t->w, t->in, t->out, &w0);
    if (st == KILN_OK && dual) st = tb_weight(b, t->type, t->w1, t->in, t->out, &w1);
    if (st != KILN_OK) return st;
    const int nr = t->nr, nblk = 4 * 132;
    *a = mv_base();
    a->w0 = w0, a->w1 = w1, a->nr = nr;
    a->pair = dual ? MV_PAIR_DUAL : MV_PAIR_ADJ;
    a->in_mode = t->norm_w ? MV_IN_NORM : MV_IN_PLAIN;
    a->epi = t->kind == KILN_MVB_ADD ? MV_EPI_ADD : qkv ? MV_EPI_QKV : dual ? MV_EPI_SWIGLU
             : t->kind == KILN_MVB_LOGITS ? MV_EPI_LOGITS : MV_EPI_STORE;
    a->x = (const float *)tb_alloc(b, (size_t)nr * t->in * 4, t->x);
    a->x_stride = t->in, a->y_stride = t->out;
    a->norm_w = t->norm_w ? (const float *)tb_alloc(b, (size_t)t->in * 4, t->norm_w) : NULL;
    a->eps = 1e-5f;
    a->y = (float *)tb_alloc(b, (size_t)nr * t->out * 4, t->kind == KILN_MVB_ADD ? t->y : NULL);
    a->arg_val = (float *)tb_alloc(b, (size_t)nr * nblk * 4, NULL);
    a->arg_idx = (int *)tb_alloc(b, (size_t)nr * nblk * 4, NULL);
    a->arg_out = (int *)tb_alloc(b, (size_t)nr * 4, NULL);
    a->counter = (unsigned *)tb_alloc(b, 4, NULL);
    if (qkv) {
        a->nq = t->nq, a->nk = t->nk, a->head_dim = t->head_dim, a->n_rot = t->n_rot, a->kv_dim = t->nk;
        a->rope_freq = (const float *)tb_alloc(b, (size_t)(t->n_rot / 2 + 1) * 4, t->rope_freq);
        a->pos = (const int *)tb_alloc(b, (size_t)nr * 4, t->pos);
        a->seq = (const int *)tb_alloc(b, (size_t)nr * 4, t->seq);
        a->seq_stride = (long long)t->n_ctx * t->nk;
        a->q_out = a->y;
        a->k_cache = (__half *)tb_alloc(b, 2 * kv_n * 2, NULL);
        a->v_cache = a->k_cache ? a->k_cache + kv_n : NULL;
    }
    if (!a->x || (t->norm_w && !a->norm_w) || !a->y || !a->arg_val || !a->arg_idx || !a->arg_out || !a->counter ||
        (qkv && (!a->rope_freq || !a->pos || !a->seq || !a->k_cache)))
        return kiln_fail(KILN_ERR_DEVICE, "cuda test: allocation failed");
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_test_matvec_rows(const kiln_cuda_mv_rows *t) {
    if (t->nr < 1 || t->nr > CK_MV_MAX_ROWS) return kiln_fail(KILN_ERR_INVALID_ARG, "cuda test: %d rows", t->nr);
    if (t->kind == KILN_MVB_QKV && (t->out != t->nq + 2 * t->nk || t->nq % t->head_dim || t->nk % t->head_dim))
        return kiln_fail(KILN_ERR_INVALID_ARG, "cuda test: qkv shape %d != %d + 2 * %d", t->out, t->nq, t->nk);
    const size_t kv_n = t->kind == KILN_MVB_QKV ? (size_t)t->n_seq * t->n_ctx * t->nk : 0;
    uint16_t *kvh = kv_n ? (uint16_t *)kiln_malloc(2 * kv_n * 2) : NULL;
    if (kv_n && !kvh) return kiln_fail(KILN_ERR_NOMEM, "cuda test: out of memory");
    test_bufs b;
    kiln_status st = tb_init(&b);
    mv_args a;
    if (st == KILN_OK) st = rows_args(&b, t, &a, kv_n);
    if (st == KILN_OK) {
        kiln_cuda_device_info di;
        kiln_cuda_probe(&di);
        const size_t smem = ck_matvec_smem_for(a.w0.type, t->in, t->nr);
        if (smem > 48 * 1024) TB_TRY(ck_set_matvec_smem(smem), "matvec shared memory");
        const int nb = ck_matvec_plan(a, di.n_sm);
        if (st == KILN_OK) ck_matvec(a, nb, b.st);
        if (st == KILN_OK) st = tb_finish(&b, t->y, a.y, (size_t)t->nr * t->out * 4);
    }
    if (st == KILN_OK && t->kind == KILN_MVB_LOGITS)
        TB_TRY(cudaMemcpy(t->argmax, a.arg_out, (size_t)t->nr * 4, cudaMemcpyDeviceToHost), "argmax copy");
    if (st == KILN_OK && kv_n) {
        TB_TRY(cudaMemcpy(kvh, a.k_cache, 2 * kv_n * 2, cudaMemcpyDeviceToHost), "cache copy");
        for (size_t i = 0; st == KILN_OK && i < 2 * kv_n; i++) t->kv[i] = kiln_f16_to_f32(kvh[i]);
    }
    kiln_free(kvh);
    tb_free(&b);
    return st;
}

extern "C" kiln_status kiln_cuda_test_gemm(uint32_t type, const void *w, int in, int out, const float *x, int n_tok,
                                           int ks, float *y) {
    test_bufs b;
    kiln_status st = tb_init(&b);
    dev_weight dw;
    if (st == KILN_OK) st = tb_weight(&b, type, w, in, out, &dw);
    if (st == KILN_OK) {
        const int lda = (int)align_up((size_t)in, 32);
        uint16_t *xh = (uint16_t *)kiln_calloc((size_t)n_tok * lda, 2);
        if (!xh) st = kiln_fail(KILN_ERR_NOMEM, "cuda test: out of memory");
        if (st == KILN_OK) {
            for (int t = 0; t < n_tok; t++)
                for (int k = 0; k < in; k++) xh[(size_t)t * lda + k] = kiln_f32_to_f16(x[(size_t)t * in + k]);
            __half *da = (__half *)tb_alloc(&b, (size_t)n_tok * lda * 2, xh);
            float *dy = (float *)tb_alloc(&b, (size_t)n_tok * out * 4, NULL);
            float *work = ks > 1 ? (float *)tb_alloc(&b, (size_t)ks * n_tok * out * 4, NULL) : NULL;
            unsigned *tiles = (unsigned *)tb_alloc(&b, (size_t)ck_gemm_tile_counters(out) * 4, NULL);
            ck_gemm_split(dw, da, lda, n_tok, dy, out, 0, false, ks, work, tiles, b.st);
            st = tb_finish(&b, y, dy, (size_t)n_tok * out * 4);
        }
        kiln_free(xh);
    }
    tb_free(&b);
    return st;
}

extern "C" kiln_status kiln_cuda_test_attention(const float *q, const float *k, const float *v, int n_head,
                                                int n_head_kv, int head_dim, int pos0, int n_tok, float *out) {
    if (n_head % n_head_kv || n_head / n_head_kv > CK_ATT_MAX_G || head_dim > 256 || head_dim % 2)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cuda test: unsupported attention shape");
    test_bufs b;
    kiln_status st = tb_init(&b);
    const int Q = n_head * head_dim, KV = n_head_kv * head_dim, n_keys = pos0 + n_tok;
    uint16_t *kh = (uint16_t *)kiln_malloc((size_t)n_keys * KV * 2 * 2);
    uint16_t *oh = (uint16_t *)kiln_malloc((size_t)n_tok * Q * 2);
    if (st == KILN_OK && (!kh || !oh)) st = kiln_fail(KILN_ERR_NOMEM, "cuda test: out of memory");
    if (st == KILN_OK) {
        uint16_t *vh = kh + (size_t)n_keys * KV;
        for (size_t i = 0; i < (size_t)n_keys * KV; i++) kh[i] = kiln_f32_to_f16(k[i]), vh[i] = kiln_f32_to_f16(v[i]);
        attn_args at;
        memset(&at, 0, sizeof at);
        at.q = (const float *)tb_alloc(&b, (size_t)n_tok * Q * 4, q);
        at.q_stride = Q;
        at.k_cache = (const __half *)tb_alloc(&b, (size_t)n_keys * KV * 2, kh);
        at.v_cache = (const __half *)tb_alloc(&b, (size_t)n_keys * KV * 2, vh);
        at.kv_dim = KV, at.n_head = n_head, at.n_head_kv = n_head_kv, at.head_dim = head_dim;
        at.scale = 1.0f / sqrtf((float)head_dim);
        __half *dout = (__half *)tb_alloc(&b, (size_t)n_tok * Q * 2, NULL);
        at.pos0 = pos0, at.out = dout, at.out_stride = Q;
        ck_attention(at, n_tok, b.st);
        st = tb_finish(&b, oh, dout, (size_t)n_tok * Q * 2);
        if (st == KILN_OK)
            for (size_t i = 0; i < (size_t)n_tok * Q; i++) out[i] = kiln_f16_to_f32(oh[i]);
    }
    kiln_free(kh);
    kiln_free(oh);
    tb_free(&b);
    return st;
}

extern "C" kiln_status kiln_cuda_test_attention_rows(const float *q, const float *k, const float *v, int n_head,
                                                     int n_head_kv, int head_dim, int n_ctx, int n_rows,
                                                     const int *seq, const int *pos, int n_split, bool half_out,
                                                     float *out) {
    if (n_head % n_head_kv || n_head / n_head_kv > CK_ATT_MAX_G || head_dim > 256 || head_dim % 2 || n_rows < 1 ||
        n_split < 0 || n_split > CK_ATT_MAX_SPLIT)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cuda test: unsupported attention shape");
    int n_seqs = 1;
    for (int r = 0; r < n_rows; r++) {
        if (pos[r] >= n_ctx || seq[r] < 0) return kiln_fail(KILN_ERR_INVALID_ARG, "cuda test: row %d outside", r);
        n_seqs = seq[r] + 1 > n_seqs ? seq[r] + 1 : n_seqs;
    }
    test_bufs b;
    kiln_status st = tb_init(&b);
    const int Q = n_head * head_dim, KV = n_head_kv * head_dim;
    const size_t nkv = (size_t)n_seqs * n_ctx * KV;
    uint16_t *kh = (uint16_t *)kiln_malloc(nkv * 2 * 2 + (size_t)n_rows * Q * 2);
    int *rows = (int *)kiln_malloc((size_t)n_rows * 2 * sizeof(int));
    if (st == KILN_OK && (!kh || !rows)) st = kiln_fail(KILN_ERR_NOMEM, "cuda test: out of memory");
    if (st == KILN_OK) {
        uint16_t *vh = kh + nkv, *oh = vh + nkv;
        for (size_t i = 0; i < nkv; i++) kh[i] = kiln_f32_to_f16(k[i]), vh[i] = kiln_f32_to_f16(v[i]);
        for (int r = 0; r < n_rows; r++) rows[r] = seq[r], rows[n_rows + r] = pos[r];
        kiln_cuda_device_info di;
        kiln_cuda_probe(&di);
        attn_args at;
        memset(&at, 0, sizeof at);
        at.q = (const float *)tb_alloc(&b, (size_t)n_rows * Q * 4, q);
        at.q_stride = Q;
        at.k_cache = (const __half *)tb_alloc(&b, nkv * 2, kh);
        at.v_cache = (const __half *)tb_alloc(&b, nkv * 2, vh);
        at.seq_stride = (long long)n_ctx * KV;
        at.kv_dim = KV, at.n_head = n_head, at.n_head_kv = n_head_kv, at.head_dim = head_dim;
        at.scale = 1.0f / sqrtf((float)head_dim);
        const int *drows = (const int *)tb_alloc(&b, (size_t)n_rows * 2 * sizeof(int), rows);
        at.row_seq = drows, at.row_pos = drows + n_rows;
        at.n_split = n_split ? n_split : ck_attn_splits(n_rows, n_head, n_head_kv, n_ctx, di.n_sm);
        at.part = (float *)tb_alloc(&b, (size_t)n_rows * at.n_split * n_head * (head_dim + 2) * 4, NULL);
        at.counters = (unsigned *)tb_alloc(&b, (size_t)n_rows * n_head * 4, NULL);
        void *dy = tb_alloc(&b, (size_t)n_rows * Q * 4, NULL);
        if (half_out) at.out = (__half *)dy, at.out_stride = Q;
        else at.out_f = (float *)dy;
        /* twice, the output made NaN between: the counters must be back at zero after a launch */
        ck_attn_decode(at, n_rows, b.st);
        cudaMemsetAsync(dy, 0xFF, (size_t)n_rows * Q * 4, b.st);
        ck_attn_decode(at, n_rows, b.st);
        if (half_out) {
            st = tb_finish(&b, oh, dy, (size_t)n_rows * Q * 2);
            if (st == KILN_OK)
                for (size_t i = 0; i < (size_t)n_rows * Q; i++) out[i] = kiln_f16_to_f32(oh[i]);
        } else {
            st = tb_finish(&b, out, dy, (size_t)n_rows * Q * 4);
        }
    }
    kiln_free(kh);
    kiln_free(rows);
    tb_free(&b);
    return st;
}

/* ------------------------------------------------------------------ matvec microbenchmark */

/* FNV-1a over n bytes, continuing h. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* GGUF rows of `type` for a random out x in matrix (normal values of scale 0.05, a fixed seed), built row by
 * row with the reference quantizer; NULL when out of memory. */
static void *bench_weight(uint32_t type, int in, int out) {
    const kiln_type_info *ti = kiln_type_get(type);
    const size_t row = kiln_row_bytes(type, (uint64_t)in);
    uint8_t *w = (uint8_t *)kiln_malloc(row * (size_t)out);
    float *f = (float *)kiln_malloc(sizeof(float) * (size_t)in);
    if (!w || !f) {
        kiln_free(w), kiln_free(f);
        return NULL;
    }
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int r = 0; r < out; r++) {
        for (int k = 0; k < in; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            f[k] = 0.05f * ((float)(s >> 40) / (float)(1 << 24) - 0.5f) * 3.4f;
        }
        ti->from_float(f, w + (size_t)r * row, in);
    }
    kiln_free(f);
    return w;
}

/* The device side of one benchmark case: its buffers and the matvec's arguments. */
typedef struct bench_case {
    test_bufs b;
    mv_args a;
    float *dy, *dq;
    __half *dkv;
    size_t kv_bytes;
    int *arg_out;
    int nb;
    uint8_t *copies;           /* n_copies copies of the weights (w0's q, d, then w1's), stride bytes apart */
    int n_copies;
    size_t stride, off[4];
} bench_case;

/* The arguments with launch i's copy of the weights. */
static mv_args bench_copy(const bench_case *c, int i) {
    mv_args a = c->a;
    if (!c->copies) return a;
    uint8_t *base = c->copies + (size_t)(i % c->n_copies) * c->stride;
    a.w0.q = base + c->off[0], a.w0.d = c->a.w0.d ? (const __half *)(base + c->off[1]) : NULL;
    if (c->a.w1.q) a.w1.q = base + c->off[2], a.w1.d = c->a.w1.d ? (const __half *)(base + c->off[3]) : NULL;
    return a;
}

/* Copies of the weights filling at least 192 MB (more than the L2), so that launches cycling through them read
 * their weights from HBM as a decode step does. */
static kiln_status bench_make_copies(bench_case *c, int n_launch) {
    const dev_weight *w[2] = {&c->a.w0, &c->a.w1};
    size_t len[4], tot = 0;
    for (int i = 0; i < 4; i++) {
        const dev_weight *d = w[i / 2];
        len[i] = !d->q ? 0 : i % 2 == 0 ? (size_t)d->row_bytes * d->out : d->d ? (size_t)d->d_per_row * d->out * 2 : 0;
        c->off[i] = tot;
        tot += align_up(len[i], 256);
    }
    c->stride = tot;
    c->n_copies = (int)((192u << 20) / tot) + 1;
    if (c->n_copies > n_launch) c->n_copies = n_launch;
    c->copies = (uint8_t *)tb_alloc(&c->b, tot * c->n_copies, NULL);
    if (!c->copies) return kiln_fail(KILN_ERR_DEVICE, "cuda bench: %d copies of %zu bytes", c->n_copies, tot);
    const void *src[4] = {c->a.w0.q, c->a.w0.d, c->a.w1.q, c->a.w1.d};
    kiln_status st = KILN_OK;
    for (int k = 0; k < c->n_copies; k++)
        for (int i = 0; i < 4; i++)
            if (len[i])
                TB_TRY(cudaMemcpyAsync(c->copies + (size_t)k * tot + c->off[i], src[i], len[i], cudaMemcpyDeviceToDevice,
                                       c->b.st), "copy");
    TB_TRY(cudaStreamSynchronize(c->b.st), "copy");
    return st;
}

#define BENCH_MAX_BLOCKS (2 * 132 * 4)

/* Buffers, weights and arguments of the case mb describes (random weights, a fixed input). */
static kiln_status bench_setup(const kiln_cuda_mv_bench *mb, bench_case *c) {
    const int in = mb->in, out = mb->out, dual = mb->kind == KILN_MVB_SWIGLU, nr = mb->nr;
    const int pos[CK_MV_MAX_ROWS] = {7, 7, 7, 7, 7, 7, 7, 7};
    test_bufs *b = &c->b;
    kiln_status st = tb_init(b);
    if (st != KILN_OK) return st;
    void *hw = bench_weight(mb->type, in, out);
    float *hx = (float *)kiln_malloc(sizeof(float) * (size_t)in * nr);
    if (!hw || !hx) st = kiln_fail(KILN_ERR_NOMEM, "cuda bench: out of memory");
    dev_weight dw0, dw1;
    memset(&dw1, 0, sizeof dw1);
    if (st == KILN_OK) st = tb_weight(b, mb->type, hw, in, out, &dw0);
    if (st == KILN_OK && dual) st = tb_weight(b, mb->type, hw, in, out, &dw1);
    for (int k = 0; hx && k < in * nr; k++) hx[k] = sinf(0.37f * (float)k) + 0.1f;
    c->kv_bytes = (size_t)16 * mb->nk * 2;
    float *dx = st == KILN_OK ? (float *)tb_alloc(b, (size_t)in * nr * 4, hx) : NULL;
    kiln_free(hw), kiln_free(hx);
    c->dy = (float *)tb_alloc(b, (size_t)out * nr * 4, NULL);
    c->dq = (float *)tb_alloc(b, (size_t)out * nr * 4, NULL);
    c->dkv = (__half *)tb_alloc(b, 2 * c->kv_bytes + 4, NULL);
    int *dpos = (int *)tb_alloc(b, sizeof pos, pos);
    float *fr = (float *)tb_alloc(b, (size_t)(mb->head_dim / 2 + 1) * 4, NULL);
    float *av = (float *)tb_alloc(b, (size_t)BENCH_MAX_BLOCKS * CK_MV_MAX_ROWS * 4, NULL);
    int *ai = (int *)tb_alloc(b, (size_t)BENCH_MAX_BLOCKS * CK_MV_MAX_ROWS * 4 + 64, NULL);
    unsigned *cnt = (unsigned *)tb_alloc(b, 4, NULL);
    if (st == KILN_OK && (!dx || !c->dy || !c->dq || !c->dkv || !dpos || !fr || !av || !ai || !cnt))
        st = kiln_fail(KILN_ERR_DEVICE, "cuda bench: allocation failed");
    if (st != KILN_OK) return st;
    mv_args &a = c->a;
    a = mv_base();
    a.w0 = dw0, a.w1 = dw1, a.nr = nr, a.x_stride = in, a.y_stride = out;
    a.pair = dual ? MV_PAIR_DUAL : MV_PAIR_ADJ;
    const bool norm = mb->kind == KILN_MVB_QKV || mb->kind == KILN_MVB_SWIGLU || mb->kind == KILN_MVB_LOGITS;
    a.in_mode = norm ? MV_IN_NORM : MV_IN_PLAIN;
    a.x = dx, a.norm_w = norm ? dx : NULL, a.eps = 1e-5f;
    a.epi = mb->kind == KILN_MVB_ADD      ? MV_EPI_ADD
            : mb->kind == KILN_MVB_QKV    ? MV_EPI_QKV
            : mb->kind == KILN_MVB_SWIGLU ? MV_EPI_SWIGLU
            : mb->kind == KILN_MVB_LOGITS ? MV_EPI_LOGITS
                                          : MV_EPI_STORE;
    a.y = c->dy;
    a.pos = dpos, a.head_dim = mb->head_dim, a.nq = mb->nq, a.nk = mb->nk, a.n_rot = mb->head_dim;
    a.kv_dim = mb->nk, a.rope_freq = fr, a.q_out = c->dq, a.k_cache = c->dkv, a.v_cache = c->dkv + c->kv_bytes / 2;
    a.arg_val = av, a.arg_idx = ai, a.counter = cnt, a.arg_out = c->arg_out = ai + BENCH_MAX_BLOCKS * CK_MV_MAX_ROWS;
    kiln_cuda_device_info di;
    kiln_cuda_probe(&di);
    const size_t smem = ck_matvec_smem_for(dw0.type, in, mb->nr);
    int smem_max = 0;
    TB_TRY(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), "shared memory limit");
    if (st == KILN_OK && smem > (size_t)smem_max)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda bench: %d rows of %d need %zu bytes of shared memory", nr, in, smem);
    if (smem > 48 * 1024) TB_TRY(ck_set_matvec_smem(smem), "matvec shared memory");
    c->nb = ck_matvec_plan(a, di.n_sm);
    if (st == KILN_OK && c->nb > BENCH_MAX_BLOCKS) st = kiln_fail(KILN_ERR_INVALID_ARG, "cuda bench: %d blocks", c->nb);
    return st;
}

/* One launch from zeroed outputs; *hash: FNV-1a of everything it wrote (y, q, the K/V rows, the argmax). */
static kiln_status bench_hash(bench_case *c, int out, uint64_t *hash) {
    out *= c->a.nr;
    ck_matvec(c->a, c->nb, c->b.st);
    kiln_status st = tb_finish(&c->b, NULL, NULL, 0);
    const size_t n = (size_t)out * 4 > 2 * c->kv_bytes ? (size_t)out * 4 : 2 * c->kv_bytes;
    uint8_t *h = (uint8_t *)kiln_malloc(n + 64);
    if (st == KILN_OK && !h) st = kiln_fail(KILN_ERR_NOMEM, "cuda bench: out of memory");
    uint64_t v = 0xCBF29CE484222325ull;
    const void *src[4] = {c->dy, c->dq, c->dkv, c->arg_out};
    const size_t len[4] = {(size_t)out * 4, (size_t)out * 4, 2 * c->kv_bytes, (size_t)c->a.nr * 4};
    for (int i = 0; i < 4 && st == KILN_OK; i++) {
        TB_TRY(cudaMemcpy(h, src[i], len[i], cudaMemcpyDeviceToHost), "bench copy");
        v = fnv(v, h, len[i]);
    }
    kiln_free(h);
    *hash = v;
    return st;
}

/* n launches captured in one graph, replayed reps times after one warm replay: microseconds per launch. */
static kiln_status bench_time(bench_case *c, int n, int reps, double *us) {
    kiln_status st = KILN_OK;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    TB_TRY(cudaStreamBeginCapture(c->b.st, cudaStreamCaptureModeThreadLocal), "capture");
    for (int i = 0; i < n && st == KILN_OK; i++) ck_matvec(bench_copy(c, i), c->nb, c->b.st);
    if (st == KILN_OK) TB_TRY(cudaStreamEndCapture(c->b.st, &g), "end capture");
    if (st == KILN_OK) TB_TRY(cudaGraphInstantiate(&ge, g, 0), "instantiate");
    TB_TRY(cudaEventCreate(&e0), "event");
    TB_TRY(cudaEventCreate(&e1), "event");
    if (st == KILN_OK) {
        TB_TRY(cudaGraphLaunch(ge, c->b.st), "replay");
        TB_TRY(cudaEventRecord(e0, c->b.st), "event");
        for (int r = 0; r < reps; r++) TB_TRY(cudaGraphLaunch(ge, c->b.st), "replay");
        TB_TRY(cudaEventRecord(e1, c->b.st), "event");
        TB_TRY(cudaStreamSynchronize(c->b.st), "replay");
        float ms = 0.0f;
        TB_TRY(cudaEventElapsedTime(&ms, e0, e1), "event time");
        *us = 1e3 * (double)ms / ((double)reps * n);
    }
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return st;
}

extern "C" kiln_status kiln_cuda_bench_matvec(kiln_cuda_mv_bench *mb) {
    if (mb->nr < 1 || mb->nr > CK_MV_MAX_ROWS) return kiln_fail(KILN_ERR_INVALID_ARG, "cuda bench: %d rows", mb->nr);
    if (mb->n_launch < 1 || mb->reps < 1) return kiln_fail(KILN_ERR_INVALID_ARG, "cuda bench: no launches");
    if (mb->kind == KILN_MVB_QKV &&
        (mb->out != mb->nq + 2 * mb->nk || mb->head_dim < 2 || mb->nq % mb->head_dim || mb->nk % mb->head_dim))
        return kiln_fail(KILN_ERR_INVALID_ARG, "cuda bench: qkv shape %d != %d + 2 * %d", mb->out, mb->nq, mb->nk);
    bench_case c;
    memset(&c, 0, sizeof c);
    kiln_status st = bench_setup(mb, &c);
    mb->blocks = c.nb;
    ck_set_pdl(mb->pdl);
    if (st == KILN_OK) st = bench_hash(&c, mb->out, &mb->hash);
    if (st == KILN_OK) st = bench_time(&c, mb->n_launch, mb->reps, &mb->us_l2);
    if (st == KILN_OK) st = bench_make_copies(&c, mb->n_launch);
    mb->n_copies = c.n_copies;
    if (st == KILN_OK) st = bench_time(&c, mb->n_launch, mb->reps, &mb->us);
    ck_set_pdl(false);
    tb_free(&c.b);
    return st;
}

extern "C" kiln_status kiln_cuda_test_moe(int path, uint32_t type, int n_embd, int n_ff, int n_expert, int k, bool norm_topk,
                                          const float *router, const void *gate, const void *up, const void *down,
                                          const float *norm_w, float eps, const float *x, int n, float *probs,
                                          int32_t *ids, float *wts, float *y, float *h) {
    test_bufs b;
    kiln_status st = tb_init(&b);
    moe_layer L;
    memset(&L, 0, sizeof L);
    if (st == KILN_OK) st = tb_weight(&b, KILN_TYPE_F32, router, n_embd, n_expert, &L.router);
    if (st == KILN_OK) st = tb_weight(&b, type, gate, n_embd, n_expert * n_ff, &L.gate);
    if (st == KILN_OK) st = tb_weight(&b, type, up, n_embd, n_expert * n_ff, &L.up);
    if (st == KILN_OK) st = tb_weight(&b, type, down, n_ff, n_expert * n_embd, &L.down);
    const moe_dims d = {n_embd, n_expert, k, n_ff};
    if (st == KILN_OK && cm_setup(d) != cudaSuccess) st = kiln_fail(KILN_ERR_INVALID_ARG, "cuda test: MoE shape");
    if (st == KILN_OK) {
        L.norm_w = (const float *)tb_alloc(&b, (size_t)n_embd * 4, norm_w);
        L.n_expert = n_expert, L.n_used = k, L.n_ff = n_ff, L.norm_topk = norm_topk;
        float *dx = (float *)tb_alloc(&b, (size_t)n * n_embd * 4, x);
        moe_scratch ms;
        size_t bytes = 0;
        const int group_rows = path == KILN_MOE_GROUPED ? 1 : 0;
        cm_plan_scratch(&ms, d, n, group_rows, NULL, &bytes);
        uint8_t *base = (uint8_t *)tb_alloc(&b, bytes, NULL);
        if (!L.norm_w || !dx || !base) st = kiln_fail(KILN_ERR_DEVICE, "cuda test: allocation failed");
        if (st == KILN_OK) {
            bytes = 0;
            cm_plan_scratch(&ms, d, n, group_rows, base, &bytes);
            if (path == KILN_MOE_GROUPED && ms.group_max < n)
                st = kiln_fail(KILN_ERR_INVALID_ARG, "cuda test: %d rows x %d chosen experts exceed one grouped launch", n, k);
        }
        if (st == KILN_OK) {
            cm_ffn(L, ms, dx, n_embd, eps, n, false, b.st);
            st = tb_finish(&b, y, dx, (size_t)n * n_embd * 4);
        }
        if (st == KILN_OK) st = tb_finish(&b, probs, ms.probs, (size_t)n * n_expert * 4);
        if (st == KILN_OK) st = tb_finish(&b, ids, ms.ids, (size_t)n * k * 4);
        if (st == KILN_OK) st = tb_finish(&b, wts, ms.wts, (size_t)n * k * 4);
        if (st == KILN_OK && h && path == KILN_MOE_PER_ROW) st = tb_finish(&b, h, ms.h, (size_t)n * k * n_ff * 4);
    }
    tb_free(&b);
    return st;
}

extern "C" kiln_status kiln_cuda_test_moe_group(const int32_t *ids, int n_rows, int k, int n_expert, int32_t *offsets,
                                                int32_t *list, int32_t *pos) {
    if (n_rows < 1 || k < 1 || n_expert < 1 || n_expert > 512 || (long long)n_rows * k > 65535)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cuda test moe group: %d rows x %d of %d experts", n_rows, k, n_expert);
    test_bufs b;
    kiln_status st = tb_init(&b);
    if (st != KILN_OK) return st;
    const size_t n = (size_t)n_rows * k;
    moe_scratch ms;
    memset(&ms, 0, sizeof ms);
    int *di = (int *)tb_alloc(&b, n * 4, ids);
    ms.offsets = (int *)tb_alloc(&b, (size_t)(n_expert + 1) * 4, NULL);
    ms.list = (int *)tb_alloc(&b, n * 4, NULL);
    ms.pos = (int *)tb_alloc(&b, n * 4, NULL);
    if (!di || !ms.offsets || !ms.list || !ms.pos) st = kiln_fail(KILN_ERR_DEVICE, "cuda test: allocation failed");
    if (st == KILN_OK) {
        cm_group(ms, di, n_rows, k, n_expert, false, b.st);
        st = tb_finish(&b, offsets, ms.offsets, (size_t)(n_expert + 1) * 4);
    }
    if (st == KILN_OK) st = tb_finish(&b, list, ms.list, n * 4);
    if (st == KILN_OK) st = tb_finish(&b, pos, ms.pos, n * 4);
    tb_free(&b);
    return st;
}

extern "C" kiln_status kiln_cuda_test_sample(const kiln_sample_spec *specs, int n_rows, const float *logits, int n_vocab,
                                             int32_t *ids, int32_t *one_block) {
    if (n_rows < 1 || n_vocab < 1 || !specs || !logits || !ids)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cuda test sample: bad arguments");
    test_bufs b;
    kiln_status st = tb_init(&b);
    if (st != KILN_OK) return st;
    const size_t nl = (size_t)n_rows * n_vocab * 4;
    kiln_sample_spec *ds = (kiln_sample_spec *)tb_alloc(&b, (size_t)n_rows * sizeof *specs, specs);
    float *dl = (float *)tb_alloc(&b, nl, logits);
    int *di = (int *)tb_alloc(&b, (size_t)n_rows * 4, ids);
    void *dscr = tb_alloc(&b, (size_t)n_rows * ck_sample_scratch_bytes(n_vocab), NULL); /* zeroed */
    if (!ds || !dl || !di || !dscr) st = kiln_fail(KILN_ERR_DEVICE, "cuda test: allocation failed");
    if (st == KILN_OK) {
        ck_sample(ds, dl, n_vocab, (size_t)n_vocab, n_rows, di, dscr, b.st);
        st = tb_finish(&b, ids, di, (size_t)n_rows * 4);
        for (int r = 0; one_block && st == KILN_OK && r < n_rows; r++) {
            const char *at = (const char *)dscr + (size_t)r * ck_sample_scratch_bytes(n_vocab) + ck_sample_path_offset();
            if (cudaMemcpy(&one_block[r], at, 4, cudaMemcpyDeviceToHost) != cudaSuccess)
                st = kiln_fail(KILN_ERR_DEVICE, "cuda test sample: copy back");
        }
    }
    tb_free(&b);
    return st;
}
