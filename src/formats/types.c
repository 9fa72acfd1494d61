/* types.c — the table of GGUF tensor types: names, block geometry and compute operations. */
#include "formats/formats.h"

#include <pthread.h>
#include <strings.h>

static kiln_type_info type_table[KILN_TYPE_COUNT] = {
    [KILN_TYPE_F32] = {"f32", 1, 4, false, 0, 0, 0, 0, KILN_TYPE_F32},
    [KILN_TYPE_F16] = {"f16", 1, 2, false, 0, 0, 0, 0, KILN_TYPE_F16},
    [KILN_TYPE_Q4_0] = {"q4_0", 32, 18, true, 0, 0, 0, 0, KILN_TYPE_Q8_0},
    [KILN_TYPE_Q4_1] = {"q4_1", 32, 20, true, 0, 0, 0, 0, KILN_TYPE_Q8_1},
    [KILN_TYPE_Q5_0] = {"q5_0", 32, 22, true, 0, 0, 0, 0, KILN_TYPE_Q8_0},
    [KILN_TYPE_Q5_1] = {"q5_1", 32, 24, true, 0, 0, 0, 0, KILN_TYPE_Q8_1},
    [KILN_TYPE_Q8_0] = {"q8_0", 32, 34, true, 0, 0, 0, 0, KILN_TYPE_Q8_0},
    [KILN_TYPE_Q8_1] = {"q8_1", 32, 36, true, 0, 0, 0, 0, KILN_TYPE_Q8_1},
    [KILN_TYPE_Q2_K] = {"q2_K", 256, 84, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_Q3_K] = {"q3_K", 256, 110, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_Q4_K] = {"q4_K", 256, 144, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_Q5_K] = {"q5_K", 256, 176, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_Q6_K] = {"q6_K", 256, 210, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_Q8_K] = {"q8_K", 256, 292, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_IQ2_XS] = {"iq2_xs", 256, 74, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_IQ1_S] = {"iq1_s", 256, 50, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_IQ4_NL] = {"iq4_nl", 32, 18, true, 0, 0, 0, 0, KILN_TYPE_Q8_0},
    [KILN_TYPE_IQ3_S] = {"iq3_s", 256, 110, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_IQ2_S] = {"iq2_s", 256, 82, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_IQ4_XS] = {"iq4_xs", 256, 136, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_I8] = {"i8", 1, 1, false, 0, 0, 0, 0, KILN_TYPE_I8},
    [KILN_TYPE_I16] = {"i16", 1, 2, false, 0, 0, 0, 0, KILN_TYPE_I16},
    [KILN_TYPE_I32] = {"i32", 1, 4, false, 0, 0, 0, 0, KILN_TYPE_I32},
    [KILN_TYPE_I64] = {"i64", 1, 8, false, 0, 0, 0, 0, KILN_TYPE_I64},
    [KILN_TYPE_F64] = {"f64", 1, 8, false, 0, 0, 0, 0, KILN_TYPE_F64},
    [KILN_TYPE_IQ1_M] = {"iq1_m", 256, 56, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_BF16] = {"bf16", 1, 2, false, 0, 0, 0, 0, KILN_TYPE_BF16},
    [KILN_TYPE_TQ1_0] = {"tq1_0", 256, 54, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_TQ2_0] = {"tq2_0", 256, 66, true, 0, 0, 0, 0, KILN_TYPE_Q8_K},
    [KILN_TYPE_MXFP4] = {"mxfp4", 32, 17, true, 0, 0, 0, 0, KILN_TYPE_Q8_0},
    [KILN_TYPE_NVFP4] = {"nvfp4", 64, 36, true, 0, 0, 0, 0, KILN_TYPE_Q8_0},
};

/* Defined in the per-family files; each fills the compute operations of its types. */
void kiln_formats_register(kiln_type_info *table);

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static void init_table(void) { kiln_formats_register(type_table); }
void kiln_formats_init(void) { pthread_once(&init_once, init_table); }

const kiln_type_info *kiln_type_get(uint32_t type) {
    if (type >= KILN_TYPE_COUNT || type_table[type].name == NULL) return NULL;
    kiln_formats_init();
    return &type_table[type];
}

size_t kiln_row_bytes(uint32_t type, uint64_t n) {
    if (type >= KILN_TYPE_COUNT || type_table[type].name == NULL) return 0;
    const kiln_type_info *t = &type_table[type];
    if (n % t->block_size) return 0;
    return (size_t)(n / t->block_size) * t->type_size;
}

int kiln_type_from_name(const char *name) {
    for (int i = 0; i < KILN_TYPE_COUNT; i++)
        if (type_table[i].name && !strcasecmp(type_table[i].name, name)) return i;
    return -1;
}
