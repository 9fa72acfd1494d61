/* pool.c — the thread pool: per-thread shares of chunks claimed by compare-and-swap (the owner from the front,
 * other threads from the back), a done count per share that the caller waits on, and a generation counter that
 * spin-then-sleep workers watch for the next run; idle-priority probers that measure whether the workers' cores
 * are free. */
#include "base/pool.h"
#include "base/alloc.h"
#include "base/error.h"
#include "base/timing.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One spin step: a pause hint on x86, a yield hint on Arm, nothing elsewhere. */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Spins before a worker sleeps; after that the caller, waiting for claimed chunks, yields the core. */
#define SPIN_BEFORE_SLEEP 20000
#define SPIN_BEFORE_YIELD 2000
/* chunks per thread of a run: enough for a busy thread's share to be taken over in pieces */
#define CHUNKS_PER_THREAD 16
/* Signs of an oversubscribed machine, where more threads only slow the caller down:
 *  - stalls: the caller waited for claimed chunks longer than its own part of the run took, plus STALL_SLACK_NS
 *    (on a quiet machine the wait is at most one chunk): a thread was descheduled inside a chunk. One stall longer
 *    than STALL_LONG_NS is a sign; shorter ones are a sign when STALL_SIGNS of them fall within STALL_WINDOW
 *    parallel runs and their waits add up to at least 1 / STALL_LOSS_DIV of the window's wall time so far (at
 *    least STALL_MIN_SPAN_NS): going alone pays only when stalls take a good part of what a second thread gives.
 *    (A quiet 2-core VM shows a lone 0.3-5 ms stall every few thousand runs, a vCPU or a kernel thread taking the
 *    core for a tick; when each lone one started a solo stretch, 1B decode of 4 sequences on 2 threads ran alone
 *    for over half its runs: 25 tok/s instead of 39.6; when any three in a window did, the MoE model's decode, ~290
 *    runs a token, ran alone for half its runs: 52-57 ms a token instead of 43-45, bench/RESULTS.md.)
 *  - a low CPU share: over SAMPLES sampled runs (one run in SAMPLE_EVERY), the caller's thread ran less than
 *    MIN_CPU_SHARE of their wall time, and it waited for a core of this machine (Linux's run delay, where the
 *    system reports it) at least half as long as it lost over the window: other threads, or its own workers, took
 *    its core. (Time a hypervisor takes from the whole VM is lost too, but no thread of the machine waited for it
 *    and going alone does not get it back: a 2-core VM whose host took 20-40% of the caller's time for a moment
 *    sent the MoE model's decode alone for 1000-4000 runs at a time, bench/RESULTS.md.)
 * Then the caller computes the next runs alone (the workers fall asleep and leave their cores to the others)
 * for a stretch of SOLO_RUNS runs, doubling while the signs recur up to SOLO_RUNS_MAX; SOLO_RUNS parallel runs
 * without a sign bring it back to SOLO_RUNS. At the end of a stretch the caller does not try its threads on a
 * run (each try on a busy machine cost a few stalled runs, 2-7% of a busy-core decode): it asks its probers, one
 * per worker, at the idle scheduling priority (SCHED_IDLE: they get only CPU time that no other thread wants, so
 * they take nothing from the caller or anyone else), to spin PROBE_NS each and measure the CPU time they got, and
 * goes on alone meanwhile. Every prober at MIN_PROBE_SHARE or more (as many free cores as workers): the next run
 * is parallel; else the next stretch starts (a sign, doubling). (Probing from the workers themselves, at normal
 * priority, cost the caller its core whenever the scheduler woke a worker beside it: 14% of busy-core decode.) */
#define STALL_SLACK_NS 200000
#define STALL_LONG_NS 20000000
#define STALL_SIGNS 3
#define STALL_WINDOW 1024
#define STALL_LOSS_DIV 8
#define STALL_MIN_SPAN_NS 50000000
#define SAMPLE_EVERY 8
#define SAMPLES 32
#define MIN_CPU_SHARE 0.85
#define SOLO_RUNS 1000
#define SOLO_RUNS_MAX 64000
#define PROBE_NS 5000000
#define MIN_PROBE_SHARE 0.9

