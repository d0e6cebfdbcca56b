/* uprobe.c: host uprobes. The interface, what is caught and what is not, is egpu_uprobe.h. x86-64 only
 * (the stubs, struct pt_regs): elsewhere egpu_uprobe_attach refuses every function. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "egpu_shim.h"
#include "egpu_launchvm.h"
#include "egpu_uprobe.h"

#define EXPORT __attribute__((visibility("default")))

#define HOOKS 256        /* stubs in the pool below */
#define PROGS 16         /* programs on one function, entry and return each */
#define SLOTS 4096       /* patched GOT slots */
#define UPROBE_DEPTH 32  /* nested calls with return programs, per thread */
#define NAME_MAX_ 256
#define JUMP 5           /* an inline hook's jmp rel32 */

/* struct pt_regs of x86-64 (arch/x86/include/asm/ptrace.h), in u64 slots: bpf_tracing.h reads it so */
enum { PT_R15, PT_R14, PT_R13, PT_R12, PT_BP, PT_BX, PT_R11, PT_R10, PT_R9, PT_R8, PT_AX, PT_CX, PT_DX,
       PT_SI, PT_DI, PT_ORIG_AX, PT_IP, PT_CS, PT_FLAGS, PT_SP, PT_SS, PT_COUNT };
/* What the stub saves (egpu_uprobe_common below), in u64 slots; xmm0-7 follow, 16 bytes each. */
enum { S_DI, S_SI, S_DX, S_CX, S_R8, S_R9, S_AX, S_R10, S_BX, S_R12, S_R13, S_R14, S_R15, S_BP, S_XMM };
/* What the return thunk saves: rax, rdx, then xmm0-1. */
enum { R_AX, R_DX };

/* A hook's programs: entry, return. Never changed while runs may read it: a change is written into the
 * hook's other list and published (egpu_lvm_synchronize: launchvm.c's header). */
struct progs {
    int n[2];
    struct egpu_lvm_prog *progs[2][PROGS];
    unsigned char paused[2][PROGS];        /* progs[r][k] runs not (egpu_uprobe_pause) */
    /* progs[1][k]'s number, given when it was added: a return runs the return programs its call's entry
     * found running (numbers, not slots: a drop moves the last slot into the one it frees) */
    unsigned serial[PROGS];
};

struct hook {
    char path[NAME_MAX_], symbol[NAME_MAX_];
    void *target;                          /* the function (NULL: its object is not loaded yet) */
    /* the list runs read (NULL: none yet), the other one of `lists`; written under up_lock, each publish
     * followed by egpu_lvm_synchronize before up_lock is let go, so the other is read by no run then */
    _Atomic(struct progs *) live;
    struct progs lists[2];
    int used;
    unsigned char *code;  /* an inline hook: the function, whose first 5 bytes jump to `near` (NULL: none) */
    unsigned char code_was[JUMP]; /* those bytes before */
    unsigned char *near;  /* a page within reach of a rel32 jump: to the stub, then the trampoline */
};

struct slot {
    void **where;
    void *old;
    struct hook *hook;
    int relro;      /* read-only once relocated: written between two mprotects */
    ElfW(Addr) base; /* its object's, and the hash of its name: another may be loaded there once it is closed */
    uint64_t name;
};

static struct hook hooks[HOOKS];
static struct slot slots[SLOTS];
static size_t nslots;
static int nhooks;
static atomic_int active;                   /* hooks with programs */
static atomic_llong clock_offset;
static unsigned long long scanned_adds;     /* dl_phdr_info.dlpi_adds at the last scan */
static unsigned serials;                    /* return programs added so far (under up_lock) */
static pthread_mutex_t up_lock = PTHREAD_MUTEX_INITIALIZER; /* hooks' targets, lists, slots; before launchvm.c's */

/* read at every call: initial-exec, as interpose.c's flags (8 bytes of the static TLS block) */
static __thread int tls_in_probe __attribute__((tls_model("initial-exec"))); /* calls from a probe run none */
static __thread int tls_depth __attribute__((tls_model("initial-exec")));
/* the return addresses swapped for the return thunk, innermost last: each with where it was (the frame's slot);
 * `unwound`: the exception whose unwind put it back (below); the serials of the return programs running at
 * the entry: only they run at the return (one paused at the entry and running again at the return would count a
 * return without its call) */
struct entry {
    void *ret;
    struct hook *hook;
    void **slot;
    void *unwound;
    int n;
    unsigned serial[PROGS];
};
/* 3.3 KiB a thread: too much for the static TLS block (initial-exec above makes all of the shim's TLS
 * static), where a process that dlopens the shim (the tests' ABI-mode load) finds little room: glibc 2.36
 * took the shim's 1.1 KiB without these entries, and refused 3.4 KiB with them.
 * Each thread that swaps a return address maps its entries at its first swap (mmap: the call may be
 * malloc's, or a signal handler's), unmapped when the thread ends (returns_key). */
static __thread struct entry *tls_returns __attribute__((tls_model("initial-exec")));
static pthread_key_t returns_key;
static pthread_once_t returns_once = PTHREAD_ONCE_INIT;

/* The thread ends: its entries unmapped, and forgotten, since a later key's destructor may still call a
 * probed function (then they are mapped again, and glibc runs this again for them). */
static void returns_free(void *e) {
    tls_returns = NULL, tls_depth = 0;
    munmap(e, sizeof(struct entry[UPROBE_DEPTH]));
}

/* At an attach (add_programs), before any return program can run: no pthread_once in a signal handler. */
static void returns_key_new(void) {
    if (pthread_key_create(&returns_key, returns_free)) returns_key = (pthread_key_t)-1;
}

