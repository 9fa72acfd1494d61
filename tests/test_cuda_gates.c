/*
 * test_cuda_gates.c — the first-call gates counted from outside kiln: a CUPTI subscriber (tests/cuda/
 * cupti_gate.c) sees every driver API call of the process, whoever makes it (kiln, the CUDA runtime, a
 * library), and CUPTI's activity records report lazy function loads and JIT compilations. After
 * kiln_session_open, prefill, decode and batch calls of several session shapes must make no allocation, load
 * no module or kernel, capture or instantiate no graph, JIT nothing and leave the device's free memory as it
 * was. The test process sets CUDA_MODULE_LOADING=LAZY before its first CUDA call (every test runs in a forked
 * process of its own) and checks that the driver took it, so a kernel that open did not load shows up as a
 * load at its first use. Open itself is the positive control: there the same counters must be nonzero.
 * Deliberate defects that turn each gate red: tests/defects/ (sh tests/defects/demo.sh).
 */
#include "test.h"

#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "test_gpu.h"
#ifdef KILN_HAVE_CUPTI
#include "cuda/cupti_gate.h"
#endif

#if defined(KILN_HAVE_CUDA) && defined(KILN_HAVE_CUPTI)

/* A deterministic prompt: BOS, then n-1 ids spread over the vocabulary. */
static void gate_prompt(int salt, int n, int V, int32_t *out) {
    out[0] = 1;
    for (int i = 1; i < n; i++) out[i] = (int32_t)((i * 37 + salt * 101 + 3) % (V - 3) + 3);
}

/* One sequence: a 13-token prefill, 16 decode steps with logits, 16 greedy ones. */
static bool work_single(kiln_session *s, int V) {
    int32_t prompt[13], tok;
    gate_prompt(0, 13, V, prompt);
    const float *logits;
    if (kiln_prefill(s, prompt, 13, &logits) != KILN_OK) return false;
    tok = test_argmax(logits, V);
    for (int i = 0; i < 16; i++) {
        if (kiln_decode(s, tok, &logits) != KILN_OK) return false;
        tok = test_argmax(logits, V);
    }
    for (int i = 0; i < 16; i++)
        if (kiln_decode_greedy(s, tok, &tok) != KILN_OK) return false;
    return true;
}

/* n_seq sequences: each prefilled, batch calls of 1..n_seq decode rows (logits and argmax outputs
 * alternating; each sequence also alone), a mixed step (a new prompt of sequence 0 beside decode rows of the others), the batches again. */
static bool work_batch(kiln_session *s, int V, int n_seq) {
    int32_t prompt[9], next[8] = {0};
    for (int q = 0; q < n_seq; q++) {
        gate_prompt(q, 3 + 2 * q, V, prompt);
        if (kiln_seq_prefill(s, q, prompt, (size_t)(3 + 2 * q), NULL) != KILN_OK) return false;
        next[q] = prompt[2];
    }
    kiln_batch_row rows[16];
    kiln_batch_output outs[8];
    for (int round = 0; round < 2; round++) {
        /* k rows of k different sequences, rotated so that every sequence also runs alone (its decode graph) */
        for (int k = 1; k <= n_seq; k++)
            for (int step = 0; step < n_seq; step++) {
                for (int j = 0; j < k; j++) {
                    const int q = (step + j) % n_seq;
                    rows[j] = (kiln_batch_row){.seq = q, .id = next[q], .out = (j + step) % 2 ? KILN_OUT_ARGMAX : KILN_OUT_LOGITS};
                }
                size_t n_out = 0;
                if (kiln_batch(s, rows, (size_t)k, outs, 8, &n_out) != KILN_OK || n_out != (size_t)k) return false;
                for (size_t i = 0; i < n_out; i++) next[rows[outs[i].row].seq] = outs[i].id;
            }
        if (round == 1) break;
        /* the mixed step: sequence 0 starts over with a 6-token prompt between the others' decode rows */
        if (kiln_seq_reset(s, 0) != KILN_OK) return false;
        gate_prompt(7, 6, V, prompt);
        size_t n = 0;
        if (n_seq > 1) rows[n++] = (kiln_batch_row){.seq = 1, .id = next[1], .out = KILN_OUT_ARGMAX};
        for (int i = 0; i < 6; i++)
            rows[n++] = (kiln_batch_row){.seq = 0, .id = prompt[i], .out = i == 5 ? KILN_OUT_LOGITS : KILN_OUT_NONE};
        for (int q = 2; q < n_seq; q++) rows[n++] = (kiln_batch_row){.seq = q, .id = next[q], .out = KILN_OUT_LOGITS};
        size_t n_out = 0;
        if (kiln_batch(s, rows, n, outs, 8, &n_out) != KILN_OK || n_out != (size_t)n_seq) return false;
        for (size_t i = 0; i < n_out; i++) next[rows[outs[i].row].seq] = outs[i].id;
    }
    return true;
}

typedef struct gate_shape {
    const char *name, *model;
    kiln_session_options opt;
} gate_shape;

/* Opens one shape under the counters, runs its work, checks the windows; open_loads: whether this open must
 * show module loads (only the first open of the process loads the modules). */
