/* A CUDA program as the runtime tests need one: `app_vec MODE K N STATUS` loads one kernel,
 * vecadd(a, b, n), launches it K times with N threads, prints a line, then exits with STATUS, or is
 * killed by SIGTERM when STATUS is "kill", or execs `app_vec module 1 32 0` when STATUS is "exec", or exits 0
 * with its context destroyed (cuCtxDestroy) when STATUS is "destroy", or, when STATUS is "closefds", closes
 * every descriptor above stderr, as a daemon does, then opens the file APP_VEC_FILE names four times (the
 * numbers egpu's sockets had) and exits 0 with a line for each still in stdio's buffers, or copies stdin to
 * stdout, until the end of one or an error, when STATUS is "cat", or, when STATUS is "capture", launches the
 * kernel K times more into a stream that captures a graph, then K times more on the default stream, and exits
 * 0. Entry points come from dlsym, as PyTorch gets them.
 * MODE: module (PTX text, cuModuleLoadData + cuModuleGetFunction), library (PTX text,
 * cuLibraryLoadData + cuLibraryGetKernel), fatbin (a fatbin wrapper holding the PTX through
 * cuLibraryLoadData, as cudart loads), cubin (an ELF image: no PTX to instrument), elf (the cubin file
 * APP_VEC_CUBIN names, nvcc's, through cuModuleLoadData: a SASS-only module whose kernels the SASS back
 * end reads from its symbol table; module loads the PTX text the file APP_VEC_PTX names instead, if set), link (the PTX
 * through cuLinkAddData, then the cubin cuLinkComplete made, copied, through cuModuleLoadData, as
 * numba does), capture (the fatbin loaded and launched into a stream while it captures a graph in
 * global mode: CUDA's lazy loading loads a module at its first launch, which may be captured), devices (the
 * fatbin through cuLibraryLoadData launched K times on device 0, then device 1's primary context made
 * current, as cudaSetDevice(1) does, and the library's kernel launched K times there, and the PTX text
 * loaded there through cuModuleLoadData and launched K times). */
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char PTX[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n\n"
    ".visible .entry vecadd(\n\t.param .u64 a,\n\t.param .u64 b,\n\t.param .u64 n\n)\n{\n"
    "\t.reg .b64 %rd<4>;\n\tld.param.u64 %rd1, [a];\n\tld.global.u64 %rd2, [%rd1];\n"
    "\tst.global.u64 [%rd1], %rd2;\n\tret;\n}\n";

typedef int (*fn)();

/* wrapper -> fatbin -> one uncompressed PTX entry for sm_90 (fatbin.py's layout) */
static struct {
    uint32_t magic; uint16_t version, header_size; uint64_t size;
    uint16_t kind, entry_version; uint32_t entry_header_size; uint64_t payload_size;
    uint32_t compressed_size, options_offset; uint16_t minor, major; uint32_t arch, name_offset, name_size;
    uint64_t flags, zero, uncompressed_size;
    char ptx[sizeof PTX + 8 - sizeof PTX % 8];
} fatbin = {0xBA55ED50u, 1, 16, 64 + sizeof fatbin.ptx, 1, 0x0101, 64, sizeof fatbin.ptx, 0, 0, 0, 8, 90,
            0, 0, 0x11, 0, 0, {0}};
static struct { uint32_t magic, version; void *data, *extra; } wrapper = {0x466243B1u, 1, &fatbin, 0};
/* an ELF64 header and nothing else: what the runtime sees of a cubin */
static const unsigned char cubin[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};

int main(int argc, char **argv) {
    if (argc != 5) return 2;
    int capture = !strcmp(argv[1], "capture"), devices = !strcmp(argv[1], "devices");
    int library = !strcmp(argv[1], "library") || !strcmp(argv[1], "fatbin") || capture || devices;
    const void *image = !strcmp(argv[1], "fatbin") || capture || devices ? (const void *)&wrapper
                        : !strcmp(argv[1], "cubin") ? (const void *)cubin : (const void *)PTX;
    memcpy(fatbin.ptx, PTX, sizeof PTX);
    if (!strcmp(argv[1], "elf")) {
        const char *path = getenv("APP_VEC_CUBIN");
        FILE *f = path ? fopen(path, "rb") : NULL;
        static char elf[1 << 20];
        if (!f || !fread(elf, 1, sizeof elf, f)) return 2;
        fclose(f);
        image = elf;
    }
    const char *ptx_path = getenv("APP_VEC_PTX");
    if (!strcmp(argv[1], "module") && ptx_path && *ptx_path) {
        static char text[1 << 16];
        FILE *f = fopen(ptx_path, "r");
        size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
        if (!got) return 2;
        fclose(f);
        text[got] = 0;
        image = text;
    }
    unsigned k = atoi(argv[2]), n = atoi(argv[3]);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return 2;
#define SYM(name) fn name = (fn)dlsym(cuda, #name)
    SYM(cuInit); SYM(cuModuleLoadData); SYM(cuModuleGetFunction); SYM(cuLibraryLoadData);
    SYM(cuLibraryGetKernel); SYM(cuLaunchKernel); SYM(cuCtxSynchronize);
    SYM(cuLinkCreate_v2); SYM(cuLinkAddData_v2); SYM(cuLinkComplete); SYM(cuLinkDestroy);
    SYM(cuStreamCreate); SYM(cuStreamBeginCapture_v2); SYM(cuStreamEndCapture);
    SYM(cuDevicePrimaryCtxRetain); SYM(cuCtxSetCurrent); SYM(cuCtxGetCurrent); SYM(cuCtxDestroy_v2);
    void *mod = NULL, *f = NULL, *link = NULL, *linked = NULL, *stream = NULL, *graph = NULL;
    size_t linked_size = 0;
    int r = cuInit(0);
    if (!strcmp(argv[1], "link")) {
        r |= cuLinkCreate_v2(0, NULL, NULL, &link) | cuLinkAddData_v2(link, 1, (void *)PTX, sizeof PTX, "a.ptx", 0,
                                                                       NULL, NULL);
        r |= cuLinkComplete(link, &linked, &linked_size);
        void *copy = malloc(linked_size);   /* numba keeps bytes of its own */
        memcpy(copy, linked, linked_size);
        r |= cuLinkDestroy(link);
        image = copy;
    }
    if (capture)
        r |= cuStreamCreate(&stream, 0) | cuStreamBeginCapture_v2(stream, 0);
    if (library)
        r |= cuLibraryLoadData(&mod, image, NULL, NULL, 0, NULL, NULL, 0) | cuLibraryGetKernel(&f, mod, "vecadd");
    else
        r |= cuModuleLoadData(&mod, image) | cuModuleGetFunction(&f, mod, "vecadd");
    unsigned long long a = 11, b = 22, count = n;
    void *params[] = {&a, &b, &count};
    for (unsigned i = 0; i < k; i++)
        r |= cuLaunchKernel(f, (n + 31) / 32, 1, 1, 32, 1, 1, 0, stream, params, NULL);
    if (capture)
        r |= cuStreamEndCapture(stream, &graph);
    if (devices) {
        void *device1 = NULL, *mod1 = NULL, *f1 = NULL;
        r |= cuDevicePrimaryCtxRetain(&device1, 1) | cuCtxSetCurrent(device1);
        for (unsigned i = 0; i < k; i++)
            r |= cuLaunchKernel(f, (n + 31) / 32, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
        r |= cuModuleLoadData(&mod1, PTX) | cuModuleGetFunction(&f1, mod1, "vecadd");
        for (unsigned i = 0; i < k; i++)
            r |= cuLaunchKernel(f1, (n + 31) / 32, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
    }
    r |= cuCtxSynchronize();
    printf("app_vec %s launches=%u threads=%u result=%d\n", argv[1], k, n, r);
    fflush(stdout);
    if (!strcmp(argv[4], "kill")) raise(SIGTERM);
    if (!strcmp(argv[4], "destroy")) {
        void *ctx = NULL;
        return cuCtxGetCurrent(&ctx) | cuCtxDestroy_v2(ctx);
    }
    if (!strcmp(argv[4], "closefds")) {
        for (int fd = 3; fd < 1024; fd++) close(fd);
        for (int i = 0; i < 4; i++) {
            FILE *out = fopen(getenv("APP_VEC_FILE"), "a");
            if (!out) return 2;
            fprintf(out, "line %d\n", i);   /* written at exit, after its handlers */
        }
        return 0;
    }
    if (!strcmp(argv[4], "cat")) {
        char buf[4096];
        ssize_t got;
        while ((got = read(0, buf, sizeof buf)) > 0)
            if (write(1, buf, got) != got) break;
        return 0;
    }
    if (!strcmp(argv[4], "capture")) {
        void *captured = NULL, *graph1 = NULL;
        r = cuStreamCreate(&captured, 0) | cuStreamBeginCapture_v2(captured, 0);
        for (unsigned i = 0; i < k; i++)
            r |= cuLaunchKernel(f, (n + 31) / 32, 1, 1, 32, 1, 1, 0, captured, params, NULL);
        r |= cuStreamEndCapture(captured, &graph1);
        for (unsigned i = 0; i < k; i++)
            r |= cuLaunchKernel(f, (n + 31) / 32, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
        return r | cuCtxSynchronize();
    }
    if (!strcmp(argv[4], "exec")) {
        char *again[] = {argv[0], "module", "1", "32", "0", NULL};
        execv(argv[0], again);
        return 2;
    }
    return atoi(argv[4]);
}
