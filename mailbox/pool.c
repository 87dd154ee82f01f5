/* pool.c: per-thread message memory with batched cross-thread returns.
 *
 * Design:
 * - Producers of frees: any thread. A free by the owner pushes onto the owner's private free
 *   list. A free by another thread goes into that thread's batch for (owner, size class) (a
 *   small direct-mapped table of REMOTE_SLOTS batches). A batch is a magazine: its first
 *   message, whose free body holds the addresses of the next ones (up to mag_cap(c)). A full
 *   magazine, an evicted one or a flush is pushed onto owner->returned[class] with a CAS loop
 *   (a Treiber push, linked through the magazines' tr_next_).
 * - Consumer of returns: the owner only, which takes a class's whole returned stack with one
 *   exchange when its free list and current magazines of that class are empty. Taking
 *   everything at once means no ABA: nobody ever pops a single node. It allocates a
 *   magazine's messages from its address array, then the magazine itself. The messages were
 *   last touched on the freeing core; an address array lets their transfers overlap (they
 *   are prefetched a magazine ahead), where a free list linked through the messages made
 *   each allocation wait for the previous one's line: Savina's fjthrput (one thread sending
 *   to 60 actors on 2 cores) went from ~52 to ~39 ms (medians of 8 alternating runs).
 * - Ordering: the CAS that pushes a magazine is a release, pairing with the owner's acquire
 *   exchange, so the magazines' contents (plain stores) are visible.
 * - Message memory is never returned to the system before tr__pool_set_destroy, so a
 *   message can outlive the thread that allocated it. Even then up to SLAB_CACHE_BYTES of
 *   slabs stay in a process-wide cache that the next pools carve first: a burst's memory is
 *   touched (page-faulted and zeroed by the kernel, ~40 ms per 128 MB here) once per process,
 *   not once per runtime.
 * - Under AddressSanitizer, free chunks are poisoned past the pool's bookkeeping fields, so
 *   a use after tr__pool_free is reported as it would be with malloc.
 */
#include "mailbox/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__) || defined(TR_ASAN_BUILD)
#include <sanitizer/asan_interface.h>
#define POISON(p, n)   ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n)   ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define MIN_SHIFT        7  /* smallest chunk: 128 bytes */
#define N_CLASSES        10 /* up to 64 KiB */
#define CLASS_LARGE      0xffffu
#define SLAB_BYTES       (256u * 1024u)
#define SLAB_CACHE_BYTES ((size_t)256 << 20)
#define PREFAULT_BYTES                                                                             \
    (64u * 1024u)          /* of a prefaulted slab: 511 messages of the smallest class             \
                            */
#define PAGE_BYTES   4096u /* the smallest page size: a write to each faults it in */
#define REMOTE_SLOTS 16
#define MAG_MAX      62 /* addresses a magazine holds, at most (its class's body permitting) */
#define HEADER_BYTES ((sizeof(tr_msg_t) + 15u) & ~(size_t)15u)
#define KEEP_BYTES   offsetof(tr_msg_t, type) /* bookkeeping that stays unpoisoned */

typedef struct slab {
    struct slab *next;
} slab_t;

/* A free message used as a batch of returns: the addresses of up to MAG_MAX others. */
typedef struct magazine {
    char keep_[KEEP_BYTES]; /* the chunk's bookkeeping; tr_next_ links returned magazines */
    uint32_t n;
    tr_msg_t *m[];
} magazine_t;

typedef struct remote {
    tr__pool_t *owner;
    unsigned cls;
    unsigned cap;    /* mag_cap(cls) */
    magazine_t *mag; /* NULL: empty */
} remote_t;

