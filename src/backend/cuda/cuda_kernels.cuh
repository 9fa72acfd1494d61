/*
 * cuda_kernels.cuh — the device side of the CUDA backend: the weight views kernels read, the argument
 * blocks of the fused kernels, and the host launchers (defined in cuda_kernels.cu). C++ (nvcc) only.
 *
 * Weight layouts on the device (made at upload from the GGUF blocks, as ck_layout_of says):
 *   F32, F16, BF16, Q4_K  the file's bytes unchanged (Q4_K blocks are 144 bytes, 16-byte aligned)
 *   other types           q = the quant bytes of each block, blocks after each other (16-byte units stay
 *                         aligned); d = each block's metadata bytes (its scale first) in a slot of 2, 4 or 8
 *                         bytes: Q8_0 / Q4_0 / Q6_K d; Q4_1 d|m; Q5_0 d|qh (6 bytes in 8); Q5_1 d|m|qh
 * Types outside the list are converted to F16 at open. Every kernel reads a weight through dequant16 (16 values;
 * the 8-bit decode matvec through convert16_q8).
 */
#ifndef KILN_CUDA_KERNELS_CUH
#define KILN_CUDA_KERNELS_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* GGUF type ids of the types the kernels read (the values of kiln_type). */
enum {
    CK_F32 = 0, CK_F16 = 1, CK_Q4_0 = 2, CK_Q4_1 = 3, CK_Q5_0 = 6, CK_Q5_1 = 7, CK_Q8_0 = 8, CK_Q4_K = 12,
    CK_Q6_K = 14, CK_BF16 = 30,
};

/* Every type with kernels, for the kernel tables and dispatch switches (X(type) each). */
#define CK_TYPES(X) X(CK_F32) X(CK_F16) X(CK_BF16) X(CK_Q8_0) X(CK_Q4_0) X(CK_Q4_1) X(CK_Q5_0) X(CK_Q5_1) \
    X(CK_Q4_K) X(CK_Q6_K)

/* How a type's GGUF blocks become its device layout: a block of `values` values and `bytes` bytes gives q_len
 * quant bytes (from q_off) to q and, when meta_slot > 0, meta_len metadata bytes (from meta_off, zero-padded)
 * to a slot of meta_slot bytes of d. meta_slot 0: the rows are copied unchanged (q only). */
struct ck_layout {
    int type, values, bytes, q_off, q_len, meta_off, meta_len, meta_slot;
};

/* The layout of type t (values 0 for a type without kernels). */
static inline __host__ __device__ constexpr ck_layout ck_layout_of(int t) {
    /*                                type  values bytes q_off q_len meta_off meta_len meta_slot */
    return t == CK_F32    ? ck_layout{CK_F32,    1,    4,   0,    4,    0,      0,      0}
         : t == CK_F16    ? ck_layout{CK_F16,    1,    2,   0,    2,    0,      0,      0}
         : t == CK_BF16   ? ck_layout{CK_BF16,   1,    2,   0,    2,    0,      0,      0}
         : t == CK_Q8_0   ? ck_layout{CK_Q8_0,  32,   34,   2,   32,    0,      2,      2}
         : t == CK_Q4_0   ? ck_layout{CK_Q4_0,  32,   18,   2,   16,    0,      2,      2}
         : t == CK_Q4_1   ? ck_layout{CK_Q4_1,  32,   20,   4,   16,    0,      4,      4}
         : t == CK_Q5_0   ? ck_layout{CK_Q5_0,  32,   22,   6,   16,    0,      6,      8}
         : t == CK_Q5_1   ? ck_layout{CK_Q5_1,  32,   24,   8,   16,    0,      8,      8}
         : t == CK_Q4_K   ? ck_layout{CK_Q4_K, 256,  144,   0,  144,    0,      0,      0}
         : t == CK_Q6_K   ? ck_layout{CK_Q6_K, 256,  210,   0,  208,  208,      2,      2}
                          : ck_layout{t,         0,    0,   0,    0,    0,      0,      0};
}

/* The decode matvec quantizes its input to 8-bit blocks of 32 for these types (with the block sums where the
 * type has a per-block minimum), as the reference engine does for them, and multiplies bytes (dp4a). Measured
 * on the H200 (bench/RESULTS.md, dp4a decode matvec): it pays where the float dequantization is dear (Q4_K
 * decode +10%; Q6_K, whose 6-bit values take two shifts and masks a word); for Q8_0 the extra input
 * quantization costs more than the float products (-4% on smollm2). */
static inline __host__ __device__ constexpr bool ck_q8_input(int t) {
    return t == CK_Q4_1 || t == CK_Q5_0 || t == CK_Q5_1 || t == CK_Q4_K || t == CK_Q6_K;
}
/* Decode matvecs of several rows of these types run on the tensor cores (k_matvec_mma: half inputs); the others
 * keep their 8-bit inputs and dp4a. */
