/* The routing hook in C.
 *
 * ggml's scheduler asks the eval callback about every graph node it is about to compute (hundreds
 * per token) and splits the graph wherever the answer is yes. This file answers the asks, and on
 * each computed `ffn_moe_topk-<layer>` does everything the records need without Python: it checks
 * the tensor against the layout (int32 ids, contiguous rows of n_expert_used, ids in range), copies
 * the ids into a per-decode buffer, collects the layer's unique experts, and measures the routed
 * slabs' bytes not resident before and after the mechanism acted. A token routes 384 slabs and a
 * syscall costs about a microsecond on a VM, so the calls are most of what the hook costs: when
 * the weights are a shared mapping of the model file, one cachestat(2) over the span of the
 * layer's routed slabs answers "all cached" for the whole layer, and only otherwise does each slab
 * get its own call (cachestat on the file, or mincore(2) on a private mapping). Python is called only
 * for a mechanism's own per-layer work (`route`, NULL for demand paging) and for the one node a
 * mechanism observes (`observe`). The worker reads the buffers after each llama_decode.
 * Built by harness.build beside the patched llama.cpp, cached by its sha256; the ggml_tensor field
 * offsets are passed at run time, so no ggml header is needed.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>

#define MOE_MAX_SLABS 4 /* tensors per expert (gate, up, down; room for one more) */
#ifndef SYS_cachestat
#define SYS_cachestat 451 /* Linux 6.5; the same number on every architecture */
#endif

struct moe_cachestat_range { uint64_t off, len; };
struct moe_cachestat { uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted; };

typedef bool (*moe_observe_fn)(void *tensor, bool ask, void *user_data);
typedef bool (*moe_route_fn)(int32_t layer, const int32_t *experts, int32_t n_experts);