/* One thread's share of the current run, on its own cache line. range holds the unclaimed chunks [lo, hi), lo in
 * the low 32 bits: the owner claims lo, the others hi - 1. done counts the share's chunks finished this run. */
typedef struct share {
    _Alignas(64) _Atomic uint64_t range;
    _Atomic uint32_t done;
    _Atomic uint32_t probe_permille; /* prober ith's CPU share in its last probe, in 1/1000 of the wall time */
} share;

typedef struct { kiln_pool *p; int ith; } worker_arg;

struct kiln_pool {
    int n;
    worker_arg *args;
    pthread_t *threads;
    pthread_t *probers;      /* probers 1..n_probers, one per worker */
    int n_probers;
    share *shares;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_cond_t probe_cv; /* the probers sleep on it */
    /* The run. The caller writes it before it publishes the shares; a thread reads it only after it claimed a
     * chunk (a successful claim reads the published share, and the run cannot end before that chunk is done). */
    kiln_pool_range_fn fn;
    void *ctx;
    kiln_pool_fn share_fn;   /* kiln_pool_run's function, called through run_shares */
    void *share_ctx;
    kiln_counters *sink;     /* the caller's counter sink, carried to the workers for the run */
    int n_items, chunk;
    /* the caller's view of the machine (see SOLO_RUNS) */
    int solo_left;           /* runs still to compute alone */
    int solo_next;           /* the length of the next solo stretch */
    int calm_runs;           /* parallel runs since the last sign of oversubscription */
    int stalls, stall_runs;  /* short stalls in the current window of stall_runs parallel runs */
    uint64_t window_t0, stall_ns; /* when the window's first run started; its stalled runs' waits */
    unsigned runs;           /* parallel runs, for the sampling */
    int samples;             /* sampled runs in the current window, their thread CPU time and wall time */
    uint64_t sample_cpu_ns, sample_wall_ns;
    uint64_t sample_t0, sample_delay0; /* when the window's first sampled run started; the run delay then */
    bool probing;            /* a probe asked for and not yet read */
    _Alignas(64) _Atomic uint32_t generation;  /* one more per run: the workers' signal to look at the shares */
    _Atomic int sleepers;
    _Atomic uint32_t probe_gen;  /* one more per probe asked for (under mu) */
    _Atomic int probes_done;     /* probers that finished the current probe */
    _Atomic bool quit;
};

/* Claims one chunk of sh: the front one for its owner, else the back one. false: none left. */
static bool claim(share *sh, bool owner, int *chunk) {
    uint64_t v = atomic_load_explicit(&sh->range, memory_order_acquire);
    for (;;) {
        const uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
        if (lo >= hi) return false;
        const uint64_t next = owner ? v + 1 : v - ((uint64_t)1 << 32);
        if (atomic_compare_exchange_weak_explicit(&sh->range, &v, next, memory_order_acquire, memory_order_acquire)) {
            *chunk = (int)(owner ? lo : hi - 1);
            return true;
        }
    }
}

/* Thread ith's part of the current run: the chunks of its own share, then whatever is left of the others'. */
static void work(kiln_pool *p, int ith) {
    for (int k = 0; k < p->n; k++) {
        share *sh = &p->shares[(ith + k) % p->n];
        int c;
        while (claim(sh, k == 0, &c)) {
            const int lo = c * p->chunk, hi = p->n_items - lo > p->chunk ? lo + p->chunk : p->n_items;
            kiln_counters *prev = kiln_counters_enter(p->sink);
            p->fn(p->ctx, lo, hi, ith);
            kiln_counters_leave(prev);
            atomic_fetch_add_explicit(&sh->done, 1, memory_order_release);
        }
    }
}

