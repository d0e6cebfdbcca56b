/* egpu_ring.h: a bounded multi-producer, single-consumer queue (Vyukov's), for the shim's record rings.
 *
 * EGPU_RING(name, type, size) defines, static to the file: name_start() (call before the first push or
 * drain: pthread_once), name_push(&item) (1: in; 0: full, the item is dropped: a hook never waits for
 * the consumer), name_drain(out, max) (the consumer's: up to max items in order, how many) and
 * name_reset() (in a forked child: empty again; a producer that was mid-push left its cell half-written,
 * and the consumer's thread is gone). A
 * cell's seq equal to a position means the cell is free for it, position + 1 that it holds that
 * position's item. size is a power of two. */
#ifndef EGPU_RING_H
#define EGPU_RING_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#define EGPU_RING(name, type, size) \
    static struct { _Atomic unsigned long long seq; type item; } name##_cells[size]; \
    static _Atomic unsigned long long name##_head; \
    static unsigned long long name##_tail; /* the consumer's */ \
    static pthread_once_t name##_once = PTHREAD_ONCE_INIT; \
    static void name##_init(void) { \
        for (unsigned long long i = 0; i < (size); i++) atomic_store(&name##_cells[i].seq, i); \
    } \
    static void name##_start(void) { pthread_once(&name##_once, name##_init); } \
    static void name##_reset(void) { \
        name##_init(); \
        atomic_store(&name##_head, 0); \
        name##_tail = 0; \
    } \
    static int name##_push(const type *item) { \
        unsigned long long pos = atomic_load_explicit(&name##_head, memory_order_relaxed); \
        for (;;) { \
            __typeof__(&name##_cells[0]) c = &name##_cells[pos & ((size) - 1)]; \
            long long diff = (long long)(atomic_load_explicit(&c->seq, memory_order_acquire) - pos); \
            if (diff == 0) { \
                if (atomic_compare_exchange_weak_explicit(&name##_head, &pos, pos + 1, memory_order_relaxed, \
                                                          memory_order_relaxed)) { \
                    c->item = *item; \
                    atomic_store_explicit(&c->seq, pos + 1, memory_order_release); \
                    return 1; \
                } \
            } else if (diff < 0) { \
                return 0; \
            } else { \
                pos = atomic_load_explicit(&name##_head, memory_order_relaxed); \
            } \
        } \
    } \
    static size_t name##_drain(type *out, size_t max) { \
        name##_start(); \
        size_t n = 0; \
        while (n < max) { \
            __typeof__(&name##_cells[0]) c = &name##_cells[name##_tail & ((size) - 1)]; \
            if (atomic_load_explicit(&c->seq, memory_order_acquire) != name##_tail + 1) break; \
            out[n++] = c->item; \
            atomic_store_explicit(&c->seq, name##_tail + (size), memory_order_release); \
            name##_tail++; \
        } \
        return n; \
    }

#endif /* EGPU_RING_H */
