/* process.c: the shim across fork() and around the GIL; the one file that includes Python.h.
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
 */
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

void *egpu_gil_let_go(void) {
    if (!Py_IsInitialized()) return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    PyThreadState *mine = PyThreadState_GetUnchecked(); /* this thread's: a current one is the GIL held */
#else
    /* Before 3.12 the current thread state is the process's, whichever thread holds the GIL: this thread
     * holds it only when that state is its own. Letting it go for another thread left that one running
     * Python without its state (a launching C thread at the gate during a flip, while the control
     * server's thread held the GIL: SIGSEGV in PyErr_Occurred, tests/test_sass_live.py, 2 runs of 8). */
    PyThreadState *held = _PyThreadState_UncheckedGet();
    PyThreadState *mine = held && held == PyGILState_GetThisThreadState() ? held : NULL;
#endif
    return mine ? PyEval_SaveThread() : NULL;
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