/* This thread's entries; NULL when memory or the key is out (its calls then run no return program). */
static struct entry *thread_entries(void) {
    if (tls_returns) return tls_returns;
    void *e = mmap(NULL, sizeof(struct entry[UPROBE_DEPTH]), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (e == MAP_FAILED) return NULL;
    if (returns_key == (pthread_key_t)-1 || pthread_setspecific(returns_key, e)) {
        munmap(e, sizeof(struct entry[UPROBE_DEPTH]));
        return NULL;
    }
    return tls_returns = e;
}

#if defined(__x86_64__)
/* ---- the stubs: one per hook, a 16-byte slot each; r11 tells the common part which ---- */

void *egpu_uprobe_enter(uintptr_t stub, uint64_t *saved, void **ret_slot);
void *egpu_uprobe_exit(uint64_t *saved, uint64_t sp);
extern const char egpu_uprobe_stubs[], egpu_uprobe_ret_thunk[];

__asm__(
    ".text\n"
    ".balign 16\n"
    "egpu_uprobe_stubs:\n"
    ".rept 256\n"                          /* HOOKS */
    "  .balign 16\n"
    "  lea 0(%rip), %r11\n"                /* the stub's address + 7 */
    "  jmp egpu_uprobe_common\n"
    ".endr\n"
    /* [rsp] = the caller's return address. Save what the function and the probe may need, run the
     * entry programs (C), put everything back and jump to the function as if called directly. */
    "egpu_uprobe_common:\n"
    "  push %rbp\n"
    "  mov %rsp, %rbp\n"
    "  sub $240, %rsp\n"                   /* 14 registers, 8 xmm: rsp stays 16-aligned */
    "  mov %rdi, 0(%rsp)\n  mov %rsi, 8(%rsp)\n  mov %rdx, 16(%rsp)\n  mov %rcx, 24(%rsp)\n"
    "  mov %r8, 32(%rsp)\n  mov %r9, 40(%rsp)\n  mov %rax, 48(%rsp)\n  mov %r10, 56(%rsp)\n"
    "  mov %rbx, 64(%rsp)\n  mov %r12, 72(%rsp)\n  mov %r13, 80(%rsp)\n  mov %r14, 88(%rsp)\n"
    "  mov %r15, 96(%rsp)\n  mov 0(%rbp), %rax\n  mov %rax, 104(%rsp)\n"
    "  movdqu %xmm0, 112(%rsp)\n  movdqu %xmm1, 128(%rsp)\n  movdqu %xmm2, 144(%rsp)\n"
    "  movdqu %xmm3, 160(%rsp)\n  movdqu %xmm4, 176(%rsp)\n  movdqu %xmm5, 192(%rsp)\n"
    "  movdqu %xmm6, 208(%rsp)\n  movdqu %xmm7, 224(%rsp)\n"
    "  mov %r11, %rdi\n"
    "  mov %rsp, %rsi\n"
    "  lea 8(%rbp), %rdx\n"                /* where the return address is */
    "  call egpu_uprobe_enter\n"
    "  mov %rax, %r11\n"                   /* the function */
    "  mov 0(%rsp), %rdi\n  mov 8(%rsp), %rsi\n  mov 16(%rsp), %rdx\n  mov 24(%rsp), %rcx\n"
    "  mov 32(%rsp), %r8\n  mov 40(%rsp), %r9\n  mov 48(%rsp), %rax\n  mov 56(%rsp), %r10\n"
    "  movdqu 112(%rsp), %xmm0\n  movdqu 128(%rsp), %xmm1\n  movdqu 144(%rsp), %xmm2\n"
    "  movdqu 160(%rsp), %xmm3\n  movdqu 176(%rsp), %xmm4\n  movdqu 192(%rsp), %xmm5\n"
    "  movdqu 208(%rsp), %xmm6\n  movdqu 224(%rsp), %xmm7\n"
    "  leave\n"
    "  jmp *%r11\n"
    /* The function returned here instead of to its caller (rsp as the caller had it before the call,
     * 16-aligned). Run the return programs on rax, then go back to the caller. */
    ".balign 16\n"
    "egpu_uprobe_ret_thunk:\n"
    "  sub $64, %rsp\n"                    /* the 16 bytes above the saves keep the slot just returned from */
    "  mov %rax, 0(%rsp)\n  mov %rdx, 8(%rsp)\n  movdqu %xmm0, 16(%rsp)\n  movdqu %xmm1, 32(%rsp)\n"
    "  mov %rsp, %rdi\n"
    "  lea 64(%rsp), %rsi\n"
    "  call egpu_uprobe_exit\n"
    "  mov %rax, %r11\n"                   /* the caller's return address */
    "  mov 0(%rsp), %rax\n  mov 8(%rsp), %rdx\n  movdqu 16(%rsp), %xmm0\n  movdqu 32(%rsp), %xmm1\n"
    "  add $64, %rsp\n"
    "  jmp *%r11\n");

static void *stub_of(const struct hook *h) {
    return (void *)(egpu_uprobe_stubs + 16 * (h - hooks));
}

/* The list h's runs read now: inside a read section (egpu_lvm_enter), or under up_lock. */
static const struct progs *live(struct hook *h) {
    static const struct progs none;
    const struct progs *l = atomic_load_explicit(&h->live, memory_order_acquire);
    return l ? l : &none;
}

/* Whether return program k of l runs for the call `e` entered. */
static int entered(const struct entry *e, const struct progs *l, int k) {
    for (int i = 0; i < e->n; i++)
        if (e->serial[i] == l->serial[k]) return 1;
    return 0;
}

/* Inside a read section. At a return, `e` is its call's entry. */
static void run_all(const struct progs *l, int ret, uint64_t *regs, const struct entry *e) {
    long long offset = atomic_load_explicit(&clock_offset, memory_order_relaxed);
    for (int k = 0; k < l->n[ret]; k++)
        if (!l->paused[ret][k] && (!e || entered(e, l, k)))
            egpu_lvm_run_host(l->progs[ret][k], regs, PT_COUNT * 8, offset);
}

/* Called by the stub: run the entry programs; swap the return address when there are return
 * programs; return the function to jump to. */
__attribute__((used)) void *egpu_uprobe_enter(uintptr_t stub, uint64_t *saved, void **ret_slot) {
    struct hook *h = &hooks[(stub - (uintptr_t)egpu_uprobe_stubs) >> 4];
    if (tls_in_probe || egpu_lvm_held) return h->target; /* held: by the code a signal handler interrupted */
    tls_in_probe = 1;
    egpu_lvm_reader in = egpu_lvm_enter();
    const struct progs *l = live(h);
    if (l->n[0]) {
        uint64_t regs[PT_COUNT]; /* each slot set: a zeroing store of 168 bytes costs more than the rest */
        regs[PT_R11] = regs[PT_CS] = regs[PT_FLAGS] = regs[PT_SS] = 0;
        regs[PT_DI] = saved[S_DI], regs[PT_SI] = saved[S_SI], regs[PT_DX] = saved[S_DX];
        regs[PT_CX] = saved[S_CX], regs[PT_R8] = saved[S_R8], regs[PT_R9] = saved[S_R9];
        regs[PT_AX] = regs[PT_ORIG_AX] = saved[S_AX], regs[PT_R10] = saved[S_R10], regs[PT_BX] = saved[S_BX];
        regs[PT_R12] = saved[S_R12], regs[PT_R13] = saved[S_R13], regs[PT_R14] = saved[S_R14];
        regs[PT_R15] = saved[S_R15], regs[PT_BP] = saved[S_BP];
        regs[PT_IP] = (uint64_t)h->target, regs[PT_SP] = (uint64_t)ret_slot;
        run_all(l, 0, regs, NULL);
    }
    unsigned serial[PROGS];
    int returns = 0;
    for (int k = 0; k < l->n[1]; k++)
        if (!l->paused[1][k]) serial[returns++] = l->serial[k];
    egpu_lvm_leave(in);
    if (returns) {
        /* entries a longjmp left: their slots at or below this call's and no longer holding the thunk
         * (written over since). One that still holds it is pending: a tail call from a probed function
         * enters with its caller's slot, and a signal handler on a stack above the thread's enters above
         * the frames it interrupted; an entry left with its slot intact is dropped at a return (below). */
        while (tls_depth) {
            void **top = tls_returns[tls_depth - 1].slot;
            if (top > ret_slot || *top == (void *)egpu_uprobe_ret_thunk) break;
            tls_depth--;
        }
        if (tls_depth < UPROBE_DEPTH && thread_entries()) {
            struct entry *e = &tls_returns[tls_depth++];
            e->ret = *ret_slot, e->hook = h, e->slot = ret_slot, e->unwound = NULL, e->n = returns;
            memcpy(e->serial, serial, (size_t)returns * sizeof *serial);
            *ret_slot = (void *)egpu_uprobe_ret_thunk;
        }
    }
    tls_in_probe = 0;
    return h->target;
}

/* Where the shim cannot go on: the line, then abort (write(2): the thread may hold any lock, malloc's too). */
__attribute__((noreturn)) static void die(const char *line) {
    (void)!write(2, line, strlen(line));
    abort();
}

/* Called by the return thunk: run the return programs; return the caller's return address. */
__attribute__((used)) void *egpu_uprobe_exit(uint64_t *saved, uint64_t sp) {
    void **slot = (void **)(sp - 8);   /* the return took the thunk's address from there */
    if (tls_depth <= 0)   /* no entry to return through (a stack switched by swapcontext, say): nowhere to go */
        die("egpu: a uretprobe's function returned with no return address kept; aborting\n");
    int k = tls_depth - 1;
    while (k > 0 && tls_returns[k].slot != slot) k--;   /* entries above the returning frame's: left by a longjmp */
    tls_depth = k;
    const struct entry *e = &tls_returns[tls_depth];
    struct hook *h = e->hook;
    void *ret = e->ret;
    int was = tls_in_probe;
    tls_in_probe = 1;
    egpu_lvm_reader in = egpu_lvm_enter();
    const struct progs *l = live(h);
    if (l->n[1]) {
        /* only rax, rdx, ip and sp are known at a return; each slot set, as at entry (not `= {0}`, which
         * gcc makes a rep stos of 168 bytes: 10 ns of the 147 a uprobe with a uretprobe cost) */
        uint64_t regs[PT_COUNT];
        regs[PT_R15] = regs[PT_R14] = regs[PT_R13] = regs[PT_R12] = regs[PT_BP] = regs[PT_BX] = 0;
        regs[PT_R11] = regs[PT_R10] = regs[PT_R9] = regs[PT_R8] = regs[PT_CX] = regs[PT_SI] = regs[PT_DI] = 0;
        regs[PT_ORIG_AX] = regs[PT_CS] = regs[PT_FLAGS] = regs[PT_SS] = 0;
        regs[PT_AX] = saved[R_AX], regs[PT_DX] = saved[R_DX];
        regs[PT_IP] = (uint64_t)ret, regs[PT_SP] = sp;
        run_all(l, 1, regs, e);
    }
    egpu_lvm_leave(in);
    tls_in_probe = was;
    return ret;
}

/* An unwind looks each frame's return address up in the unwind tables: the return thunk has none, so a
 * C++ exception ends the program (std::terminate) at the first frame whose return address was swapped,
 * and pthread_exit's unwind stops there (the destructors of the frames past it never run). Before an
 * unwind starts (a throw, a rethrow, pthread_exit, a forced unwind asked for through the global scope),
 * every address the thread swapped goes back in place (the newest first: a slot a longjmp abandoned and
 * a later frame reused holds the thunk only if that frame swapped it too), its entry kept, marked with
 * the exception. Where the unwind stops, the entries of the frames it left are dropped (their return
 * programs do not run, as the kernel's do not for a frame an exception leaves) and the frames still there
 * get the thunk again: at the exception's catch, where __cxa_begin_catch's caller is the catching frame
 * (its callees' slots lie at or below the one this call returns through). Entries another exception
 * marked wait for that one's catch (a destructor may throw and catch inside a cleanup of its unwind), and
 * a cleanup's _Unwind_Resume drops those the unwind has passed. An unwind that ends otherwise (a foreign
 * runtime's catch) leaves its entries marked: their functions return past the thunk, and the entries go
 * as a longjmp's do. Not covered: pthread_cancel's unwind, which glibc starts inside the cancelled thread
 * with a function it looks up in libgcc_s itself. */
static void unswap_all(void *exc) {
    for (int k = tls_depth - 1; k >= 0; k--)
        if (*tls_returns[k].slot == (void *)egpu_uprobe_ret_thunk)
            *tls_returns[k].slot = tls_returns[k].ret, tls_returns[k].unwound = exc;
}

/* An unwind has reached the frame that called through `limit` (its callees' slots are at or below it):
 * drop the marked entries at or below it; when `exc` is caught there, swap its others back in. */
static void unwound_to(void **limit, void *caught) {
    int n = 0;
    for (int k = 0; k < tls_depth; k++) {
        if (tls_returns[k].unwound) {
            if (tls_returns[k].slot <= limit) continue;
            if (tls_returns[k].unwound == caught) {
                if (*tls_returns[k].slot != tls_returns[k].ret) continue;
                *tls_returns[k].slot = (void *)egpu_uprobe_ret_thunk, tls_returns[k].unwound = NULL;
            }
        }
        tls_returns[n++] = tls_returns[k];
    }
    tls_depth = n;
}

/* Functions found in a caller's own scope, by the caller's return address (a call site calls one of them): each
 * object's scope may give its own (a library linked with -static-libstdc++ exports a C++ runtime of its own,
 * another loads libstdc++.so), and a __cxa_begin_catch of another runtime than the catch's ends its rethrow in
 * std::terminate. Each slot filled once (`at` 1: being filled); when all are, such callers search every time. */
#define SCOPED 1024
static struct scoped { _Atomic uintptr_t at; void *fn; } scoped[SCOPED];

/* The unwinder function ``name`` the caller would call without the shim. RTLD_NEXT sees the global scope only:
 * a C++ library opened RTLD_LOCAL (a Python extension module) brings libgcc_s into none, and RTLD_NEXT finds
 * nothing; then the caller's own scope is searched, and the object found in made undeletable so that the
 * function can be kept for that caller (else looked up again at every throw: that object may be closed). */
static void *unwinder(const char *name, void **cached, void *self, void *caller) {
    void *p = *cached;
    if (p) return p;
    uintptr_t at = (uintptr_t)caller, first = (at >> 2) * 0x9e3779b97f4a7c15ull >> 54;   /* SCOPED: 10 bits */
    for (int k = 0; k < SCOPED; k++) {
        struct scoped *e = &scoped[(first + k) % SCOPED];
        uintptr_t seen = atomic_load_explicit(&e->at, memory_order_acquire);
        if (seen == at) return e->fn;
        if (!seen) break;
    }
    if ((p = egpu_real_dlsym(RTLD_NEXT, name))) return *cached = p;
    Dl_info info;
    void *h;
    if (dladdr(caller, &info) && info.dli_fname && *info.dli_fname &&
        (h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD))) {
        p = egpu_real_dlsym(h, name);
        dlclose(h);
    }
    if (!p || p == self) die("egpu: no unwinder function to call; aborting\n");
    if (dladdr(p, &info) && info.dli_fname && dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE))
        for (int k = 0; k < SCOPED; k++) {
            struct scoped *e = &scoped[(first + k) % SCOPED];
            uintptr_t free_ = 0;
            if (atomic_compare_exchange_strong(&e->at, &free_, 1)) {
                e->fn = p;
                atomic_store_explicit(&e->at, at, memory_order_release);
                break;
            }
        }
    return p;
}