static void gate_one(const gate_shape *g, bool open_loads) {
    kiln_model *m;
    REQUIRE_OK(kiln_model_open(test_shared(g->model), &m));
    const int V = m->hp.n_vocab;
    cg_counts c0, c1, c2, open_d, work_d;
    kiln_session *s = NULL;
    cg_snapshot(&c0);
    kiln_status st = kiln_session_open(m, &g->opt, &s);
    cg_snapshot(&c1);
    if (st != KILN_OK) {
        test_failf(__FILE__, __LINE__, "%s: open: %s", g->name, kiln_last_error());
        kiln_model_close(m);
        return;
    }
    CHECK_STR(kiln_session_backend(s), "cuda");
    uint64_t free0 = 0, free1 = 0;
    const bool mem0 = cg_free_device_bytes(&free0);
    cg_snapshot(&c1); /* the memory query is outside both windows */
    const bool ran = g->opt.n_seq > 1 ? work_batch(s, V, g->opt.n_seq) : work_single(s, V);
    CHECKF(ran, "%s: a call failed: %s", g->name, kiln_last_error());
    cg_snapshot(&c2);
    const bool mem1 = cg_free_device_bytes(&free1);
    cg_diff(&c0, &c1, &open_d);
    cg_diff(&c1, &c2, &work_d);
    cg_print("open", &open_d);
    cg_print("after open", &work_d);
    printf("  %s: device free memory %.1f MiB before the calls, delta after them %+lld bytes\n", g->name,
           free0 / 1048576.0, (long long)free1 - (long long)free0);
    /* the positive control: the subscriber saw open's own allocations, loads and instantiations */
    CHECKF(open_d.driver_calls > 0 && work_d.driver_calls > 0, "%s: the subscriber saw no driver call", g->name);
    CHECKF(open_d.device_allocs >= 2, "%s: open's arena and pinned buffer not seen (%llu allocations)", g->name,
           (unsigned long long)open_d.device_allocs);
    CHECKF(open_d.graph_captures >= (uint64_t)(g->opt.n_seq ? g->opt.n_seq : 1), "%s: open's graphs not seen", g->name);
    if (open_loads) CHECKF(open_d.module_loads > 0, "%s: open's kernel loads not seen", g->name);
    /* the gates */
    CHECKF(work_d.device_allocs == 0, "%s: %llu device allocations after open: %s", g->name,
           (unsigned long long)work_d.device_allocs, work_d.names);
    CHECKF(work_d.module_loads == 0, "%s: %llu module/kernel loads after open: %s", g->name,
           (unsigned long long)work_d.module_loads, work_d.names);
    CHECKF(work_d.graph_captures == 0, "%s: %llu graph captures/instantiations after open: %s", g->name,
           (unsigned long long)work_d.graph_captures, work_d.names);
    CHECKF(work_d.jit_compiles == 0, "%s: %llu JIT compilations after open: %s", g->name,
           (unsigned long long)work_d.jit_compiles, work_d.names);
    CHECKF(mem0 && mem1, "%s: cudaMemGetInfo failed", g->name);
    CHECKF(free1 == free0, "%s: the device's free memory changed by %+lld bytes over the calls", g->name,
           (long long)free1 - (long long)free0);
    kiln_session_close(s);
    kiln_model_close(m);
}

TEST(cuda_gates_cupti_nothing_allocated_loaded_or_captured_after_open) {
    /* read by the driver when this process creates its CUDA context: before any CUDA call */
    setenv("CUDA_MODULE_LOADING", "LAZY", 1);
    if (!test_gpu_ready()) return;
    /* subscribed before the context exists (open creates it), so open's own calls are seen too */
    char why[256];
    if (!cg_start(why, sizeof why)) {
        test_skip("CUPTI cannot subscribe here (%s)", why);
        return;
    }
    static const gate_shape shapes[] = {
        {"dense llama, one sequence", "models/tinystories-656K/TinyStories-656K-Q8_0.gguf",
         {.n_ctx = 256, .device = KILN_DEVICE_CUDA}},
        {"dense llama, 4 sequences", "models/tinystories-656K/TinyStories-656K-Q8_0.gguf",
         {.n_ctx = 128, .max_batch = 32, .n_seq = 4, .device = KILN_DEVICE_CUDA}},
        {"qwen3 (Q/K norm), 2 sequences", "models/archs/tiny-qwen3.gguf",
         {.n_ctx = 128, .max_batch = 16, .n_seq = 2, .device = KILN_DEVICE_CUDA}},
        {"qwen3moe (routing and experts on the device), 2 sequences", "models/archs/tiny-qwen3moe.gguf",
         {.n_ctx = 128, .max_batch = 16, .n_seq = 2, .device = KILN_DEVICE_CUDA}},
        {"qwen3moe, one sequence (its 13-token prefill groups the rows by expert)", "models/archs/tiny-qwen3moe.gguf",
         {.n_ctx = 128, .device = KILN_DEVICE_CUDA}},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        printf("  [%s]\n", shapes[i].name);
        gate_one(&shapes[i], i == 0);
        if (i == 0) {
            const int lazy = cg_lazy_loading();
            CHECKF(lazy == 1, "the driver's module loading is not lazy (%d): CUDA_MODULE_LOADING was not taken", lazy);
        }
    }
}

#else

TEST(cuda_gates_cupti_not_built_skips) {
#if !defined(KILN_HAVE_CUDA)
    test_skip("kiln was built without CUDA (nvcc not found)");
#else
    /* the ASan binary never links CUPTI; build/cuda/kiln_tests_cuda does where the toolkit has libcupti */
    test_skip("this test binary was built without CUPTI (the CUPTI gates are in build/cuda/kiln_tests_cuda where "
              "libcupti is found beside nvcc; see make's output)");
#endif
}

#endif
