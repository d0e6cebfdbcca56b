/* process.c: the shim across fork() and exec(), and around the GIL; the one file that includes Python.h.
 *
 * A C program's fork() copies the shim as the forking thread's siblings left it: locks they held, a
 * gate a swap held, rings half-written, and an interpreter whose other threads are gone. The handlers
 * registered here take every table lock of the shim before the fork (so none is copied mid-update),
 * give them back in the parent and make them new in the child, where each file also resets what
 * belonged to the parent's other threads (egpu_*_fork). When the shim's Python is up they do for the
 * interpreter what os.fork does (PyOS_BeforeFork, PyOS_AfterFork_*), which runs the runtime's
 * after-fork hooks in the child: its own control socket (runtime/live.py). A fork that os.fork makes
 * does that itself: hooks.attach tells the shim (egpu_shim_python_forking) and the handlers leave the
 * interpreter alone. The interpreter comes first and goes last: no shim lock is held while waiting for
 * the GIL.
 *
 * exec replaces the image without running an exit handler, and the new image writes its exit dump under the
 * same pid: the exec hooks have the runtime dump the old image first (egpu_py_exec), and withdraw that dump
 * when the exec fails (the process goes on, its maps count on). Only in the process the runtime started in
 * (egpu_shim_exec_owner): a child that forked or vforked calls no Python before it execs. The dump runs
 * while the other threads still live (the kernel ends them only inside the exec), so a lock one of them
 * holds is let go as at exit. glibc's exec functions make the system call themselves (execvp never reaches
 * execve through the PLT), so each is hooked; the l forms build their vector and take the v forms' way.
 *
 * Every exec and posix_spawn also keeps the new image in the job: where the environment it is given lacks egpu's
 * (`env -i`, subprocess's env={}, a program's own LD_PRELOAD) the hook passes a copy with egpu's variables added
 * and the shim put back into LD_PRELOAD beside the program's own entries, as preload tools keep themselves in a
 * process tree; a child left out ran its kernels without probes, and egpu-run said no process loaded CUDA code.
 * glibc's system, popen and wordexp spawn their shell by a call of their own, past these hooks, with environ: their
 * hooks put what environ lacks of egpu's back into it first. Only static or setuid programs, and programs that
 * exec by a raw system call, get past it.
 */
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wordexp.h>

#include "egpu_shim.h"
#include "egpu_launchvm.h"
#include "egpu_uprobe.h"

#define EXPORT __attribute__((visibility("default")))

/* A Python program of another version than the shim's brings its own interpreter, and the shim's calls
 * into Python reach it (the program's libpython comes first in the symbol search): cffi's start against
 * it hung (3.12 and 3.13 under a shim built for 3.11) or failed in every hook (3.10). Such a process runs
 * no probe, as one whose cuInit fails, and says so once. */
int egpu_python_matches(void) {
    static _Atomic int known; /* 0 not asked yet, 1 the same Python, -1 another */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (__builtin_expect(k != 0, 1)) return k > 0;
    char built[16];
    snprintf(built, sizeof built, "%d.%d.", PY_MAJOR_VERSION, PY_MINOR_VERSION);
    const char *running = Py_GetVersion();
    k = strncmp(running, built, strlen(built)) ? -1 : 1;
    if (!atomic_exchange(&known, k) && k < 0)
        fprintf(stderr, "egpu[%d]: this process runs Python %.*s, the shim was built for Python %d.%d: it runs no "
                "probe (run it under the egpu-run of an egpu installed for its Python)\n", (int)getpid(),
                (int)strcspn(running, " "), running, PY_MAJOR_VERSION, PY_MINOR_VERSION);
    return k > 0;
}

