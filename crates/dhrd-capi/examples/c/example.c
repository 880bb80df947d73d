/* A C program using dhrd's engine: open an object on a file, write, flush, read back,
 * truncate, report progress and counters, close. Exits 0 and prints "ok" on success.
 * Build: cc -I crates/dhrd-capi/include example.c target/release/libdhrd_capi.a \
 *        -lpthread -ldl -lm -o example */
#include <stdio.h>
#include <string.h>
#include "dhrd.h"

#define CHECK(call)                                                              \
    do {                                                                         \
        int err_ = (call);                                                       \
        if (err_ != 0) {                                                         \
            fprintf(stderr, "%s: %s (errno %d)\n", #call, dhrd_strerror(err_), err_); \
            return 1;                                                            \
        }                                                                        \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s BACKING_FILE\n", argv[0]);
        return 2;
    }
    struct dhrd_options opts;
    CHECK(dhrd_options_default(&opts));
    opts.create = true;
    opts.durability = DHRD_DURABILITY_SYNC;
    opts.ram_budget_bytes = 64u << 20;

    dhrd_object *obj = NULL;
    CHECK(dhrd_open(argv[1], &opts, &obj));

    const char msg[] = "durable hybrid RAM disk";
    CHECK(dhrd_write(obj, msg, sizeof msg, 1 << 20)); /* durable when it returns */
    CHECK(dhrd_flush(obj));

    char back[64] = {0};
    size_t n = 0;
    CHECK(dhrd_read(obj, back, sizeof back, 1 << 20, &n));
    if (n != sizeof msg || memcmp(back, msg, n) != 0) {
        fprintf(stderr, "read back %zu bytes: %s\n", n, back);
        return 1;
    }
    /* Past the end: a short read of nothing, not an error. */
    CHECK(dhrd_read(obj, back, sizeof back, 8u << 20, &n));
    if (n != 0) {
        fprintf(stderr, "read past the end returned %zu bytes\n", n);
        return 1;
    }
    /* An unknown durability is refused. */
    struct dhrd_options bad = opts;
    bad.durability = 7;
    dhrd_object *none = NULL;
    if (dhrd_open(argv[1], &bad, &none) == 0) {
        fprintf(stderr, "an unknown durability was accepted\n");
        return 1;
    }

    CHECK(dhrd_set_len(obj, 4096));
    uint64_t len = 0;
    CHECK(dhrd_len(obj, &len));
    CHECK(dhrd_wait_loaded(obj, 10000));

    struct dhrd_progress p;
    struct dhrd_stats s;
    CHECK(dhrd_get_progress(obj, &p));
    CHECK(dhrd_get_stats(obj, &s));
    printf("len %llu, chunks %llu/%llu loaded, writes %llu, syncs %llu, read-only %d\n",
           (unsigned long long)len, (unsigned long long)p.chunks_loaded,
           (unsigned long long)p.chunks_total, (unsigned long long)s.writes,
           (unsigned long long)s.syncs, (int)s.read_only_after_failure);
    CHECK(dhrd_close(obj));
    puts("ok");
    return len == 4096 ? 0 : 1;
}
