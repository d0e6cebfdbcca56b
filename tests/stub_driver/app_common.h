/* What every test app does once it can resolve driver entry points; the apps differ only in how
 * they resolve them (app_cudart.c: cuGetProcAddress_v2 like cudart, app_dlsym.c: dlsym like PyTorch,
 * or dlvsym, app_linked.c: linked against libcuda like Triton's stub).
 *
 * Output, one line each: "resolve API VERSION FLAGS -> LIBRARY SYMBOL" (who answers: the shim's hook
 * or the driver itself), "rc STEP RESULT", "stats ...", "allocs ...", "record ...". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "egpu_shim.h" /* the shim's C API types; its functions are found with dlsym */

typedef void *H; /* every handle */

/* api, cudaVersion, flags (2 = per-thread default stream), exported symbol of that choice */
typedef void *(*resolve_fn)(const char *api, int version, unsigned long long flags, const char *symbol);

static const char PTX[] =
    "//\n// test module\n//\n.version 8.0\n.target sm_90\n.address_size 64\n\n"
    ".visible .entry kernel_a(\n\t.param .u64 a,\n\t.param .u64 b\n)\n{\n\tret;\n}\n\n"
    ".visible .entry kernel_b(\n\t.param .u64 c\n)\n{\n\tret;\n}\n";

static void *resolved(resolve_fn get, const char *api, int version, unsigned long long flags,
                      const char *symbol) {
    void *p = get(api, version, flags, symbol);
    Dl_info info = {0};
    char lib[256] = "none";
    if (p && dladdr(p, &info) && info.dli_fname) {
        snprintf(lib, sizeof lib, "%s", info.dli_fname);
        snprintf(lib, sizeof lib, "%s", basename(lib));
    }
    printf("resolve %s %d %llu -> %s %s\n", api, version, flags, lib,
           p && info.dli_sname ? info.dli_sname : "none");
    return p;
}

#define GETV(var, api, ver, flags, sym, type) __typeof__(type) var = (type)resolved(get, #api, ver, flags, #sym)
#define GET(api, ver, flags, sym, type) GETV(api, api, ver, flags, sym, type)
#define RC(step, expr) printf("rc %s %d\n", step, (int)(expr))

/* Fatbin wrapper -> fatbin with one uncompressed PTX entry for sm_90 (fatbin.py's layout). */
struct fatbin_image {
    uint32_t magic; uint16_t version, header_size; uint64_t size;
    uint16_t kind, entry_version; uint32_t entry_header_size; uint64_t payload_size;
    uint32_t compressed_size, options_offset; uint16_t minor, major; uint32_t arch, name_offset, name_size;
    uint64_t flags, zero, uncompressed_size;
    char ptx[sizeof PTX + 8 - sizeof PTX % 8];
};
static struct fatbin_image fatbin = {
    0xBA55ED50u, 1, 16, 64 + sizeof fatbin.ptx,
    1, 0x0101, 64, sizeof fatbin.ptx, 0, 0, 0, 8, 90, 0, 0, 0x11, 0, 0, {0}};
static struct { uint32_t magic, version; void *data, *extra; } wrapper = {0x466243B1u, 1, &fatbin, 0};

typedef struct {
    unsigned int gx, gy, gz, bx, by, bz, shmem;
    H stream;
    void *attrs;
    unsigned int nattrs;
} launch_config;

typedef struct {
    H func;
    unsigned int gx, gy, gz, bx, by, bz, shmem;
    void **params, **extra;
    H kern, ctx;
} node_params;

/* CUgraphNodeParams: the type, then a 232-byte union; a memory node's out parameter alloc.dptr is
 * reserved1[14] (byte 128) */
typedef struct {
    int type, reserved0[3];
    union { long long reserved1[29]; node_params kernel; };
    long long reserved2;
} graph_node;

