/* A parallel-for in which the calling thread never waits for a helper to arrive (pool.c). */
#ifndef TORQ_POOL_H
#define TORQ_POOL_H

typedef void (*torq_chunk_fn)(void *ctx, int i);

/* fn(ctx, i) for i in [0, n), on the caller and up to nthreads - 1 helpers */
void torq_parallel_for(int n, torq_chunk_fn fn, void *ctx, int nthreads);

typedef void (*torq_range_fn)(void *ctx, int begin, int end);

/* fn(ctx, begin, end) over [0, n) in ranges of at least grain items (about 8 per thread): one
 * claim per range, so items of a few hundred nanoseconds do not make the threads fight over
 * the counter; one range (no helper) when n <= grain */
void torq_parallel_ranges(int n, int grain, torq_range_fn fn, void *ctx, int nthreads);

/* fn(ctx, begin, end) over [0, n) in ranges of exactly grain items (the last one shorter): for
 * long jobs of short items, where ranges of n / (8 * threads) would leave one thread alone
 * finishing a long last range */
void torq_parallel_grain(int n, int grain, torq_range_fn fn, void *ctx, int nthreads);

#endif
