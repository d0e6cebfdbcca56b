/* Linked beside driver_more.c into the stand-in libcuda.so.1 of the cow tests (tests/test_cow_live.py):
 * the copy, memset, stream and event calls shim/cow.c hooks or makes, over driver_more.c's fake device
 * memory (reached through its exported copies, which log as well), and cuFuncGetParamInfo from the
 * module's PTX (every parameter 8 bytes). Logs to EGPU_STUB_LOG like the stand-in. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult egpu_stub_ok(void);   /* libcuda_stub.c: CUDA_SUCCESS, or not after a fork */
#define OK egpu_stub_ok()
#define INVALID_VALUE 1
#define INVALID_HANDLE 400

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n);

static void say(const char *fmt, ...) {
    const char *path = getenv("EGPU_STUB_LOG");
    if (!path || !*path) return;
    char line[512];
    int n = snprintf(line, sizeof line, "%d ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2) n = sizeof line - 2;
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd >= 0) {
        (void)!write(fd, line, n);
        close(fd);
    }
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
    say("cuMemcpyAsync dst=%#llx src=%#llx size=%zu stream=%p", dst, src, n, s);
    return cuMemcpyDtoD_v2(dst, src, n);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
    say("cuMemcpyDtoDAsync_v2 dst=%#llx src=%#llx size=%zu stream=%p", dst, src, n, s);
    return cuMemcpyDtoD_v2(dst, src, n);
}
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
    char *b = malloc(n ? n : 1);
    memset(b, v, n);
    say("cuMemsetD8_v2 dst=%#llx size=%zu", dst, n);
    CUresult r = cuMemcpyHtoD_v2(dst, b, n);
    free(b);
    return r;
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, void *s) {
    say("cuMemsetD32Async dst=%#llx count=%zu stream=%p", dst, n, s);
    return OK;
}
CUresult cuMemcpy2D_v2(const void *copy) { say("cuMemcpy2D_v2"); return OK; }

/* as many streams as asked for (app_cow streams makes thousands): each a handle of its own */
CUresult cuStreamCreateWithPriority(void **s, unsigned int flags, int priority) {
    if (!(*s = malloc(1))) return INVALID_VALUE;
    say("cuStreamCreateWithPriority stream=%p", *s);
    return OK;
}

static int next_event = 1;
CUresult cuEventCreate(void **e, unsigned int flags) {
    int *id = malloc(sizeof *id);
    *id = next_event++;
    *e = id;
    return OK;
}
CUresult cuEventDestroy_v2(void *e) { free(e); return OK; }
CUresult cuEventRecord(void *e, void *s) {
    const char *us = getenv("EGPU_STUB_EVENT_RECORD_US"); /* a driver slow to record: the cut holds longer */
    if (us) usleep(atoi(us));
    say("cuEventRecord event=%d stream=%p", *(int *)e, s);
    return OK;
}
CUresult cuEventSynchronize(void *e) { return OK; }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned int flags) {
    say("cuStreamWaitEvent stream=%p event=%d", s, *(int *)e);
    return OK;
}

/* struct function/module of libcuda_stub.c: a function knows its module's PTX. */
struct module { int id; char *ptx; };
struct function { char name[128]; struct module *m; int kernel; };

CUresult cuFuncGetParamInfo(void *f, size_t index, size_t *offset, size_t *size) {
    const struct function *fn = f;
    char key[160];
    snprintf(key, sizeof key, ".entry %s(", fn->name);
    const char *p = fn->m && fn->m->ptx ? strstr(fn->m->ptx, key) : NULL;
    if (!p) return INVALID_HANDLE;
    const char *end = strchr(p, ')');
    size_t n = 0;
    for (const char *q = strstr(p, ".param"); q && q < end; q = strstr(q + 1, ".param")) n++;
    if (index >= n) return INVALID_VALUE;
    *offset = 8 * index;
    if (size) *size = 8;
    return OK;
}
CUresult cuKernelGetParamInfo(void *k, size_t index, size_t *offset, size_t *size) { return INVALID_HANDLE; }
