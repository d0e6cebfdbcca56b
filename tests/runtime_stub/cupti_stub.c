/* A stand-in libcupti.so for the durations tests: the calls runtime/durations.py makes.
 * cuptiActivityFlushAll hands over one buffer of CUpti_ActivityKernel-shaped records (kind at 0, start
 * at 16, end at 24, streamId at 48, grid at 52, block at 64, correlationId at 92, name pointer at 104)
 * described by EGPU_STUB_CUPTI: "name:ns,name:ns,...", plus one memcpy-kind record that must be skipped.
 * Record i starts at STUB_T0 + 1000 i on stream 7 + i % 2, correlation id 100 + i, grid (i+1,1,1),
 * block (64,1,1); cuptiGetTimestamp says STUB_T0. Logs to EGPU_STUB_LOG like the stand-in driver. */
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
static int enabled;

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
    enabled = kind == 10;
    return 0;
}

int cuptiGetTimestamp(uint64_t *ts) {
    *ts = STUB_T0;
    return 0;
}

static char names[64][128];

int cuptiActivityFlushAll(unsigned flag) {
    note("cuptiActivityFlushAll", flag);
    if (!enabled || !on_request) return 0;
    uint8_t *buf = NULL;
    size_t size = 0, max = 0, valid = 0;
    on_request(&buf, &size, &max);
    const char *spec = getenv("EGPU_STUB_CUPTI");
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", spec ? spec : "");
    int i = 0;
    for (char *tok = strtok(copy, ","); tok && i < 64 && valid + 2 * RECORD <= size; tok = strtok(NULL, ","), i++) {
        char *colon = strrchr(tok, ':');
        if (!colon) continue;
        *colon = 0;
        snprintf(names[i], sizeof names[i], "%s", tok);
        uint8_t *r = buf + valid;
        memset(r, 0, RECORD);
        uint32_t kind = i == 1 ? 1 : 10; /* the second slot: a CUPTI_ACTIVITY_KIND_MEMCPY first */
        if (kind == 1) {
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
    on_complete(NULL, 0, buf, size, valid);
    return 0;
}

int cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, void **record) {
    uint8_t *next = *record ? (uint8_t *)*record + RECORD : buffer;
    if (next + RECORD > buffer + valid) return END_OF_BUFFER;
    *record = next;
    return 0;
}
