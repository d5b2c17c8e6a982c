/* A stand-in libcupti for the CPU tests: at the flush, one buffer with a 2 ms kernel that
 * ended 1 ms before, a pageable 4096-byte upload and a 512-byte memset, on CLOCK_REALTIME
 * (CUPTI's clock on Linux). FAKE_CUPTI_REFUSE makes it refuse the registration. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cupti_activity.h"

static CUpti_BuffersCallbackRequestFunc requested;
static CUpti_BuffersCallbackCompleteFunc completed;

static uint64_t now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc r, CUpti_BuffersCallbackCompleteFunc c) {
    if (getenv("FAKE_CUPTI_REFUSE")) return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS;
    requested = r;
    completed = c;
    return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) { (void)kind; return CUPTI_SUCCESS; }
CUptiResult cuptiGetTimestamp(uint64_t *t) { *t = now(); return CUPTI_SUCCESS; }
CUptiResult cuptiGetResultString(CUptiResult r, const char **s) {
    *s = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS ? "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED" : "CUPTI_ERROR_UNKNOWN";
    return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext c, uint32_t s, size_t *d) { (void)c; (void)s; *d = 0; return CUPTI_SUCCESS; }

static size_t size_of(const CUpti_Activity *r) {
    switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return sizeof(CUpti_ActivityKernel3);
    case CUPTI_ACTIVITY_KIND_MEMCPY: return sizeof(CUpti_ActivityMemcpy3);
    default: return sizeof(CUpti_ActivityMemset3);
    }
}

CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, CUpti_Activity **record) {
    uint8_t *next = *record ? (uint8_t *)*record + ((size_of(*record) + 7) & ~(size_t)7) : buffer;
    if (next >= buffer + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)next;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityFlushAll(uint32_t flag) {
    (void)flag;
    if (!requested) return CUPTI_SUCCESS;
    uint8_t *buffer;
    size_t size, max;
    requested(&buffer, &size, &max);
    memset(buffer, 0, 1024);
    uint64_t t = now();
    CUpti_ActivityKernel3 *k = (CUpti_ActivityKernel3 *)buffer;
    k->kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k->gridX = 4, k->gridY = k->gridZ = 1, k->blockX = 256, k->blockY = k->blockZ = 1;
    k->registersPerThread = 32, k->staticSharedMemory = 1024, k->dynamicSharedMemory = 0;
    k->start = t - 3000000, k->end = t - 1000000, k->streamId = 7, k->name = "_Z4spinPy";
    size_t at = (sizeof *k + 7) & ~(size_t)7;
    CUpti_ActivityMemcpy3 *c = (CUpti_ActivityMemcpy3 *)(buffer + at);
    c->kind = CUPTI_ACTIVITY_KIND_MEMCPY, c->copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
    c->srcKind = CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE, c->dstKind = 3;
    c->bytes = 4096, c->start = t - 4000000, c->end = t - 3500000, c->streamId = 7;
    at += (sizeof *c + 7) & ~(size_t)7;
    CUpti_ActivityMemset3 *m = (CUpti_ActivityMemset3 *)(buffer + at);
    m->kind = CUPTI_ACTIVITY_KIND_MEMSET, m->bytes = 512, m->start = t - 900000, m->end = t - 800000, m->streamId = 7;
    at += (sizeof *m + 7) & ~(size_t)7;
    completed(NULL, 0, buffer, size, at);
    requested = NULL;
    return CUPTI_SUCCESS;
}
