/* jinja_arena.c — the bump allocator behind a parsed template and each render (see jinja.h). With
 * a->shadow set, every chunk carries one shadow byte per data byte (content tracking), zeroed with each
 * allocation and found by address with jinja_arena_shadow. */
#include "chat/jinja.h"

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
        size_t bytes, data = a->shadow ? cap * 2 : cap;
        if (data < cap || !kiln_add_size(sizeof(jinja_arena_chunk), data, &bytes)) return NULL;
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
    if (a->shadow) memset((unsigned char *)p + h->cap, 0, need);
    return p;
}

unsigned char *jinja_arena_shadow(const jinja_arena *a, const void *p, size_t n) {
    if (!a->shadow) return NULL;
    const unsigned char *q = p;
    for (jinja_arena_chunk *h = a->head; h; h = h->next) {
        if (q >= h->data && q < h->data + h->used && n <= (size_t)(h->data + h->used - q))
            return h->data + h->cap + (q - h->data);
    }
    return NULL;
}

bool jinja_arena_contains(const jinja_arena *a, const void *p) {
    const unsigned char *q = p;
    for (jinja_arena_chunk *h = a->head; h; h = h->next)
        if (q >= h->data && q < h->data + h->used) return true;
    return false;
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
