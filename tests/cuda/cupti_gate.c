/*
 * cupti_gate.c — the CUPTI subscriber of cupti_gate.h: driver API calls are classified by name on entry,
 * resource callbacks by id, activity records (overhead: lazy function / runtime-triggered module loading and
 * driver compilation; JIT) when CUPTI hands back a buffer. Activity buffers come from a static pool, so the
 * counting itself calls no malloc in the measured windows. Test-only code.
 */
#include "cuda/cupti_gate.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

enum { CG_ALLOC, CG_MODULE, CG_GRAPH, CG_JIT, CG_N };

static uint64_t g_count[CG_N];
static uint64_t g_driver_calls;

/* the names counted since the last snapshot */
#define CG_MAX_NAMES 24
static struct { char name[48]; uint64_t n; } g_names[CG_MAX_NAMES];
static int g_n_names;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void count(int what, const char *name) {
    __atomic_add_fetch(&g_count[what], 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g_lock);
    int i = 0;
    while (i < g_n_names && strcmp(g_names[i].name, name)) i++;
    if (i == g_n_names && g_n_names < CG_MAX_NAMES) {
        snprintf(g_names[i].name, sizeof g_names[i].name, "%s", name);
        g_names[i].n = 0;
        g_n_names++;
    }
    if (i < g_n_names) g_names[i].n++;
    pthread_mutex_unlock(&g_lock);
}

/* The category of a driver API function, or -1 when it is not counted. */
static int classify(const char *fn) {
    static const struct { const char *prefix; int what; } rules[] = {
        {"cuMemAlloc", CG_ALLOC},           {"cuMemHostAlloc", CG_ALLOC},       {"cuMemCreate", CG_ALLOC},
        {"cuMemHostRegister", CG_ALLOC},    {"cuArrayCreate", CG_ALLOC},        {"cuArray3DCreate", CG_ALLOC},
        {"cuMipmappedArrayCreate", CG_ALLOC},
        {"cuModuleLoad", CG_MODULE},        {"cuLibraryLoad", CG_MODULE},       {"cuModuleGetFunction", CG_MODULE},
        {"cuLibraryGetKernel", CG_MODULE},  {"cuKernelGetFunction", CG_MODULE}, {"cuLink", CG_MODULE},
        {"cuStreamBeginCapture", CG_GRAPH}, {"cuGraphCreate", CG_GRAPH},        {"cuGraphInstantiate", CG_GRAPH},
        {"cuGraphExecUpdate", CG_GRAPH},    {"cuGraphClone", CG_GRAPH},         {"cuGraphAdd", CG_GRAPH},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (!strncmp(fn, rules[i].prefix, strlen(rules[i].prefix))) return rules[i].what;
    return -1;
}

static void CUPTIAPI on_callback(void *ud, CUpti_CallbackDomain dom, CUpti_CallbackId id, const void *data) {
    (void)ud;
    if (dom == CUPTI_CB_DOMAIN_DRIVER_API) {
        const CUpti_CallbackData *d = (const CUpti_CallbackData *)data;
        if (d->callbackSite != CUPTI_API_ENTER) return;
        __atomic_add_fetch(&g_driver_calls, 1, __ATOMIC_RELAXED);
        const int what = d->functionName ? classify(d->functionName) : -1;
        if (what >= 0) count(what, d->functionName);
    } else if (dom == CUPTI_CB_DOMAIN_RESOURCE) {
        if (id == CUPTI_CBID_RESOURCE_MODULE_LOADED) count(CG_MODULE, "resource:module_loaded");
        else if (id == CUPTI_CBID_RESOURCE_GRAPH_CREATED) count(CG_GRAPH, "resource:graph_created");
        else if (id == CUPTI_CBID_RESOURCE_GRAPH_CLONED) count(CG_GRAPH, "resource:graph_cloned");
        else if (id == CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED) count(CG_GRAPH, "resource:graphexec_created");
    }
}

/* ---- activity records: a static pool of buffers (no malloc while counting) */

#define CG_BUFS 8
#define CG_BUF_BYTES (256u << 10)
static uint8_t g_pool[CG_BUFS][CG_BUF_BYTES] __attribute__((aligned(64)));
static int g_pool_used[CG_BUFS];

static void CUPTIAPI on_buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = NULL, *size = 0, *max_records = 0;
    for (int i = 0; i < CG_BUFS; i++) {
        int expect = 0;
        if (__atomic_compare_exchange_n(&g_pool_used[i], &expect, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            *buf = g_pool[i], *size = CG_BUF_BYTES;
            return;
        }
    }
    count(CG_JIT, "cupti:activity buffers exhausted (records dropped)"); /* fails the gate loudly */
}

static void CUPTIAPI on_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_JIT) {
            count(CG_JIT, "activity:jit");
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_OVERHEAD) {
            /* kind and overheadKind lead every version of the overhead record (CUpti_ActivityOverhead, 2, 3);
             * the kinds by value, as older CUPTI headers lack the names of the loading ones */
            const struct { CUpti_ActivityKind kind; uint32_t overhead; } *o = (const void *)rec;
            if (o->overhead == (5u << 16)) count(CG_MODULE, "activity:lazy_function_loading");
            else if (o->overhead == (4u << 16)) count(CG_MODULE, "activity:runtime_triggered_module_loading");
            else if (o->overhead == 1u) count(CG_JIT, "activity:driver_compiler");
        }
    }
    for (int i = 0; i < CG_BUFS; i++)
        if (buf == g_pool[i]) __atomic_store_n(&g_pool_used[i], 0, __ATOMIC_RELEASE);
}