/* This thread's state when it holds the GIL, else NULL. */
static PyThreadState *gil_held_here(void) {
    if (!Py_IsInitialized()) return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    return PyThreadState_GetUnchecked(); /* this thread's: a current one is the GIL held */
#else
    /* Before 3.12 the current thread state is the process's, whichever thread holds the GIL: this thread
     * holds it only when that state is its own. Letting it go for another thread left that one running
     * Python without its state (a launching C thread at the gate during a flip, while the control
     * server's thread held the GIL: SIGSEGV in PyErr_Occurred, tests/test_sass_live.py, 2 runs of 8). */
    PyThreadState *held = _PyThreadState_UncheckedGet();
    return held && held == PyGILState_GetThisThreadState() ? held : NULL;
#endif
}

int egpu_gil_held(void) { return gil_held_here() != NULL; }

void *egpu_gil_let_go(void) {
    return gil_held_here() ? PyEval_SaveThread() : NULL;
}

void egpu_gil_take_back(void *state) {
    if (state) PyEval_RestoreThread(state);
}

static __thread int tls_python_forks;      /* os.fork is forking this thread */
static __thread int tls_python_held;       /* the handlers hold the interpreter for this fork */
static __thread PyGILState_STATE tls_gil;

EXPORT void egpu_shim_python_forking(void) { tls_python_forks = 1; }

static void prepare(void) {
    tls_python_held = !tls_python_forks && egpu_python_attached() && Py_IsInitialized();
    if (tls_python_held) {
        tls_gil = PyGILState_Ensure();
        PyOS_BeforeFork();
    }
    egpu_uprobe_fork(EGPU_FORK_PREPARE); /* before the VM's lock, as attach takes them */
    egpu_lvm_fork(EGPU_FORK_PREPARE);
    egpu_cow_fork(EGPU_FORK_PREPARE);
    egpu_sass_fork(EGPU_FORK_PREPARE);
    egpu_interpose_fork(EGPU_FORK_PREPARE);
}

static void after(enum egpu_fork_phase phase) {
    egpu_interpose_fork(phase);
    egpu_sass_fork(phase);
    egpu_cow_fork(phase);
    egpu_lvm_fork(phase);
    egpu_uprobe_fork(phase);
    tls_python_forks = 0;
    if (!tls_python_held) return;
    tls_python_held = 0;
    if (phase == EGPU_FORK_CHILD) PyOS_AfterFork_Child();
    else PyOS_AfterFork_Parent();
    PyGILState_Release(tls_gil);
}

static void in_parent(void) { after(EGPU_FORK_PARENT); }
static void in_child(void) { after(EGPU_FORK_CHILD); }

static void install(void) { pthread_atfork(prepare, in_parent, in_child); }

void egpu_fork_handlers(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install);
}

/* ---- exec ---- */

extern char **environ;

/* What a new image needs of egpu's environment to run the probes, taken from this image's at load (copies:
 * setproctitle writes over the strings the kernel passed): every EGPU_* variable, the other tools' settings
 * EGPU_CARRY names (Triton's ptxas and caches: runtime/job.py's job_env), and egpu's entries of two lists. Only
 * in a job of egpu-run (EGPU_PRELOAD set there): a program that preloads the shim by hand passes on what it
 * wants. Never freed: every exec reads them, a vforked child's too. */
static char **carried;   /* "NAME=value", NULL-terminated */
static struct list {
    const char *name, *seps, *entry_env;
    int first;           /* egpu's entry goes before the program's (the shim's), else after them */
    const char *entry;   /* egpu's, from entry_env at load */
} lists[] = {
    {"LD_PRELOAD", " :", "EGPU_PRELOAD", 1, NULL},    /* the loader splits at either */
    {"PYTHONPATH", ":", "EGPU_PYTHONPATH", 0, NULL},  /* the cffi stand-in, after the program's own */
};
#define LISTS (sizeof lists / sizeof lists[0])

static int named(const char *var, const char *name, size_t len) {
    return !strncmp(var, name, len) && var[len] == '=';
}

/* Whether `list`, split at any of `seps`, holds `word`. */
static int listed(const char *list, const char *word, const char *seps) {
    size_t len = strlen(word);
    for (const char *w = list + strspn(list, seps); *w; w += strcspn(w, seps), w += strspn(w, seps))
        if (strcspn(w, seps) == len && !strncmp(w, word, len)) return 1;
    return 0;
}

