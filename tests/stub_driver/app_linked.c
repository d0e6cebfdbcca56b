/* Reaches the driver like Triton's stub: linked against libcuda, calling its symbols directly
 * (under LD_PRELOAD they bind to the shim's exported hooks). Generated symbol list: every symbol
 * app_common.h resolves. */
#include "app_common.h"

extern int cuCtxSynchronize();
extern int cuFuncGetAttribute();
extern int cuFuncSetAttribute();
extern int cuGetExportTable();
extern int cuGraphAddKernelNode();
extern int cuGraphAddKernelNode_v2();
extern int cuGraphAddNode();
extern int cuGraphAddNode_v2();
extern int cuGraphExecKernelNodeSetParams();
extern int cuGraphExecKernelNodeSetParams_v2();
extern int cuGraphExecNodeSetParams();
extern int cuGraphInstantiateWithFlags();
extern int cuGraphKernelNodeSetParams();
extern int cuGraphKernelNodeSetParams_v2();
extern int cuGraphNodeSetParams();
extern int cuInit();
extern int cuKernelGetAttribute();
extern int cuKernelGetFunction();
extern int cuLaunchCooperativeKernel();
extern int cuLaunchCooperativeKernel_ptsz();
extern int cuLaunchKernel();
extern int cuLaunchKernelEx();
extern int cuLaunchKernelEx_ptsz();
extern int cuLaunchKernel_ptsz();
extern int cuLibraryGetKernel();
extern int cuLibraryGetModule();
extern int cuLibraryLoadData();
extern int cuLibraryLoadFromFile();
extern int cuLibraryUnload();
extern int cuLinkAddData_v2();
extern int cuLinkAddFile_v2();
extern int cuLinkComplete();
extern int cuLinkCreate_v2();
extern int cuLinkDestroy();
extern int cuMemAlloc();
extern int cuMemAllocAsync();
extern int cuMemAllocAsync_ptsz();
extern int cuMemAllocFromPoolAsync();
extern int cuMemAllocFromPoolAsync_ptsz();
extern int cuMemAllocHost_v2();
extern int cuMemAllocManaged();
extern int cuMemAllocPitch_v2();
extern int cuMemAlloc_v2();
extern int cuMemCreate();
extern int cuMemFreeAsync();
extern int cuMemFreeHost();
extern int cuMemFree_v2();
extern int cuMemHostAlloc();
extern int cuMemHostRegister_v2();
extern int cuMemHostUnregister();
extern int cuMemMap();
extern int cuMemRelease();
extern int cuMemUnmap();
extern int cuMemcpy_ptds();
extern int cuModuleEnumerateFunctions();
extern int cuModuleGetFunction();
extern int cuModuleLoad();
extern int cuModuleLoadData();
extern int cuModuleLoadDataEx();
extern int cuModuleLoadFatBinary();
extern int cuModuleUnload();
extern int cuOccupancyMaxActiveBlocksPerMultiprocessor();

