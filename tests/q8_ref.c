/* q8_ref.c — see q8_ref.h. */
#include "q8_ref.h"

#include "formats/blocks.h"
#include "formats/formats.h"

bool test_q8_input(uint32_t type) {
    return type == KILN_TYPE_Q4_1 || type == KILN_TYPE_Q5_0 || type == KILN_TYPE_Q5_1 || type == KILN_TYPE_Q4_K ||
           type == KILN_TYPE_Q6_K;
}

bool test_q8_hidden(uint32_t type) { return type != KILN_TYPE_F32 && type != KILN_TYPE_F16 && type != KILN_TYPE_BF16; }

double test_q8_ref_dot(uint32_t type, const void *w_row, const float *deq_row, const float *x, int n) {
    const kiln_type_info *q8 = kiln_type_get(KILN_TYPE_Q8_1);
    /* Q4_1 / Q5_1 blocks start with d, m (halves); their values are d * q + m */
    const size_t min_block = type == KILN_TYPE_Q4_1 ? sizeof(block_q4_1) : type == KILN_TYPE_Q5_1 ? sizeof(block_q5_1) : 0;
    double acc = 0;
    for (int b = 0; b < n / 32; b++) {
        block_q8_1 q;
        float xq[32], m = 0, s;
        q8->from_float(x + 32 * b, &q, 32);
        q8->to_float(&q, xq, 32); /* d * level, exactly */
        if (min_block) {
            const uint16_t *wb = (const uint16_t *)((const uint8_t *)w_row + b * min_block);
            kiln_f16_to_float(wb + 1, &m, 1);
        }
        kiln_f16_to_float(&q.s, &s, 1);
        for (int i = 0; i < 32; i++) acc += ((double)deq_row[32 * b + i] - m) * xq[i];
        acc += (double)m * s;
    }
    return acc;
}