/* This thread's CPU time. */
static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A probe: spins PROBE_NS of wall time and records the CPU time this thread got in it. */
static void probe(kiln_pool *p, int ith) {
    const uint64_t c0 = thread_cpu_ns(), t0 = kiln_now_ns();
    uint64_t t;
    while ((t = kiln_now_ns()) - t0 < PROBE_NS) cpu_relax();
    const uint64_t permille = (thread_cpu_ns() - c0) * 1000 / (t - t0);
    atomic_store_explicit(&p->shares[ith].probe_permille, (uint32_t)permille, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->probes_done, 1, memory_order_release);
}

/* Waits for a generation other than *seen (spinning, then asleep) and records it; false when the pool closes. */
static bool wait_run(kiln_pool *p, uint32_t *seen) {
    for (int spins = 0;; spins++) {
        if (atomic_load_explicit(&p->quit, memory_order_acquire)) return false;
        const uint32_t g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != *seen) { *seen = g; return true; }
        if (spins < SPIN_BEFORE_SLEEP) { cpu_relax(); continue; }
        /* sleepers then generation, against the caller's generation then sleepers (both seq_cst): one of the
         * two sees the other's write, so a run is never missed */
        pthread_mutex_lock(&p->mu);
        atomic_fetch_add(&p->sleepers, 1);
        while (atomic_load(&p->generation) == *seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->cv, &p->mu);
        atomic_fetch_sub(&p->sleepers, 1);
        pthread_mutex_unlock(&p->mu);
        spins = 0;
    }
}

static void *worker_main(void *arg) {
    kiln_pool *p = ((worker_arg *)arg)->p;
    const int ith = ((worker_arg *)arg)->ith;
    uint32_t seen = 0;
    while (wait_run(p, &seen)) work(p, ith);
    return NULL;
}

/* Prober ith: at the idle priority where the system has it (else at the normal one), asleep until a probe is
 * asked for, then probe(). */
static void *prober_main(void *arg) {
    kiln_pool *p = ((worker_arg *)arg)->p;
    const int ith = ((worker_arg *)arg)->ith;
#ifdef SCHED_IDLE
    const struct sched_param none = {0};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &none);
#endif
    uint32_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->probe_gen) == seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->probe_cv, &p->mu);
        seen = atomic_load(&p->probe_gen);
        pthread_mutex_unlock(&p->mu);
        if (atomic_load(&p->quit)) return NULL;
        probe(p, ith);
    }
}

kiln_status kiln_pool_open(int n_threads, kiln_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_pool_open: thread count %d out of range 1..1024", n_threads);
    kiln_pool *p = kiln_aligned_alloc(64, sizeof *p);
    if (!p) return kiln_fail(KILN_ERR_NOMEM, "kiln_pool_open: out of memory");
    memset(p, 0, sizeof *p);
    p->n = 1;
    p->solo_next = SOLO_RUNS;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->probe_cv, NULL);
    p->threads = kiln_calloc((size_t)n_threads, sizeof(pthread_t));
    p->probers = kiln_calloc((size_t)n_threads, sizeof(pthread_t));
    p->args = kiln_calloc((size_t)n_threads, sizeof(worker_arg));
    p->shares = kiln_aligned_alloc(64, (size_t)n_threads * sizeof(share));
    if (!p->threads || !p->probers || !p->args || !p->shares) {
        kiln_pool_close(p);
        return kiln_fail(KILN_ERR_NOMEM, "kiln_pool_open: out of memory");
    }
    memset(p->shares, 0, (size_t)n_threads * sizeof(share));
    for (int i = 1; i < n_threads; i++) {
        p->args[i] = (worker_arg){p, i};
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) {
            kiln_pool_close(p);
            return kiln_fail(KILN_ERR_INTERNAL, "kiln_pool_open: pthread_create failed");
        }
        p->n = i + 1;
    }
    for (int i = 1; i < n_threads; i++) {
        if (pthread_create(&p->probers[i], NULL, prober_main, &p->args[i]) != 0) {
            kiln_pool_close(p);
            return kiln_fail(KILN_ERR_INTERNAL, "kiln_pool_open: pthread_create failed");
        }
        p->n_probers = i;
    }
    *out = p;
    return KILN_OK;
}