static const struct { const char *symbol; void *address; } linked[] = {
    {"cuCtxSynchronize", (void *)cuCtxSynchronize},
    {"cuFuncGetAttribute", (void *)cuFuncGetAttribute},
    {"cuFuncSetAttribute", (void *)cuFuncSetAttribute},
    {"cuGetExportTable", (void *)cuGetExportTable},
    {"cuGraphAddKernelNode", (void *)cuGraphAddKernelNode},
    {"cuGraphAddKernelNode_v2", (void *)cuGraphAddKernelNode_v2},
    {"cuGraphAddNode", (void *)cuGraphAddNode},
    {"cuGraphAddNode_v2", (void *)cuGraphAddNode_v2},
    {"cuGraphExecKernelNodeSetParams", (void *)cuGraphExecKernelNodeSetParams},
    {"cuGraphExecKernelNodeSetParams_v2", (void *)cuGraphExecKernelNodeSetParams_v2},
    {"cuGraphExecNodeSetParams", (void *)cuGraphExecNodeSetParams},
    {"cuGraphInstantiateWithFlags", (void *)cuGraphInstantiateWithFlags},
    {"cuGraphKernelNodeSetParams", (void *)cuGraphKernelNodeSetParams},
    {"cuGraphKernelNodeSetParams_v2", (void *)cuGraphKernelNodeSetParams_v2},
    {"cuGraphNodeSetParams", (void *)cuGraphNodeSetParams},
    {"cuInit", (void *)cuInit},
    {"cuKernelGetAttribute", (void *)cuKernelGetAttribute},
    {"cuKernelGetFunction", (void *)cuKernelGetFunction},
    {"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel},
    {"cuLaunchCooperativeKernel_ptsz", (void *)cuLaunchCooperativeKernel_ptsz},
    {"cuLaunchKernel", (void *)cuLaunchKernel},
    {"cuLaunchKernelEx", (void *)cuLaunchKernelEx},
    {"cuLaunchKernelEx_ptsz", (void *)cuLaunchKernelEx_ptsz},
    {"cuLaunchKernel_ptsz", (void *)cuLaunchKernel_ptsz},
    {"cuLibraryGetKernel", (void *)cuLibraryGetKernel},
    {"cuLibraryGetModule", (void *)cuLibraryGetModule},
    {"cuLibraryLoadData", (void *)cuLibraryLoadData},
    {"cuLibraryLoadFromFile", (void *)cuLibraryLoadFromFile},
    {"cuLibraryUnload", (void *)cuLibraryUnload},
    {"cuLinkAddData_v2", (void *)cuLinkAddData_v2},
    {"cuLinkAddFile_v2", (void *)cuLinkAddFile_v2},
    {"cuLinkComplete", (void *)cuLinkComplete},
    {"cuLinkCreate_v2", (void *)cuLinkCreate_v2},
    {"cuLinkDestroy", (void *)cuLinkDestroy},
    {"cuMemAlloc", (void *)cuMemAlloc},
    {"cuMemAllocAsync", (void *)cuMemAllocAsync},
    {"cuMemAllocAsync_ptsz", (void *)cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync},
    {"cuMemAllocFromPoolAsync_ptsz", (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemAllocHost_v2", (void *)cuMemAllocHost_v2},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged},
    {"cuMemAllocPitch_v2", (void *)cuMemAllocPitch_v2},
    {"cuMemAlloc_v2", (void *)cuMemAlloc_v2},
    {"cuMemCreate", (void *)cuMemCreate},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync},
    {"cuMemFreeHost", (void *)cuMemFreeHost},
    {"cuMemFree_v2", (void *)cuMemFree_v2},
    {"cuMemHostAlloc", (void *)cuMemHostAlloc},
    {"cuMemHostRegister_v2", (void *)cuMemHostRegister_v2},
    {"cuMemHostUnregister", (void *)cuMemHostUnregister},
    {"cuMemMap", (void *)cuMemMap},
    {"cuMemRelease", (void *)cuMemRelease},
    {"cuMemUnmap", (void *)cuMemUnmap},
    {"cuMemcpy_ptds", (void *)cuMemcpy_ptds},
    {"cuModuleEnumerateFunctions", (void *)cuModuleEnumerateFunctions},
    {"cuModuleGetFunction", (void *)cuModuleGetFunction},
    {"cuModuleLoad", (void *)cuModuleLoad},
    {"cuModuleLoadData", (void *)cuModuleLoadData},
    {"cuModuleLoadDataEx", (void *)cuModuleLoadDataEx},
    {"cuModuleLoadFatBinary", (void *)cuModuleLoadFatBinary},
    {"cuModuleUnload", (void *)cuModuleUnload},
    {"cuOccupancyMaxActiveBlocksPerMultiprocessor", (void *)cuOccupancyMaxActiveBlocksPerMultiprocessor},
};

static void *by_link(const char *api, int version, unsigned long long flags, const char *symbol) {
    for (size_t i = 0; i < sizeof linked / sizeof linked[0]; i++)
        if (!strcmp(linked[i].symbol, symbol)) return linked[i].address;
    return NULL;
}

int main(int argc, char **argv) { return app_main(argc, argv, by_link); }
