/* LOCAL SYNTAX CHECK ONLY (see sanitizer_patching.h here). */
#pragma once
#include "sanitizer_patching.h"
typedef uint32_t Sanitizer_CallbackId;
typedef struct Sanitizer_Subscriber_st* Sanitizer_SubscriberHandle;
typedef enum { SANITIZER_CB_DOMAIN_RESOURCE = 3, SANITIZER_CB_DOMAIN_LAUNCH = 5 } Sanitizer_CallbackDomain;
enum { SANITIZER_CBID_RESOURCE_CONTEXT_CREATION_FINISHED = 3, SANITIZER_CBID_RESOURCE_MODULE_LOADED = 9,
       SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_LOADED = 24 };
enum { SANITIZER_CBID_LAUNCH_BEGIN = 1, SANITIZER_CBID_LAUNCH_END = 3 };
typedef void (*Sanitizer_CallbackFunc)(void* userdata, Sanitizer_CallbackDomain domain, Sanitizer_CallbackId cbid,
                                       const void* cbdata);
typedef struct { CUcontext context; CUmodule module; size_t cubinSize; const char* pCubin; CUlibrary library; }
    Sanitizer_ResourceModuleData;
typedef struct { CUcontext context; CUdevice device; } Sanitizer_ResourceContextData;
typedef struct {
    CUcontext context; CUstream stream; Sanitizer_StreamHandle hStream; CUdevice device; CUmodule module;
    CUfunction function; const char* functionName; uint64_t gridId; Sanitizer_LaunchHandle hLaunch;
    uint32_t gridDim_x, gridDim_y, gridDim_z, blockDim_x, blockDim_y, blockDim_z;
} Sanitizer_LaunchData;
extern "C" {
SanitizerResult sanitizerSubscribe(Sanitizer_SubscriberHandle* sub, Sanitizer_CallbackFunc cb, void* userdata);
SanitizerResult sanitizerEnableDomain(uint32_t enable, Sanitizer_SubscriberHandle sub, Sanitizer_CallbackDomain d);
SanitizerResult sanitizerGetResultString(SanitizerResult result, const char** str);
SanitizerResult sanitizerAlloc(CUcontext ctx, void** devPtr, size_t size);
SanitizerResult sanitizerMemcpyHostToDeviceAsync(void* dst, void* src, size_t count, Sanitizer_StreamHandle s);
SanitizerResult sanitizerMemcpyDeviceToHost(void* dst, void* src, size_t count, Sanitizer_StreamHandle s);
SanitizerResult sanitizerStreamSynchronize(Sanitizer_StreamHandle s);
SanitizerResult sanitizerGetStreamHandle(CUcontext ctx, CUstream stream, Sanitizer_StreamHandle* h);
}