static void print_allocations(const char *when) {
    size_t (*allocations)(struct egpu_alloc *, size_t) = dlsym(RTLD_DEFAULT, "egpu_shim_allocations");
    struct egpu_alloc a[16];
    size_t n = allocations ? allocations(a, 16) : 0;
    printf("allocs %s n=%zu", when, n);
    for (size_t i = 0; i < n && i < 16; i++) printf(" %d:%llu", a[i].kind, a[i].size);
    printf("\n");
}

static int scenario(resolve_fn get, int full) {
    GET(cuInit, 2000, 0, cuInit, CUresult (*)(unsigned));
    GET(cuModuleLoadData, 2000, 0, cuModuleLoadData, CUresult (*)(H *, const void *));
    GET(cuModuleGetFunction, 2000, 0, cuModuleGetFunction, CUresult (*)(H *, H, const char *));
    GET(cuLaunchKernel, 4000, 0, cuLaunchKernel,
        CUresult (*)(H, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, H, void **, void **));
    H mod, fa, fb;
    unsigned long long a = 11, b = 22, c = 33;
    void *params_ab[] = {&a, &b}, *params_c[] = {&c};
    RC("init", cuInit(0));
    RC("load", cuModuleLoadData(&mod, PTX));
    RC("get_a", cuModuleGetFunction(&fa, mod, "kernel_a"));
    RC("get_b", cuModuleGetFunction(&fb, mod, "kernel_b"));
    RC("launch_a", cuLaunchKernel(fa, 1, 1, 1, 32, 1, 1, 0, NULL, params_ab, NULL));
    if (!full) return 0;

    int (*records)(int) = dlsym(RTLD_DEFAULT, "egpu_shim_records");
    if (records) records(1);
    GETV(cuLaunchKernel_ptsz, cuLaunchKernel, 7000, 2, cuLaunchKernel_ptsz,
        CUresult (*)(H, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, H, void **, void **));
    GETV(cuLaunchKernelEx_ptsz, cuLaunchKernelEx, 11060, 2, cuLaunchKernelEx_ptsz,
         CUresult (*)(const launch_config *, H, void **, void **));
    GET(cuLaunchCooperativeKernel, 9000, 0, cuLaunchCooperativeKernel,
        CUresult (*)(H, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, H, void **));
    GETV(cuGraphAddKernelNode_v2, cuGraphAddKernelNode, 12000, 0, cuGraphAddKernelNode_v2,
         CUresult (*)(H *, H, const H *, size_t, const node_params *));
    RC("launch_b_ptsz", cuLaunchKernel_ptsz(fb, 2, 1, 1, 64, 1, 1, 0, (H)0x5, params_c, NULL));
    unsigned long long buffer[2] = {11, 22};
    size_t buffer_size = sizeof buffer;
    void *extra[] = {(void *)1, buffer, (void *)2, &buffer_size, NULL};
    RC("launch_a_extra", cuLaunchKernel(fa, 3, 1, 1, 32, 1, 1, 0, NULL, NULL, extra));
    launch_config cfg = {4, 1, 1, 128, 1, 1, 0, NULL, NULL, 0};
    RC("launch_ex_a", cuLaunchKernelEx_ptsz(&cfg, fa, params_ab, NULL));
    RC("launch_coop_a", cuLaunchCooperativeKernel(fa, 5, 1, 1, 32, 1, 1, 0, NULL, params_ab));
    node_params np = {fa, 6, 1, 1, 32, 1, 1, 0, params_ab, NULL, NULL, NULL};
    H node;
    RC("graph_a", cuGraphAddKernelNode_v2(&node, NULL, NULL, 0, &np));
    RC("launch_zero_grid", cuLaunchKernel(fa, 0, 1, 1, 32, 1, 1, 0, NULL, params_ab, NULL));

    /* cudart's way: a fatbin wrapper to cuLibraryLoadData, then the CUkernel launched as a function */
    GET(cuLibraryLoadData, 12000, 0, cuLibraryLoadData,
        CUresult (*)(H *, const void *, int *, void **, unsigned, int *, void **, unsigned));
    GET(cuLibraryGetKernel, 12000, 0, cuLibraryGetKernel, CUresult (*)(H *, H, const char *));
    GET(cuKernelGetFunction, 12000, 0, cuKernelGetFunction, CUresult (*)(H *, H));
    GET(cuLibraryUnload, 12000, 0, cuLibraryUnload, CUresult (*)(H));
    memcpy(fatbin.ptx, PTX, sizeof PTX);
    H lib, kern, kfunc;
    RC("library_load", cuLibraryLoadData(&lib, &wrapper, NULL, NULL, 0, NULL, NULL, 0));
    RC("library_kernel", cuLibraryGetKernel(&kern, lib, "kernel_a"));
    RC("kernel_function", cuKernelGetFunction(&kfunc, kern));
    RC("kernel_function_again", cuKernelGetFunction(&kfunc, kern)); /* as libraries repeat it */
    RC("launch_kernel_handle", cuLaunchKernel(kern, 7, 1, 1, 32, 1, 1, 0, NULL, params_ab, NULL));

    /* the other ways to load code: a file (torch.compile's path), options, a bare fatbin */
    GET(cuModuleLoad, 2000, 0, cuModuleLoad, CUresult (*)(H *, const char *));
    GET(cuModuleLoadDataEx, 2010, 0, cuModuleLoadDataEx, CUresult (*)(H *, const void *, unsigned, int *, void **));
    GET(cuModuleLoadFatBinary, 2000, 0, cuModuleLoadFatBinary, CUresult (*)(H *, const void *));
    GETV(cuGraphExecKernelNodeSetParams_v2, cuGraphExecKernelNodeSetParams, 12000, 0,
         cuGraphExecKernelNodeSetParams_v2, CUresult (*)(H, H, const node_params *));
    FILE *file = fopen("egpu_app.ptx", "w");
    fputs(PTX, file);
    fclose(file);
    H from_file, with_options, from_fatbin, fa_file;
    RC("load_file", cuModuleLoad(&from_file, "egpu_app.ptx"));
    RC("get_a_file", cuModuleGetFunction(&fa_file, from_file, "kernel_a"));
    /* options of the app's own, its info and error logs among them: the app reads back what the driver wrote
     * for its load (a replacement's when one loaded, else its own image's), as without egpu */
    char app_info[64] = "the app's info", app_log[64] = "the app's log";
    int options[] = {0 /* CU_JIT_MAX_REGISTERS */, 3 /* CU_JIT_INFO_LOG_BUFFER */, 4 /* its size */,
                     5 /* CU_JIT_ERROR_LOG_BUFFER */, 6 /* its size */};
    void *values[] = {(void *)32, app_info, (void *)sizeof app_info, app_log, (void *)sizeof app_log};
    RC("load_ex", cuModuleLoadDataEx(&with_options, PTX, 5, options, values));
    printf("load_ex_options %d,%d,%d,%d,%d %zu %zu %zu [%s] [%s]\n", options[0], options[1], options[2], options[3],
           options[4], (size_t)values[0], (size_t)values[2], (size_t)values[4],
           values[1] == app_info ? app_info : "moved", values[3] == app_log ? app_log : "moved");
    RC("load_fatbin", cuModuleLoadFatBinary(&from_fatbin, &fatbin));
    np.func = fa_file;
    np.gx = 9;
    RC("graph_exec_set", cuGraphExecKernelNodeSetParams_v2((H)0x9, node, &np));

    /* a library from a file, through its module; the launch entry points not used above */
    GET(cuLibraryLoadFromFile, 12000, 0, cuLibraryLoadFromFile,
        CUresult (*)(H *, const char *, int *, void **, unsigned, int *, void **, unsigned));
    GET(cuLibraryGetModule, 12000, 0, cuLibraryGetModule, CUresult (*)(H *, H));
    GET(cuLaunchKernelEx, 11060, 0, cuLaunchKernelEx, CUresult (*)(const launch_config *, H, void **, void **));
    GETV(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel, 9000, 2, cuLaunchCooperativeKernel_ptsz,
         CUresult (*)(H, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, H, void **));
    H lib_file, lib_module, fa_lib;
    RC("library_load_file", cuLibraryLoadFromFile(&lib_file, "egpu_app.ptx", NULL, NULL, 0, NULL, NULL, 0));
    RC("library_module", cuLibraryGetModule(&lib_module, lib_file));
    RC("get_a_library_module", cuModuleGetFunction(&fa_lib, lib_module, "kernel_a"));
    cfg.gx = 10;
    RC("launch_ex_a_library", cuLaunchKernelEx(&cfg, fa_lib, params_ab, NULL));
    RC("launch_coop_b_ptsz", cuLaunchCooperativeKernel_ptsz(fb, 11, 1, 1, 64, 1, 1, 0, NULL, params_c));

    /* the other kernel node entry points, and the generic ones with kernel and other nodes */
    GET(cuGraphAddKernelNode, 10000, 0, cuGraphAddKernelNode,
        CUresult (*)(H *, H, const H *, size_t, const node_params *));
    GET(cuGraphKernelNodeSetParams, 10000, 0, cuGraphKernelNodeSetParams, CUresult (*)(H, const node_params *));
    GETV(cuGraphKernelNodeSetParams_v2, cuGraphKernelNodeSetParams, 12000, 0, cuGraphKernelNodeSetParams_v2,
         CUresult (*)(H, const node_params *));
    GET(cuGraphExecKernelNodeSetParams, 10010, 0, cuGraphExecKernelNodeSetParams,
        CUresult (*)(H, H, const node_params *));
    GET(cuGraphAddNode, 12020, 0, cuGraphAddNode, CUresult (*)(H *, H, const H *, size_t, graph_node *));
    GETV(cuGraphAddNode_v2, cuGraphAddNode, 12030, 0, cuGraphAddNode_v2,
         CUresult (*)(H *, H, const H *, const void *, size_t, graph_node *));
    GET(cuGraphNodeSetParams, 12020, 0, cuGraphNodeSetParams, CUresult (*)(H, graph_node *));
    GET(cuGraphExecNodeSetParams, 12020, 0, cuGraphExecNodeSetParams, CUresult (*)(H, H, graph_node *));
    node_params na = {fa, 12, 1, 1, 32, 1, 1, 0, params_ab, NULL, NULL, NULL};
    node_params nb = {fb, 13, 1, 1, 64, 1, 1, 0, params_c, NULL, NULL, NULL};
    node_params nk = {NULL, 14, 1, 1, 32, 1, 1, 0, params_ab, NULL, kern, NULL}; /* by its CUkernel */
    RC("graph_v1", cuGraphAddKernelNode(&node, NULL, NULL, 0, &na));
    RC("graph_set_v1", cuGraphKernelNodeSetParams(node, &nb));
    RC("graph_set_kernel", cuGraphKernelNodeSetParams_v2(node, &nk));
    na.gx = 0;
    RC("graph_exec_set_v1_zero_grid", cuGraphExecKernelNodeSetParams((H)0x9, node, &na));
    graph_node gn = {.type = 0}; /* CU_GRAPH_NODE_TYPE_KERNEL */
    gn.kernel = nb;
    gn.kernel.gx = 16;
    RC("node_b", cuGraphAddNode(&node, NULL, NULL, 0, &gn));
    gn.kernel = na;
    gn.kernel.gx = 17;
    RC("node_a_v2", cuGraphAddNode_v2(&node, NULL, NULL, NULL, 0, &gn));
    gn.kernel = nk;
    gn.kernel.gx = 0;
    RC("node_set_kernel_zero_grid", cuGraphNodeSetParams(node, &gn));
    gn.kernel = (node_params){fa_file, 19, 1, 1, 32, 1, 1, 0, NULL, extra, NULL, NULL};
    RC("node_exec_set_extra", cuGraphExecNodeSetParams((H)0x9, node, &gn));
    /* a memory node (CU_GRAPH_NODE_TYPE_MEM_ALLOC) holding a registered function where a kernel node
     * keeps its own: it must reach the driver as it is, and the driver's answer reach this struct */
    graph_node alloc = {.type = 10};
    alloc.reserved1[0] = (long long)(uintptr_t)fb;
    RC("node_alloc", cuGraphAddNode_v2(&node, NULL, NULL, NULL, 0, &alloc));
    printf("node_out dptr=%#llx first=%s\n", (unsigned long long)alloc.reserved1[14],
           alloc.reserved1[0] == (long long)(uintptr_t)fb ? "fb" : "changed");
    RC("node_set_alloc", cuGraphNodeSetParams(node, &alloc));

    GET(cuLinkCreate, 6050, 0, cuLinkCreate_v2, CUresult (*)(unsigned, int *, void **, H *));
    GET(cuLinkAddData, 6050, 0, cuLinkAddData_v2,
        CUresult (*)(H, int, void *, size_t, const char *, unsigned, int *, void **));
    GET(cuLinkAddFile, 6050, 0, cuLinkAddFile_v2, CUresult (*)(H, int, const char *, unsigned, int *, void **));
    GET(cuLinkComplete, 5050, 0, cuLinkComplete, CUresult (*)(H, void **, size_t *));
    GET(cuLinkDestroy, 5050, 0, cuLinkDestroy, CUresult (*)(H));
    H link;
    void *cubin;
    size_t cubin_size;
    RC("link_create", cuLinkCreate(0, NULL, NULL, &link));
    RC("link_ptx", cuLinkAddData(link, 1, (void *)PTX, sizeof PTX, "a.ptx", 0, NULL, NULL));
    RC("link_cubin", cuLinkAddData(link, 0, (void *)"\x7f" "ELF", 4, "a.cubin", 0, NULL, NULL));
    RC("link_ptx_file", cuLinkAddFile(link, 1, "egpu_app.ptx", 0, NULL, NULL));
    RC("link_complete", cuLinkComplete(link, &cubin, &cubin_size));
    RC("link_destroy", cuLinkDestroy(link));

    GETV(cuMemAlloc_v2, cuMemAlloc, 3020, 0, cuMemAlloc_v2, CUresult (*)(unsigned long long *, size_t));
    GETV(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, 2, cuMemAllocAsync_ptsz,
         CUresult (*)(unsigned long long *, size_t, H));
    GET(cuMemHostAlloc, 2020, 0, cuMemHostAlloc, CUresult (*)(void **, size_t, unsigned));
    GET(cuMemCreate, 10020, 0, cuMemCreate,
        CUresult (*)(unsigned long long *, size_t, const void *, unsigned long long));
    GET(cuMemMap, 10020, 0, cuMemMap,
        CUresult (*)(unsigned long long, size_t, size_t, unsigned long long, unsigned long long));
    GETV(cuMemFree_v2, cuMemFree, 3020, 0, cuMemFree_v2, CUresult (*)(unsigned long long));
    GET(cuMemFreeHost, 2000, 0, cuMemFreeHost, CUresult (*)(void *));
    GET(cuMemRelease, 10020, 0, cuMemRelease, CUresult (*)(unsigned long long));
    GET(cuMemUnmap, 10020, 0, cuMemUnmap, CUresult (*)(unsigned long long, size_t));
    GETV(cuMemAllocHost_v2, cuMemAllocHost, 3020, 0, cuMemAllocHost_v2, CUresult (*)(void **, size_t));
    GETV(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0, cuMemAllocPitch_v2,
         CUresult (*)(unsigned long long *, size_t *, size_t, size_t, unsigned));
    GET(cuMemAllocManaged, 6000, 0, cuMemAllocManaged, CUresult (*)(unsigned long long *, size_t, unsigned));
    GET(cuMemAllocAsync, 11020, 0, cuMemAllocAsync, CUresult (*)(unsigned long long *, size_t, H));
    GET(cuMemAllocFromPoolAsync, 11020, 0, cuMemAllocFromPoolAsync, CUresult (*)(unsigned long long *, size_t, H, H));
    GETV(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, 2, cuMemAllocFromPoolAsync_ptsz,
         CUresult (*)(unsigned long long *, size_t, H, H));
    GET(cuMemFreeAsync, 11020, 0, cuMemFreeAsync, CUresult (*)(unsigned long long, H));
    GETV(cuMemHostRegister_v2, cuMemHostRegister, 6050, 0, cuMemHostRegister_v2,
         CUresult (*)(void *, size_t, unsigned));
    GET(cuMemHostUnregister, 4000, 0, cuMemHostUnregister, CUresult (*)(void *));
    GETV(cuMemcpy_ptds, cuMemcpy, 7000, 2, cuMemcpy_ptds, CUresult (*)(unsigned long long, unsigned long long, size_t));
    unsigned long long d1, d2, handle;
    void *host;
    RC("alloc", cuMemAlloc_v2(&d1, 4096));
    RC("alloc_async", cuMemAllocAsync_ptsz(&d2, 8192, NULL));
    RC("host_alloc", cuMemHostAlloc(&host, 100, 0));
    RC("mem_create", cuMemCreate(&handle, 1 << 21, NULL, 0));
    RC("mem_map", cuMemMap(0x7f0000000000ull, 1 << 21, 0, handle, 0));
    unsigned long long pitched, managed, async, pooled, pooled_ptsz;
    size_t pitch;
    void *pinned;
    static char registered[800];
    RC("alloc_host", cuMemAllocHost_v2(&pinned, 500));
    RC("alloc_pitch", cuMemAllocPitch_v2(&pitched, &pitch, 100, 3, 4));
    RC("alloc_managed", cuMemAllocManaged(&managed, 300, 1));
    RC("alloc_async_legacy", cuMemAllocAsync(&async, 200, NULL));
    RC("alloc_pool", cuMemAllocFromPoolAsync(&pooled, 600, (H)0x3, NULL));
    RC("alloc_pool_ptsz", cuMemAllocFromPoolAsync_ptsz(&pooled_ptsz, 700, (H)0x3, NULL));
    RC("host_register", cuMemHostRegister_v2(registered, sizeof registered, 0));
    RC("memcpy_ptds", cuMemcpy_ptds(d2, d1, 64));
    print_allocations("live");
    RC("free", cuMemFree_v2(d1));
    RC("free_null", cuMemFree_v2(0));
    RC("free_host", cuMemFreeHost(host));
    RC("unmap", cuMemUnmap(0x7f0000000000ull, 1 << 21));
    RC("release", cuMemRelease(handle));
    RC("free_host_pinned", cuMemFreeHost(pinned));
    RC("free_async", cuMemFreeAsync(async, NULL));
    RC("host_unregister", cuMemHostUnregister(registered));
    print_allocations("after");

    /* what may load code lazily besides loads and lookups: a partly loaded function's occupancy and
     * attributes (cuModuleEnumerateFunctions hands such out), a CUkernel's attributes, a graph's kernels */
    GET(cuModuleEnumerateFunctions, 12040, 0, cuModuleEnumerateFunctions, CUresult (*)(H *, unsigned, H));
    GET(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050, 0, cuOccupancyMaxActiveBlocksPerMultiprocessor,
        CUresult (*)(int *, H, int, size_t));
    GET(cuFuncSetAttribute, 9000, 0, cuFuncSetAttribute, CUresult (*)(H, int, int));
    GET(cuKernelGetAttribute, 12000, 0, cuKernelGetAttribute, CUresult (*)(int *, int, H, int));
    GET(cuGraphInstantiateWithFlags, 11040, 0, cuGraphInstantiateWithFlags, CUresult (*)(H *, H, unsigned long long));
    H listed[2], kern_file, exec;
    int blocks, kernel_attr;
    RC("enumerate", cuModuleEnumerateFunctions(listed, 2, from_fatbin));
    RC("occupancy_listed", cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, listed[0], 128, 0));
    RC("occupancy_listed_again", cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, listed[0], 128, 0));
    RC("set_attribute_listed", cuFuncSetAttribute(listed[1], 8, 1024));
    RC("kernel_attribute", cuKernelGetAttribute(&kernel_attr, 0, kern, 0));
    RC("library_file_kernel", cuLibraryGetKernel(&kern_file, lib_file, "kernel_a"));
    RC("kernel_attribute_file", cuKernelGetAttribute(&kernel_attr, 0, kern_file, 0));
    RC("launch_kernel_file", cuLaunchKernel(kern_file, 20, 1, 1, 32, 1, 1, 0, NULL, params_ab, NULL));
    RC("launch_kernel_file_again", cuLaunchKernel(kern_file, 21, 1, 1, 32, 1, 1, 0, NULL, params_ab, NULL));
    RC("graph_instantiate", cuGraphInstantiateWithFlags(&exec, (H)0x7, 0));

    /* the driver's own answers pass through unchanged */
    GET(cuFuncGetAttribute, 2020, 0, cuFuncGetAttribute, CUresult (*)(int *, int, H));
    GET(cuCtxSynchronize, 2000, 0, cuCtxSynchronize, CUresult (*)(void));
    GET(cuGetExportTable, 3000, 0, cuGetExportTable, CUresult (*)(const void **, const void *));
    GETV(cuMemAlloc_v1, cuMemAlloc, 2000, 0, cuMemAlloc, CUresult (*)(unsigned *, unsigned));
    GET(cuModuleUnload, 2000, 0, cuModuleUnload, CUresult (*)(H));
    H missing;
    int attr;
    const void *table;
    unsigned small;
    RC("load_missing_file", cuModuleLoad(&missing, "/nonexistent/egpu.ptx"));
    RC("func_attribute_bad", cuFuncGetAttribute(&attr, 99, fa));
    RC("ctx_synchronize", cuCtxSynchronize());
    RC("export_table", cuGetExportTable(&table, "0123456789abcdef"));
    RC("alloc_v1", cuMemAlloc_v1(&small, 16));
    RC("unload", cuModuleUnload(mod));
    RC("library_unload", cuLibraryUnload(lib));

    void (*stats)(struct egpu_stats *) = dlsym(RTLD_DEFAULT, "egpu_shim_stats");
    size_t (*drain)(struct egpu_launch_record *, size_t) = dlsym(RTLD_DEFAULT, "egpu_shim_drain");
    unsigned long long (*launches)(void *) = dlsym(RTLD_DEFAULT, "egpu_shim_launches");
    if (stats && drain && launches) {
        struct egpu_stats s;
        stats(&s);
        printf("stats launches=%llu redirected=%llu records=%llu dropped=%llu launches_a=%llu launches_b=%llu\n",
               s.launches, s.redirected, s.records, s.dropped, launches(fa), launches(fb));
        struct egpu_launch_record r[16];
        size_t n = drain(r, 16);
        for (size_t i = 0; i < n; i++)
            printf("record id=%llu api=%d f=%s redirected=%d grid=%u block=%u stream=%p\n", r[i].launch_id, r[i].api,
                   r[i].function == fa ? "a" : r[i].function == fb ? "b" : r[i].function == kern ? "kern" : "?",
                   r[i].launched != r[i].function, r[i].grid[0], r[i].block[0], r[i].stream);
    }
    return 0;
}

/* argv[1] == "child": the small scenario only; "--fork": also run it in a forked and exec'd child. */
static int app_main(int argc, char **argv, resolve_fn get) {
    int child = argc > 1 && !strcmp(argv[1], "child");
    if (argc > 1 && !strcmp(argv[1], "--fork")) {
        pid_t pid = fork();
        if (pid == 0) {
            execl("/proc/self/exe", argv[0], "child", (char *)NULL);
            _exit(127);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        printf("child exit=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    int r = scenario(get, !child);
    fflush(stdout);
    return r;
}