struct tr__pool {
    /* written by the owning thread */
    tr__pool_set_t *set;
    pthread_t thread;
    tr__pool_t *next_in_set; /* under set->mu */
    tr_msg_t *free[N_CLASSES];
    magazine_t *mags[N_CLASSES]; /* returned magazines being allocated from, linked */
    uintptr_t fresh_next[N_CLASSES], fresh_end[N_CLASSES]; /* the newest slab's uncarved part */
    remote_t remote[REMOTE_SLOTS];
    slab_t *slabs;
    _Atomic size_t bytes;
    char pad_[64];
    /* written by other threads */
    _Atomic(magazine_t *) returned[N_CLASSES];
};

struct tr__pool_set {
    pthread_mutex_t mu;
    uint64_t id;
    tr__pool_t *pools;
};

/* Slabs of closed pool sets, kept for reuse (all slabs are SLAB_BYTES: see add_slab). */
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static slab_t *cache;
static size_t cache_bytes;

/* The cache's push and pop (pop: NULL when empty); cache_mu held. */
static void cache_push(slab_t *s)
{
    s->next = cache;
    cache = s;
    cache_bytes += SLAB_BYTES;
}

static slab_t *cache_pop(void)
{
    slab_t *s = cache;
    if (s) {
        cache = s->next;
        cache_bytes -= SLAB_BYTES;
    }
    return s;
}

static _Atomic uint64_t next_set_id = 1;
_Thread_local uint64_t tr__pool_tls_set_id;
_Thread_local tr__pool_t *tr__pool_tls_pool;

static unsigned class_of(size_t total)
{
    if (total <= ((size_t)1 << MIN_SHIFT)) return 0;
    unsigned shift = 64 - (unsigned)__builtin_clzll((unsigned long long)(total - 1));
    unsigned c = shift - MIN_SHIFT;
    return c < N_CLASSES ? c : CLASS_LARGE;
}

static size_t class_bytes(unsigned c)
{
    return (size_t)1 << (MIN_SHIFT + c);
}

static inline tr_msg_t *link_of(tr_msg_t *m)
{
    return atomic_load_explicit(&m->tr_next_, memory_order_relaxed);
}

static inline void set_link(tr_msg_t *m, tr_msg_t *next)
{
    atomic_store_explicit(&m->tr_next_, next, memory_order_relaxed);
}

tr__pool_set_t *tr__pool_set_create(void)
{
    tr__pool_set_t *set = calloc(1, sizeof(*set));
    if (!set) return NULL;
    pthread_mutex_init(&set->mu, NULL);
    set->id = atomic_fetch_add_explicit(&next_set_id, 1, memory_order_relaxed);
    return set;
}

void tr__pool_set_destroy(tr__pool_set_t *set)
{
    if (!set) return;
    tr__pool_t *p = set->pools;
    while (p) {
        tr__pool_t *next = p->next_in_set;
        for (slab_t *s = p->slabs; s;) {
            slab_t *sn = s->next;
            UNPOISON(s, SLAB_BYTES);
            pthread_mutex_lock(&cache_mu);
            bool keep = cache_bytes + SLAB_BYTES <= SLAB_CACHE_BYTES;
            if (keep) cache_push(s);
            pthread_mutex_unlock(&cache_mu);
            if (!keep) free(s);
            s = sn;
        }
        free(p);
        p = next;
    }
    pthread_mutex_destroy(&set->mu);
    free(set);
}

static tr__pool_t *pool_for_thread(tr__pool_set_t *set)
{
    pthread_t self = pthread_self();
    pthread_mutex_lock(&set->mu);
    tr__pool_t *p = set->pools;
    while (p && !pthread_equal(p->thread, self))
        p = p->next_in_set;
    if (!p && (p = aligned_alloc(64, (sizeof(*p) + 63) & ~(size_t)63))) {
        memset(p, 0, sizeof(*p));
        p->set = set;
        p->thread = self; /* a later thread with the same id adopts it: this one is gone */
        for (int c = 0; c < N_CLASSES; c++)
            atomic_init(&p->returned[c], NULL);
        p->next_in_set = set->pools;
        set->pools = p;
    }
    pthread_mutex_unlock(&set->mu);
    return p;
}

