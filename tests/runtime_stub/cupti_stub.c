/* A stand-in libcupti.so for the durations tests: the calls runtime/durations.py makes.
 * cuptiActivityFlushAll hands over one buffer of CUpti_ActivityKernel-shaped records (kind at 0, start
 * at 16, end at 24, streamId at 48, grid at 52, block at 64, correlationId at 92, name pointer at 104)
 * described by EGPU_STUB_CUPTI: "name:ns,name:ns,...", plus one runtime-API-kind record that must be skipped.
 * Record i starts at STUB_T0 + 1000 i on stream 7 + i % 2, correlation id 100 + i, grid (i+1,1,1),
 * block (64,1,1); cuptiGetTimestamp says STUB_T0. Logs to EGPU_STUB_LOG like the stand-in driver.
 *
 * Copies, sets, syncs and unified-memory counters, each kind only once enabled (CUpti_ActivityMemcpy6,
 * CUpti_ActivityMemset4, CUpti_ActivityMemcpyPtoP4, CUpti_ActivitySynchronization2,
 * CUpti_ActivityUnifiedMemoryCounter3 offsets, runtime/copies.py and runtime/uvm.py):
 *   EGPU_STUB_CUPTI_COPIES "kind:detail:bytes:ns:stream,..."  (kind 1, 2, 22 or 38; detail: copyKind,
 *                                                             memoryKind or sync type), copy i at
 *                                                             STUB_T0 + 100 µs + 10 µs i, correlation id 200 + i
 *   EGPU_STUB_CUPTI_UVM "counter:address:value:ns:flags,..."  record i at STUB_T0 + 100 i, src 0, dst 1
 * cuptiActivityConfigureUnifiedMemoryCounter takes only the basic four counters (so egpu retries) and
 * logs each kind enabled; EGPU_STUB_CUPTI_NO_UVM=1 refuses every configuration. Every record is handed
 * over at the first cuptiActivityFlushAll, forced (1) or not (0). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RECORD 160
#define END_OF_BUFFER 12 /* CUPTI_ERROR_MAX_LIMIT_REACHED */
#define STUB_T0 1000000

typedef void (*request_fn)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*complete_fn)(void *ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid);
static request_fn on_request;
static complete_fn on_complete;
static uint64_t enabled; /* bit k: activity kind k on */

static void note(const char *what, unsigned v) {
    const char *path = getenv("EGPU_STUB_LOG");
    if (!path || !*path) return;
    char line[128];
    int n = snprintf(line, sizeof line, "%d %s %u\n", (int)getpid(), what, v);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd >= 0) {
        (void)!write(fd, line, n);
        close(fd);
    }
}

int cuptiActivityRegisterCallbacks(request_fn req, complete_fn done) {
    on_request = req;
    on_complete = done;
    return 0;
}

int cuptiActivityEnable(unsigned kind) {
    note("cuptiActivityEnable", kind);
    if (kind < 64) enabled |= 1ull << kind;
    return 0;
}

typedef struct { uint32_t scope, kind, device, enable; } um_config;

int cuptiActivityConfigureUnifiedMemoryCounter(um_config *config, uint32_t count) {
    const char *refuse = getenv("EGPU_STUB_CUPTI_NO_UVM");
    if (refuse && *refuse == '1') return 1; /* CUPTI_ERROR_INVALID_PARAMETER */
    for (uint32_t i = 0; i < count; i++)
        if (config[i].kind > 4 || config[i].scope != 1 || !config[i].enable) return 1;
    for (uint32_t i = 0; i < count; i++) note("cuptiActivityConfigureUnifiedMemoryCounter", config[i].kind);
    return 0;
}