static int carry_wanted(const char *var, const char *names) {
    size_t len = strcspn(var, "=");
    if (!var[len]) return 0;
    char name[len + 1];
    memcpy(name, var, len);
    name[len] = 0;
    return !strncmp(name, "EGPU_", 5) || listed(names, name, " ");
}

static void carry_at_load(void) {
    const char *names = getenv("EGPU_CARRY");
    if (!getenv("EGPU_PRELOAD") || !environ) return;
    size_t n = 0;
    for (char **e = environ; *e; e++) n += carry_wanted(*e, names ? names : "");
    char **vars = calloc(n + 1, sizeof *vars);
    if (!vars) return;
    n = 0;
    for (char **e = environ; *e; e++)
        if (carry_wanted(*e, names ? names : "") && !(vars[n++] = strdup(*e))) return;
    for (size_t i = 0; i < LISTS; i++) {
        const char *entry = getenv(lists[i].entry_env);
        lists[i].entry = entry && *entry ? strdup(entry) : NULL;
    }
    carried = vars;
}

static int has_name(char *const envp[], const char *var) {
    size_t len = strcspn(var, "=");
    for (char *const *e = envp; e && *e; e++)
        if (named(*e, var, len)) return 1;
    return 0;
}

/* "NAME=" list l's `old` value (NULL: none) with egpu's entry, written at `dst` where not NULL; *bytes grows by
 * its size. */
static char *join(char *dst, const struct list *l, const char *old, size_t *bytes) {
    size_t name = strlen(l->name), entry = strlen(l->entry), rest = old ? strlen(old) + 1 : 0;
    if (dst) {
        char *at = dst + name + 1;
        memcpy(dst, l->name, name);
        dst[name] = '=';
        if (old && !l->first) {
            memcpy(at, old, rest - 1);
            at[rest - 1] = l->seps[0];
            at += rest;
        }
        memcpy(at, l->entry, entry);
        at += entry;
        if (old && l->first) {
            at[0] = l->seps[0];
            memcpy(at + 1, old, rest - 1);
            at += rest;
        }
        *at = 0;
    }
    *bytes += name + 1 + entry + rest + 1;
    return dst;
}

/* envp and what it lacks of egpu's environment, into out (pointers) and buf (the lists' new strings); with out
 * NULL, only counted. The pointers out takes, 0 where envp lacks nothing (it goes to exec as it is); *bytes:
 * buf's. Only the caller's memory and the strings taken at load: a vforked child runs it, and a signal handler
 * may (exec is async-signal-safe). */
static size_t carry(char *const envp[], char **out, char *buf, size_t *bytes) {
    size_t k = 0, added = 0;
    *bytes = 0;
    if (!carried) return 0;
    for (char *const *e = envp; e && *e; e++, k++) {
        char *var = *e;
        for (size_t i = 0; i < LISTS; i++) {
            const struct list *l = &lists[i];
            size_t len = strlen(l->name);
            if (l->entry && named(*e, l->name, len) && !listed(*e + len + 1, l->entry, l->seps)) {
                var = join(buf ? buf + *bytes : NULL, l, *e + len + 1, bytes);
                added++;
            }
        }
        if (out) out[k] = var;
    }
    for (char **c = carried; *c; c++)
        if (!has_name(envp, *c)) {
            if (out) out[k] = *c;
            k++, added++;
        }
    for (size_t i = 0; i < LISTS; i++)
        if (lists[i].entry && !has_name(envp, lists[i].name)) {
            char *var = join(buf ? buf + *bytes : NULL, &lists[i], NULL, bytes);
            if (out) out[k] = var;
            k++, added++;
        }
    if (out) out[k] = NULL;
    return added ? k + 1 : 0;
}