static bool cupti_ok(CUptiResult r, const char *what, char *why, size_t cap) {
    if (r == CUPTI_SUCCESS) return true;
    const char *s = "?";
    cuptiGetResultString(r, &s);
    snprintf(why, cap, "%s: %s", what, s);
    return false;
}

bool cg_start(char *why, size_t cap) {
    static CUpti_SubscriberHandle sub;
    return cupti_ok(cuptiSubscribe(&sub, on_callback, NULL), "cuptiSubscribe", why, cap) &&
           cupti_ok(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API), "enable the driver API domain", why, cap) &&
           cupti_ok(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RESOURCE), "enable the resource domain", why, cap) &&
           cupti_ok(cuptiActivityRegisterCallbacks(on_buffer_requested, on_buffer_completed), "activity buffers", why,
                    cap) &&
           cupti_ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_OVERHEAD), "enable overhead records", why, cap) &&
           cupti_ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_JIT), "enable JIT records", why, cap);
}

void cg_snapshot(cg_counts *out) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    memset(out, 0, sizeof *out);
    out->device_allocs = __atomic_load_n(&g_count[CG_ALLOC], __ATOMIC_ACQUIRE);
    out->module_loads = __atomic_load_n(&g_count[CG_MODULE], __ATOMIC_ACQUIRE);
    out->graph_captures = __atomic_load_n(&g_count[CG_GRAPH], __ATOMIC_ACQUIRE);
    out->jit_compiles = __atomic_load_n(&g_count[CG_JIT], __ATOMIC_ACQUIRE);
    out->driver_calls = __atomic_load_n(&g_driver_calls, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&g_lock);
    size_t n = 0;
    for (int i = 0; i < g_n_names && n < sizeof out->names; i++)
        n += (size_t)snprintf(out->names + n, sizeof out->names - n, "%s%s x%llu", i ? ", " : "", g_names[i].name,
                              (unsigned long long)g_names[i].n);
    g_n_names = 0;
    pthread_mutex_unlock(&g_lock);
}

void cg_diff(const cg_counts *a, const cg_counts *b, cg_counts *d) {
    *d = *b;
    d->device_allocs -= a->device_allocs;
    d->module_loads -= a->module_loads;
    d->graph_captures -= a->graph_captures;
    d->jit_compiles -= a->jit_compiles;
    d->driver_calls -= a->driver_calls;
}

bool cg_any(const cg_counts *d) { return d->device_allocs || d->module_loads || d->graph_captures || d->jit_compiles; }

void cg_print(const char *label, const cg_counts *d) {
    printf("  %s: cupti device_allocs %llu module_loads %llu graph_captures %llu jit %llu (driver calls %llu)%s%s\n",
           label, (unsigned long long)d->device_allocs, (unsigned long long)d->module_loads,
           (unsigned long long)d->graph_captures, (unsigned long long)d->jit_compiles,
           (unsigned long long)d->driver_calls, d->names[0] ? ": " : "", d->names);
}

int cg_lazy_loading(void) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return -1;
    CUresult (*get)(CUmoduleLoadingMode *) = (CUresult(*)(CUmoduleLoadingMode *))dlsym(h, "cuModuleGetLoadingMode");
    CUmoduleLoadingMode mode;
    const int r = get && get(&mode) == CUDA_SUCCESS ? mode == CU_MODULE_LAZY_LOADING : -1;
    dlclose(h);
    return r;
}

bool cg_free_device_bytes(uint64_t *free_bytes) {
    size_t f = 0, total = 0;
    if (cudaMemGetInfo(&f, &total) != cudaSuccess) return false;
    *free_bytes = f;
    return true;
}