/* ``before`` runs with `limit`: the slot this call returns through. */
#define UNWINDER(type, name, params, args, before)                                        \
    EXPORT type name params {                                                             \
        static void *real;                                                                \
        type (*f) params = (type (*) params)unwinder(#name, &real, (void *)name,          \
                                                     __builtin_return_address(0));       \
        void **limit = (void **)__builtin_frame_address(0) + 1;                           \
        (void)limit;                                                                      \
        before;                                                                           \
        return f args;                                                                    \
    }
UNWINDER(int, _Unwind_RaiseException, (void *exc), (exc), unswap_all(exc))
UNWINDER(int, _Unwind_Resume_or_Rethrow, (void *exc), (exc), unswap_all(exc))
UNWINDER(int, _Unwind_ForcedUnwind, (void *exc, void *stop, void *arg), (exc, stop, arg), unswap_all(exc))
UNWINDER(void, _Unwind_Resume, (void *exc), (exc), unwound_to(limit, NULL))
UNWINDER(void *, __cxa_begin_catch, (void *exc), (exc), unwound_to(limit, exc))
#undef UNWINDER

EXPORT void pthread_exit(void *value) {
    static void (*real)(void *);
    if (!real) real = (void (*)(void *))egpu_real_dlsym(RTLD_NEXT, "pthread_exit");
    static char exiting;   /* the unwind's exception is glibc's own: a mark no catch names */
    unswap_all(&exiting);
    real(value);
    __builtin_unreachable();
}

#else
static void *stub_of(const struct hook *h) { return NULL; }
#endif

/* ---- loaded objects ---- */

/* One loaded object, as dl_iterate_phdr gives it. */
struct object {
    const char *name;         /* the executable's: /proc/self/exe resolved */
    ElfW(Addr) base;
    const ElfW(Dyn) *dynamic;
    ElfW(Addr) relro, relro_end;
};

static char exe_path[PATH_MAX];