/* The records EGPU_STUB_CUPTI_COPIES and EGPU_STUB_CUPTI_UVM describe, appended at buf + *valid. */
static void more_records(uint8_t *buf, size_t size, size_t *valid) {
    char copy[4096];
    const char *spec = getenv("EGPU_STUB_CUPTI_COPIES");
    snprintf(copy, sizeof copy, "%s", spec ? spec : "");
    int i = 0;
    for (char *tok = strtok(copy, ","); tok && *valid + RECORD <= size; tok = strtok(NULL, ","), i++) {
        unsigned kind, detail, stream;
        unsigned long long bytes, ns;
        if (sscanf(tok, "%u:%u:%llu:%llu:%u", &kind, &detail, &bytes, &ns, &stream) != 5) continue;
        if (kind >= 64 || !(enabled & 1ull << kind)) continue;
        uint8_t *r = buf + *valid;
        memset(r, 0, RECORD);
        uint64_t start = STUB_T0 + 100000 + 10000 * i, end = start + ns;
        uint32_t corr = 200 + i, device = 0;
        memcpy(r, &kind, 4);
        if (kind == 38) { /* CUpti_ActivitySynchronization2 */
            memcpy(r + 4, &detail, 4);
            memcpy(r + 8, &start, 8);
            memcpy(r + 16, &end, 8);
            memcpy(r + 24, &corr, 4);
            memcpy(r + 32, &stream, 4);
        } else {
            if (kind == 2) { /* memset: memoryKind at 50 */
                uint16_t memory = detail;
                memcpy(r + 50, &memory, 2);
            } else {
                uint8_t direction = detail;
                memcpy(r + 4, &direction, 1);
            }
            memcpy(r + 8, &bytes, 8);
            memcpy(r + 16, &start, 8);
            memcpy(r + 24, &end, 8);
            memcpy(r + 32, &device, 4);
            memcpy(r + 40, &stream, 4);
            memcpy(r + (kind == 22 ? 60 : 44), &corr, 4);
        }
        *valid += RECORD;
    }
    if (!(enabled & 1ull << 25)) return;
    spec = getenv("EGPU_STUB_CUPTI_UVM");
    snprintf(copy, sizeof copy, "%s", spec ? spec : "");
    i = 0;
    for (char *tok = strtok(copy, ","); tok && *valid + RECORD <= size; tok = strtok(NULL, ","), i++) {
        unsigned counter, flags;
        unsigned long long address, value, ns;
        if (sscanf(tok, "%u:%llx:%llu:%llu:%u", &counter, &address, &value, &ns, &flags) != 5) continue;
        uint8_t *r = buf + *valid;
        memset(r, 0, RECORD);
        uint32_t kind = 25, src = 0, dst = 1, stream = 7, pid = (uint32_t)getpid();
        uint64_t start = STUB_T0 + 100 * i, end = start + ns;
        memcpy(r, &kind, 4);
        memcpy(r + 4, &counter, 4);
        memcpy(r + 8, &value, 8);
        memcpy(r + 16, &start, 8);
        memcpy(r + 24, &end, 8);
        memcpy(r + 32, &address, 8);
        memcpy(r + 40, &src, 4);
        memcpy(r + 44, &dst, 4);
        memcpy(r + 48, &stream, 4);
        memcpy(r + 52, &pid, 4);
        memcpy(r + 56, &flags, 4);
        *valid += RECORD;
    }
}

int cuptiGetTimestamp(uint64_t *ts) {
    *ts = STUB_T0;
    return 0;
}

static char names[64][128];

int cuptiActivityFlushAll(unsigned flag) {
    note("cuptiActivityFlushAll", flag);
    if (!enabled || !on_request) return 0;
    static int flushed; /* records are handed over once, at the first flush */
    if (flushed++) return 0;
    uint8_t *buf = NULL;
    size_t size = 0, max = 0, valid = 0;
    on_request(&buf, &size, &max);
    const char *spec = getenv("EGPU_STUB_CUPTI");
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", spec ? spec : "");
    int i = 0;
    for (char *tok = strtok(copy, ","); tok && i < 64 && valid + 2 * RECORD <= size && (enabled & 1ull << 10);
         tok = strtok(NULL, ","), i++) {
        char *colon = strrchr(tok, ':');
        if (!colon) continue;
        *colon = 0;
        snprintf(names[i], sizeof names[i], "%s", tok);
        uint8_t *r = buf + valid;
        memset(r, 0, RECORD);
        uint32_t kind = i == 1 ? 5 : 10; /* the second slot: a CUPTI_ACTIVITY_KIND_RUNTIME first */
        if (kind == 5) {
            memcpy(r, &kind, 4);
            valid += RECORD;
            r += RECORD;
            memset(r, 0, RECORD);
            kind = 10;
        }
        uint64_t start = STUB_T0 + 1000 * i, end = start + strtoull(colon + 1, NULL, 10);
        const char *name = names[i];
        uint32_t stream = 7 + i % 2, correlation = 100 + i;
        int32_t dims[6] = {i + 1, 1, 1, 64, 1, 1};
        memcpy(r, &kind, 4);
        memcpy(r + 16, &start, 8);
        memcpy(r + 24, &end, 8);
        memcpy(r + 48, &stream, 4);
        memcpy(r + 52, dims, sizeof dims);
        memcpy(r + 92, &correlation, 4);
        memcpy(r + 104, &name, sizeof name);
        valid += RECORD;
    }
    more_records(buf, size, &valid);
    on_complete(NULL, 0, buf, size, valid);
    note("records handed over", (unsigned)(valid / RECORD));
    return 0;
}

int cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, void **record) {
    uint8_t *next = *record ? (uint8_t *)*record + RECORD : buffer;
    if (next + RECORD > buffer + valid) return END_OF_BUFFER;
    *record = next;
    return 0;
}
