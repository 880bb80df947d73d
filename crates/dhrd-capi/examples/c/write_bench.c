/* Durable 4 KiB random writes through the C API against the same writes made raw
 * (O_DIRECT|O_DSYNC pwrite on the same file): THREADS writers for SECS seconds each.
 * Prints one JSON line: {"mode": ..., "threads": N, "iops": X, "lat_us_mean": Y}.
 *
 * Usage: write_bench dhrd|raw FILE THREADS SECS
 * The file must exist; the writes land anywhere in it, at 4 KiB-aligned random offsets.
 * Build: cc -O2 -I crates/dhrd-capi/include write_bench.c target/release/libdhrd_capi.a \
 *        -lpthread -ldl -lm -o write_bench */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "dhrd.h"

#define IO_BYTES 4096

struct worker {
    int raw_fd;
    dhrd_object *obj;
    uint64_t blocks;
    uint64_t seed;
    volatile int *stop;
    uint64_t ops;
    double lat_ns_sum;
    int failed;
};

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static uint64_t next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void *run(void *arg) {
    struct worker *w = arg;
    void *buf = NULL;
    if (posix_memalign(&buf, IO_BYTES, IO_BYTES) != 0) {
        w->failed = 1;
        return NULL;
    }
    memset(buf, (int)(w->seed & 0xff) | 1, IO_BYTES);
    while (!*w->stop) {
        uint64_t off = (next(&w->seed) % w->blocks) * IO_BYTES;
        double t0 = now_ns();
        int err;
        if (w->obj) {
            err = dhrd_write(w->obj, buf, IO_BYTES, off);
        } else {
            err = pwrite(w->raw_fd, buf, IO_BYTES, (off_t)off) == IO_BYTES ? 0 : 1;
        }
        if (err) {
            w->failed = 1;
            break;
        }
        w->lat_ns_sum += now_ns() - t0;
        w->ops++;
    }
    free(buf);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s dhrd|raw FILE THREADS SECS\n", argv[0]);
        return 2;
    }
    int use_dhrd = strcmp(argv[1], "dhrd") == 0;
    int threads = atoi(argv[3]);
    double secs = atof(argv[4]);
    struct stat st;
    if (threads < 1 || threads > 256 || secs <= 0 || stat(argv[2], &st) != 0 ||
        st.st_size < IO_BYTES) {
        fprintf(stderr, "bad arguments or missing file %s\n", argv[2]);
        return 2;
    }
    dhrd_object *obj = NULL;
    int raw_fd = -1;
    if (use_dhrd) {
        struct dhrd_options opts;
        if (dhrd_options_default(&opts) != 0) return 1;
        opts.create = false;
        opts.durability = DHRD_DURABILITY_SYNC;
        int err = dhrd_open(argv[2], &opts, &obj);
        if (err != 0) {
            fprintf(stderr, "dhrd_open: %s\n", dhrd_strerror(err));
            return 1;
        }
        /* Measure writes to loaded chunks, as a long-running user would see them. */
        if (dhrd_wait_loaded(obj, 600000) != 0) {
            fprintf(stderr, "load did not finish\n");
            return 1;
        }
    } else {
        raw_fd = open(argv[2], O_RDWR | O_DIRECT | O_DSYNC | O_CLOEXEC);
        if (raw_fd < 0) {
            perror("open O_DIRECT|O_DSYNC");
            return 1;
        }
    }
    volatile int stop = 0;
    struct worker *ws = calloc((size_t)threads, sizeof *ws);
    pthread_t *ts = calloc((size_t)threads, sizeof *ts);
    if (!ws || !ts) return 1;
    double t0 = now_ns();
    for (int i = 0; i < threads; i++) {
        ws[i] = (struct worker){raw_fd, obj, (uint64_t)st.st_size / IO_BYTES, 99 + (uint64_t)i,
                                &stop, 0, 0.0, 0};
        pthread_create(&ts[i], NULL, run, &ws[i]);
    }
    struct timespec d = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    nanosleep(&d, NULL);
    stop = 1;
    uint64_t ops = 0;
    double lat = 0;
    int failed = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(ts[i], NULL);
        ops += ws[i].ops;
        lat += ws[i].lat_ns_sum;
        failed |= ws[i].failed;
    }
    double elapsed = (now_ns() - t0) / 1e9;
    if (obj) dhrd_close(obj);
    if (raw_fd >= 0) close(raw_fd);
    if (failed) {
        fprintf(stderr, "a write failed\n");
        return 1;
    }
    printf("{\"mode\": \"%s\", \"threads\": %d, \"iops\": %.1f, \"lat_us_mean\": %.1f}\n",
           argv[1], threads, (double)ops / elapsed, ops ? lat / (double)ops / 1e3 : 0.0);
    return 0;
}
