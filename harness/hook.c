/* The routing hook's "ask" path in C.
 *
 * ggml's scheduler asks the eval callback about every graph node it is about to compute (hundreds
 * per token) and splits the graph wherever the answer is yes. Answering in Python costs a ctypes
 * call per node; here only nodes whose name starts with one of the wanted prefixes
 * ("ffn_moe_topk-", and the one a mechanism observes) reach the Python callback, once each, after
 * they are computed. Built by harness.build beside the patched llama.cpp, cached by its sha256.
 */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

typedef bool (*moe_observe_fn)(void *tensor, bool ask, void *user_data);

struct moe_hook {
    moe_observe_fn observe;     /* the Python callback: called with ask = false, wanted nodes only */
    size_t name_offset;         /* offsetof(struct ggml_tensor, name) of the pinned ggml */
    char prefix[2][32];
    size_t prefix_len[2];       /* 0: unused */
    unsigned long long asked;   /* nodes the scheduler asked about */
    unsigned long long passed;  /* nodes handed to Python */
};

static bool wanted(const struct moe_hook *h, const char *name) {
    for (int i = 0; i < 2; i++) {
        if (h->prefix_len[i] && strncmp(name, h->prefix[i], h->prefix_len[i]) == 0) {
            return true;
        }
    }
    return false;
}

bool moe_hook_eval(void *tensor, bool ask, void *user_data) {
    struct moe_hook *h = user_data;
    bool want = wanted(h, (const char *)tensor + h->name_offset);
    if (ask) {
        h->asked++;
        return want;
    }
    if (!want) {
        return true;  /* computed without being asked for: nothing to observe */
    }
    h->passed++;
    return h->observe(tensor, false, NULL);
}
