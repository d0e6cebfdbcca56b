// Facts for a live SASS attach: patch after launches ran, a second patch image, indirect calls from a
// fixed stub into a later image (sanitizerGetCallbackPcAndSize), unpatch/repatch, and their costs.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <sanitizer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>
#include <string>

#define CK(x) do { SanitizerResult r_ = (x); if (r_ != SANITIZER_SUCCESS) { const char *s=0; sanitizerGetResultString(r_, &s); printf("FAIL %s: %d %s\n", #x, (int)r_, s?s:"?"); } } while (0)
static double now_ms() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }

struct Mod { CUcontext ctx; CUmodule mod; size_t size; };
static std::vector<Mod> mods;
static void *g_record = nullptr;  // device record given to every launch
static unsigned long long g_threads = 0, g_launches = 0;
static int g_set_data = 0;
static int g_adding = 0;

static void cb(void *, Sanitizer_CallbackDomain domain, Sanitizer_CallbackId cbid, const void *data) {
    if (domain == SANITIZER_CB_DOMAIN_RESOURCE && cbid == SANITIZER_CBID_RESOURCE_MODULE_LOADED) {
        auto *d = (const Sanitizer_ResourceModuleData *)data;
        if (!g_adding) mods.push_back({d->context, d->module, d->cubinSize});
    } else if (domain == SANITIZER_CB_DOMAIN_LAUNCH && cbid == SANITIZER_CBID_LAUNCH_BEGIN) {
        auto *ld = (const Sanitizer_LaunchData *)data;
        g_launches++;
        g_threads += (unsigned long long)ld->gridDim_x * ld->gridDim_y * ld->gridDim_z * ld->blockDim_x * ld->blockDim_y * ld->blockDim_z;
        if (g_set_data) CK(sanitizerSetLaunchCallbackData(ld->hLaunch, ld->function, ld->hStream, g_record));
    }
}

__global__ void vecadd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

