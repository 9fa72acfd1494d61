/*
 * formats.h — the block formats of GGUF tensors: the stable on-disk type ids (ggml's numbering), their
 * block geometry, and per type the compute operations:
 *   to_float(x, y, n)           dequantize n values (n a multiple of the block size)
 *   from_float(x, y, n)         quantize n floats with the reference quantizer (bit-compatible with ggml)
 *   vec_dot(n, s, x, y)         *s = dot(row x of this type, activation y of vec_dot_type), scalar reference
 *                               following ggml's generic order of operations
 *   vec_dot_fast                the best SIMD variant for this CPU (== vec_dot where none exists)
 * Activation formats (Q8_0, Q8_1, Q8_K) have from_float too, so a matmul quantizes its input once.
 */
#ifndef KILN_FORMATS_H
#define KILN_FORMATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kiln_type {
    KILN_TYPE_F32 = 0,
    KILN_TYPE_F16 = 1,
    KILN_TYPE_Q4_0 = 2,
    KILN_TYPE_Q4_1 = 3,
    KILN_TYPE_Q5_0 = 6,
    KILN_TYPE_Q5_1 = 7,
    KILN_TYPE_Q8_0 = 8,
    KILN_TYPE_Q8_1 = 9,
    KILN_TYPE_Q2_K = 10,
    KILN_TYPE_Q3_K = 11,
    KILN_TYPE_Q4_K = 12,
    KILN_TYPE_Q5_K = 13,
    KILN_TYPE_Q6_K = 14,
    KILN_TYPE_Q8_K = 15,
    KILN_TYPE_IQ2_XXS = 16,
    KILN_TYPE_IQ2_XS = 17,
    KILN_TYPE_IQ3_XXS = 18,
    KILN_TYPE_IQ1_S = 19,
    KILN_TYPE_IQ4_NL = 20,
    KILN_TYPE_IQ3_S = 21,
    KILN_TYPE_IQ2_S = 22,
    KILN_TYPE_IQ4_XS = 23,
    KILN_TYPE_I8 = 24,
    KILN_TYPE_I16 = 25,
    KILN_TYPE_I32 = 26,
    KILN_TYPE_I64 = 27,
    KILN_TYPE_F64 = 28,
    KILN_TYPE_IQ1_M = 29,
    KILN_TYPE_BF16 = 30,
    KILN_TYPE_TQ1_0 = 34,
    KILN_TYPE_TQ2_0 = 35,
    KILN_TYPE_MXFP4 = 39,
    KILN_TYPE_NVFP4 = 40,
    KILN_TYPE_COUNT = 41,
} kiln_type;

typedef void (*kiln_to_float_fn)(const void *x, float *y, int64_t n);
typedef void (*kiln_from_float_fn)(const float *x, void *y, int64_t n);
typedef void (*kiln_vec_dot_fn)(int n, float *s, const void *x, const void *y);

typedef struct kiln_type_info {
    const char *name;          /* ggml's name: "f32", "q4_K", ... */
    uint32_t block_size;       /* values per block */
    uint32_t type_size;        /* bytes per block */
    bool is_quantized;
    /* compute operations; NULL where kiln cannot compute with this type (it can still read the file) */
    kiln_to_float_fn to_float;
    kiln_from_float_fn from_float;
    kiln_vec_dot_fn vec_dot;        /* scalar reference */
    kiln_vec_dot_fn vec_dot_fast;   /* best variant for this CPU */
    kiln_type vec_dot_type;         /* the activation's format for vec_dot */
} kiln_type_info;

/* The table entry of a type id, or NULL when the id is not a known GGUF type. */
const kiln_type_info *kiln_type_get(uint32_t type);

/* Bytes of a row of n values; 0 when the type is unknown or n is not a multiple of the block size. */
size_t kiln_row_bytes(uint32_t type, uint64_t n);

/* Parses a type name ("Q4_K", "q8_0", "f16"; case-insensitive). Returns -1 when unknown. */
int kiln_type_from_name(const char *name);