static void object_of(const struct dl_phdr_info *info, struct object *o) {
    *o = (struct object){info->dlpi_name, info->dlpi_addr};
    if (!o->name || !o->name[0]) {
        if (!exe_path[0]) {
            ssize_t n = readlink("/proc/self/exe", exe_path, sizeof exe_path - 1);
            exe_path[n > 0 ? n : 0] = 0;
        }
        o->name = exe_path;
    }
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC) o->dynamic = (const void *)(info->dlpi_addr + ph->p_vaddr);
        if (ph->p_type == PT_GNU_RELRO)
            o->relro = info->dlpi_addr + ph->p_vaddr, o->relro_end = o->relro + ph->p_memsz;
    }
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* PATH names object `name`: the same string or basename, a basename prefix ending at a '.', or the same
 * file. */
static int names(const char *path, const char *name) {
    const char *pb = base_name(path), *nb = base_name(name);
    size_t n = strlen(pb);
    if (!strcmp(path, name) || (!strncmp(pb, nb, n) && (nb[n] == 0 || nb[n] == '.'))) return 1;
    char a[PATH_MAX], b[PATH_MAX];
    return strchr(path, '/') && realpath(path, a) && realpath(name, b) && !strcmp(a, b);
}

/* The shim itself, ld.so and the vDSO: their GOTs are not patched (the shim's calls must not reach
 * probes; the loader's are not the application's). */
static int skipped(const struct object *o) {
    static char self;
    Dl_info di;
    struct link_map *lm = NULL;
    const char *b = base_name(o->name);
    if (!strncmp(b, "ld-linux", 8) || !strncmp(b, "linux-vdso", 10) || !o->dynamic) return 1;
    return dladdr1(&self, &di, (void **)&lm, RTLD_DL_LINKMAP) && lm && lm->l_addr == o->base;
}

/* SYMBOL as object `o` defines it (dlsym on its own handle, then checked to be in it); NULL if not. */
static void *defined_in(const struct object *o, const char *symbol) {
    void *handle = dlopen(o->name == exe_path ? NULL : o->name, RTLD_LAZY | RTLD_NOLOAD);
    if (!handle) return NULL;
    void *p = egpu_real_dlsym(handle, symbol);
    dlclose(handle);
    Dl_info di;
    struct link_map *lm = NULL;
    if (!p || !dladdr1(p, &di, (void **)&lm, RTLD_DL_LINKMAP) || !lm || lm->l_addr != o->base) return NULL;
    return p;
}

/* ---- GOT slots ---- */

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* One aligned store, so a thread calling through the slot meanwhile reads the old or the new value. */
static void write_slot(void **where, void *value, int relro) {
    void *page = (void *)((uintptr_t)where & ~(uintptr_t)4095); /* an aligned slot never spans two */
    if (relro) mprotect(page, 4096, PROT_READ | PROT_WRITE);
    atomic_store_explicit((_Atomic(void *) *)where, value, memory_order_release);
    if (relro) mprotect(page, 4096, PROT_READ);
}

/* Whether slot s is still the one patched: its object, not another loaded at its address since it was closed (a
 * slot there may import some other function, or be data), and still holding the stub (not the same file loaded
 * anew). Read only once the object is known: where may be in no mapped page of another. */
static int slot_live(const struct slot *s) {
    Dl_info di;
    struct link_map *lm = NULL;
    return dladdr1(s->where, &di, (void **)&lm, RTLD_DL_LINKMAP) && lm && lm->l_addr == s->base &&
           name_hash(lm->l_name ? lm->l_name : "") == s->name && *s->where == stub_of(s->hook);
}

static int patched(void **where) {
    for (size_t k = 0; k < nslots; k++)
        if (slots[k].where == where) return 1;
    return 0;
}

/* Whether calls through GOT slot `where` of `o` reach h's function: the slot holds it, or (a JUMP_SLOT not
 * bound yet, still pointing at `o`'s own PLT) the global lookup of the slot's symbol at the slot's `version`
 * (NULL: none asked) would bind it there: a slot importing foo@VER_1 is not bound to foo@@VER_2. A slot
 * bound to another definition (an interposer: the shim's own cu* hooks) is left alone. */
static int reaches(const struct object *o, void **where, const struct hook *h, const char *version) {
    if (*where == h->target) return 1;
    Dl_info di;
    struct link_map *lm = NULL;
    void *bound = version ? egpu_real_dlvsym(RTLD_DEFAULT, h->symbol, version)
                          : egpu_real_dlsym(RTLD_DEFAULT, h->symbol);
    return dladdr1(*where, &di, (void **)&lm, RTLD_DL_LINKMAP) && lm && lm->l_addr == o->base && bound == h->target;
}

/* The version `o` asks of its undefined dynamic symbol `index` (DT_VERSYM's entry, named in DT_VERNEED); NULL
 * when it asks none. */
static const char *version_needed(const ElfW(Half) *versym, const ElfW(Verneed) *verneed, const char *strtab,
                                  size_t index) {
    ElfW(Half) v = versym ? versym[index] & 0x7fff : 0;
    if (v < 2) return NULL; /* VER_NDX_LOCAL, VER_NDX_GLOBAL */
    for (const ElfW(Verneed) *n = verneed; n; n = n->vn_next ? (const void *)((const char *)n + n->vn_next) : NULL)
        for (const ElfW(Vernaux) *a = (const void *)((const char *)n + n->vn_aux); a;
             a = a->vna_next ? (const void *)((const char *)a + a->vna_next) : NULL)
            if (a->vna_other == v) return strtab + a->vna_name;
    return NULL;
}

/* Point `o`'s GOT slots importing a hooked function at its stub. Under up_lock. */
static void patch_object(const struct object *o) {
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Half) *versym = NULL;
    const ElfW(Verneed) *verneed = NULL;
    const ElfW(Rela) *tables[2] = {NULL, NULL};
    size_t sizes[2] = {0, 0};
    for (const ElfW(Dyn) *d = o->dynamic; d->d_tag != DT_NULL; d++) {
        /* glibc relocates these entries in place where .dynamic is writable; else they are offsets */
        ElfW(Addr) p = d->d_un.d_ptr < o->base ? d->d_un.d_ptr + o->base : d->d_un.d_ptr;
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const void *)p; break;
        case DT_STRTAB: strtab = (const void *)p; break;
        case DT_JMPREL: tables[0] = (const void *)p; break;
        case DT_PLTRELSZ: sizes[0] = d->d_un.d_val; break;
        case DT_RELA: tables[1] = (const void *)p; break;
        case DT_RELASZ: sizes[1] = d->d_un.d_val; break;
        case DT_VERSYM: versym = (const void *)p; break;
        case DT_VERNEED: verneed = (const void *)p; break;
        }
    }
    if (!symtab || !strtab) return;
    for (int t = 0; t < 2; t++) {
        for (size_t k = 0; tables[t] && k < sizes[t] / sizeof(ElfW(Rela)); k++) {
            const ElfW(Rela) *r = &tables[t][k];
            unsigned type = ELF64_R_TYPE(r->r_info);
            const ElfW(Sym) *sym = &symtab[ELF64_R_SYM(r->r_info)];
            if ((type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) || !ELF64_R_SYM(r->r_info) ||
                sym->st_shndx != SHN_UNDEF)
                continue;
            const char *name = strtab + sym->st_name;
            const char *version = version_needed(versym, verneed, strtab, ELF64_R_SYM(r->r_info));
            void **where = (void **)(o->base + r->r_offset);
            for (int i = 0; i < nhooks; i++) {
                struct hook *h = &hooks[i];
                if (!h->used || !h->target || strcmp(h->symbol, name) || !reaches(o, where, h, version) ||
                    patched(where) || nslots == SLOTS)
                    continue;
                int relro = (ElfW(Addr))where >= o->relro && (ElfW(Addr))where < o->relro_end;
                slots[nslots++] = (struct slot){where, *where, h, relro, o->base,
                                                name_hash(o->name == exe_path ? "" : o->name)}; /* its l_name */
                write_slot(where, stub_of(h), relro);
            }
        }
    }
}