/* `env`: `envp` where it has all of egpu's environment, else its copy with the rest (carry), on this frame. */
#define WITH_EGPU_ENV(envp, env) \
    size_t bytes_, slots_ = carry(envp, NULL, NULL, &bytes_); \
    char *vec_[slots_ + 1], buf_[bytes_ + 1]; \
    char *const *env = slots_ ? (carry(envp, vec_, buf_, &bytes_), vec_) : (envp)

enum exec_fn { EXECVE, EXECVPE, FEXECVE, EXECVEAT, POSIX_SPAWN, POSIX_SPAWNP, SYSTEM, POPEN, WORDEXP, EXEC_FNS };
static const char *const exec_names[EXEC_FNS] = {"execve", "execvpe", "fexecve", "execveat", "posix_spawn",
                                                 "posix_spawnp", "system", "popen", "wordexp"};
static _Atomic(void *) exec_reals[EXEC_FNS]; /* NULL where libc lacks one (execveat before glibc 2.34) */
typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*fexecve_fn)(int, char *const[], char *const[]);
typedef int (*execveat_fn)(int, const char *, char *const[], char *const[], int);
typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
                        char *const[], char *const[]);
typedef int (*system_fn)(const char *);
typedef FILE *(*popen_fn)(const char *, const char *);
typedef int (*wordexp_fn)(const char *, wordexp_t *, int);

static void egpu_exec_lookup(void) {
    for (int i = 0; i < EXEC_FNS; i++)
        if (!atomic_load(&exec_reals[i])) atomic_store(&exec_reals[i], egpu_dlsym_next(exec_names[i]));
}

/* Looked up as the shim loads, in every process, and never in a child on its way to exec: a vfork child shares
 * its parent's memory while the parent's other threads run on, and one of them may hold the loader's lock (inside
 * dlopen) waiting for the vforked thread; a fork child of a threaded process may find the loader's lists half
 * changed. The one piece of work the constructor does: nine lookups and the environment to carry (microseconds),
 * and no Python. */
__attribute__((constructor)) static void exec_lookup_at_load(void) {
    egpu_exec_lookup();
    carry_at_load();
}

static void *exec_real(enum exec_fn i) {
    if (!atomic_load_explicit(&exec_reals[i], memory_order_acquire)) egpu_exec_lookup();
    return atomic_load_explicit(&exec_reals[i], memory_order_acquire);
}

/* The real exec function i (a `type`) called with the arguments, bracketed by the runtime's exec phases;
 * errno as the failed exec left it. */
#define EXEC(i, type, ...) ({ \
    type fn_ = (type)exec_real(i); \
    int dumped_ = fn_ && egpu_python_exec(EGPU_EXEC_BEFORE); \
    int r_ = fn_ ? fn_(__VA_ARGS__) : (errno = ENOSYS, -1); \
    if (dumped_) { int e_ = errno; egpu_python_exec(EGPU_EXEC_FAILED); errno = e_; } \
    r_; })

/* The v and l forms without an environment pass this one's to those with one, as glibc's do (execv is
 * execve(..., environ), execvp execvpe): the program may have taken egpu's variables out of it. */
EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
    WITH_EGPU_ENV(envp, env);
    return EXEC(EXECVE, execve_fn, path, argv, env);
}
EXPORT int execv(const char *path, char *const argv[]) { return execve(path, argv, environ); }
EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
    WITH_EGPU_ENV(envp, env);
    return EXEC(EXECVPE, execve_fn, file, argv, env);
}
EXPORT int execvp(const char *file, char *const argv[]) { return execvpe(file, argv, environ); }
EXPORT int fexecve(int fd, char *const argv[], char *const envp[]) {
    WITH_EGPU_ENV(envp, env);
    return EXEC(FEXECVE, fexecve_fn, fd, argv, env);
}
EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags) {
    WITH_EGPU_ENV(envp, env);
    return EXEC(EXECVEAT, execveat_fn, dirfd, path, argv, env, flags);
}

/* The l forms' `arg, ...` up to the NULL that ends them as the vector `argv` (a VLA in the caller's frame, as
 * glibc builds it); `ap` is left past that NULL, where execle's envp follows. */
