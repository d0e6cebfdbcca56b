/* egpu_gate.h: a gate the hooks pass and a holder closes (interpose.c's launch gate, cow.c's copy gate).
 *
 * A hook counts itself in `inflight` from before its check to after its driver call; the holder raises
 * `hold`, then waits for `inflight` to drain. Both sides seq_cst, so either the hook sees the hold or
 * the holder sees the hook (Dekker). Unheld cost: two uncontended atomics.
 *
 * Every hold is bounded. The holder waits for the drain only until its deadline (a hook may sit in a
 * driver call that waits for a kernel that never ends), then opens the gate again and fails; every
 * holder (egpu_shim_swap, cow.c's cut) opens by its deadline whatever happens, so a hook waits at most
 * that long. egpu_gate_wait lets go of the GIL while it waits (interpose.c).
 *
 * One holder at a time: `hold` is a flag, not a count, so a second holder would find the gate closed and
 * drained, and the first one's open would let launches through in the middle of the second's flip. The
 * holders (egpu_shim_swap, cow.c's arm and disarm) are only called from the handlers of EXCLUSIVE control
 * commands (control.py: attach, detach, swap, checkpoint, restore), which run one at a time; the runtime's
 * Live.lock around a swap's flip and a checkpoint's arm and disarm keeps them apart too. */
#ifndef EGPU_GATE_H
#define EGPU_GATE_H

#include <sched.h>
#include <stdatomic.h>
#include <time.h>

struct egpu_gate {
    _Atomic int hold;
    _Atomic long inflight;
};

static inline unsigned long long egpu_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

/* Until `g` is open (a hook that found it held, outside it). */
void egpu_gate_wait(struct egpu_gate *g);

static inline void egpu_gate_enter(struct egpu_gate *g) {
    atomic_fetch_add(&g->inflight, 1);
    while (__builtin_expect(atomic_load(&g->hold), 0)) {
        atomic_fetch_sub(&g->inflight, 1);
        egpu_gate_wait(g);
        atomic_fetch_add(&g->inflight, 1);
    }
}

static inline void egpu_gate_exit(struct egpu_gate *g) {
    atomic_fetch_sub_explicit(&g->inflight, 1, memory_order_release);
}

/* Hold `g`: 0 once no hook is inside it; -1 (open again) if one still is at `deadline_ns`. */
static inline int egpu_gate_close(struct egpu_gate *g, unsigned long long deadline_ns) {
    atomic_store(&g->hold, 1);
    while (atomic_load(&g->inflight)) {
        if (egpu_now_ns() >= deadline_ns) {
            atomic_store(&g->hold, 0);
            return -1;
        }
        sched_yield();
    }
    return 0;
}

static inline void egpu_gate_open(struct egpu_gate *g) { atomic_store(&g->hold, 0); }

/* In a forked child: only the forking thread is left, inside no hook, and no holder. */
static inline void egpu_gate_reset(struct egpu_gate *g) {
    atomic_store(&g->hold, 0);
    atomic_store(&g->inflight, 0);
}

#endif /* EGPU_GATE_H */