uint64_t tr__pool_set_id(const tr__pool_set_t *set)
{
    return set->id;
}

tr__pool_t *tr__pool_get(tr__pool_set_t *set)
{
    if (tr__pool_tls_set_id == set->id) return tr__pool_tls_pool;
    tr__pool_t *p = pool_for_thread(set);
    if (p) {
        tr__pool_tls_set_id = set->id;
        tr__pool_tls_pool = p;
    }
    return p;
}

/* See pool.h. The slabs are taken out of the cache (and new ones made) under the lock, and
 * written without it: a page fault is ~5 us here, 30 on a busy VM. */
void tr__pool_prefault(unsigned n)
{
    slab_t *got = NULL;
    unsigned k = 0;
    pthread_mutex_lock(&cache_mu);
    for (; k < n && cache; k++) {
        slab_t *s = cache_pop();
        s->next = got;
        got = s;
    }
    pthread_mutex_unlock(&cache_mu);
    for (slab_t *s; k < n && (s = aligned_alloc(64, SLAB_BYTES)); k++) {
        s->next = got; /* none: the first slab a thread takes is then a new one */
        got = s;
    }
    for (slab_t *s = got; s; s = s->next) /* the first page has s->next */
        for (size_t off = PAGE_BYTES; off < PREFAULT_BYTES; off += PAGE_BYTES)
            ((volatile char *)s)[off] = 0;
    pthread_mutex_lock(&cache_mu);
    while (got) {
        slab_t *s = got;
        got = s->next;
        bool keep = cache_bytes + SLAB_BYTES <= SLAB_CACHE_BYTES;
        if (keep) cache_push(s);
        if (!keep) free(s);
    }
    pthread_mutex_unlock(&cache_mu);
}

/* Takes a new slab for class c. Its chunks are carved one at a time as they are needed
 * (carve): carving all 2,048 128-byte chunks at once wrote to every one of the slab's 64
 * pages, each a page fault the first time, ~200 us in one allocation on a VM, which bench
 * latency saw as its max. */
static int add_slab(tr__pool_t *pool, unsigned c)
{
    size_t chunk = class_bytes(c);
    size_t bytes = SLAB_BYTES; /* >= 4 chunks of the largest class */
    _Static_assert(SLAB_BYTES >= ((size_t)4 << (MIN_SHIFT + N_CLASSES - 1)), "slab size");
    pthread_mutex_lock(&cache_mu);
    slab_t *s = cache_pop();
    pthread_mutex_unlock(&cache_mu);
    if (!s) s = aligned_alloc(64, bytes);
    if (!s) return TR_ENOMEM;
    s->next = pool->slabs;
    pool->slabs = s;
    atomic_fetch_add_explicit(&pool->bytes, bytes, memory_order_relaxed);
    /* the first chunk holds the slab header: start at the first chunk boundary past it */
    pool->fresh_next[c] = (uintptr_t)s + chunk;
    pool->fresh_end[c] = (uintptr_t)s + bytes - bytes % chunk;
    POISON((char *)s + chunk, bytes - bytes % chunk - chunk);
    return 0;
}

/* The next uncarved chunk of class c, or NULL when the newest slab is used up. */
static tr_msg_t *carve(tr__pool_t *pool, unsigned c)
{
    uintptr_t at = pool->fresh_next[c];
    if (at == pool->fresh_end[c]) return NULL; /* both 0 before the first slab */
    pool->fresh_next[c] = at + class_bytes(c);
    tr_msg_t *m = (tr_msg_t *)at;
    UNPOISON(m, KEEP_BYTES);
    m->tr_pool_ = pool;
    m->tr_class_ = c;
    return m;
}

static unsigned mag_cap(unsigned c)
{
    size_t cap = (class_bytes(c) - sizeof(magazine_t)) / sizeof(tr_msg_t *);
    return cap < MAG_MAX ? (unsigned)cap : MAG_MAX;
}

