/* jinja_arena.c — the bump allocator behind a parsed template and each render (see jinja.h). */
#include "tokenizer/jinja.h"

#include <string.h>

#include "base/alloc.h"

struct jinja_arena_chunk {
    jinja_arena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

#define JINJA_CHUNK_MIN (64u * 1024u)

void *jinja_arena_alloc(jinja_arena *a, size_t n) {
    size_t need = (n + 15u) & ~(size_t)15u;
    if (need < n) return NULL;
    if (a->limit && (need > a->limit || a->total > a->limit - need)) return NULL;
    jinja_arena_chunk *h = a->head;
    if (!h || h->cap - h->used < need) {
        size_t cap = need > JINJA_CHUNK_MIN ? need : JINJA_CHUNK_MIN;
        if (h && h->cap * 2 > cap && h->cap < (16u << 20)) cap = h->cap * 2;
        size_t bytes;
        if (!kiln_add_size(sizeof(jinja_arena_chunk), cap, &bytes)) return NULL;
        jinja_arena_chunk *nc = kiln_malloc(bytes);
        if (!nc) return NULL;
        nc->next = h;
        nc->used = 0;
        nc->cap = cap;
        a->head = h = nc;
    }
    void *p = h->data + h->used;
    h->used += need;
    a->total += need;
    memset(p, 0, n);
    return p;
}

void jinja_arena_free(jinja_arena *a) {
    jinja_arena_chunk *h = a->head;
    while (h) {
        jinja_arena_chunk *next = h->next;
        kiln_free(h);
        h = next;
    }
    a->head = NULL;
    a->total = 0;
}
