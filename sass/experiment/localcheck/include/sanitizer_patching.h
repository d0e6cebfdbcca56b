/* LOCAL SYNTAX CHECK ONLY: a minimal stand-in for the real header, written from the public docs
 * (docs.nvidia.com/compute-sanitizer/api). run.sh builds against the real header on the GPU machine. */
#pragma once
#include <stdint.h>
#include <cuda.h>
#define SANITIZERAPI
typedef enum { SANITIZER_PATCH_SUCCESS = 0, SANITIZER_PATCH_ERROR = 1 } SanitizerPatchResult;
typedef enum { SANITIZER_MEMORY_DEVICE_FLAG_NONE = 0, SANITIZER_MEMORY_DEVICE_FLAG_READ = 1,
               SANITIZER_MEMORY_DEVICE_FLAG_WRITE = 2, SANITIZER_MEMORY_DEVICE_FLAG_ATOMSYS = 4,
               SANITIZER_MEMORY_DEVICE_FLAG_PREFETCH = 8 } Sanitizer_DeviceMemoryFlags;
typedef enum { SANITIZER_INSTRUCTION_INVALID = 0, SANITIZER_INSTRUCTION_BLOCK_ENTER = 1,
               SANITIZER_INSTRUCTION_BLOCK_EXIT = 2,
               SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS = 3 } Sanitizer_InstructionId;
typedef struct Sanitizer_Stream_st* Sanitizer_StreamHandle;
typedef struct Sanitizer_Launch_st* Sanitizer_LaunchHandle;
typedef enum { SANITIZER_SUCCESS = 0 } SanitizerResult;
#if defined(__cplusplus)
extern "C" {
#endif
SanitizerResult sanitizerAddPatchesFromFile(const char* filename, CUcontext ctx);
SanitizerResult sanitizerAddPatches(const void* image, CUcontext ctx);
SanitizerResult sanitizerPatchInstructions(const Sanitizer_InstructionId id, CUmodule module, const char* name);
SanitizerResult sanitizerPatchModule(CUmodule module);
SanitizerResult sanitizerSetCallbackData(CUfunction kernel, const void* userdata);
SanitizerResult sanitizerSetLaunchCallbackData(Sanitizer_LaunchHandle launch, CUfunction kernel,
                                               Sanitizer_StreamHandle stream, const void* userdata);
#if defined(__cplusplus)
}
#endif