static inline magazine_t *mag_link(magazine_t *g)
{
    return (magazine_t *)(void *)link_of((tr_msg_t *)(void *)g);
}

/* Fetches a magazine's messages to be written, and the next magazine's address array to be
 * read. Each message's envelope lines (fresh_envelope writes both) are fetched with a write
 * prefetch (PREFETCHW on x86): a returned message's first line is still shared with the core
 * that read it, and its second was last written by this thread megabytes of messages ago. A
 * store to either waits for the line to be owned, and the push's locked exchange waits for
 * that store; asked for a magazine ahead, the ownership arrives while the messages before
 * are sent. fjthrput with the sending thread pinned to a vCPU whose caches the host was
 * loading (bench/RESULTS.md): 58-63 ms against 84-92 with a read prefetch of the first line.
 * An earlier two-thread test found PREFETCHW slower for lines another core holds modified;
 * these lines are held shared or not at all. */
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("prfchw"))) /* so that a write prefetch is PREFETCHW */
#endif
static void
prefetch_magazine(magazine_t *g, unsigned c)
{
    if (!g) return;
    for (uint32_t i = 0; i < g->n; i++)
        for (size_t off = 0; off < HEADER_BYTES; off += 64)
            __builtin_prefetch((char *)g->m[i] + off, 1, 3);
    magazine_t *next = mag_link(g);
    size_t bytes = sizeof(magazine_t) + mag_cap(c) * sizeof(tr_msg_t *);
    for (size_t off = 0; next && off < bytes; off += 64)
        __builtin_prefetch((char *)next + off, 0, 3);
}

/* Makes g the magazine allocated from. Its messages were fetched when the one before it
 * started (or now, when it is the first); the next magazine's are fetched now, a magazine
 * ahead of use, so that the transfers have time to land. */
static void start_magazine(tr__pool_t *pool, unsigned c, magazine_t *g, bool first)
{
    pool->mags[c] = g;
    if (g && first) prefetch_magazine(g, c);
    if (g) prefetch_magazine(mag_link(g), c);
}

/* A free chunk of class c from the returned magazines, taking the returned stack when they
 * are used up; NULL when nothing came back. */
static tr_msg_t *from_magazines(tr__pool_t *pool, unsigned c)
{
    magazine_t *g = pool->mags[c];
    if (!g) {
        if (!atomic_load_explicit(&pool->returned[c], memory_order_relaxed)) return NULL;
        /* acquire: pairs with the release CAS in push_remote */
        start_magazine(pool, c,
                       atomic_exchange_explicit(&pool->returned[c], NULL, memory_order_acquire),
                       true);
        g = pool->mags[c];
    }
    if (g->n) return g->m[--g->n];
    start_magazine(pool, c, mag_link(g), false);
    return (tr_msg_t *)(void *)g; /* its addresses all handed out: the magazine itself */
}

/* The head of the pool's own free list of class c, or NULL. */
static tr_msg_t *pop_free(tr__pool_t *pool, unsigned c)
{
    tr_msg_t *m = pool->free[c];
    if (m) pool->free[c] = link_of(m);
    return m;
}

/* m made a fresh message of body capacity cap: unlinked, envelope zeroed. */
static inline tr_msg_t *fresh_envelope(tr_msg_t *m, size_t cap)
{
    set_link(m, NULL);
    memset((char *)m + KEEP_BYTES, 0, sizeof(tr_msg_t) - KEEP_BYTES);
    m->tr_cap_ = (uint32_t)cap;
    return m;
}

/* A free chunk of class c made a fresh message. */
static inline tr_msg_t *fresh(tr_msg_t *m, unsigned c)
{
    UNPOISON((char *)m + KEEP_BYTES, class_bytes(c) - KEEP_BYTES);
    return fresh_envelope(m, class_bytes(c) - HEADER_BYTES);
}

