/* nvtx.c: NVTX ranges with the same names as the trace's spans, so Nsight Systems shows the
 * lanes Perfetto shows. Built with CUDA, the calls go to NVTX v3 (header-only; it costs a
 * pointer check until a tool such as nsys injects itself); without CUDA they do nothing.
 * The runtime pushes a range when a behaviour starts handling a message and pops it when
 * the behaviour returns, on the worker thread that runs it.
 */
#include "troupe/monitor.h"

#include "tr_build_config.h"

#if TR_HAVE_CUDA && defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#define HAVE_NVTX 1
#endif
#endif

int tr_monitor_nvtx_available(void)
{
#ifdef HAVE_NVTX
    return 1;
#else
    return 0;
#endif
}

#ifdef HAVE_NVTX
/* NVTX initialises itself at its first call, unsynchronised: two threads making their first
 * call at once race (ThreadSanitizer sees it). One initialisation, before any range. */
static pthread_once_t nvtx_once = PTHREAD_ONCE_INIT;

static void nvtx_init(void)
{
    nvtxInitialize(NULL);
}
#endif

void tr_monitor_range_push(const tr_monitor_t *m, const char *name)
{
#ifdef HAVE_NVTX
    if (!m) return;
    pthread_once(&nvtx_once, nvtx_init);
    nvtxRangePushA(name);
#else
    (void)m;
    (void)name;
#endif
}

void tr_monitor_range_pop(const tr_monitor_t *m)
{
#ifdef HAVE_NVTX
    if (m) nvtxRangePop();
#else
    (void)m;
#endif
}
