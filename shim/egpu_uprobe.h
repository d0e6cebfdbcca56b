/* egpu_uprobe.h: host uprobes (shim/uprobe.c), in the three parts of egpu_shim.h.
 *
 * A uprobe runs a program of launchvm.c (its maps the ones launch probes and, through the runtime's
 * copies, GPU probes use) at each call of a function, a uretprobe at each return, in the calling
 * thread, with r1 = a read-only x86-64 `struct pt_regs` (bpf_tracing.h's PT_REGS_PARMn: di, si, dx, cx,
 * r8, r9; PT_REGS_RC: ax; ip the function, sp the stack pointer at the call or the return).
 *
 * How calls are caught, without ptrace or root: the function's address is looked up in the object
 * that defines it, and then
 * - every GOT slot that imports it by name (JUMP_SLOT: calls through the PLT; GLOB_DAT: -fno-plt calls
 *   and address-taken functions; one asking for another version of the name, foo@VER_1 where foo@@VER_2 is
 *   probed, is left alone) in every loaded object but the shim and ld.so is pointed at a stub;
 *   objects loaded later are patched at the next dlsym in the process (egpu_uprobe_dlsym) or
 *   egpu_uprobe_rescan;
 * - dlsym and dlvsym hand out the stub instead of the function (not for RTLD_NEXT, whose answer
 *   depends on the caller's address).
 * A function no GOT slot or dlsym reaches (linked statically into the executable, as static cudart's
 * cudaLaunchKernel is) gets an inline hook instead (egpu_uprobe_attach_inline). Direct calls inside a
 * shared object to a function it exports are not caught. The calls egpu's runtime makes in the process (its
 * Python interpreter and threads) are caught as the application's are: a probe on libc's malloc or strlen
 * counts them too.
 *
 * A stub saves the argument registers (and xmm0-7), runs the entry programs, and jumps to the function
 * with every register and the stack as the caller left them, so any signature and stack arguments
 * work, but for vector arguments wider than 128 bits (__m256, __m512 in ymm/zmm0-7): only their low 128
 * bits are saved, and a C library routine a probe run calls may clear the rest (the AVX2 forms end
 * with vzeroupper; on CPUs with AVX-512 glibc picks forms that leave ymm0-15 alone). With return
 * programs it first swaps the return address for a thunk's (the real one kept on a per-thread stack of
 * UPROBE_DEPTH entries; deeper calls run no return program): the thunk runs them with rax and goes back
 * to the caller with rax, rdx, xmm0, xmm1 as the function left them. A C++ throw, longjmp or
 * pthread_exit out of such a function skips the thunk and its return programs (uprobe.c puts the
 * swapped addresses back before an unwind starts). Calls made while a probe runs on the same thread,
 * or while the thread holds the probe engine's lock (a signal handler that interrupted it), run no
 * probe.
 */
#ifndef EGPU_UPROBE_H
#define EGPU_UPROBE_H

/* ---- part 1: implemented in Python (embedding_api) ---- */

/* ---- part 2: C API for the runtime (cdef) ---- */

/* What egpu_uprobe_attach (or egpu_uprobe_attach_inline) did. */
enum egpu_uprobe_result {
    EGPU_UPROBE_ATTACHED = 0,   /* GOT slots patched (maybe none yet) and dlsym answers the stub */
    EGPU_UPROBE_PENDING = 1,    /* no loaded object is PATH yet: attached when one is loaded */
    EGPU_UPROBE_NO_SYMBOL = -1, /* PATH is loaded and defines no function SYMBOL */
    EGPU_UPROBE_FULL = -2,      /* too many hooked functions, programs on one, or patched slots */
    EGPU_UPROBE_UNPATCHABLE = -3, /* an inline hook cannot be written there (see egpu_uprobe_attach_inline) */
    EGPU_UPROBE_BUSY = -4,        /* a thread stayed inside the bytes an inline hook's jump would cover */
    EGPU_UPROBE_UNHELD = -5       /* the other threads could not be held while an inline hook was stored */
};