void kiln_pool_close(kiln_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, true);
    pthread_cond_broadcast(&p->cv);
    pthread_cond_broadcast(&p->probe_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    for (int i = 1; i <= p->n_probers; i++) pthread_join(p->probers[i], NULL);
    kiln_free(p->threads);
    kiln_free(p->probers);
    kiln_free(p->args);
    kiln_free(p->shares);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->probe_cv);
    kiln_free(p);
}

int kiln_pool_size(const kiln_pool *p) { return p->n; }

/* Publishes a run of n_chunks chunks: share s gets the chunks kiln_split gives it; then wakes the workers. */
static void publish(kiln_pool *p, int n_chunks) {
    for (int s = 0; s < p->n; s++) {
        int lo, hi;
        kiln_split(n_chunks, s, p->n, &lo, &hi);
        atomic_store_explicit(&p->shares[s].done, 0, memory_order_relaxed);
        atomic_store_explicit(&p->shares[s].range, (uint64_t)lo | (uint64_t)hi << 32, memory_order_release);
    }
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Asks every prober for a probe (the caller does not wait). */
static void ask_probe(kiln_pool *p) {
    atomic_store_explicit(&p->probes_done, 0, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->probe_gen, 1);
    pthread_cond_broadcast(&p->probe_cv);
    pthread_mutex_unlock(&p->mu);
    p->probing = true;
}

/* Waits until every chunk of the run is done (by now every chunk has been claimed). */
static void wait_done(kiln_pool *p, int n_chunks) {
    for (int s = 0; s < p->n; s++) {
        int lo, hi;
        kiln_split(n_chunks, s, p->n, &lo, &hi);
        for (int spins = 0; atomic_load_explicit(&p->shares[s].done, memory_order_acquire) < (uint32_t)(hi - lo); spins++) {
            if (spins < SPIN_BEFORE_YIELD) cpu_relax();
            else sched_yield();
        }
    }
}

/* Nanoseconds this thread has been runnable and waiting for a core of this machine (the second field of Linux's
 * /proc/thread-self/schedstat), or UINT64_MAX where the system does not say. */
static uint64_t thread_run_delay_ns(void) {
    char buf[128];
    const int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return UINT64_MAX;
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return UINT64_MAX;
    buf[n] = 0;
    char *end;
    strtoull(buf, &end, 10); /* the time on a core, then the time waiting for one */
    if (*end != ' ') return UINT64_MAX;
    return strtoull(end, NULL, 10);
}

/* Adds one sampled run that started at t0; true when a window of SAMPLES ends with the caller's CPU share below
 * MIN_CPU_SHARE, and (where the run delay is known) with half the lost time or more spent waiting for a core. */
static bool cpu_share_low(kiln_pool *p, uint64_t t0, uint64_t cpu_ns, uint64_t wall_ns) {
    if (p->samples == 0) p->sample_t0 = t0, p->sample_delay0 = thread_run_delay_ns();
    p->sample_cpu_ns += cpu_ns;
    p->sample_wall_ns += wall_ns;
    if (++p->samples < SAMPLES) return false;
    bool low = (double)p->sample_cpu_ns < MIN_CPU_SHARE * (double)p->sample_wall_ns;
    const uint64_t delay = low ? thread_run_delay_ns() : UINT64_MAX;
    if (delay != UINT64_MAX && p->sample_delay0 <= delay) { /* (another thread's delay, or none, at the start) */
        /* the samples cover one run in SAMPLE_EVERY, the run delay the whole window: compare fractions */
        const double lost = 1.0 - (double)p->sample_cpu_ns / (double)p->sample_wall_ns,
                     waited = (double)(delay - p->sample_delay0) / (double)(t0 + wall_ns - p->sample_t0);
        low = waited >= 0.5 * lost;
    }
    p->samples = 0;
    p->sample_cpu_ns = p->sample_wall_ns = 0;
    return low;
}

/* After a parallel run, or a probe read: a sign of oversubscription starts a solo stretch (doubling while they
 * recur), a calm stretch resets its length. */
static void note_busy(kiln_pool *p, bool busy) {
    if (!busy) {
        if (++p->calm_runs >= SOLO_RUNS) p->solo_next = SOLO_RUNS;
        return;
    }
    p->calm_runs = 0;
    p->stalls = p->stall_runs = 0;
    p->solo_left = p->solo_next;
    p->solo_next = p->solo_next * 2 < SOLO_RUNS_MAX ? p->solo_next * 2 : SOLO_RUNS_MAX;
    p->samples = 0;
    p->sample_cpu_ns = p->sample_wall_ns = 0;
}

/* Reads the probe asked for once every prober has finished it (p->probing cleared): true (a sign: another
 * stretch alone) when some prober got less than MIN_PROBE_SHARE of its wall time, false when none did (the next
 * run is parallel). false while a prober is still probing (p->probing stays set: the caller goes on alone). */
static bool solo_probe_read(kiln_pool *p) {
    if (atomic_load_explicit(&p->probes_done, memory_order_acquire) < p->n - 1) return false;
    p->probing = false;
    for (int i = 1; i < p->n; i++)
        if (atomic_load_explicit(&p->shares[i].probe_permille, memory_order_relaxed) < 1000 * MIN_PROBE_SHARE)
            return true;
    return false;
}

/* After a parallel run that started at t0, whose caller computed its own part until t1 and waited for claimed
 * chunks until t2: whether the stalls so far are a sign (see STALL_SIGNS). */
static bool stall_sign(kiln_pool *p, uint64_t t0, uint64_t t1, uint64_t t2) {
    if (++p->stall_runs > STALL_WINDOW || p->stall_runs == 1)
        p->stall_runs = 1, p->stalls = 0, p->stall_ns = 0, p->window_t0 = t0;
    const uint64_t own_ns = t1 - t0, wait_ns = t2 - t1;
    if (wait_ns <= own_ns + STALL_SLACK_NS) return false;
    if (wait_ns > STALL_LONG_NS) return true;
    p->stall_ns += wait_ns;
    const uint64_t span = t2 - p->window_t0 > STALL_MIN_SPAN_NS ? t2 - p->window_t0 : STALL_MIN_SPAN_NS;
    return ++p->stalls >= STALL_SIGNS && p->stall_ns * STALL_LOSS_DIV >= span;
}

void kiln_pool_for(kiln_pool *p, int n, int grain, kiln_pool_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    const int grains = n / grain + (n % grain != 0), target = CHUNKS_PER_THREAD * p->n;
    const int chunk = grain * (grains / target + (grains % target != 0));
    const int n_chunks = n / chunk + (n % chunk != 0);
    if (p->n == 1 || n_chunks == 1 || p->solo_left > 0 || p->probing) {
        if (p->solo_left > 0 && --p->solo_left == 0) ask_probe(p); /* the stretch is over: are the cores free? */
        fn(ctx, 0, n, 0);
        if (p->probing && solo_probe_read(p)) note_busy(p, true);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->sink = kiln_counters_sink();
    p->n_items = n;
    p->chunk = chunk;
    const bool sample = ++p->runs % SAMPLE_EVERY == 0;
    const uint64_t c0 = sample ? thread_cpu_ns() : 0, t0 = kiln_now_ns();
    publish(p, n_chunks);
    work(p, 0);
    const uint64_t t1 = kiln_now_ns();
    wait_done(p, n_chunks);
    const uint64_t t2 = kiln_now_ns();
    bool busy = stall_sign(p, t0, t1, t2);
    if (sample) busy |= cpu_share_low(p, t0, thread_cpu_ns() - c0, t2 - t0);
    note_busy(p, busy);
}

static void run_shares(void *ctx, int lo, int hi, int ith) {
    kiln_pool *p = ctx;
    for (int i = lo; i < hi; i++) p->share_fn(p->share_ctx, i, p->n);
}

void kiln_pool_run(kiln_pool *p, kiln_pool_fn fn, void *ctx) {
    if (p->n == 1) { fn(ctx, 0, 1); return; }
    p->share_fn = fn;
    p->share_ctx = ctx;
    kiln_pool_for(p, p->n, 1, run_shares, p);
}