static inline __host__ __device__ constexpr bool ck_mv_mma(int t) { return !ck_q8_input(t); }
/* dequant16 gives value = s * v + b with b != 0 for these types. */
static inline __host__ __device__ constexpr bool ck_has_min(int t) { return t == CK_Q4_K || t == CK_Q4_1 || t == CK_Q5_1; }

/* A weight matrix on the device: out rows of in values. */
struct dev_weight {
    const uint8_t *q;     /* row data (see the layouts above) */
    const __half *d;      /* per-block metadata slots (see the layouts above); NULL for unrepacked types */
    int type;             /* CK_* */
    int in, out;
    long long row_bytes;  /* bytes of one row in q */
    int d_per_row;        /* halves per row in d (blocks x meta_slot / 2) */
};

/* Attention limits: query heads per KV head, head_dim / 64. */
#define CK_ATT_MAX_G 8
#define CK_ATT_MAX_D 4

/* Matrix x vector, decode path: nr input rows (1..CK_MV_MAX_ROWS) through one weight matrix, each weight value
 * loaded once and applied to every row. How the block builds its inputs (in_mode), which weight rows a warp
 * computes (pair), and what it does with the dot products of each input row (epi).
 *
 * Rows (continuous batching): input row r is x + r * x_stride (n = w0.in floats); its outputs are
 * y + r * y_stride (STORE / ADD / SWIGLU / LOGITS, and q_out + r * y_stride for QKV). QKV: row r rotates at
 * position pos[r] and appends K/V at k_cache / v_cache + seq[r] * seq_stride + pos[r] * kv_dim (seq == NULL:
 * every row in the cache given, as one sequence); with cuda_backend.cu's cache layout (n_seq, n_layer, n_ctx,
 * kv_dim) that is k_cache = kc + il * n_ctx * kv_dim (sequence 0's layer il), seq_stride = n_layer * n_ctx *
 * kv_dim. LOGITS: row r's argmax goes to arg_out[r]; arg_val / arg_idx hold nr * n_blocks partials (size them
 * for nr times the largest grid). Row r's results are bit-identical to a 1-row call on that row.
 * With nr = 0 or 1 (mv_base leaves it 0) it is the single-row call; strides are then unused.
 * Shared memory: ck_matvec_smem_rows(in, nr) bytes, so a session that launches nr rows raises the limit once
 * at open with ck_set_matvec_smem(ck_matvec_smem_rows(widest in, nr)); ck_matvec_max_rows says how many
 * rows fit. Grid: ck_matvec_plan (one wave: two blocks per SM of one row, one of several; where one group of
 * all rows leaves SMs idle, the rows are split into groups with blocks of their own, the weights shared through
 * L2; set nr first). The
 * weights must be complete before the launch (they are read before the kernel's PDL wait: several rows load
 * their first step there, one row prefetches it to L2). */
#define CK_MV_MAX_ROWS 8
enum { MV_IN_PLAIN = 0, MV_IN_NORM = 1 };
enum { MV_PAIR_ADJ = 0, MV_PAIR_DUAL = 1 };
enum { MV_EPI_STORE = 0, MV_EPI_ADD = 1, MV_EPI_QKV = 2, MV_EPI_SWIGLU = 3, MV_EPI_LOGITS = 4 };

struct mv_args {
    dev_weight w0, w1;          /* w1: second matrix of MV_PAIR_DUAL (same type and shape) */
    int pair, in_mode, epi;
    int ksplit;                 /* warps per pair (k_matvec_mma: per tile of 8 pairs; 1, 2, 4, 8); set by
                                 * ck_matvec_plan */
    int nr;                     /* input rows, 1..CK_MV_MAX_ROWS (0 reads as 1) */
    int row_groups;             /* the rows split into this many groups of ck_mv_group_rows, each on its own
                                 * blocks (block b: group b % row_groups); 0 or 1: one; set by ck_matvec_plan */
    long long x_stride, y_stride; /* floats between consecutive rows' inputs / outputs */
    const float *x;             /* input rows (PLAIN, NORM) */
    const float *norm_w;        /* NORM: RMSNorm weight (one for all rows) */
    float eps;
    int head_dim;
    const int *pos;             /* device: position of row r's token at pos[r] (QKV) */
    const int *seq;             /* device: sequence of row r at seq[r] (QKV), or NULL */
    long long seq_stride;       /* QKV: halves between consecutive sequences' caches (with seq) */
    float *y;                   /* STORE / ADD / SWIGLU / LOGITS output */
    /* QKV: rows [0, nq) are q, [nq, nq+nk) k, the rest v; row_offset places w0's rows in that range */
    int row_offset, nq, nk, n_rot, kv_dim;
    const float *rope_freq;     /* n_rot/2 inverse frequencies */
    float *q_out;
    __half *k_cache, *v_cache;  /* this layer's (n_ctx, kv_dim) of sequence 0 (of seq[r] with seq) */
    /* LOGITS: logits to y, argmax partials (nr x n_blocks), the last block writes arg_out[0..nr) */
    float *arg_val;
    int *arg_idx;
    unsigned *counter;          /* zero between launches (the last block re-arms it) */
    int *arg_out;
};

