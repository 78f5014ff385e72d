/* A parallel-for for the native kernels in which the calling thread never waits for a helper
 * to arrive, only for chunks a helper has already claimed.
 *
 * Why not OpenMP: an OpenMP loop ends in a barrier that every thread of the team must reach.
 * On a shared host (the project's 2 vCPUs run other jobs) the second thread is often not
 * scheduled, and every barrier then costs a scheduler time slice: measured with libgomp at load
 * 14, MobileNetV2 took 900 ms on 2 threads against 72 ms on one. Here the caller claims chunks
 * itself from an atomic counter; a helper that is not running simply claims none.
 *
 * One job at a time: a second caller that finds the pool busy runs its loop alone. Helpers spin
 * briefly between jobs (the next conv of a run follows within microseconds), then sleep.
 */
#include <pthread.h>
#include <stdatomic.h>

#define TORQ_MAX_HELPERS 63
#define TORQ_SPIN 20000

#include "pool.h"

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_flag busy;               /* a caller owns the job slot */
    atomic_int gen;                 /* job generation: helpers join on a change */
    atomic_int next, done, active, sleeping;
    int n, want;                    /* chunks; helpers wanted by this job */
    torq_chunk_fn fn;
    void *ctx;
    int nhelpers;
} torq_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, ATOMIC_FLAG_INIT};

#include <sched.h>

static inline void torq_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* wait politely: spin, and yield the CPU now and then (the thread we wait for may need it) */
static inline void torq_wait_step(int *spins)
{
    if (++*spins % 256 == 0)
        sched_yield();
    else
        torq_relax();
}

/* a forked child has none of the parent's helpers */
static void torq_pool_after_fork(void)
{
    torq_pool.nhelpers = 0;
    atomic_store(&torq_pool.active, 0);
    atomic_store(&torq_pool.sleeping, 0);
    atomic_flag_clear(&torq_pool.busy);
    pthread_mutex_init(&torq_pool.mu, NULL);
    pthread_cond_init(&torq_pool.cv, NULL);
}

static void torq_run_chunks(void)
{
    int i;
    while ((i = atomic_fetch_add(&torq_pool.next, 1)) < torq_pool.n) {
        torq_pool.fn(torq_pool.ctx, i);
        atomic_fetch_add(&torq_pool.done, 1);
    }
}

static void *torq_helper(void *arg)
{
    const int id = (int)(long)arg;
    int seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load(&torq_pool.gen) == seen && spins < TORQ_SPIN) {
            torq_relax();
            spins++;
        }
        pthread_mutex_lock(&torq_pool.mu);
        while (atomic_load(&torq_pool.gen) == seen) {
            atomic_fetch_add(&torq_pool.sleeping, 1);
            pthread_cond_wait(&torq_pool.cv, &torq_pool.mu);
            atomic_fetch_sub(&torq_pool.sleeping, 1);
        }
        seen = atomic_load(&torq_pool.gen);
        const int join = id < torq_pool.want;       /* fields are stable while we hold the lock */
        if (join)
            atomic_fetch_add(&torq_pool.active, 1);
        pthread_mutex_unlock(&torq_pool.mu);
        if (join) {
            torq_run_chunks();
            atomic_fetch_sub(&torq_pool.active, 1);
        }
    }
    return NULL;
}

/* fn(ctx, i) for i in [0, n), on the caller and up to nthreads - 1 helpers */
void torq_parallel_for(int n, torq_chunk_fn fn, void *ctx, int nthreads)
{
    if (nthreads > TORQ_MAX_HELPERS + 1)
        nthreads = TORQ_MAX_HELPERS + 1;
    if (nthreads <= 1 || n <= 1 || atomic_flag_test_and_set(&torq_pool.busy)) {
        for (int i = 0; i < n; i++)
            fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&torq_pool.mu);
    int spins = 0;
    while (atomic_load(&torq_pool.active))          /* helpers still leaving the previous job */
        torq_wait_step(&spins);
    static int forked_hook = 0;
    if (!forked_hook)
        forked_hook = !pthread_atfork(NULL, NULL, torq_pool_after_fork);
    while (torq_pool.nhelpers < nthreads - 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, torq_helper, (void *)(long)torq_pool.nhelpers))
            break;
        pthread_detach(t);
        torq_pool.nhelpers++;
    }
    torq_pool.fn = fn;
    torq_pool.ctx = ctx;
    torq_pool.n = n;
    torq_pool.want = nthreads - 1;
    atomic_store(&torq_pool.next, 0);
    atomic_store(&torq_pool.done, 0);
    atomic_fetch_add(&torq_pool.gen, 1);
    if (atomic_load(&torq_pool.sleeping))
        pthread_cond_broadcast(&torq_pool.cv);
    pthread_mutex_unlock(&torq_pool.mu);
    torq_run_chunks();
    spins = 0;
    while (atomic_load(&torq_pool.done) < n)        /* only chunks a helper is working on */
        torq_wait_step(&spins);
    atomic_flag_clear(&torq_pool.busy);
}


typedef struct {
    torq_range_fn fn;
    void *ctx;
    int n, per;
} range_job;

static void range_chunk(void *ctx, int i)
{
    const range_job *r = ctx;
    const int end = (i + 1) * r->per < r->n ? (i + 1) * r->per : r->n;
    r->fn(r->ctx, i * r->per, end);
}

void torq_parallel_ranges(int n, int grain, torq_range_fn fn, void *ctx, int nthreads)
{
    if (grain < 1)
        grain = 1;
    int per = nthreads > 1 ? (n + 8 * nthreads - 1) / (8 * nthreads) : n;
    torq_parallel_grain(n, per < grain ? grain : per, fn, ctx, nthreads);
}

void torq_parallel_grain(int n, int grain, torq_range_fn fn, void *ctx, int nthreads)
{
    if (grain < 1)
        grain = 1;
    if (n <= grain || nthreads <= 1) {
        if (n > 0)
            fn(ctx, 0, n);
        return;
    }
    range_job r = {fn, ctx, n, grain};
    torq_parallel_for((n + grain - 1) / grain, range_chunk, &r, nthreads);
}