/* Give every slot of `h` its old value back (those of objects since closed are not written: another object may be
 * there). Under up_lock. */
static void unpatch(struct hook *h) {
    size_t kept = 0;
    for (size_t k = 0; k < nslots; k++) {
        if (slots[k].hook != h) slots[kept++] = slots[k];
        else if (slot_live(&slots[k])) write_slot(slots[k].where, slots[k].old, slots[k].relro);
    }
    nslots = kept;
}

/* Resolve pending hooks and patch every object. Under up_lock. */
static int scan_one(struct dl_phdr_info *info, size_t size, void *arg) {
    struct object o;
    object_of(info, &o);
    scanned_adds = info->dlpi_adds;
    for (int i = 0; i < nhooks; i++) {
        struct hook *h = &hooks[i];
        if (h->used && !h->target && names(h->path, o.name)) h->target = defined_in(&o, h->symbol);
    }
    return 0;
}

static int patch_one(struct dl_phdr_info *info, size_t size, void *arg) {
    struct object o;
    object_of(info, &o);
    if (!skipped(&o)) patch_object(&o);
    return 0;
}

static void scan(void) {
    size_t kept = 0; /* slots of objects closed since: a new one there is patched as any other */
    for (size_t k = 0; k < nslots; k++)
        if (slot_live(&slots[k])) slots[kept++] = slots[k];
    nslots = kept;
    dl_iterate_phdr(scan_one, NULL);
    dl_iterate_phdr(patch_one, NULL);
}

static int adds_now(struct dl_phdr_info *info, size_t size, void *arg) {
    *(unsigned long long *)arg = info->dlpi_adds;
    return 1;
}

EXPORT void egpu_uprobe_rescan(void) {
    unsigned long long adds = 0;
    dl_iterate_phdr(adds_now, &adds);
    pthread_mutex_lock(&up_lock);
    if (adds != scanned_adds) scan();
    pthread_mutex_unlock(&up_lock);
}

/* The list to write h's next one into: a copy of the live one, in the list no run reads (under up_lock). */
static struct progs *next_list(struct hook *h) {
    struct progs *next = atomic_load_explicit(&h->live, memory_order_relaxed) == &h->lists[0] ? &h->lists[1]
                                                                                            : &h->lists[0];
    *next = *live(h);
    return next;
}

/* `next` is h's list from now on (under up_lock; egpu_lvm_synchronize before up_lock is let go). */
static void publish(struct hook *h, struct progs *next) {
    atomic_store_explicit(&h->live, next, memory_order_release);
}

/* Give h the `n` programs, all at once (no call runs some of them and not the others), and mark it used:
 * 0, or -1 when they do not fit. Under up_lock. */
static int add_programs(struct hook *h, struct egpu_lvm_prog *const *progs, const int *rets, size_t n) {
    struct progs *next = next_list(h);
    int room[2] = {PROGS - next->n[0], PROGS - next->n[1]};
    for (size_t k = 0; k < n; k++) room[rets[k] != 0]--;
    if (room[0] < 0 || room[1] < 0) return -1;
    pthread_once(&returns_once, returns_key_new);
    for (size_t k = 0; k < n; k++) {
        int r = rets[k] != 0;
        next->paused[r][next->n[r]] = 0;
        if (r) next->serial[next->n[r]] = ++serials;
        next->progs[r][next->n[r]++] = progs[k];
    }
    h->used = 1;
    publish(h, next);
    egpu_lvm_synchronize(); /* the list before is read by no run: the next change may write it */
    atomic_fetch_add(&active, (int)n);
    return 0;
}

static int listed(struct egpu_lvm_prog *const *progs, size_t n, const struct egpu_lvm_prog *p);

/* The programs out of every hook they are on; when this returns, no run of them is under way (under up_lock). */
static void drop_programs(struct egpu_lvm_prog *const *progs, size_t n) {
    for (int i = 0; i < nhooks; i++) {
        struct progs *next = next_list(&hooks[i]);
        int dropped = 0;
        for (int ret = 0; ret < 2; ret++)
            for (int k = 0; k < next->n[ret]; k++)
                if (listed(progs, n, next->progs[ret][k])) {
                    int last = --next->n[ret];
                    next->paused[ret][k] = next->paused[ret][last];
                    if (ret) next->serial[k] = next->serial[last];
                    next->progs[ret][k--] = next->progs[ret][last];
                    dropped++;
                }
        if (dropped) publish(&hooks[i], next), atomic_fetch_sub(&active, dropped);
    }
    egpu_lvm_synchronize(); /* runs that read the lists before have ended */
}

/* ---- inline hooks: functions no GOT slot or dlsym reaches ----
 *
 * The function's first 5 bytes become `jmp rel32` to a page beside it (within 2 GB), which jumps on to
 * the stub; the stub's target is the trampoline on that page: the instructions those bytes cut into,
 * moved there by the runtime (runtime/inline_hooks.py re-encodes what is relative to where they run),
 * then a jump back to the first instruction after them. The jump is written with one store of the aligned
 * 8-byte word holding its 5 bytes, so a thread entering the function meanwhile runs the old bytes or the
 * new, never a mix: the function must start at most 3 bytes past an 8-byte boundary (compilers align
 * functions to 16). The word's other 3 bytes are stored as they are at that moment (compare-exchange), at
 * the hook and when detach puts the 5 bytes back, so a debugger's breakpoint or another tool's patch on
 * the next instruction stays. A thread stopped on an instruction boundary inside those 5 bytes (after an
 * endbr64, say) would resume in the middle of the jump (seen once in CI), so the store is made while every
 * other thread waits in a signal handler, none of them inside (store_stopped). */

#define NEAR_STUB 0     /* jmp *0(%rip); .quad stub */
#define NEAR_TRAMPOLINE 16

/* The JUMP bytes at `at` (at most 3 past an 8-byte boundary) become `bytes`, in one store of their word. */
static void write_code(unsigned char *at, const unsigned char *bytes) {
    _Atomic uint64_t *word = (_Atomic uint64_t *)((uintptr_t)at & ~(uintptr_t)7);
    void *page = (void *)((uintptr_t)word & ~(uintptr_t)4095); /* an aligned word never spans two */
    mprotect(page, 4096, PROT_READ | PROT_WRITE | PROT_EXEC); /* executable throughout: threads run here */
    uint64_t was = atomic_load_explicit(word, memory_order_relaxed), now;
    do {
        now = was;
        memcpy((unsigned char *)&now + (at - (unsigned char *)word), bytes, JUMP);
    } while (!atomic_compare_exchange_weak_explicit(word, &was, now, memory_order_release, memory_order_relaxed));
    mprotect(page, 4096, PROT_READ | PROT_EXEC);
}

/* ---- the other threads held while a jump is stored ----
 * Each other thread is sent STOP_SIGNAL (its round in si_value: a late one from an earlier round is let
 * go at once), reports whether it stopped inside (at, at + 5) and spins until released. With one inside,
 * all are released and the round is tried again: it leaves those bytes within a few instructions. No
 * lock is taken while they are held: one may be held inside malloc's. A thread that blocks the signal is
 * not waited for, and not guarded against. */

#define STOP_SIGNAL (SIGRTMAX - 5)
#define STOP_ROUNDS 100
#define STOP_UNHELD_ROUNDS 10 /* rounds in a row in which some thread did not answer: the hook is refused */
#define STOP_WAIT_NS 20000000ll /* a round's wait for the answers, and 100 us more a thread */
#define STOP_THREADS 4096 /* threads held at most (the answer counts are 16 bits) */
#define STOP_LISTED 32768 /* threads listed at most, those that cannot be held among them */

/* Each round's counts in one word: the round (high 32 bits), threads inside (bits 16-31), threads that
 * answered (bits 0-15); a handler adds to it only while the word is its round's, so one that comes late
 * never counts in a later round. stop_left counts those that left the handler, the same way. */
