/* Troupe's monitor: the trace recorder the runtime feeds, and DeepSpeed's familiar outputs.
 *
 * The recorder keeps one lane per actor (a small integer the runtime chooses, with a name and
 * a kind that drives the breakdown and the colours), a span per handled message, a flow from
 * every send to its handling, counters and instant markers. Events go into per-thread
 * lock-free buffers (no lock, no allocation on the hot path; a full buffer drops and counts)
 * and a writer thread turns them into a Chrome trace-event file, `trace_rank<R>.json`, one
 * event per line. A step window (wait, warmup, active, repeat, as PyTorch's profiler
 * schedule) chooses which steps are written. A small always-on ring per thread keeps the last
 * spans for a flight-recorder dump after a failure.
 *
 * Times are nanoseconds of CLOCK_MONOTONIC (tr_now_ns()). Names passed as `const char *`
 * to the hot-path calls must have static lifetime (message type names, counter names).
 *
 * The other half of this header reproduces DeepSpeed's outputs: the wall-clock-breakdown
 * timer lines, the throughput and progress lines, the csv_monitor layout and TensorBoard
 * event files. docs/tracing.md describes every output and `troupe trace`.
 */
#ifndef TR_INCLUDE_TROUPE_MONITOR_H
#define TR_INCLUDE_TROUPE_MONITOR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "troupe/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- the recorder ---------------------------------------------------------------------- */

typedef enum {
    TR_LANE_COMPUTE = 0, /* forward/backward, optimizer math */
    TR_LANE_COMM = 1,    /* reduce-scatter, all-gather, all-reduce */
    TR_LANE_IO = 2,      /* NVMe swap, checkpoint, data loading from disk */
    TR_LANE_CONTROL = 3, /* bookkeeping actors: engine, monitor, supervisor */
    TR_LANE_DATA = 4,    /* data movement that is neither comm nor io: loader, bucketer */
    TR_LANE_KIND_COUNT_
} tr_lane_kind_t;

/* "compute", "comm", "io", "control", "data"; NULL for an unknown kind. Any thread. */
const char *tr_lane_kind_name(tr_lane_kind_t kind);
/* The kind named s, or -1. Any thread. */
int tr_lane_kind_parse(const char *s);

#define TR_MONITOR_MAX_LANES 4096

/* Which steps are traced: skip `wait` steps, record `warmup` steps without writing them,
 * write `active` steps; that cycle runs `repeat` times (0 = forever). All zero: every step. */
typedef struct tr_trace_steps {
    uint32_t wait, warmup, active, repeat;
} tr_trace_steps_t;

typedef struct tr_trace_opts {
    int enabled;             /* write trace_rank<rank>.json into output_path */
    const char *output_path; /* directory, created if missing; copied */
    int flight_recorder;     /* keep the always-on ring of the last spans per thread */
    tr_trace_steps_t steps;
    unsigned rank;
    size_t buffer_events; /* events per thread buffer, rounded up to a power of 2; 0 = 65536 */
    size_t flight_spans;  /* spans per thread ring, power of 2; 0 = 256 */
    unsigned flush_ms;    /* writer thread period; 0 = 100 */
} tr_trace_opts_t;

typedef struct tr_monitor tr_monitor_t;

/* One handled message. name is the message type's name (static lifetime); flow is the id the
 * message was sent with (0: none); bytes its payload size. */
typedef struct tr_span {
    const char *name;
    uint64_t begin_ns, end_ns;
    uint64_t step;
    uint32_t micro_step;
    uint32_t lane;
    uint64_t bytes;
    uint64_t flow;
} tr_span_t;

typedef struct tr_monitor_stats {
    uint64_t events_written;  /* trace events written to the file */
    uint64_t dropped;         /* events lost: a thread buffer was full, or a lane out of range */
    uint64_t unmatched_flows; /* sends never handled in the window (not written) */
    uint64_t threads;         /* thread buffers registered */
} tr_monitor_stats_t;

/* Creates a monitor. With opts->enabled it creates output_path, opens
 * <output_path>/trace_rank<rank>.json, writes the header and starts the writer thread; with
 * only flight_recorder it keeps the rings and writes nothing. The run's time origin is the
 * moment of this call. TR_EINVAL (bad steps, no output_path), TR_ENOMEM, or -errno from
 * mkdir/fopen. The runtime's thread, before its workers start recording. */