static std::string slurp(const char *p) { FILE *f = fopen(p, "rb"); std::string s; char buf[65536]; size_t k; while ((k = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, k); fclose(f); return s; }

struct Rec { unsigned long long fn, counter, self, mem_fn; };

int main(int argc, char **argv) {
    const char *dir = argv[1];
    Sanitizer_SubscriberHandle sub;
    CK(sanitizerSubscribe(&sub, (Sanitizer_CallbackFunc)cb, nullptr));
    CK(sanitizerEnableDomain(1, sub, SANITIZER_CB_DOMAIN_RESOURCE));
    int n = 1 << 24;
    float *a, *b, *c; unsigned long long *counter; Rec *rec;
    cudaMalloc(&a, n * 4); cudaMalloc(&b, n * 4); cudaMalloc(&c, n * 4);
    cudaMalloc(&counter, 8); cudaMalloc(&rec, sizeof(Rec));
    cudaMemset(a, 0, n * 4); cudaMemset(b, 0, n * 4); cudaMemset(counter, 0, 8); cudaMemset(rec, 0, sizeof(Rec));
    g_record = rec;
    CUcontext ctx; cuCtxGetCurrent(&ctx);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    auto timeit = [&](const char *what, int reps) {
        vecadd<<<n / 256, 256>>>(a, b, c, n); cudaDeviceSynchronize();
        cudaEventRecord(e0);
        for (int i = 0; i < reps; i++) vecadd<<<n / 256, 256>>>(a, b, c, n);
        cudaEventRecord(e1); cudaEventSynchronize(e1);
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        unsigned long long cnt; cudaMemcpy(&cnt, counter, 8, cudaMemcpyDeviceToHost);
        printf("TIME %-40s %8.4f ms/launch counter=%llu (%.2f per thread-launch) err=%s\n", what, ms / reps, cnt,
               (double)cnt / ((double)n * (reps + 1)), cudaGetErrorString(cudaGetLastError()));
        cudaMemset(counter, 0, 8); cudaDeviceSynchronize();
    };
    timeit("standby (resource domain only)", 20);
    // cublas: its modules load lazily at first use
    cublasHandle_t h; cublasCreate(&h);
    int m = 4096; float *A, *B, *C; cudaMalloc(&A, m * m * 4); cudaMalloc(&B, m * m * 4); cudaMalloc(&C, m * m * 4);
    cudaMemset(A, 0, m*m*4); cudaMemset(B, 0, m*m*4);
    float one = 1, zero = 0;
    auto gemm = [&](const char *what, int reps) {
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, A, m, B, m, &zero, C, m); cudaDeviceSynchronize();
        cudaMemset(counter, 0, 8); unsigned long long t0 = g_threads;
        cudaEventRecord(e0);
        for (int i = 0; i < reps; i++) cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, A, m, B, m, &zero, C, m);
        cudaEventRecord(e1); cudaEventSynchronize(e1);
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        unsigned long long cnt; cudaMemcpy(&cnt, counter, 8, cudaMemcpyDeviceToHost);
        printf("TIME %-40s %8.4f ms/gemm counter=%llu threads(cb)=%llu err=%s\n", what, ms / reps, cnt, g_threads - t0,
               cudaGetErrorString(cudaGetLastError()));
    };
    gemm("gemm standby", 10);
    printf("modules seen: %zu\n", mods.size());

        std::string ga = slurp((std::string(dir) + "/ga.cubin").c_str());
    std::string gb = slurp((std::string(dir) + "/gb.cubin").c_str());
    double t = now_ms();
    g_adding = 1; CK(sanitizerAddPatches(ga.data(), ctx)); g_adding = 0;
    printf("ADD gen A %.3f ms\n", now_ms() - t);

    CK(sanitizerEnableDomain(1, sub, SANITIZER_CB_DOMAIN_LAUNCH));
    g_set_data = 1;
    Rec r = {0, (unsigned long long)counter, 0, 0};
    cudaMemcpy(rec, &r, sizeof r, cudaMemcpyHostToDevice);
    timeit("launch callbacks on, nothing patched", 20);
    auto patch_all = [&](const char *what, const char *enter, const char *mem, int unpatch) {
        double t = now_ms(), tu = 0; int ok = 0; double worst = 0;
        for (auto &mo : mods) {
            double t1 = now_ms();
            if (unpatch) { CK(sanitizerUnpatchModule(mo.mod)); tu += now_ms() - t1; }
            SanitizerResult r1 = enter ? sanitizerPatchInstructions(SANITIZER_INSTRUCTION_BLOCK_ENTER, mo.mod, enter) : SANITIZER_SUCCESS;
            SanitizerResult r2 = mem ? sanitizerPatchInstructions(SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS, mo.mod, mem) : SANITIZER_SUCCESS;
            SanitizerResult r3 = sanitizerPatchModule(mo.mod);
            ok += r1 == 0 && r2 == 0 && r3 == 0;
            double dt = now_ms() - t1; if (dt > worst) worst = dt;
            if (!(r1 == 0 && r2 == 0 && r3 == 0)) printf("  patch %p: %d %d %d\n", (void *)mo.mod, r1, r2, r3);
        }
        printf("PATCH %-30s %zu modules (%d ok) in %.3f ms (unpatch %.3f ms, worst module %.3f ms)\n", what, mods.size(), ok, now_ms() - t, tu, worst);
    };
    for (auto &mo : mods) printf("module %p cubin %zu B\n", (void *)mo.mod, mo.size);
    patch_all("gen A enter (first patch)", "gA_enter", nullptr, 0);
    timeit("gen A enter (+1)", 20);
    gemm("gemm gen A enter", 10);
    patch_all("gen A enter+mem (repatch)", "gA_enter", "gA_mem", 1);
    timeit("gen A enter+mem (+1, +1/access)", 20);
    gemm("gemm gen A enter+mem", 10);
    t = now_ms();
    g_adding = 1; CK(sanitizerAddPatches(gb.data(), ctx)); g_adding = 0;
    printf("ADD gen B %.3f ms\n", now_ms() - t);
    patch_all("gen B direct (repatch)", "gB_direct", nullptr, 1);
    timeit("gen B direct (+100)", 20);
    gemm("gemm gen B direct", 10);
    patch_all("gen B enter, no unpatch", "gB_enter", nullptr, 0);
    timeit("gen B enter without unpatch (+2?)", 20);
    g_set_data = 0;
    timeit("patched, no callback data set", 20);
    g_set_data = 1;
    t = now_ms();
    for (auto &mo : mods) CK(sanitizerUnpatchModule(mo.mod));
    printf("UNPATCH all in %.3f ms\n", now_ms() - t);
    timeit("unpatched, callbacks on", 20);
    t = now_ms();
    CK(sanitizerEnableDomain(0, sub, SANITIZER_CB_DOMAIN_LAUNCH));
    printf("launch domain off in %.3f ms\n", now_ms() - t);
    timeit("back to standby", 20);
    gemm("gemm back to standby", 10);
    printf("launch callbacks seen: %llu\n", g_launches);
    return 0;
}