static _Atomic uint64_t stop_count, stop_left;
static _Atomic int stop_round;
static _Atomic uintptr_t stop_at;

/* The word before the add; UINT64_MAX when it is no longer the round's (nothing added). */
static uint64_t tagged_add(_Atomic uint64_t *word, int round, uint64_t add) {
    uint64_t v = atomic_load(word);
    while (v >> 32 == (uint64_t)round)
        if (atomic_compare_exchange_weak(word, &v, v + add)) return v;
    return UINT64_MAX;
}

/* Who answered the round, in answer order: the round (high 32 bits), whether it was inside (bit 31), its
 * tid. Tagged, so that a handler that stalls past its round writes nothing a later round reads as its own. */
static _Atomic uint64_t stop_who[STOP_THREADS];

/* The last round each thread's handler finished, late or not: tid (high 32 bits) and round, by the tid's
 * low 16 bits (another tid there reads as not finished). A thread can be seen neither masked nor with the
 * signal pending in the instant between the two, and then run the handler: only this mark says it has. */
static _Atomic uint64_t stop_done[1 << 16];

static void stop_finished(int round) {
    pid_t tid = (pid_t)syscall(SYS_gettid);
    atomic_store(&stop_done[tid & 0xffff], (uint64_t)(uint32_t)tid << 32 | (uint32_t)round);
}

static void stop_handler(int sig, siginfo_t *si, void *context) {
    (void)sig, (void)context;
    int round = si->si_value.sival_int;
    if (si->si_code != SI_QUEUE) return;
    if (round != atomic_load(&stop_round)) { /* a round gone by */
        stop_finished(round);
        return;
    }
    uint64_t inside = 0;
#if defined(__x86_64__)
    uintptr_t pc = (uintptr_t)((ucontext_t *)context)->uc_mcontext.gregs[REG_RIP], at = atomic_load(&stop_at);
    inside = pc > at && pc < at + JUMP;
#endif
    uint64_t before = tagged_add(&stop_count, round, inside << 16 | 1);
    if (before != UINT64_MAX && (before & 0xffff) < STOP_THREADS)
        atomic_store(&stop_who[before & 0xffff], (uint64_t)round << 32 | inside << 31 | (uint32_t)syscall(SYS_gettid));
    while (atomic_load_explicit(&stop_round, memory_order_acquire) == round) sched_yield();
    stop_finished(round);
    tagged_add(&stop_left, round, 1);
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ll + t.tv_nsec;
}

/* Nothing from here to the store may call malloc, or anything that may: a held thread may be held inside
 * malloc's lock (opendir's malloc while they were held hung a test harness: found in review). */

/* Whether thread `tid` can be held: MASKED when it blocks STOP_SIGNAL (its status's SigBlk: the CUDA
 * driver's own threads, say, or one still in our handler, which blocks every signal), GONE when it is a
 * zombie (a main thread that called pthread_exit) or its status cannot be read. Neither is waited for. */
enum hold { HOLDABLE, MASKED, GONE };
static enum hold hold_state_of(pid_t tid, char *state, int *pending) {
    char path[64] = "/proc/self/task/", digits[16], buf[4096];
    int len = 0;
    for (unsigned v = (unsigned)tid; v || !len; v /= 10) digits[len++] = (char)('0' + v % 10);
    size_t at = strlen(path);
    while (len) path[at++] = digits[--len];
    memcpy(path + at, "/status", sizeof "/status");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    if (fd >= 0) close(fd);
    if (n <= 0) return GONE;
    buf[n] = 0;
    const char *mask = strstr(buf, "\nSigBlk:"), *st = strstr(buf, "\nState:\t"), *pnd = strstr(buf, "\nSigPnd:");
    *state = st ? st[8] : '?';
    *pending = pnd && strtoull(pnd + 8, NULL, 16) >> (STOP_SIGNAL - 1) & 1; /* sent to it, not yet taken */
    if (*state == 'Z' || !mask) return GONE;
    return strtoull(mask + 8, NULL, 16) >> (STOP_SIGNAL - 1) & 1 ? MASKED : HOLDABLE;
}

static enum hold hold_state(pid_t tid) {
    char state;
    int pending;
    return hold_state_of(tid, &state, &pending);
}

/* The tids of this process's threads into tids[] (at most `max`), read with getdents64 into a static
 * buffer; -1 when /proc cannot be read or there are more. */
static int list_threads(pid_t *tids, int max) {
    static char buf[16384] __attribute__((aligned(8)));
    struct dirent64_ {
        uint64_t ino;
        int64_t off;
        unsigned short reclen;
        unsigned char type;
        char name[];
    };
    int fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC), n = 0;
    if (fd < 0) return -1;
    long got = 0;
    while (n >= 0 && (got = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0)
        for (long off = 0; off < got && n >= 0; off += ((struct dirent64_ *)(buf + off))->reclen) {
            pid_t tid = (pid_t)atoi(((struct dirent64_ *)(buf + off))->name);
            if (tid > 0) n = n < max ? (tids[n] = tid, n + 1) : -1;
        }
    if (got < 0) n = -1;
    close(fd);
    return n;
}

/* Our handler on STOP_SIGNAL (checked each time: the application may have taken the signal since); 0 when
 * the signal is another's. Once installed it stays: a signal still pending after a round must find it. */
static int stop_handler_in_place(void) {
    struct sigaction sa = {0}, cur;
    if (sigaction(STOP_SIGNAL, NULL, &cur)) return 0;
    if (cur.sa_flags & SA_SIGINFO && cur.sa_sigaction == stop_handler) return 1;
    if (cur.sa_handler != SIG_DFL) return 0;
    sa.sa_sigaction = stop_handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigfillset(&sa.sa_mask);
    return sigaction(STOP_SIGNAL, &sa, NULL) == 0;
}

/* The threads but this one that can be held, into tids[] (STOP_THREADS of them at most); -1 when there
 * are more, or as list_threads. */
static int holdable_threads(pid_t *tids, pid_t self) {
    static pid_t all[STOP_LISTED];
    int n = list_threads(all, STOP_LISTED), m = 0;
    for (int i = 0; i < n; i++)
        if (all[i] != self && hold_state(all[i]) == HOLDABLE) {
            if (m == STOP_THREADS) return -1;
            tids[m++] = all[i];
        }
    return n < 0 ? -1 : m;
}

/* Whether a thread that could be held is missing from tids[0..n): one started during the round. */
static int thread_started(const pid_t *tids, int n, pid_t self) {
    static pid_t now[STOP_THREADS];
    int m = holdable_threads(now, self);
    if (m < 0) return 1;
    for (int i = 0; i < m; i++) {
        int known = 0;
        for (int k = 0; k < n && !known; k++) known = tids[k] == now[i];
        if (!known) return 1;
    }
    return 0;
}

/* Whether a thread that was inside the 5 bytes in round `round`, or was signalled then and did not
 * answer, may still be in our handler or have it still to run: in it, it blocks every signal until its
 * sigreturn, so listed then it would be taken for a thread that blocks the signal for good, and not held,
 * and a late one runs the handler of a round gone by. Our handler never sleeps: a thread in it runs or
 * waits for a page (state R or D). So it is waited for while it runs masked, while the signal is pending
 * and not blocked, and while it runs and its handler has not marked that round finished (stop_done). One
 * that blocks the signal while it sleeps blocks it of its own accord. A thread that answered from outside
 * resumes outside: it needs no such wait. */
static int inside_in_handler(const pid_t *inside, int n, int round) {
    for (int i = 0; i < n; i++) {
        char state;
        int pending;
        enum hold h = hold_state_of(inside[i], &state, &pending);
        uint64_t done = atomic_load(&stop_done[inside[i] & 0xffff]);
        int running = state == 'R' || state == 'D';
        int finished = done >> 32 == (uint32_t)inside[i] && (uint32_t)done >= (uint32_t)round;
        if ((h == MASKED && running) || (h == HOLDABLE && pending) || (h != GONE && running && !finished))
            return 1;
    }
    return 0;
}