/* Run progs[k] at each call (rets[k] 0) or return (rets[k] 1) of SYMBOL defined in the loaded object
 * PATH: its file name, its basename, a prefix of its basename ending before a '.' (libcuda.so for
 * libcuda.so.1), or a path resolving to the same file; the executable too. The `n` programs start
 * together: a call runs all of them or none. Returns enum egpu_uprobe_result. */
int egpu_uprobe_attach(const char *path, const char *symbol, struct egpu_lvm_prog *const *progs, const int *rets,
                       size_t n);
/* The `n` programs run no more, all from the same moment (after this returns, no thread is inside one);
 * a function left with no program is unhooked (its GOT slots and dlsym answer restored). A call already
 * inside its function then returns without its return programs. */
void egpu_uprobe_detach(struct egpu_lvm_prog *const *progs, size_t n);
/* The `n` programs run no more (paused 1: after this returns, no thread is inside one), or again (0), their
 * functions hooked all the while: so putting them back cannot fail (egpu detach and swap pause a probe's
 * programs before the change, which may fail, and detach them once it is made). A call that entered while
 * its return programs were paused returns without them. */
void egpu_uprobe_pause(struct egpu_lvm_prog *const *progs, size_t n, int paused);
/* A page within a rel32 jump of `function` for its inline hook (the one it has, once hooked), writable
 * until egpu_uprobe_attach_inline fills it; NULL if none could be mapped. */
void *egpu_uprobe_near(void *function);
/* An inline hook for a function no GOT slot or dlsym reaches (one linked into the executable): `function`
 * at most 3 bytes past an 8-byte boundary, its first `cut` (>= 5) bytes whole instructions, `moved` those
 * instructions re-encoded to run at near + 16 (runtime/inline_hooks.py); PATH and SYMBOL name it in
 * reports. The jump is stored while every other thread of the process is held in a handler of signal
 * SIGRTMAX - 5 outside its 5 bytes (a thread that blocks the signal is neither waited for nor guarded
 * against); EGPU_UPROBE_BUSY when a thread stayed inside them through 100 rounds, EGPU_UPROBE_UNHELD
 * (nothing stored) when the signal is the application's, or in 10 rounds in a row some thread did not
 * answer, had just started, or, inside the 5 bytes the round before, had not left the handler within 20 ms
 * (a round every thread answered starts the count again: a loaded machine answers late now and then). Then as
 * egpu_uprobe_attach; egpu_uprobe_detach of its last program puts its bytes back. */
int egpu_uprobe_attach_inline(const char *path, const char *symbol, void *function, void *near,
                              const unsigned char *moved, size_t moved_len, size_t cut,
                              struct egpu_lvm_prog *const *progs, const int *rets, size_t n);
/* Whether a loaded object is PATH (as egpu_uprobe_attach matches it): 1 and its file and load base. */
int egpu_uprobe_object(const char *path, char *file, size_t file_len, unsigned long long *base);
/* What became of a hook egpu_uprobe_attach left pending: EGPU_UPROBE_ATTACHED once an object PATH defining SYMBOL
 * was loaded and scanned, EGPU_UPROBE_NO_SYMBOL while one is loaded that defines none, else EGPU_UPROBE_PENDING. */
int egpu_uprobe_state(const char *path, const char *symbol);
/* GOT slots currently pointing at SYMBOL's stub (the sites calls are caught at). */
size_t egpu_uprobe_sites(const char *symbol);
/* bpf_ktime_get_ns() in uprobes reads CLOCK_MONOTONIC + offset_ns (the launch probes' clock). */
void egpu_uprobe_clock(long long offset_ns);
/* Patch objects loaded since the last scan (cheap when none were). */
void egpu_uprobe_rescan(void);

/* ---- part 3: C only ---- */

/* dlsym's and dlvsym's answer `found`, or the stub of the hooked function it is; objects loaded since
 * the last scan are patched first. For interpose.c, only while egpu_uprobes_on(). */
void *egpu_uprobe_dlsym(void *found);
int egpu_uprobes_on(void);
/* interpose.c: the C library's own dlsym (the shim's answers cu* names with its hooks). */
void *egpu_real_dlsym(void *handle, const char *name);
void *egpu_real_dlvsym(void *handle, const char *name, const char *version);
void egpu_uprobe_fork(enum egpu_fork_phase phase);

#endif