/* Half-precision conversions (round to nearest even, like ggml). */
float kiln_f16_to_f32(uint16_t h);
uint16_t kiln_f32_to_f16(float f);
float kiln_bf16_to_f32(uint16_t h);
uint16_t kiln_f32_to_bf16(float f);

/* Converts one activation row x (n floats) to the vec_dot_type of weight_type (F32 copy, F16, BF16,
 * Q8_0, Q8_1 or Q8_K) into dst, as the reference engine's CPU matmul does: Q8_0 / Q8_1 with its AVX2
 * activation quantizer (id = 127/amax, halves to even; kiln_q8_*_act_*), the others with from_float; which must hold
 * kiln_row_bytes(vec_dot_type, n). n must be a multiple of the weight type's block size and the
 * weight type must have a vec_dot (programmer error otherwise). Allocates nothing. */
void kiln_quantize_row_for_dot(uint32_t weight_type, const float *x, void *dst, int64_t n);

/* The fastest quantizer of a type that produces exactly the bytes of its reference from_float (AVX2
 * scale searches for the K types, AVX2 Q8_0 / Q8_K), or from_float itself; NULL when the type has none. */
kiln_from_float_fn kiln_from_float_fast(uint32_t type);

/* KILN_X86: the *_avx2.c / *_avx512.c kernels exist only in x86 builds (the Makefile leaves them out
 * elsewhere), so code that names them does so under #if KILN_X86; other targets run the portable kernels. */
#if defined(__x86_64__) || defined(__i386__)
#define KILN_X86 1
/* True when this CPU has AVX2, FMA and F16C (the *_avx2.c kernels may run). */
int kiln_cpu_has_avx2(void);
/* True when this CPU also has AVX-512 F, BW, VL and VNNI (the *_avx512.c kernels may run). */
int kiln_cpu_has_avx512vnni(void);
#else
#define KILN_X86 0
static inline int kiln_cpu_has_avx2(void) { return 0; }
static inline int kiln_cpu_has_avx512vnni(void) { return 0; }
#endif
/* The kernel levels of the CPU code (cpu_level.c). x86: AVX2 needs AVX2 + FMA + F16C; AVX512 needs AVX2 and
 * AVX-512 F, BW, VL and VNNI (the *_avx512.c kernels: VNNI integer dots, bit-identical to the AVX2 ones).
 * aarch64: NEON. KILN_CPU_SCALAR is the scalar reference everywhere. */
typedef enum kiln_isa_level { KILN_CPU_SCALAR = 0, KILN_CPU_NEON = 1, KILN_CPU_AVX2 = 2, KILN_CPU_AVX512 = 3 } kiln_isa_level;

/* The best level this CPU and build support. */
kiln_isa_level kiln_cpu_level_best(void);
/* The level the kernels run at: the best one, lowered by KILN_CPU_LEVEL (scalar|avx2|avx512|neon; a level above
 * the best is a warning and the best applies) or KILN_NO_SIMD=1 (scalar). Read once (thread-safe), fixed after. */
kiln_isa_level kiln_cpu_level(void);
/* "scalar", "neon", "avx2", "avx512". */
const char *kiln_cpu_level_name(kiln_isa_level level);
/* True where the CPU runs 512-bit operations as two 256-bit halves (AMD Zen 4), which changes which of two
 * bit-identical kernel shapes is faster (cpu_gemm_avx512.c); read once, like the level. */
bool kiln_cpu_avx512_in_halves(void);

/* KILN_NEON: the *_neon.c kernels exist only in aarch64 builds (NEON is part of that base ISA). */
#if defined(__aarch64__) && defined(__ARM_NEON)
#define KILN_NEON 1
#else
#define KILN_NEON 0
#endif

/* Fills in the compute operations of the table (called once, thread-safe; kiln_type_get calls it). */
void kiln_formats_init(void);

#endif
