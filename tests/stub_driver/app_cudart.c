/* Reaches the driver like cudart (DESIGN.md section 3): dlopen("libcuda.so.1"), one
 * dlsym(h, "cuGetProcAddress_v2"), cuGetProcAddress for cuGetProcAddress itself, then every entry
 * point through the one that call returned, by (api, cudaVersion, flags). */
#include "app_common.h"

typedef CUresult (*gpa_fn)(const char *, void **, int, unsigned long long, int *);
static gpa_fn gpa;

static void *by_proc_address(const char *api, int version, unsigned long long flags, const char *symbol) {
    void *p = NULL;
    int status = -1;
    CUresult r = gpa(api, &p, version, flags, &status);
    return r == 0 ? p : NULL;
}

int main(int argc, char **argv) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("no libcuda: %s\n", dlerror()); return 2; }
    gpa_fn first = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    gpa = first;
    gpa = (gpa_fn)resolved(by_proc_address, "cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2");
    if (!gpa) return 3;
    resolved(by_proc_address, "cuGetProcAddress", 11030, 0, "cuGetProcAddress");
    resolved(by_proc_address, "cuLaunchKernel", 12000, 1, "cuLaunchKernel");
    resolved(by_proc_address, "cuLaunchKernel", 6000, 2, "cuLaunchKernel");
    resolved(by_proc_address, "cuGraphAddKernelNode", 11000, 0, "cuGraphAddKernelNode");
    resolved(by_proc_address, "cuMemFreeAsync", 12000, 2, "cuMemFreeAsync_ptsz");
    resolved(by_proc_address, "cuGraphAddNode", 13000, 0, "cuGraphAddNode_v2");
    resolved(by_proc_address, "cuStreamBeginCapture", 10000, 0, "cuStreamBeginCapture");  /* one argument */
    resolved(by_proc_address, "cuStreamBeginCapture", 10000, 2, "cuStreamBeginCapture_ptsz");
    resolved(by_proc_address, "cuStreamBeginCapture", 12000, 2, "cuStreamBeginCapture_v2_ptsz");
    resolved(by_proc_address, "cuStreamEndCapture", 12000, 0, "cuStreamEndCapture");
    resolved(by_proc_address, "cuNoSuchFunction", 12000, 0, "cuNoSuchFunction");
    return app_main(argc, argv, by_proc_address);
}
