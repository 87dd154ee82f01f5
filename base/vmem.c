/* vmem.c: anonymous private mappings (see vmem.h). */
#include "base/vmem.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static size_t page_size(void)
{
    static size_t page;
    if (!page) {
        long p = sysconf(_SC_PAGESIZE);
        page = p > 0 ? (size_t)p : 4096;
    }
    return page;
}

void *tr__vmem_alloc(size_t bytes)
{
    size_t len = bytes ? bytes : 1;
    void *p =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void tr__vmem_free(void *p, size_t bytes)
{
    if (p) munmap(p, bytes ? bytes : 1);
}

void tr__vmem_release(void *p, size_t bytes)
{
    if (!bytes) return;
    size_t page = page_size();
    uintptr_t a = (uintptr_t)p, b = a + bytes;
    uintptr_t lo = (a + page - 1) & ~(uintptr_t)(page - 1), hi = b & ~(uintptr_t)(page - 1);
    if (lo >= hi) { /* no whole page inside */
        memset(p, 0, bytes);
        return;
    }
    memset(p, 0, lo - a);
    memset((void *)hi, 0, b - hi);
    /* Private anonymous memory reads as zeros after MADV_DONTNEED. Should the advice fail (it
     * cannot for a valid mapping), zeroing keeps the contract. */
    if (madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0) memset((void *)lo, 0, hi - lo);
}
