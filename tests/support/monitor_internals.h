/* monitor_internals.h: the monitor's internals that the data-parallel benchmark reads, in one
 * test-only header: a loaded trace's spans and lanes (monitor/trace_model.h; the public
 * troupe/trace.h has no span iterator) and the bandwidth formulas of the comms log
 * (monitor/comms_log.h).
 *
 * Programs under bench/ include this, never a private header. It lives with the tests because
 * it is not part of the installed API; nothing here is stable. Any thread, per the contracts in
 * the headers it includes.
 */
#ifndef TR_TESTS_SUPPORT_MONITOR_INTERNALS_H
#define TR_TESTS_SUPPORT_MONITOR_INTERNALS_H

#include "monitor/comms_log.h"
#include "monitor/trace_model.h"

#endif
