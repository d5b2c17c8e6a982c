/* A native CUDA program for tests/gpu: the driver API and a PTX kernel that spins for a
 * given time on the GPU's global timer. It uploads 64 MiB of pageable memory, launches one
 * kernel to warm up and N more between two events, and prints the events' time. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *PTX =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry spin(.param .u64 ns)\n{\n"
    "  .reg .u64 %t<3>;\n  .reg .pred %p;\n"
    "  ld.param.u64 %t1, [ns];\n  mov.u64 %t0, %globaltimer;\n  add.u64 %t1, %t0, %t1;\n"
    "LOOP:\n  mov.u64 %t2, %globaltimer;\n  setp.lt.u64 %p, %t2, %t1;\n  @%p bra LOOP;\n  ret;\n}\n";

#define CHECK(call)                                                                 \
    do {                                                                            \
        CUresult r_ = (call);                                                       \
        if (r_ != CUDA_SUCCESS) {                                                   \
            const char *s_ = "?";                                                   \
            cuGetErrorString(r_, &s_);                                              \
            fprintf(stderr, "%s: %s\n", #call, s_);                                 \
            return 1;                                                               \
        }                                                                           \
    } while (0)

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20;
    unsigned long long ns = argc > 2 ? strtoull(argv[2], NULL, 10) : 5000000ull;
    CUdevice device;
    CUcontext context;
    CUmodule module;
    CUfunction spin;
    CUevent start, end;
    CUdeviceptr buffer;
    size_t bytes = 64u << 20;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuDevicePrimaryCtxRetain(&context, device));
    CHECK(cuCtxSetCurrent(context));
    CHECK(cuModuleLoadData(&module, PTX));
    CHECK(cuModuleGetFunction(&spin, module, "spin"));
    char *host = malloc(bytes);
    memset(host, 1, bytes);
    CHECK(cuMemAlloc(&buffer, bytes));
    CHECK(cuMemcpyHtoD(buffer, host, bytes));
    void *args[] = {&ns};
    CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuEventCreate(&start, 0));
    CHECK(cuEventCreate(&end, 0));
    CHECK(cuEventRecord(start, NULL));
    for (int i = 0; i < n; i++) CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
    CHECK(cuEventRecord(end, NULL));
    CHECK(cuEventSynchronize(end));
    float ms = 0;
    CHECK(cuEventElapsedTime(&ms, start, end));
    printf("EVENTS_MS=%.3f\n", ms);
    CHECK(cuMemFree(buffer));
    free(host);
    CHECK(cuDevicePrimaryCtxRelease(device));
    return 0;
}
