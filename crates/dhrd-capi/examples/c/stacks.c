/* Every backing and fast layer of the C API, from C: opens BACKING (a file, a block
 * device or rbd:POOL/IMAGE) alone, under NVM write-back ("nvm FILE") or under an SSD
 * cache tier ("ssd FILE"); writes, closes (which writes back), reopens and reads the bytes
 * back, and checks that the status document names the layer. Exits 0 and prints "ok".
 * Usage: stacks BACKING [nvm FILE | ssd FILE] */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
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

#define CHUNK_BYTES (64u << 10)
#define PIECE_BYTES 5000
/* Unaligned pieces in three chunks, the test checks them in the backing too. */
static const uint64_t OFFSETS[] = {4096 + 123, (1u << 20) + 5, (3u << 20) + 77};
#define PIECES (sizeof OFFSETS / sizeof OFFSETS[0])

static unsigned char byte_at(uint64_t at) { return (unsigned char)(at * 31 % 251 + 1); }

static void options(struct dhrd_options *o, const char *kind, const char *file) {
    dhrd_options_default(o);
    o->create = true;
    o->min_len_bytes = 8u << 20;
    o->chunk_bytes = CHUNK_BYTES;
    o->durability = DHRD_DURABILITY_FSYNC;
    if (kind && strcmp(kind, "nvm") == 0) {
        o->nvm_path = file;
    } else if (kind && strcmp(kind, "ssd") == 0) {
        o->tier_ssd_path = file;
        o->tier_ssd_bytes = 16 * CHUNK_BYTES + 2 * 4096;
    }
}

/* The status document as a string the caller frees; NULL on failure. The counters move
 * between two calls, so the length first returned may no longer be enough: try again. */
static char *status_json(dhrd_object *obj) {
    size_t n = 0;
    int err = dhrd_get_status_json(obj, NULL, 0, &n);
    for (int attempt = 0; err == ERANGE && attempt < 10; attempt++) {
        size_t room = n + 256;
        char *doc = malloc(room);
        if (!doc) return NULL;
        err = dhrd_get_status_json(obj, doc, room, &n);
        if (err == 0) return doc;
        free(doc);
    }
    fprintf(stderr, "status: %s\n", dhrd_strerror(err));
    return NULL;
}

/* Options a fast layer refuses: EINVAL before anything is opened. */
static int check_refusals(const char *backing, const char *kind, const char *file) {
    struct dhrd_options o;
    dhrd_object *none = NULL;
    options(&o, kind, file);
    o.read_only = true;
    if (dhrd_open(backing, &o, &none) != EINVAL) {
        fprintf(stderr, "a read-only open with a fast layer was not EINVAL\n");
        return 1;
    }
    options(&o, kind, file);
    o.nvm_path = file;
    o.tier_ssd_path = file;
    o.tier_ssd_bytes = 16 * CHUNK_BYTES + 2 * 4096;
    if (dhrd_open(backing, &o, &none) != EINVAL) {
        fprintf(stderr, "NVM write-back and an SSD tier at once were not EINVAL\n");
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 4) {
        fprintf(stderr, "usage: %s BACKING [nvm FILE | ssd FILE]\n", argv[0]);
        return 2;
    }
    const char *backing = argv[1];
    const char *kind = argc == 4 ? argv[2] : NULL;
    const char *file = argc == 4 ? argv[3] : NULL;
    struct dhrd_options o;
    options(&o, kind, file);
    if (kind && check_refusals(backing, kind, file)) return 1;

    dhrd_object *obj = NULL;
    CHECK(dhrd_open(backing, &o, &obj));
    unsigned char piece[PIECE_BYTES];
    for (size_t p = 0; p < PIECES; p++) {
        for (size_t i = 0; i < PIECE_BYTES; i++) piece[i] = byte_at(OFFSETS[p] + i);
        CHECK(dhrd_write(obj, piece, PIECE_BYTES, OFFSETS[p]));
    }
    CHECK(dhrd_close(obj)); /* flushes, then writes the fast layer back */

    CHECK(dhrd_open(backing, &o, &obj));
    for (size_t p = 0; p < PIECES; p++) {
        size_t n = 0;
        CHECK(dhrd_read(obj, piece, PIECE_BYTES, OFFSETS[p], &n));
        for (size_t i = 0; i < PIECE_BYTES; i++) {
            if (n != PIECE_BYTES || piece[i] != byte_at(OFFSETS[p] + i)) {
                fprintf(stderr, "piece %zu: byte %zu of %zu differs after the reopen\n", p, i, n);
                return 1;
            }
        }
    }
    char *doc = status_json(obj);
    if (!doc) return 1;
    int has_wb = strstr(doc, "\"writeback\":") != NULL;
    int has_tier = strstr(doc, "\"tier\":") != NULL;
    int want_wb = kind && strcmp(kind, "nvm") == 0;
    int want_tier = kind && strcmp(kind, "ssd") == 0;
    if (!strstr(doc, "\"size_bytes\":") || has_wb != want_wb || has_tier != want_tier) {
        fprintf(stderr, "status document does not describe the stack: %s\n", doc);
        free(doc);
        return 1;
    }
    printf("%s\n", doc);
    free(doc);
    CHECK(dhrd_close(obj));
    puts("ok");
    return 0;
}