enum stop_result { STORED, STAYED, UNHELD };

/* The jump stored at `at` while every other thread that can be held is held outside its 5 bytes:
 * STORED. STAYED: a thread was inside them in the last of STOP_ROUNDS rounds; UNHELD: the threads could
 * not be held (the signal is the application's, /proc unreadable, a thread that never answered, threads
 * forever starting); nothing is stored then, since a thread resuming inside the jump would crash the
 * job. Under up_lock (the tid list and the rounds are its). */
static enum stop_result store_stopped(unsigned char *at, const unsigned char *jump) {
    static pid_t tids[STOP_THREADS], inside[STOP_THREADS];
    static int round, ninside, inside_round; /* kept across calls: a refused hook's last round counts too */
    if (!stop_handler_in_place()) return UNHELD;
    pid_t pid = getpid(), self = (pid_t)syscall(SYS_gettid);
    atomic_store(&stop_at, (uintptr_t)at);
    enum stop_result last = UNHELD;
    for (int attempt = 0, unheld = 0; attempt < STOP_ROUNDS; attempt++) {
        /* Those inside the last round out of the handler first (a handler that never said who it was
         * counts every thread that did not as inside). One still in it after a round's wait keeps this
         * round from holding, and is waited for again next round. */
        int masked = 0;
        for (long long end = now_ns() + STOP_WAIT_NS; !masked && ninside;) {
            if (!inside_in_handler(inside, ninside, inside_round)) ninside = 0;
            else if (now_ns() >= end) masked = 1;
            else usleep(100);
        }
        if (masked) {
            last = UNHELD;
            if (++unheld == STOP_UNHELD_ROUNDS) return UNHELD;
            usleep(1000);
            continue;
        }
        int n = holdable_threads(tids, self);
        if (n < 0) return UNHELD;
        round = round % 0x7fffffff + 1;
        atomic_store(&stop_count, (uint64_t)round << 32);
        atomic_store(&stop_left, (uint64_t)round << 32);
        atomic_store_explicit(&stop_round, round, memory_order_release);
        uint64_t sent = 0;
        for (int k = 0; k < n; k++) {
            siginfo_t info = {0};
            info.si_signo = STOP_SIGNAL, info.si_code = SI_QUEUE, info.si_pid = pid, info.si_uid = getuid();
            info.si_value.sival_int = round;
            sent += syscall(SYS_rt_tgsigqueueinfo, pid, tids[k], STOP_SIGNAL, &info) == 0;
        }
        /* a loaded machine delivers late: the wait grows with the threads to run */
        long long wait = STOP_WAIT_NS + n * 100000ll;
        for (long long end = now_ns() + wait; (atomic_load(&stop_count) & 0xffff) < sent && now_ns() < end;)
            sched_yield();
        uint64_t counts = atomic_load(&stop_count);
        int all_held = (counts & 0xffff) == sent && sent == (uint64_t)n && !thread_started(tids, n, self);
        last = !all_held ? UNHELD : counts >> 16 & 0xffff ? STAYED : STORED;
        if (last == STORED) write_code(at, jump);
        atomic_store_explicit(&stop_round, 0, memory_order_release); /* every held thread goes on */
        int unknown = 0;
        inside_round = round;
        for (int k = 0; k < (int)(counts & 0xffff); k++) { /* each says who it was right after counting in */
            uint64_t who = atomic_load(&stop_who[k]);
            for (long long end = now_ns() + wait; who >> 32 != (uint64_t)round && now_ns() < end;)
                sched_yield(), who = atomic_load(&stop_who[k]);
            if (who >> 32 != (uint64_t)round) unknown = 1;
            else if (who >> 31 & 1) inside[ninside++] = (pid_t)(who & 0x7fffffff);
        }
        /* any signalled thread that did not say who it was (stalled before or after counting in) may be
         * inside, or still in a handler with the signal masked: waited for as if inside */
        for (int k = 0; (unknown || (counts & 0xffff) < (uint64_t)n) && last != STORED && k < n; k++) {
            int named = 0;
            for (int j = 0; j < (int)(counts & 0xffff) && !named; j++) {
                uint64_t who = atomic_load(&stop_who[j]);
                named = who >> 32 == (uint64_t)round && (pid_t)(who & 0x7fffffff) == tids[k];
            }
            if (!named) inside[ninside++] = tids[k];
        }
        for (long long end = now_ns() + wait; (atomic_load(&stop_left) & 0xffff) < (counts & 0xffff) && now_ns() < end;)
            sched_yield();
        if (last == STORED) ninside = 0; /* nobody was inside */
        if (last == STAYED) unheld = 0;  /* every thread answered: late answers before were a loaded machine's */
        if (last == STORED || (last == UNHELD && ++unheld == STOP_UNHELD_ROUNDS)) return last;
        usleep(last == UNHELD ? 1000 : 100);
    }
    return last;
}

static void put_jump(unsigned char *at, const void *to) { /* jmp *0(%rip); .quad to: 14 bytes */
    static const unsigned char jmp[6] = {0xff, 0x25, 0, 0, 0, 0};
    memcpy(at, jmp, sizeof jmp);
    memcpy(at + 6, &to, 8);
}

static struct hook *inline_hook_of(const void *function) {
    for (int i = 0; i < nhooks; i++)
        if (hooks[i].code == function) return &hooks[i];
    return NULL;
}

EXPORT void *egpu_uprobe_near(void *function) {
    pthread_mutex_lock(&up_lock);
    struct hook *h = inline_hook_of(function);
    void *page = h ? h->near : NULL;
    uintptr_t f = (uintptr_t)function & ~(uintptr_t)4095;
    for (uintptr_t d = 1 << 20; !page && d < (1ul << 31) - (1 << 21); d += 1 << 20)
        for (int side = 0; side < 2 && !page; side++) {
            if (side == 0 && d > f) continue;
            uintptr_t want = side == 0 ? f - d : f + d;
            void *p = mmap((void *)want, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) continue;
            intptr_t dist = (intptr_t)p - (intptr_t)function;
            if (dist > -(1l << 31) + 8192 && dist < (1l << 31) - 8192) page = p;
            else munmap(p, 4096);
        }
    pthread_mutex_unlock(&up_lock);
    return page;
}

EXPORT int egpu_uprobe_attach_inline(const char *path, const char *symbol, void *function, void *near,
                                     const unsigned char *moved, size_t moved_len, size_t cut,
                                     struct egpu_lvm_prog *const *progs, const int *rets, size_t n) {
#if !defined(__x86_64__)
    return EGPU_UPROBE_NO_SYMBOL;
#endif
    unsigned char *f = function, *page = near;
    intptr_t rel = (intptr_t)page - (intptr_t)(f + JUMP);
    if (((uintptr_t)f & 7) > 8 - JUMP || cut < JUMP || moved_len + NEAR_TRAMPOLINE + 14 > 4096 || rel != (int32_t)rel ||
        strlen(path) >= NAME_MAX_ || strlen(symbol) >= NAME_MAX_)
        return EGPU_UPROBE_UNPATCHABLE;
    egpu_fork_handlers();
    pthread_mutex_lock(&up_lock);
    int result = EGPU_UPROBE_FULL;
    struct hook *h = inline_hook_of(f);
    if (h && h->near != page) goto out;   /* the page egpu_uprobe_near gave for it */
    if (!h) {
        if (nhooks == HOOKS) goto out;
        h = &hooks[nhooks++];
        put_jump(page + NEAR_STUB, stub_of(h));
        memcpy(page + NEAR_TRAMPOLINE, moved, moved_len);
        put_jump(page + NEAR_TRAMPOLINE + moved_len, f + cut);
        mprotect(page, 4096, PROT_READ | PROT_EXEC);
        strcpy(h->path, path), strcpy(h->symbol, symbol); /* no call reaches a new hook before its jump */
        h->target = page + NEAR_TRAMPOLINE;
        h->code = f, h->near = page;
    }
    if (add_programs(h, progs, rets, n)) goto out;
    unsigned char jump[JUMP] = {0xe9};
    int32_t rel32 = (int32_t)rel;
    memcpy(jump + 1, &rel32, 4);
    if (memcmp(f, jump, JUMP)) {
        memcpy(h->code_was, f, JUMP);
        enum stop_result stored = store_stopped(f, jump);
        if (stored != STORED) {
            drop_programs(progs, n);
            h->used = live(h)->n[0] || live(h)->n[1];
            result = stored == STAYED ? EGPU_UPROBE_BUSY : EGPU_UPROBE_UNHELD;
            goto out;
        }
    }
    result = EGPU_UPROBE_ATTACHED;
out:
    pthread_mutex_unlock(&up_lock);
    return result;
}

