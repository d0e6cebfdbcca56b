/* egpu_table.h: the shim's lookup tables keyed by a driver handle, insert-only.
 *
 * An entry's first member is its key, an _Atomic(void *); NULL marks a free entry. Open addressing with
 * linear probing from a multiplicative hash of the key; a key is claimed with one CAS, so readers never
 * lock and an entry, once claimed, keeps its key for good. EGPU_TABLE_FIND(table, key, insert): the
 * entry of `key` in the array `table` (its length a power of two), claimed when absent and `insert`;
 * NULL when absent (or full). */
#ifndef EGPU_TABLE_H
#define EGPU_TABLE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

static inline void *egpu_table_find(void *entries, size_t stride, unsigned int bits, void *key, int insert) {
    if (!key) return NULL;
    uint32_t size = 1u << bits;
    uint32_t i = (uint32_t)((((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull) >> (64 - bits));
    for (uint32_t n = 0; n < size; n++, i = (i + 1) & (size - 1)) {
        _Atomic(void *) *at = (_Atomic(void *) *)((char *)entries + (size_t)i * stride);
        void *k = atomic_load_explicit(at, memory_order_acquire);
        if (k == key) return at;
        if (!k) {
            if (!insert) return NULL;
            if (atomic_compare_exchange_strong_explicit(at, &k, key, memory_order_acq_rel, memory_order_acquire) ||
                k == key)
                return at;
        }
    }
    return NULL;
}

#define EGPU_TABLE_FIND(table, key, insert) \
    ((__typeof__(&(table)[0]))egpu_table_find((table), sizeof (table)[0], \
                                              __builtin_ctz(sizeof (table) / sizeof (table)[0]), (key), (insert)))

#endif /* EGPU_TABLE_H */