/* tr__pool_alloc's other cases: a large message, a returned magazine to start, a slab's next
 * uncarved chunk, a new slab. */
__attribute__((noinline)) static tr_msg_t *alloc_slow(tr__pool_t *pool, size_t body_size)
{
    size_t total = HEADER_BYTES + body_size;
    unsigned c = class_of(total);
    tr_msg_t *m;
    if (c == CLASS_LARGE) {
        m = aligned_alloc(64, (total + 63) & ~(size_t)63);
        if (!m) return NULL;
        m->tr_pool_ = pool;
        m->tr_class_ = CLASS_LARGE;
        return fresh_envelope(m, body_size);
    }
    if (!(m = pop_free(pool, c)) && !(m = from_magazines(pool, c)) && !(m = carve(pool, c))) {
        if (add_slab(pool, c) < 0) return NULL;
        m = carve(pool, c);
    }
    return fresh(m, c);
}

/* The path every message takes, kept free of the slow cases' register saves: the thread's own
 * free list, else the magazine being allocated from. */
tr_msg_t *tr__pool_alloc(tr__pool_t *pool, size_t body_size)
{
    unsigned c = class_of(HEADER_BYTES + body_size);
    if (c == CLASS_LARGE) return alloc_slow(pool, body_size);
    tr_msg_t *m = pool->free[c];
    if (m) {
        pool->free[c] = link_of(m);
        return fresh(m, c);
    }
    magazine_t *g = pool->mags[c];
    if (g && g->n) return fresh(g->m[--g->n], c);
    return alloc_slow(pool, body_size);
}

static void push_remote(remote_t *r)
{
    _Atomic(magazine_t *) *stack = &r->owner->returned[r->cls];
    magazine_t *old = atomic_load_explicit(stack, memory_order_relaxed);
    do {
        set_link((tr_msg_t *)(void *)r->mag, (tr_msg_t *)(void *)old);
        /* release: publishes the magazine's contents to the owner's acquire exchange */
    } while (!atomic_compare_exchange_weak_explicit(stack, &old, r->mag, memory_order_release,
                                                    memory_order_relaxed));
    r->mag = NULL;
}

void tr__pool_free(tr__pool_t *pool, tr_msg_t *m)
{
    unsigned c = m->tr_class_;
    if (c == CLASS_LARGE) {
        free(m);
        return;
    }
    tr__pool_t *owner = m->tr_pool_;
    POISON((char *)m + KEEP_BYTES, class_bytes(c) - KEEP_BYTES);
    if (owner == pool) {
        set_link(m, pool->free[c]);
        pool->free[c] = m;
        return;
    }
    remote_t *r = &pool->remote[(((uintptr_t)owner >> 6) + c) % REMOTE_SLOTS];
    if (r->mag && (r->owner != owner || r->cls != c)) push_remote(r);
    if (!r->mag) { /* m becomes the magazine */
        r->owner = owner;
        r->cls = c;
        r->cap = mag_cap(c);
        r->mag = (magazine_t *)(void *)m;
        UNPOISON(m, sizeof(magazine_t) + mag_cap(c) * sizeof(tr_msg_t *));
        r->mag->n = 0;
        return;
    }
    magazine_t *g = r->mag;
    g->m[g->n++] = m;
    if (g->n == r->cap) push_remote(r);
}

void tr__pool_flush(tr__pool_t *pool)
{
    for (int i = 0; i < REMOTE_SLOTS; i++)
        if (pool->remote[i].mag) push_remote(&pool->remote[i]);
}

size_t tr__pool_set_bytes(tr__pool_set_t *set)
{
    size_t total = 0;
    pthread_mutex_lock(&set->mu);
    for (tr__pool_t *p = set->pools; p; p = p->next_in_set)
        total += atomic_load_explicit(&p->bytes, memory_order_relaxed);
    pthread_mutex_unlock(&set->mu);
    return total;
}
