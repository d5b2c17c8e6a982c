/* pytest-gpuprof's CUPTI injection library, for the native programs a test starts.
 *
 * The CUDA driver loads it in each process that starts CUDA while CUDA_INJECTION64_PATH
 * names it, and calls InitializeInjection. It does nothing unless the test set
 * PYTEST_GPUPROF_CHILDREN (a folder), or where this process's Python start-up hook records
 * its work with cupti-python already (PYTEST_GPUPROF_PYTHON_PID is this pid). Otherwise it
 * records the process's kernels, copies and memsets with CUPTI's activity API and writes:
 *
 *   FOLDER/PID.json    at start: {"command": ..., "started": NS, "native": 1[, "rank": N]}
 *                      or {"command": ..., "started": NS, "refused": WHY}
 *   FOLDER/PID.native  at exit, whole (written as PID.native.tmp, then renamed), one line
 *                      a record, times in CLOCK_MONOTONIC ns (Python's perf_counter_ns):
 *     k START END STREAM BLOCKS THREADS REGISTERS SHARED NAME
 *     c START END STREAM BYTES COPYKIND PAGEABLE
 *     m START END STREAM BYTES
 *     dropped N
 *
 * CUPTI's timestamps are paired with CLOCK_MONOTONIC once, at start: the pair with the
 * shortest bracket of 16, its error half that bracket (printed as "pairing NS").
 * No libpython: it runs in any process. Record layouts are the header's newest
 * (GPUPROF_KERNEL, GPUPROF_MEMCPY, GPUPROF_MEMSET, chosen by the build).
 */
#define _GNU_SOURCE
#include <cupti.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef GPUPROF_KERNEL
#error "build with -DGPUPROF_KERNEL=CUpti_ActivityKernelN (the header's newest)"
#endif
#ifndef GPUPROF_MEMCPY
#error "build with -DGPUPROF_MEMCPY=CUpti_ActivityMemcpyN"
#endif
#ifndef GPUPROF_MEMSET
#error "build with -DGPUPROF_MEMSET=CUpti_ActivityMemsetN"
#endif

#define BUFFER_BYTES (8u << 20)

static char folder[4096];
static char records_tmp[4200];
static FILE *records;
static pthread_mutex_t records_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t offset_ns; /* CLOCK_MONOTONIC minus CUPTI's clock */
static pid_t owner;

static int64_t monotonic_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* the command line, JSON-escaped, at most 300 bytes of it */
static void command(char *out, size_t room) {
    char raw[300];
    size_t n = 0, o = 0;
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (f) {
        n = fread(raw, 1, sizeof raw, f);
        fclose(f);
    }
    for (size_t i = 0; i < n && o + 7 < room; i++) {
        unsigned char c = (unsigned char)raw[i];
        if (c == 0) {
            if (i + 1 < n) out[o++] = ' ';
        } else if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c < 0x20) {
            o += (size_t)snprintf(out + o, room - o, "\\u%04x", c);
        } else {
            out[o++] = (char)c;
        }
    }
    out[o] = 0;
}

/* whether FOLDER is still the test's: a real folder of this user's that no one else can
   write in (a process that outlives its test finds it gone, or re-made by someone else) */
static int own_folder(void) {
    struct stat info;
    if (lstat(folder, &info) != 0) return 0;
    return S_ISDIR(info.st_mode) && info.st_uid == geteuid() && !(info.st_mode & (S_IWGRP | S_IWOTH));
}

/* a new file of its own in FOLDER: created, never opened through a link or over one there */
static FILE *create_new(const char *path) {
    if (!own_folder()) return NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "w");
    if (!f) close(fd);
    return f;
}

/* write TEXT to FOLDER/PID.SUFFIX whole: a new temporary file, then renamed */
static void write_whole(const char *suffix, const char *text) {
    char path[4200], tmp[4210];
    snprintf(path, sizeof path, "%s/%d.%s", folder, (int)owner, suffix);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = create_new(tmp);
    if (!f) return;
    fputs(text, f);
    if (fclose(f) == 0 && own_folder()) rename(tmp, path);
    else unlink(tmp);
}

static void say(const char *field, const char *value, int64_t started) {
    char cmd[2100], text[4400];
    command(cmd, sizeof cmd);
    const char *rank = getenv("RANK");
    char rank_field[64] = "";
    if (rank && *rank && strspn(rank, "0123456789") == strlen(rank) && strlen(rank) < 10)
        snprintf(rank_field, sizeof rank_field, ", \"rank\": %s", rank);
    if (value)
        snprintf(text, sizeof text, "{\"command\": \"%s\", \"started\": %lld, \"%s\": \"%s\"%s}", cmd,
                 (long long)started, field, value, rank_field);
    else
        snprintf(text, sizeof text, "{\"command\": \"%s\", \"started\": %lld, \"native\": 1%s}", cmd,
                 (long long)started, rank_field);
    write_whole("json", text);
}

