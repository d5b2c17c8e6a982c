/* A stand-in for CUPTI's activity header: the few types and calls the injection library
 * uses, laid out as the tests' fake libcupti (fake_cupti.c) fills them. Versions 2 and 3
 * of each record, so the build must pick the newest. */
#ifndef FAKE_CUPTI_ACTIVITY_H
#define FAKE_CUPTI_ACTIVITY_H
#include <stddef.h>
#include <stdint.h>
#include "cuda.h"
#define CUPTIAPI
typedef enum { CUPTI_SUCCESS = 0, CUPTI_ERROR_MAX_LIMIT_REACHED = 12, CUPTI_ERROR_MULTIPLE_SUBSCRIBERS = 39 } CUptiResult;
typedef enum {
    CUPTI_ACTIVITY_KIND_MEMCPY = 1,
    CUPTI_ACTIVITY_KIND_MEMSET = 2,
    CUPTI_ACTIVITY_KIND_KERNEL = 3,
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL = 10,
} CUpti_ActivityKind;
typedef enum {
    CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN, CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, CUPTI_ACTIVITY_MEMCPY_KIND_DTOH,
    CUPTI_ACTIVITY_MEMCPY_KIND_HTOA, CUPTI_ACTIVITY_MEMCPY_KIND_ATOH, CUPTI_ACTIVITY_MEMCPY_KIND_ATOA,
    CUPTI_ACTIVITY_MEMCPY_KIND_ATOD, CUPTI_ACTIVITY_MEMCPY_KIND_DTOA, CUPTI_ACTIVITY_MEMCPY_KIND_DTOD,
    CUPTI_ACTIVITY_MEMCPY_KIND_HTOH, CUPTI_ACTIVITY_MEMCPY_KIND_PTOP,
} CUpti_ActivityMemcpyKind;
enum { CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE = 1, CUPTI_ACTIVITY_MEMORY_KIND_PINNED = 2 };
enum { CUPTI_ACTIVITY_FLAG_FLUSH_FORCED = 1 };
typedef struct { CUpti_ActivityKind kind; } CUpti_Activity;
typedef struct { CUpti_ActivityKind kind; uint64_t start, end; } CUpti_ActivityKernel2;
typedef struct {
    CUpti_ActivityKind kind;
    int32_t gridX, gridY, gridZ, blockX, blockY, blockZ;
    uint16_t registersPerThread;
    int32_t staticSharedMemory, dynamicSharedMemory;
    uint64_t start, end;
    uint32_t streamId;
    const char *name;
} CUpti_ActivityKernel3;
typedef struct { CUpti_ActivityKind kind; uint64_t bytes; } CUpti_ActivityMemcpy2;
typedef struct {
    CUpti_ActivityKind kind;
    uint8_t copyKind, srcKind, dstKind;
    uint64_t bytes, start, end;
    uint32_t streamId;
} CUpti_ActivityMemcpy3;
typedef struct { CUpti_ActivityKind kind; uint64_t bytes; } CUpti_ActivityMemset2;
typedef struct { CUpti_ActivityKind kind; uint64_t bytes, start, end; uint32_t streamId; } CUpti_ActivityMemset3;
typedef void (CUPTIAPI *CUpti_BuffersCallbackRequestFunc)(uint8_t **buffer, size_t *size, size_t *maxNumRecords);
typedef void (CUPTIAPI *CUpti_BuffersCallbackCompleteFunc)(CUcontext context, uint32_t streamId, uint8_t *buffer,
                                                           size_t size, size_t validSize);
CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind);
CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t validBufferSizeBytes, CUpti_Activity **record);
CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId, size_t *dropped);
CUptiResult cuptiActivityFlushAll(uint32_t flag);
CUptiResult cuptiGetTimestamp(uint64_t *timestamp);
CUptiResult cuptiGetResultString(CUptiResult result, const char **str);
#endif
