/*
 * cuda_testing.cu — single kernels run on test data for the GPU tests (kiln_cuda_test_* in cuda_api.h): a
 * matvec, a GEMM, attention, the MoE feed-forward, the device sampler. Linked into the test binaries only,
 * never into libkiln.
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
                                           float *y) {
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
            ck_gemm(dw, da, lda, n_tok, dy, out, 0, false, b.st);
            st = tb_finish(&b, y, dy, (size_t)n_tok * out * 4);
        }
        kiln_free(xh);
    }
    tb_free(&b);
    return st;
}

extern "C" kiln_status kiln_cuda_test_attention(const float *q, const float *k, const float *v, int n_head,
                                                int n_head_kv, int head_dim, int pos0, int n_tok, bool split,
                                                float *out) {
    if (split && n_tok != 1) return kiln_fail(KILN_ERR_INVALID_ARG, "cuda test: the split path takes one token");
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
        if (split) {
            /* decode: splits of DEC_CHUNK keys (and one idle split beyond the last), combined by the last */
            const int n_split = (n_keys + DEC_CHUNK - 1) / DEC_CHUNK + 1;
            int *dpos = (int *)tb_alloc(&b, 4, &pos0);
            float *part = (float *)tb_alloc(&b, (size_t)n_split * n_head * (head_dim + 2) * 4, NULL);
            unsigned *cnt = (unsigned *)tb_alloc(&b, (size_t)n_head_kv * 4, NULL);
            float *dy = (float *)tb_alloc(&b, (size_t)Q * 4, NULL);
            at.chunk = DEC_CHUNK, at.pos_dev = dpos, at.part = part, at.counters = cnt, at.out_f = dy;
            ck_attention(at, n_split, 1, b.st);
            st = tb_finish(&b, out, dy, (size_t)Q * 4);
        } else {
            __half *dout = (__half *)tb_alloc(&b, (size_t)n_tok * Q * 2, NULL);
            at.chunk = n_keys, at.pos0 = pos0, at.out = dout, at.out_stride = Q;
            ck_attention(at, 1, n_tok, b.st);
            st = tb_finish(&b, oh, dout, (size_t)n_tok * Q * 2);
            if (st == KILN_OK)
                for (size_t i = 0; i < (size_t)n_tok * Q; i++) out[i] = kiln_f16_to_f32(oh[i]);
        }
    }
    kiln_free(kh);
    kiln_free(oh);
    tb_free(&b);
    return st;
}

extern "C" kiln_status kiln_cuda_test_moe(uint32_t type, int n_embd, int n_ff, int n_expert, int k, bool norm_topk,
                                          const float *router, const void *gate, const void *up, const void *down,
                                          const float *norm_w, float eps, const float *x, int n, float *probs,
                                          int32_t *ids, float *wts, float *y) {
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
        cm_plan_scratch(&ms, d, n, NULL, &bytes);
        uint8_t *base = (uint8_t *)tb_alloc(&b, bytes, NULL);
        if (!L.norm_w || !dx || !base) st = kiln_fail(KILN_ERR_DEVICE, "cuda test: allocation failed");
        if (st == KILN_OK) {
            bytes = 0;
            cm_plan_scratch(&ms, d, n, base, &bytes);
            cm_ffn(L, ms, dx, n_embd, eps, n, false, b.st);
            st = tb_finish(&b, y, dx, (size_t)n * n_embd * 4);
        }
        if (st == KILN_OK) st = tb_finish(&b, probs, ms.probs, (size_t)n * n_expert * 4);
        if (st == KILN_OK) st = tb_finish(&b, ids, ms.ids, (size_t)n * k * 4);
        if (st == KILN_OK) st = tb_finish(&b, wts, ms.wts, (size_t)n * k * 4);
    }
    tb_free(&b);
    return st;
}

extern "C" kiln_status kiln_cuda_test_sample(const kiln_sample_spec *specs, int n_rows, const float *logits, int n_vocab,
                                             int32_t *ids) {
    if (n_rows < 1 || n_vocab < 1 || !specs || !logits || !ids)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cuda test sample: bad arguments");
    test_bufs b;
    kiln_status st = tb_init(&b);
    if (st != KILN_OK) return st;
    const size_t nl = (size_t)n_rows * n_vocab * 4;
    kiln_sample_spec *ds = (kiln_sample_spec *)tb_alloc(&b, (size_t)n_rows * sizeof *specs, specs);
    float *dl = (float *)tb_alloc(&b, nl, logits);
    int *di = (int *)tb_alloc(&b, (size_t)n_rows * 4, ids);
    int *dscr = (int *)tb_alloc(&b, (size_t)n_rows * n_vocab * 4, NULL);
    if (!ds || !dl || !di || !dscr) st = kiln_fail(KILN_ERR_DEVICE, "cuda test: allocation failed");
    if (st == KILN_OK) {
        ck_sample(ds, dl, n_vocab, (size_t)n_vocab, n_rows, di, dscr, b.st);
        st = tb_finish(&b, ids, di, (size_t)n_rows * 4);
    }
    tb_free(&b);
    return st;
}