static const char *copy_kind(uint32_t kind) {
    switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HTOD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DTOH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return "HTOA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return "ATOH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA: return "ATOA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD: return "ATOD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return "DTOA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DTOD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HTOH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PTOP";
    default: return "copy";
    }
}

static long long at(uint64_t t) { return (long long)((int64_t)t + offset_ns); }

static void write_record(const CUpti_Activity *record) {
    switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const GPUPROF_KERNEL *k = (const GPUPROF_KERNEL *)record;
        long long blocks = (long long)k->gridX * k->gridY * k->gridZ;
        long long threads = (long long)k->blockX * k->blockY * k->blockZ;
        long long shared = (long long)k->staticSharedMemory + k->dynamicSharedMemory;
        fprintf(records, "k %lld %lld %u %lld %lld %u %lld %s\n", at(k->start), at(k->end), k->streamId, blocks,
                threads, (unsigned)k->registersPerThread, shared, k->name && *k->name ? k->name : "?");
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const GPUPROF_MEMCPY *c = (const GPUPROF_MEMCPY *)record;
        int pageable = c->srcKind == CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE || c->dstKind == CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE;
        fprintf(records, "c %lld %lld %u %llu %s %d\n", at(c->start), at(c->end), c->streamId,
                (unsigned long long)c->bytes, copy_kind(c->copyKind), pageable);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const GPUPROF_MEMSET *m = (const GPUPROF_MEMSET *)record;
        fprintf(records, "m %lld %lld %u %llu\n", at(m->start), at(m->end), m->streamId, (unsigned long long)m->bytes);
        break;
    }
    default:
        break;
    }
}

static void CUPTIAPI requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI completed(CUcontext context, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)size;
    CUpti_Activity *record = NULL;
    pthread_mutex_lock(&records_lock);
    if (records) {
        while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) write_record(record);
        size_t dropped = 0;
        if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS && dropped)
            fprintf(records, "dropped %zu\n", dropped);
    }
    pthread_mutex_unlock(&records_lock);
    free(buffer);
}

static void finish(void) {
    if (getpid() != owner) return; /* a forked copy: its parent writes */
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&records_lock);
    if (records) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%d.native", folder, (int)owner);
        if (fclose(records) == 0 && own_folder()) rename(records_tmp, path);
        else unlink(records_tmp);
        records = NULL;
    }
    pthread_mutex_unlock(&records_lock);
}

/* CUPTI's clock against CLOCK_MONOTONIC: the tightest of 16 brackets */
static void pair_clocks(void) {
    int64_t best = INT64_MAX;
    for (int i = 0; i < 16; i++) {
        uint64_t cupti = 0;
        int64_t before = monotonic_ns();
        cuptiGetTimestamp(&cupti);
        int64_t after = monotonic_ns();
        if (after - before < best) {
            best = after - before;
            offset_ns = before + (after - before) / 2 - (int64_t)cupti;
        }
    }
    if (records) fprintf(records, "pairing %lld\n", (long long)(best / 2));
}

static const char *refused(CUptiResult result) {
    static const char *text;
    text = "unknown error";
    cuptiGetResultString(result, &text);
    return text;
}

__attribute__((visibility("default"))) int InitializeInjection(void) {
    const char *told = getenv("PYTEST_GPUPROF_CHILDREN");
    const char *python = getenv("PYTEST_GPUPROF_PYTHON_PID");
    owner = getpid();
    if (!told || !*told || strlen(told) >= sizeof folder) return 1;
    if (python && atoi(python) == (int)owner) return 1; /* cupti-python records this one */
    strcpy(folder, told);
    int64_t started = monotonic_ns();
    snprintf(records_tmp, sizeof records_tmp, "%s/%d.native.tmp", folder, (int)owner);
    records = create_new(records_tmp);
    if (!records) return 1; /* the folder is gone, or not the test's: the test has ended */
    fputs("# pytest-gpuprof native records 1\n", records);
    CUptiResult r = cuptiActivityRegisterCallbacks(requested, completed);
    static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                               CUPTI_ACTIVITY_KIND_MEMSET};
    for (size_t i = 0; r == CUPTI_SUCCESS && i < sizeof kinds / sizeof kinds[0]; i++) r = cuptiActivityEnable(kinds[i]);
    if (r != CUPTI_SUCCESS) {
        char why[300];
        snprintf(why, sizeof why, "CUPTI refused the injection library: %s", refused(r));
        fclose(records);
        records = NULL;
        unlink(records_tmp);
        say("refused", why, started);
        return 1;
    }
    pair_clocks();
    say(NULL, NULL, started);
    atexit(finish);
    return 1;
}