/* ---- the runtime's API ---- */

/* Whether PATH is a loaded object (the last one PATH names: its name and base), and defines SYMBOL
 * (*target; no SYMBOL: the first object PATH names). */
struct lookup {
    const char *path, *symbol;
    int loaded;
    void *target;
    const char *name;
    unsigned long long base;
};

static int lookup_one(struct dl_phdr_info *info, size_t size, void *arg) {
    struct lookup *l = arg;
    struct object o;
    object_of(info, &o);
    if (!names(l->path, o.name)) return 0;
    l->loaded = 1, l->name = o.name, l->base = o.base;
    if (!l->symbol) return 1;
    l->target = defined_in(&o, l->symbol);
    return l->target != NULL;
}

EXPORT int egpu_uprobe_object(const char *path, char *file, size_t file_len, unsigned long long *base) {
    struct lookup l = {path, NULL, 0, NULL, NULL, 0};
    dl_iterate_phdr(lookup_one, &l);
    if (!l.loaded || strlen(l.name) >= file_len) return 0;
    strcpy(file, l.name);
    *base = l.base;
    return 1;
}

EXPORT int egpu_uprobe_attach(const char *path, const char *symbol, struct egpu_lvm_prog *const *progs,
                              const int *rets, size_t n) {
#if !defined(__x86_64__)
    return EGPU_UPROBE_NO_SYMBOL;
#endif
    if (strlen(path) >= NAME_MAX_ || strlen(symbol) >= NAME_MAX_) return EGPU_UPROBE_NO_SYMBOL;
    egpu_fork_handlers();
    struct lookup l = {path, symbol, 0, NULL, NULL, 0};
    pthread_mutex_lock(&up_lock);
    dl_iterate_phdr(lookup_one, &l);
    int result = EGPU_UPROBE_FULL;
    if (l.loaded && !l.target) {
        result = EGPU_UPROBE_NO_SYMBOL;
        goto out;
    }
    struct hook *h = NULL, *spare = NULL;
    for (int i = 0; i < nhooks && !h; i++) {
        if (hooks[i].used && !strcmp(hooks[i].path, path) && !strcmp(hooks[i].symbol, symbol)) h = &hooks[i];
        else if (!hooks[i].used && !spare && hooks[i].target == l.target) spare = &hooks[i];
    }
    if (!h) { /* a new hook, or a used one's again: a thread may still be in an old stub, so never another's */
        h = spare ? spare : nhooks < HOOKS ? &hooks[nhooks++] : NULL;
        if (!h) goto out;
        /* a spare's lists are empty (it went unused so), and no call reaches a new one before scan() */
        strcpy(h->path, path), strcpy(h->symbol, symbol);
        h->target = l.target, h->used = 1;
    }
    if (add_programs(h, progs, rets, n)) goto out;
    if (h->target) scan();
    result = h->target ? EGPU_UPROBE_ATTACHED : EGPU_UPROBE_PENDING;
out:
    pthread_mutex_unlock(&up_lock);
    return result;
}

static int listed(struct egpu_lvm_prog *const *progs, size_t n, const struct egpu_lvm_prog *p) {
    for (size_t k = 0; k < n; k++)
        if (progs[k] == p) return 1;
    return 0;
}

EXPORT void egpu_uprobe_detach(struct egpu_lvm_prog *const *progs, size_t n) {
    pthread_mutex_lock(&up_lock);
    drop_programs(progs, n);
    for (int i = 0; i < nhooks; i++) {
        struct hook *h = &hooks[i];
        if (h->used && !live(h)->n[0] && !live(h)->n[1]) {
            unpatch(h);
            if (h->code) write_code(h->code, h->code_was); /* its page stays: a thread may be in it */
            h->used = 0; /* its target stays: stub and target keep matching for threads still in it */
        }
    }
    pthread_mutex_unlock(&up_lock);
}

EXPORT void egpu_uprobe_pause(struct egpu_lvm_prog *const *progs, size_t n, int paused) {
    pthread_mutex_lock(&up_lock);
    for (int i = 0; i < nhooks; i++) {
        struct progs *next = next_list(&hooks[i]);
        int changed = 0;
        for (int ret = 0; ret < 2; ret++)
            for (int k = 0; k < next->n[ret]; k++)
                if (listed(progs, n, next->progs[ret][k])) next->paused[ret][k] = paused != 0, changed = 1;
        if (changed) publish(&hooks[i], next);
    }
    egpu_lvm_synchronize(); /* once this returns, no run of a paused program is under way */
    pthread_mutex_unlock(&up_lock);
}

EXPORT int egpu_uprobe_state(const char *path, const char *symbol) {
    int state = EGPU_UPROBE_PENDING;
    pthread_mutex_lock(&up_lock);
    for (int i = 0; i < nhooks; i++)
        if (hooks[i].used && hooks[i].target && !strcmp(hooks[i].path, path) && !strcmp(hooks[i].symbol, symbol))
            state = EGPU_UPROBE_ATTACHED;
    pthread_mutex_unlock(&up_lock);
    if (state == EGPU_UPROBE_PENDING) {
        struct lookup l = {path, symbol, 0, NULL, NULL, 0};
        dl_iterate_phdr(lookup_one, &l);
        if (l.loaded && !l.target) state = EGPU_UPROBE_NO_SYMBOL;
    }
    return state;
}

EXPORT size_t egpu_uprobe_sites(const char *symbol) {
    size_t n = 0;
    pthread_mutex_lock(&up_lock);
    for (size_t k = 0; k < nslots; k++) n += !strcmp(slots[k].hook->symbol, symbol);
    pthread_mutex_unlock(&up_lock);
    return n;
}

EXPORT void egpu_uprobe_clock(long long offset_ns) {
    atomic_store_explicit(&clock_offset, offset_ns, memory_order_relaxed);
}

int egpu_uprobes_on(void) {
    return atomic_load_explicit(&active, memory_order_relaxed) > 0;
}

void *egpu_uprobe_dlsym(void *found) {
    if (!found) return NULL;
    unsigned long long adds = 0;
    dl_iterate_phdr(adds_now, &adds);
    /* never wait here: a dlopen's constructor may call dlsym holding the loader's lock, which an attach
     * holding up_lock may be waiting for; that attach scans the objects itself */
    if (adds != scanned_adds && !pthread_mutex_trylock(&up_lock)) {
        scan();
        pthread_mutex_unlock(&up_lock);
    }
    for (int i = 0; i < nhooks; i++)
        if (hooks[i].used && hooks[i].target == found) return stub_of(&hooks[i]);
    return found;
}

void egpu_uprobe_fork(enum egpu_fork_phase phase) {
    if (phase == EGPU_FORK_PREPARE) pthread_mutex_lock(&up_lock);
    else if (phase == EGPU_FORK_PARENT) pthread_mutex_unlock(&up_lock);
    else pthread_mutex_init(&up_lock, NULL);
}