struct moe_hook {
    moe_observe_fn observe;      /* Python: nodes named prefix[1], after they are computed */
    moe_route_fn route;          /* Python: a layer's unique experts; NULL: no per-layer work */
    size_t off_type, off_ne, off_nb, off_data, off_name; /* offsets in struct ggml_tensor */
    int32_t type_i32;            /* GGML_TYPE_I32 of the pinned ggml */
    char prefix[2][32];          /* [0] "ffn_moe_topk-", [1] the observed prefix or "" */
    size_t prefix_len[2];        /* 0: unused */
    /* the layout, built by the worker from the layout file */
    int32_t n_layer, n_expert, n_expert_used;
    const uint8_t *layer_is_moe; /* [n_layer] */
    const uint64_t *slab_off;    /* [n_layer][n_expert][MOE_MAX_SLABS]: file offsets */
    const uint64_t *slab_len;    /* same shape; 0: no slab */
    uintptr_t base;              /* address of file offset 0 in the mapping */
    unsigned char *vec;          /* mincore scratch of vec_len pages */
    size_t vec_len;
    size_t page;
    int32_t cache_fd;            /* >= 0: the weights are a shared mapping of this file, whose page
                                  * cache cachestat reads; -1: mincore (set here if the kernel has no
                                  * cachestat) */
    /* set by the worker before each decode */
    int32_t enabled;             /* 0: answer every ask "no" (the bare decode, for an A/B) */
    int32_t token0, batch_n;
    int32_t measure_residency;   /* 0: no residency syscalls this decode (a measured-window token) */
    int32_t *rows;               /* [rows_cap][4]: token, layer, rank, expert */
    int32_t rows_cap;
    int32_t *unique;             /* [n_layer][n_expert]: each routed layer's unique experts */
    int32_t *unique_n;           /* [n_layer] */
    int32_t *routed_layer;       /* [n_layer]: layers in the order they were routed */
    /* written here, per decode (the worker zeroes them) */
    int32_t n_rows, n_routed;
    uint64_t missing, missing_after;
    uint64_t hook_ns;            /* time in this file's observing path, Python calls excluded */
    uint64_t python_ns;          /* time in the Python calls (the mechanism's own work) */
    /* totals */
    unsigned long long asked;    /* nodes the scheduler asked about */
    unsigned long long passed;   /* nodes handed to Python */
    unsigned long long residency_calls; /* cachestat/mincore syscalls made */
    char error[256];             /* set when the hook stops a decode */
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int which_prefix(const struct moe_hook *h, const char *name) {
    for (int i = 0; i < 2; i++) {
        if (h->prefix_len[i] && strncmp(name, h->prefix[i], h->prefix_len[i]) == 0) {
            return i;
        }
    }
    return -1;
}

#define FIELD(t, off, type) (*(type *)((char *)(t) + (off)))

/* Pages of the whole pages [first, first + pages) of the file not in its page cache, by
 * cachestat; -1 if it failed, -2 if this kernel has no cachestat (or a sandbox refuses it). */
static int64_t uncached_pages(struct moe_hook *h, uint64_t first, uint64_t pages) {
    struct moe_cachestat_range r = {first * h->page, pages * h->page};
    struct moe_cachestat cs;
    if (syscall(SYS_cachestat, h->cache_fd, &r, &cs, 0) != 0) {
        return (errno == ENOSYS || errno == EPERM) ? -2 : -1;
    }
    return (int64_t)(pages - (cs.nr_cache < pages ? cs.nr_cache : pages));
}

/* Pages of the whole pages [first, first + pages) of the file not resident in the mapping, by
 * mincore; -1 if it failed. */
static int64_t unmapped_pages(struct moe_hook *h, uint64_t first, uint64_t pages) {
    if (pages > h->vec_len) {
        errno = ERANGE;
        return -1;
    }
    if (mincore((void *)(h->base + first * h->page), pages * h->page, h->vec) != 0) {
        return -1;
    }
    uint64_t resident = 0;
    size_t i = 0;
    for (; i + 8 <= pages; i += 8) { /* bit 0 of each byte; eight bytes summed by one multiply */
        uint64_t w;
        memcpy(&w, h->vec + i, 8);
        resident += ((w & 0x0101010101010101ull) * 0x0101010101010101ull) >> 56;
    }
    for (; i < pages; i++) {
        resident += h->vec[i] & 1;
    }
    return (int64_t)(pages - resident);
}

/* Pages of the file range [off, off + len), rounded out to whole pages, not resident. */
static int64_t absent_pages(struct moe_hook *h, uint64_t off, uint64_t len) {
    uint64_t first = off / h->page, last = (off + len + h->page - 1) / h->page;
    h->residency_calls++;
    if (h->cache_fd >= 0) {
        int64_t n = uncached_pages(h, first, last - first);
        if (n != -2) {
            return n;
        }
        h->cache_fd = -1; /* no cachestat here: mincore from now on */
    }
    return unmapped_pages(h, first, last - first);
}

/* True if one cachestat call finds every page from the layer's first routed slab to its last
 * cached: then no routed slab misses a byte. Only where that span is about the size of the
 * layer's expert tensors (side by side in a GGUF), so the call never walks much else of the file. */
static bool layer_span_cached(struct moe_hook *h, int32_t layer, const int32_t *experts, int32_t n) {
    size_t row = (size_t)layer * h->n_expert;
    uint64_t lo = UINT64_MAX, hi = 0, tensors = 0;
    for (int k = 0; k < MOE_MAX_SLABS; k++) {
        tensors += h->slab_len[row * MOE_MAX_SLABS + k] * (uint64_t)h->n_expert;
    }
    for (int32_t i = 0; i < n; i++) {
        for (int k = 0; k < MOE_MAX_SLABS; k++) {
            size_t at = (row + experts[i]) * MOE_MAX_SLABS + k;
            if (h->slab_len[at]) {
                lo = h->slab_off[at] < lo ? h->slab_off[at] : lo;
                hi = h->slab_off[at] + h->slab_len[at] > hi ? h->slab_off[at] + h->slab_len[at] : hi;
            }
        }
    }
    return hi > lo && hi - lo <= tensors + tensors / 4 && absent_pages(h, lo, hi - lo) == 0;
}

/* Missing bytes of every slab of the layer's unique experts, added to *acc: each slab's pages
 * not resident, at most its length; false on error. */
static bool add_missing(struct moe_hook *h, int32_t layer, const int32_t *experts, int32_t n,
                        uint64_t *acc) {
    if (h->cache_fd >= 0 && n > 1 && layer_span_cached(h, layer, experts, n)) {
        return true; /* the common case once the working set fits: one call, not one per slab */
    }
    for (int32_t i = 0; i < n; i++) {
        size_t at = ((size_t)layer * h->n_expert + experts[i]) * MOE_MAX_SLABS;
        for (int k = 0; k < MOE_MAX_SLABS; k++) {
            if (h->slab_len[at + k] == 0) {
                continue;
            }
            int64_t pages = absent_pages(h, h->slab_off[at + k], h->slab_len[at + k]);
            if (pages < 0) {
                snprintf(h->error, sizeof h->error, "%s failed on layer %d expert %d: %s",
                         h->cache_fd >= 0 ? "cachestat" : "mincore", layer, experts[i],
                         strerror(errno));
                return false;
            }
            uint64_t bytes = (uint64_t)pages * h->page;
            *acc += bytes < h->slab_len[at + k] ? bytes : h->slab_len[at + k];
        }
    }
    return true;
}

/* sizeof(struct moe_hook): the worker checks its ctypes mirror against it before using a
 * library built from another version of this file */
size_t moe_hook_struct_size(void) { return sizeof(struct moe_hook); }

/* The missing bytes of the layer's given experts as the hook measures them (tests compare the
 * two methods with Python's mincore); -1 on error (h->error says which). */
int64_t moe_hook_missing(struct moe_hook *h, int32_t layer, const int32_t *experts, int32_t n) {
    uint64_t acc = 0;
    return add_missing(h, layer, experts, n, &acc) ? (int64_t)acc : -1;
}

static bool fail(struct moe_hook *h, const char *name, const char *what, long long a, long long b) {
    snprintf(h->error, sizeof h->error, "%s: %s (%lld, expected %lld)", name, what, a, b);
    return false;
}

/* The mechanism's per-layer work (Python), timed apart from the hook's own. */
static bool call_route(struct moe_hook *h, int32_t layer, const int32_t *uniq, int32_t n) {
    uint64_t t0 = now_ns();
    h->passed++;
    bool ok = h->route(layer, uniq, n);
    h->python_ns += now_ns() - t0;
    return ok;
}

static bool on_topk(struct moe_hook *h, void *t, const char *name) {
    const char *digits = name + h->prefix_len[0];
    char *end = NULL;
    long layer = strtol(digits, &end, 10);
    if (end == digits || *end != '\0') {
        return true; /* a view of the node ("ffn_moe_topk-0 (reshaped)"), not the layer's ids */
    }
    const int64_t *ne = &FIELD(t, h->off_ne, int64_t);
    const size_t *nb = &FIELD(t, h->off_nb, size_t);
    const char *data = FIELD(t, h->off_data, const char *);
    if (FIELD(t, h->off_type, int32_t) != h->type_i32) {
        return fail(h, name, "type is not I32", FIELD(t, h->off_type, int32_t), h->type_i32);
    }
    if (nb[0] != 4) {
        return fail(h, name, "nb[0]", (long long)nb[0], 4);
    }
    if (ne[0] != h->n_expert_used) {
        return fail(h, name, "ne[0] is not n_expert_used", ne[0], h->n_expert_used);
    }
    if (nb[1] < 4 * (size_t)ne[0]) {
        return fail(h, name, "row stride nb[1] under a row of ids", (long long)nb[1], 4 * ne[0]);
    }
    if (ne[1] < 1 || ne[1] > h->batch_n) {
        return fail(h, name, "rows for the batch", ne[1], h->batch_n);
    }
    if (layer < 0 || layer >= h->n_layer || !h->layer_is_moe[layer]) {
        return fail(h, name, "not a MoE layer of the layout", layer, h->n_layer);
    }
    if (h->n_routed >= h->n_layer) {
        return fail(h, name, "more routing decisions in one decode than layers", h->n_routed + 1,
                    h->n_layer);
    }
    int32_t n_tok = (int32_t)ne[1];
    if (h->n_rows + n_tok * h->n_expert_used > h->rows_cap) {
        return fail(h, name, "id rows overflow the buffer", h->n_rows + n_tok * h->n_expert_used,
                    h->rows_cap);
    }
    /* the last layer computes only the rows whose logits are needed (the batch's last token), so
     * rows map onto the batch's final n_tok tokens */
    int32_t first = h->token0 + h->batch_n - n_tok;
    int32_t *uniq = h->unique + (size_t)h->n_routed * h->n_expert;
    int32_t n_uniq = 0;
    uint8_t seen[1024] = {0};
    if (h->n_expert > (int32_t)sizeof seen) {
        return fail(h, name, "more experts than the hook handles", h->n_expert, sizeof seen);
    }
    for (int32_t r = 0; r < n_tok; r++) {
        const int32_t *ids = (const int32_t *)(data + (size_t)r * nb[1]);
        for (int32_t rank = 0; rank < h->n_expert_used; rank++) {
            int32_t e = ids[rank];
            if (e < 0 || e >= h->n_expert) {
                snprintf(h->error, sizeof h->error,
                         "%s: token row %d routes to expert %d, outside 0..%d", name, r, e,
                         h->n_expert - 1);
                return false;
            }
            int32_t *row = h->rows + (size_t)h->n_rows++ * 4;
            row[0] = first + r;
            row[1] = (int32_t)layer;
            row[2] = rank;
            row[3] = e;
            if (!seen[e]) {
                seen[e] = 1;
                uniq[n_uniq++] = e;
            }
        }
    }
    h->unique_n[h->n_routed] = n_uniq;
    h->routed_layer[h->n_routed++] = (int32_t)layer;
    uint64_t missing_before = h->missing;
    if (!h->measure_residency) {
        /* a token of the measured window: the residency syscalls are instrumentation a deployed
         * mechanism would not make, so they run on the prompt and the warm-up tokens only */
        return h->route ? call_route(h, (int32_t)layer, uniq, n_uniq) : true;
    }
    if (!add_missing(h, (int32_t)layer, uniq, n_uniq, &h->missing)) {
        return false;
    }
    if (h->route && !call_route(h, (int32_t)layer, uniq, n_uniq)) {
        return false; /* the Python side holds the error */
    }
    if (!h->route) {
        /* nothing ran between the two measurements: the second would find the same bytes */
        h->missing_after += h->missing - missing_before;
        return true;
    }
    return add_missing(h, (int32_t)layer, uniq, n_uniq, &h->missing_after);
}

bool moe_hook_eval(void *tensor, bool ask, void *user_data) {
    struct moe_hook *h = user_data;
    const char *name = (const char *)tensor + h->off_name;
    int which = which_prefix(h, name);
    if (ask) {
        h->asked++;
        return h->enabled && which >= 0;
    }
    if (which < 0) {
        return true; /* computed without being asked for: nothing to observe */
    }
    uint64_t t0 = now_ns(), python0 = h->python_ns;
    bool ok;
    if (which == 0) {
        ok = on_topk(h, tensor, name);
    } else {
        h->passed++;
        ok = h->observe(tensor, false, NULL);
        h->python_ns += now_ns() - t0;
    }
    h->hook_ns += (now_ns() - t0) - (h->python_ns - python0);
    return ok;
}
