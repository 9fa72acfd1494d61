/*
 * cuda_testing.cu — single kernels run on test data for the GPU tests (kiln_cuda_test_* in cuda_api.h): a
 * matvec, a GEMM, attention. Linked into the test binaries only, never into libkiln.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"
extern "C" {
#include "backend/cuda/cuda_api.h"
#include "base/alloc.h"
#include "base/error.h"
#include "formats/formats.h"
}

/* ------------------------------------------------------------------ single kernels for the tests */

/* Device buffers of one test call, freed together. */
typedef struct test_bufs {
    void *p[16];
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
    if (b->n >= 16 || cudaMalloc(&p, n ? n : 1) != cudaSuccess) return NULL;
    kiln_count_device_alloc();
    b->p[b->n++] = p;
    if (init) cudaMemcpy(p, init, n, cudaMemcpyHostToDevice);
    else cudaMemset(p, 0, n ? n : 1);
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
    const int bb = type == CK_Q8_0 ? 34 : type == CK_Q4_0 ? 18 : 210;
    const int doff = type == CK_Q6_K ? 208 : 0, qoff = type == CK_Q6_K ? 0 : 2;
    const int qlen = type == CK_Q8_0 ? 32 : type == CK_Q4_0 ? 16 : 208;
    ck_repack(raw, (long long)out * dw->d_per_row, bb, doff, qoff, qlen, q, d, b->st);
    dw->q = q, dw->d = d;
    return KILN_OK;
}

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
            ck_gemm_split(dw, da, lda, n_tok, dy, out, 0, false, ks, work, b.st);
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
        at.n_split = n_split ? n_split : ck_attn_splits(n_rows, n_head_kv, n_ctx, di.n_sm);
        at.part = (float *)tb_alloc(&b, (size_t)n_rows * at.n_split * n_head * (head_dim + 2) * 4, NULL);
        at.counters = (unsigned *)tb_alloc(&b, (size_t)n_rows * n_head_kv * 4, NULL);
        void *dy = tb_alloc(&b, (size_t)n_rows * Q * 4, NULL);
        if (half_out) at.out = (__half *)dy, at.out_stride = Q;
        else at.out_f = (float *)dy;
        /* twice: the counters must be back at zero after a launch */
        ck_attn_decode(at, n_rows, b.st);
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