int tr_monitor_create(const tr_trace_opts_t *opts, tr_monitor_t **out);

/* Stops the writer, drains every buffer, closes the JSON array and the file, frees all.
 * NULL does nothing. After every recording thread has stopped calling in. Same thread as
 * create. */
void tr_monitor_destroy(tr_monitor_t *m);

/* Names lane (< TR_MONITOR_MAX_LANES) and gives its kind; name is copied (47 bytes kept).
 * Writes the lane's thread_name and thread_sort_index metadata. A lane is named once: later
 * calls for it are ignored. TR_EINVAL for a lane or kind out of range; NULL m does
 * nothing. Any thread; before the lane's first span. */
int tr_monitor_lane_set(tr_monitor_t *m, uint32_t lane, const char *name, tr_lane_kind_t kind);

/* The engine starts step `step` (0-based, counting optimizer steps): moves the window and
 * records a "step" instant marker at now_ns. NULL does nothing. Any thread, one
 * call at a time, in step order (the engine calls it where a step opens). */
void tr_monitor_step(tr_monitor_t *m, uint64_t step, uint64_t now_ns);

/* Records a handled message: a complete event on span->lane (< TR_MONITOR_MAX_LANES), and
 * the end of its flow. Lock-free, no allocation. NULL does nothing. Worker threads (any
 * thread). */
void tr_monitor_span(tr_monitor_t *m, const tr_span_t *span);

/* Records a send from lane: the start of flow `flow` (nonzero, unique per run; unique across
 * ranks when messages cross ranks). name is the message type. Any thread. */
void tr_monitor_send(tr_monitor_t *m, uint32_t lane, uint64_t flow, const char *name,
                     uint64_t now_ns);

/* A counter sample: mailbox depth, bucket memory, pinned/device memory, aio bytes in
 * flight. lane < 0 makes it process-wide; otherwise the lane's name is appended to the
 * counter's name. Any thread. */
void tr_monitor_counter(tr_monitor_t *m, int lane, const char *name, double value, uint64_t now_ns);

/* The counters' names, so every actor reports the same series. */
#define TR_COUNTER_MAILBOX_DEPTH "mailbox_depth"       /* per lane: messages queued */
#define TR_COUNTER_BUCKET_BYTES  "bucket_bytes"        /* gradient bucket memory in use */
#define TR_COUNTER_PINNED_BYTES  "pinned_bytes"        /* pinned host memory in use */
#define TR_COUNTER_DEVICE_BYTES  "device_bytes"        /* device memory in use */
#define TR_COUNTER_AIO_INFLIGHT  "aio_bytes_in_flight" /* NVMe reads/writes submitted */
#define TR_COUNTER_SWAP_READ     "swap_bytes_read"     /* the swapper's reads, cumulative */
#define TR_COUNTER_SWAP_WRITTEN  "swap_bytes_written"  /* the swapper's writes, cumulative */
#define TR_COUNTER_SWAP_IO_MS                                                                      \
    "swap_io_ms" /* the swapper's time in reads and writes (with their                             \
                  * checksums), cumulative; the share of it hidden                                 \
                  * behind compute: troupe trace summary */

/* An instant marker on a lane. Any thread. */
void tr_monitor_instant(tr_monitor_t *m, uint32_t lane, const char *name, uint64_t now_ns);

/* Writes out everything recorded so far (the writer thread does this every flush_ms, more
 * often while buffers fill). -errno on a write error. Any thread; the caller waits for a
 * drain in progress, the recording threads never wait. */
int tr_monitor_flush(tr_monitor_t *m);

/* Writes every thread's flight ring (the last spans) as a Chrome trace file at path.
 * Meant for an unhandled failure: call it after the workers have stopped, or accept that a
 * thread still recording may leave one torn span. TR_EINVAL when the ring is off. Any
 * thread. */
int tr_monitor_flight_dump(tr_monitor_t *m, const char *path);

/* Counts so far. Any thread. */
void tr_monitor_stats(tr_monitor_t *m, tr_monitor_stats_t *out);

/* Whether events of the current step are being recorded: the runtime may skip work it
 * does only for the trace (reading a mailbox depth) when this is 0. Any thread. */
int tr_monitor_recording(const tr_monitor_t *m);