#define ARG_VECTOR(arg, argv, ap) \
    va_start(ap, arg); \
    size_t n_ = 1; \
    for (const char *a_ = arg; a_; a_ = va_arg(ap, const char *)) n_++; \
    va_end(ap); \
    char *argv[n_]; \
    va_start(ap, arg); \
    argv[0] = (char *)arg; \
    for (size_t k_ = 1; k_ < n_; k_++) argv[k_] = va_arg(ap, char *);

EXPORT int execl(const char *path, const char *arg, ...) {
    va_list ap;
    ARG_VECTOR(arg, argv, ap);
    va_end(ap);
    return execve(path, argv, environ);
}
EXPORT int execlp(const char *file, const char *arg, ...) {
    va_list ap;
    ARG_VECTOR(arg, argv, ap);
    va_end(ap);
    return execvpe(file, argv, environ);
}
EXPORT int execle(const char *path, const char *arg, ...) {
    va_list ap;
    ARG_VECTOR(arg, argv, ap);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, argv, envp);
}

/* posix_spawn replaces no image of this process (no exec phases); its child gets egpu's environment all the same.
 * glibc's own spawns (system, popen, wordexp) never reach here: their hooks follow. */
#define SPAWN(i, pid, path, actions, attr, argv, envp) ({ \
    spawn_fn fn_ = (spawn_fn)exec_real(i); \
    WITH_EGPU_ENV(envp, env); \
    fn_ ? fn_(pid, path, actions, attr, argv, env) : ENOSYS; })

EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *actions,
                       const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    return SPAWN(POSIX_SPAWN, pid, path, actions, attr, argv, envp);
}
EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *actions,
                        const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    return SPAWN(POSIX_SPAWNP, pid, file, actions, attr, argv, envp);
}

/* ---- system, popen, wordexp ---- */

/* "NAME=value" into this process's environment, for good: putenv keeps the copy. */
static void put(const char *var) {
    char *copy = strdup(var);
    if (copy) putenv(copy);
}

/* What environ lacks of egpu's environment (carry), put into it; errno as it was. glibc's system, popen and wordexp
 * spawn their shell with environ by a call of their own, past the hooks above, and take no environment to pass a
 * copy in: so the process's own gets egpu's variables back, and keeps them (the next child would get them anyway).
 * strdup and putenv allocate and putenv takes the environment's lock, which no caller here minds: none of the three
 * is async-signal-safe (system waits for its shell, popen allocates its FILE), so none runs in a signal handler or
 * a vforked child; that lock keeps another thread's setenv meanwhile, as between two setenv calls. */
static void carry_into_environ(void) {
    char **own = environ;
    size_t bytes, slots = carry(own, NULL, NULL, &bytes);
    if (!slots) return;
    char *vec[slots], buf[bytes + 1];
    int e = errno;
    carry(own, vec, buf, &bytes);
    size_t n = 0, k = 0; /* what own lacks (a list joined with egpu's entry, a variable added) to vec's front */
    for (; own && own[k]; k++)
        if (vec[k] != own[k]) vec[n++] = vec[k];
    for (; vec[k]; k++) vec[n++] = vec[k];
    for (k = 0; k < n; k++) put(vec[k]); /* only now: putenv may move and free own */
    errno = e;
}

/* The real function i (a `type`) called with the arguments once environ has egpu's environment; `failed` with
 * ENOSYS where libc lacks it. */
#define SHELL(i, type, failed, ...) ({ \
    type fn_ = (type)exec_real(i); \
    carry_into_environ(); \
    fn_ ? fn_(__VA_ARGS__) : (errno = ENOSYS, failed); })

EXPORT int system(const char *command) { return SHELL(SYSTEM, system_fn, -1, command); }
EXPORT FILE *popen(const char *command, const char *mode) { return SHELL(POPEN, popen_fn, NULL, command, mode); }
EXPORT int wordexp(const char *words, wordexp_t *w, int flags) {
    return SHELL(WORDEXP, wordexp_fn, WRDE_NOSPACE, words, w, flags);
}