/* Attention over the F16 cache. k_cache / v_cache: layer il of sequence 0's region, rows of kv_dim halves;
 * a sequence's region starts seq_stride halves after the previous one's.
 * Prefill (ck_attention): tokens t in [0, n_tok) of one sequence at positions pos0 + t over keys 0 .. pos0 + t,
 * the normalised output as half to out (out_stride): head_dim 64 / 128 on the tensor cores by blocks of 64
 * tokens and one query head (Q, the probabilities and the cache in half precision, F32 sums), other head sizes
 * by one block per (KV head, token) in F32.
 * Decode (ck_attn_decode): one query row per row r of the step (row_seq[r], row_pos[r] in device memory;
 * a row with pos < 0 is padding: its output is zeros and it reads no cache). Each row's n_keys = pos + 1
 * keys are cut at run time into equal chunks of at least 128 keys over at most n_split splits (the grid is
 * fixed, the graph captured once; splits past the row's last chunk leave at once, and a row of one chunk
 * writes its output directly); block (split, kvh, r) attends over its chunk, writes a partial, and the last
 * block of (r, kvh) to finish combines the used splits' partials with all its threads. Output: out (half, out_stride per row) when set, else out_f (float,
 * n_head * head_dim per row). */
struct attn_args {
    const float *q;             /* (rows, q_stride) */
    int q_stride;
    const __half *k_cache, *v_cache;
    long long seq_stride;
    int kv_dim, n_head, n_head_kv, head_dim;
    int pos0;                   /* prefill */
    const int *row_seq, *row_pos; /* decode */
    int n_split;                /* decode: splits per (row, group of heads), at most CK_ATT_MAX_SPLIT */
    float *part;                /* decode: (row, split, head, hd + 2) */
    unsigned *counters;         /* decode: one per (row, group of heads) (n_head per row suffice), zero between
                                 * launches */
    float *out_f;
    __half *out;
    int out_stride;
    float scale;
};
#define CK_ATT_MAX_SPLIT 128

/* Splits of a decode attention over n_rows rows (the grid): enough blocks for four per SM (measured against two:
 * qwen3-0.6b +3.7% after 512 tokens, the others equal; bench/RESULTS.md), at most 32 and no
 * more than a context of n_ctx keys can use (chunks of at least 32 keys). A split of a row is a block per group
 * of query heads (of at most AD_HEADS_PER_BLOCK of cuda_attention.cu: one), so at most n_head blocks. */
int ck_attn_splits(int n_rows, int n_head, int n_head_kv, int n_ctx, int n_sm);

/* Every __global__ of the backend, listed so that open can load each one eagerly. */
int ck_kernel_count(void);
const void *ck_kernel_at(int i);
const char *ck_kernel_name(int i);
/* Largest dynamic shared memory the matvec kernels may need for an input of n values (one row), for nr rows,
 * and the most rows (<= CK_MV_MAX_ROWS) whose shared memory fits in smem_limit bytes (0 when none). */
size_t ck_matvec_smem(int n);
size_t ck_matvec_smem_rows(int n, int nr);
int ck_matvec_max_rows(int n, size_t smem_limit);
/* The same for k_matvec_mma (nr >= 2 rows of a ck_mv_mma type): the rows as halves. */
size_t ck_matvec_mma_smem(int n, int nr);
/* The shared memory of a matvec launch of nr rows of n values of `type` (whichever kernel ck_matvec takes). */
size_t ck_matvec_smem_for(int type, int n, int nr);

cudaError_t ck_set_matvec_smem(size_t bytes);
/* Programmatic dependent launch between consecutive kernels (sm_90 and newer) for launches from this
 * thread (each session sets its own before launching); off by default. */
void ck_set_pdl(bool on);
bool ck_pdl_on(void);

/* The matvec of a over n_blocks blocks (one row: k_matvec<T, 1>; nr rows of a ck_mv_mma type: k_matvec_mma<T>;
 * of another type: k_matvec<T, R> for R = 2, 4 or 8, the smallest R >= nr). */
void ck_matvec(const mv_args &a, int n_blocks, cudaStream_t st);
/* Chooses the grid of a matvec launch, how many warps share a pair and how many row groups there are (sets
 * a.ksplit and a.row_groups); returns blocks. */
