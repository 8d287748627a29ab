/* The routing hook in C.
 *
 * ggml's scheduler asks the eval callback about every graph node it is about to compute (hundreds
 * per token) and splits the graph wherever the answer is yes. This file answers the asks, and on
 * each computed `ffn_moe_topk-<layer>` does everything the records need without Python: it checks
 * the tensor against the layout (int32 ids, contiguous rows of n_expert_used, ids in range), copies
 * the ids into a per-decode buffer, collects the layer's unique experts, and measures with mincore
 * the routed slabs' bytes not resident before and after the mechanism acted. Python is called only
 * for a mechanism's own per-layer work (`route`, NULL for demand paging) and for the one node a
 * mechanism observes (`observe`). The worker reads the buffers after each llama_decode.
 * Built by harness.build beside the patched llama.cpp, cached by its sha256; the ggml_tensor field
 * offsets are passed at run time, so no ggml header is needed.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MOE_MAX_SLABS 4 /* tensors per expert (gate, up, down; room for one more) */

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
    /* set by the worker before each decode */
    int32_t token0, batch_n;
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

/* Bytes of [off, off + len) of the file whose pages are not resident; -1 if mincore failed. */
static int64_t missing_bytes(struct moe_hook *h, uint64_t off, uint64_t len) {
    uintptr_t start = (h->base + off) & ~(uintptr_t)(h->page - 1);
    uintptr_t end = (h->base + off + len + h->page - 1) & ~(uintptr_t)(h->page - 1);
    size_t pages = (end - start) / h->page;
    if (pages > h->vec_len || mincore((void *)start, end - start, h->vec) != 0) {
        return -1;
    }
    uint64_t absent = 0;
    for (size_t i = 0; i < pages; i++) {
        absent += !(h->vec[i] & 1);
    }
    absent *= h->page;
    return (int64_t)(absent < len ? absent : len);
}

/* Missing bytes of every slab of the layer's unique experts, added to *acc; false on error. */
static bool add_missing(struct moe_hook *h, int32_t layer, const int32_t *experts, int32_t n,
                        uint64_t *acc) {
    for (int32_t i = 0; i < n; i++) {
        size_t at = ((size_t)layer * h->n_expert + experts[i]) * MOE_MAX_SLABS;
        for (int k = 0; k < MOE_MAX_SLABS; k++) {
            if (h->slab_len[at + k] == 0) {
                continue;
            }
            int64_t m = missing_bytes(h, h->slab_off[at + k], h->slab_len[at + k]);
            if (m < 0) {
                snprintf(h->error, sizeof h->error, "mincore failed on layer %d expert %d", layer,
                         experts[i]);
                return false;
            }
            *acc += (uint64_t)m;
        }
    }
    return true;
}

static bool fail(struct moe_hook *h, const char *name, const char *what, long long a, long long b) {
    snprintf(h->error, sizeof h->error, "%s: %s (%lld, expected %lld)", name, what, a, b);
    return false;
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
    if (!add_missing(h, (int32_t)layer, uniq, n_uniq, &h->missing)) {
        return false;
    }
    if (h->route) {
        uint64_t t0 = now_ns();
        h->passed++;
        bool ok = h->route((int32_t)layer, uniq, n_uniq);
        h->python_ns += now_ns() - t0;
        if (!ok) {
            return false; /* the Python side holds the error */
        }
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
        return which >= 0;
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
