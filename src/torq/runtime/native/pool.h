/* A parallel-for in which the calling thread never waits for a helper to arrive (pool.c). */
#ifndef TORQ_POOL_H
#define TORQ_POOL_H

typedef void (*torq_chunk_fn)(void *ctx, int i);

/* fn(ctx, i) for i in [0, n), on the caller and up to nthreads - 1 helpers */
void torq_parallel_for(int n, torq_chunk_fn fn, void *ctx, int nthreads);

#endif