int ck_matvec_plan(mv_args &a, int n_sm);
/* The input rows of one row group of a (the last group may have fewer). */
static inline __host__ __device__ int ck_mv_group_rows(const mv_args &a) {
    const int nr = a.nr < 1 ? 1 : a.nr, g = a.row_groups < 1 ? 1 : a.row_groups;
    return (nr + g - 1) / g;
}
void ck_attention(const attn_args &a, int n_tok, cudaStream_t st);
void ck_attn_decode(const attn_args &a, int n_rows, cudaStream_t st);
/* The attention kernels, for the kernel table (cuda_attention.cu). */
int ck_attn_kernel_count(void);
const void *ck_attn_kernel_at(int i);
const char *ck_attn_kernel_name(int i);

/* Prefill pieces. */
/* x[t] = row ids[t] of w (dequantized), t < n_tok. */
void ck_embed(const dev_weight &w, const int *ids, float *x, int n_tok, cudaStream_t st);
/* out[t] = RMSNorm(x[idx[t]]) * w as half (idx NULL: row t), t < n_tok. */
void ck_rmsnorm_rows(const float *x, const int *idx, const float *w, float eps, int n, int n_tok, __half *out,
                     int out_stride, cudaStream_t st);
/* out[t] = the index of the largest of the n values of row t (the lowest index among equals), t < n_rows. */
void ck_argmax_rows(const float *x, int n, int n_rows, int *out, cudaStream_t st);
/* C[t][col_off + r] (=|+=) sum_k A[t][k] W[r][k]; A half (n_tok, lda), lda a multiple of 32 with zero padding. */
void ck_gemm(const dev_weight &w, const __half *A, int lda, int n_tok, float *C, int ldc, int col_off, bool add,
             cudaStream_t st);
/* The same with the k range split over ks blocks (ks > 1: partials in work, ks * n_tok * w.out floats, then
 * added in order of the split: deterministic; up to FEW_ROWS rows by the last block of each column of outputs,
 * counting in tiles[ck_gemm_tile_counters(w.out)], zero before and after; more rows by a second kernel);
 * ck_gemm_splits: the ks that fills the GPU for n_tok rows. */
#define FEW_ROWS 16
void ck_gemm_split(const dev_weight &w, const __half *A, int lda, int n_tok, float *C, int ldc, int col_off, bool add,
                   int ks, float *work, unsigned *tiles, cudaStream_t st);
int ck_gemm_splits(const dev_weight &w, int n_tok, int n_sm);
int ck_gemm_tile_counters(int out);
/* RoPE of q and k of n_tok rows in place, k and v appended to the cache: row t at position pos0 + t, or at
 * pos_dev[t] of sequence seq_dev[t] (a sequence's cache seq_stride halves after the previous one's; a row
 * with position < 0 appends nothing) when pos_dev is set. */
void ck_rope_store(float *qkv, int stride, int n_tok, int pos0, const int *pos_dev, const int *seq_dev,
                   long long seq_stride, int nq, int nk, int head_dim, int n_rot, const float *rope_freq,
                   __half *k_cache, __half *v_cache, int kv_dim, cudaStream_t st);
/* The Q/K/V rows after their matmul when the blocks ask for more than RoPE (biases, per-head RMSNorm of q and
 * k, NEOX RoPE): in this order, as the CPU backend does, then q stays in place and k, v go to the cache. */
typedef struct qkv_post_args {
    float *qkv;
    int stride;                    /* floats between the rows of q|k|v */
    int pos0;                      /* position of row 0 (rows follow), unless pos_dev */
    const int *pos_dev;            /* row t at pos_dev[t] of sequence seq_dev[t] (a decode step reads them from
                                    * device memory; position < 0: a padding row, nothing appended) */
    const int *seq_dev;
    long long seq_stride;          /* halves between two sequences' caches */
    int nq, nk, head_dim, n_rot;
    bool neox;                     /* pairs (i, i + n_rot/2) instead of (2i, 2i + 1) */
    const float *bias;             /* nq + 2 nk floats, or NULL */
    const float *q_norm, *k_norm;  /* head_dim floats each, or NULL */
    float eps;
    const float *rope_freq;
    __half *k_cache, *v_cache;
    int kv_dim;
} qkv_post_args;
void ck_qkv_post(const qkv_post_args &a, int n_tok, cudaStream_t st);
void ck_swiglu_rows(const float *g, const float *u, int n, int n_tok, __half *out, int out_stride, cudaStream_t st);
void ck_swiglu_vec(const float *g, const float *u, int n, float *out, cudaStream_t st);
/* Upload helper: n_blocks GGUF blocks of layout L into the device layout (q and d; see ck_layout). */
void ck_repack(const uint8_t *src, long long n_blocks, const ck_layout &L, uint8_t *dst_q, __half *dst_d, cudaStream_t st);

#endif