/* NVTX ranges named like the spans, for Nsight Systems: push when a behaviour starts
 * handling a message, pop when it returns (the thread that runs it). No-ops when m is NULL
 * or the build has no CUDA. */
void tr_monitor_range_push(const tr_monitor_t *m, const char *name);
void tr_monitor_range_pop(const tr_monitor_t *m);
/* 1 when this build sends ranges to NVTX. Any thread. */
int tr_monitor_nvtx_available(void);

/* --- DeepSpeed's SynchronizedWallClockTimer (wall_clock_breakdown) ----------------------- */

/* DeepSpeed's engine timer names, in the order its lines print them. */
#define TR_WALLTIMER_MICRO_NAMES                                                                   \
    "fwd_microstep", "bwd_microstep", "bwd_inner_microstep", "bwd_allreduce_microstep",            \
        "step_microstep"
#define TR_WALLTIMER_GLOBAL_NAMES "fwd", "bwd", "bwd_inner", "bwd_allreduce", "step"

typedef struct tr_walltimers tr_walltimers_t;

/* A group of named timers that accumulate milliseconds. TR_ENOMEM. Any thread, one at a
 * time per group (the engine's). */
int tr_walltimers_create(tr_walltimers_t **out);
void tr_walltimers_destroy(tr_walltimers_t *t);
/* Starts/stops the timer called name (created on first use; name copied). Starting a
 * started timer or stopping a stopped one is TR_EINVAL, as DeepSpeed's asserts. */
int tr_walltimers_start(tr_walltimers_t *t, const char *name, uint64_t now_ns);
int tr_walltimers_stop(tr_walltimers_t *t, const char *name, uint64_t now_ns);
/* Milliseconds accumulated by name (0 if unknown); reset clears it. A running timer's
 * elapsed time so far is included and it keeps running. */
double tr_walltimers_elapsed_ms(tr_walltimers_t *t, const char *name, int reset, uint64_t now_ns);
/* Formats DeepSpeed's log_dist line "[Rank R] time (ms) | name: 12.34 | ..." for the names
 * that exist (in the order given), each divided by normalizer, resetting them when reset.
 * Writes at most cap bytes including the NUL and returns the length it needed (snprintf
 * style). */
size_t tr_walltimers_log_line(tr_walltimers_t *t, unsigned rank, const char *const *names,
                              size_t n_names, double normalizer, int reset, uint64_t now_ns,
                              char *buf, size_t cap);

/* --- DeepSpeed's ThroughputTimer and progress line -------------------------------------- */

typedef struct tr_throughput {
    uint64_t batch_size;       /* train_batch_size: samples per global step */
    uint64_t start_step;       /* steps excluded from timing; DeepSpeed's default 2 */
    uint64_t steps_per_output; /* steps_per_print */
    uint64_t epoch, micro_step, global_step;
    double total_elapsed_s, step_elapsed_s;
    uint64_t start_ns; /* 0: timing not begun (DeepSpeed's start_time == 0) */
    int started;
} tr_throughput_t;

/* batch_size samples per global step; start_step 0 means DeepSpeed's 2. */
void tr_throughput_init(tr_throughput_t *tp, uint64_t batch_size, uint64_t steps_per_output,
                        uint64_t start_step);
/* Before each micro-step's forward. */
void tr_throughput_start(tr_throughput_t *tp, uint64_t now_ns);
/* After each micro-step; global_step at an accumulation boundary. Returns 1 and writes the
 * line "epoch=E/micro_step=M/global_step=G, RunningAvgSamplesPerSec=..., CurrSamplesPerSec=...,
 * MemAllocated=...GB, MaxMemAllocated=...GB" (numbers as Python prints them) when DeepSpeed
 * would log it, 0 otherwise. mem_* are bytes. */
int tr_throughput_stop(tr_throughput_t *tp, int global_step, uint64_t now_ns,
                       uint64_t mem_allocated, uint64_t max_mem_allocated, char *buf, size_t cap);
/* A new epoch: micro_step restarts at 0. */
void tr_throughput_epoch(tr_throughput_t *tp);

/* DeepSpeed's progress line "[Rank 0] step=S, skipped=K, lr=[...], mom=[[b1, b2], ...]"
 * (mom as betas pairs from a JSON config; n_mom pairs, may be 0 for "mom=[]"). snprintf
 * style. Any thread. */
