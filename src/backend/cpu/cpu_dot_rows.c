/* cpu_dot_rows.c — the reference multi-row dot and the choice of a fast one (cpu_dot_rows.h). */
#include "backend/cpu/cpu_dot_rows.h"

#include "formats/blocks.h"

void cpu_dot_rows_ref(kiln_vec_dot_fn dot, int n, const void *x, const uint8_t *y, size_t y_stride, int ny,
                      const float *yd, float *s, size_t s_stride) {
    (void)yd;
    for (int j = 0; j < ny; j++) dot(n, s + (size_t)j * s_stride, x, y + (size_t)j * y_stride);
}

cpu_dot_rows_fn cpu_dot_rows_select(kiln_vec_dot_fn dot) {
#if defined(__x86_64__) || defined(__i386__)
    if (dot == kiln_dot_q8_0_avx2) return cpu_dot_rows_q8_0_avx2; /* only where it is the dot in use */
#endif
    return cpu_dot_rows_ref;
}