size_t tr_progress_line(unsigned rank, uint64_t step, uint64_t skipped, const double *lr,
                        size_t n_lr, const double (*mom)[2], size_t n_mom, char *buf, size_t cap);

/* Python's repr() of a float ("0.1", "1e-05", "3.0", "inf"): snprintf style. */
size_t tr_pyfloat_format(double v, char *buf, size_t cap);

/* --- csv_monitor ----------------------------------------------------------------------- */

/* The tags DeepSpeed's engine writes to its monitors (csv_monitor, tensorboard), with the
 * step being the number of samples trained so far. */
#define TR_TAG_TRAIN_LOSS            "Train/Samples/train_loss"
#define TR_TAG_LR                    "Train/Samples/lr"
#define TR_TAG_LOSS_SCALE            "Train/Samples/loss_scale" /* fp16 only */
#define TR_TAG_FORWARD_MS            "Train/Samples/elapsed_time_ms_forward"
#define TR_TAG_BACKWARD_MS           "Train/Samples/elapsed_time_ms_backward"
#define TR_TAG_BACKWARD_INNER_MS     "Train/Samples/elapsed_time_ms_backward_inner"
#define TR_TAG_BACKWARD_ALLREDUCE_MS "Train/Samples/elapsed_time_ms_backward_allreduce"
#define TR_TAG_STEP_MS               "Train/Samples/elapsed_time_ms_step"

typedef struct tr_csv_monitor tr_csv_monitor_t;

/* DeepSpeed's csv_monitor: files in <output_path>/<job_name>/ (created), one per tag. An
 * existing non-empty file is appended to without a second header (a resumed run).
 * -errno from mkdir. One thread (rank 0's engine). */
int tr_csv_monitor_create(const char *output_path, const char *job_name, tr_csv_monitor_t **out);
void tr_csv_monitor_destroy(tr_csv_monitor_t *c);
/* Appends the row "<step>,<value>" to the tag's file (tag "Train/Samples/lr" goes to
 * Train_Samples_lr.csv, header "step,lr"), as Python's csv module writes it. -errno on a
 * write error, naming the file on stderr. */
int tr_csv_monitor_write(tr_csv_monitor_t *c, const char *tag, double value, uint64_t step);
/* The same for a value DeepSpeed holds as a Python int, printed without ".0": the fp16 loss
 * scale is 2**initial_scale_power (an int) until the scaler first changes it, and a float
 * ("32768.0") from then on. */
int tr_csv_monitor_write_int(tr_csv_monitor_t *c, const char *tag, int64_t value, uint64_t step);
/* The directory the files go to. */
const char *tr_csv_monitor_dir(const tr_csv_monitor_t *c);

/* --- TensorBoard ----------------------------------------------------------------------- */

typedef struct tr_tb_writer tr_tb_writer_t;

/* An event file events.out.tfevents.<unix seconds>.<host>.<pid>.0 in
 * <output_path>/<job_name>/ (created), starting with the file_version event. -errno from
 * mkdir/fopen. One thread (rank 0's engine). */
int tr_tb_writer_create(const char *output_path, const char *job_name, tr_tb_writer_t **out);
void tr_tb_writer_destroy(tr_tb_writer_t *w);
/* Appends one Event{wall_time, step, summary{value{tag, simple_value}}} record. -errno on a
 * write error. */
int tr_tb_writer_scalar(tr_tb_writer_t *w, const char *tag, float value, int64_t step,
                        double wall_time);
int tr_tb_writer_flush(tr_tb_writer_t *w);
/* The file's path. */
const char *tr_tb_writer_path(const tr_tb_writer_t *w);

/* TFRecord's masked CRC-32C of data. Any thread. */
uint32_t tr_crc32c_masked(const void *data, size_t len);
uint32_t tr_crc32c(uint32_t crc, const void *data, size_t len);

/* --- comms_logger ---------------------------------------------------------------------- */

/* DeepSpeed's comms_logger lands with the multi-rank issue: its per-collective records (op,
 * message size, latency, algorithm and bus bandwidth) will be spans and counters on the comm
 * actor's lane, its summary table part of `troupe trace summary`. */

#ifdef __cplusplus
}
#endif
#endif
