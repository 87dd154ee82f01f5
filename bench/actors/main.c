/* main.c: troupe_actors, the Troupe side of `make bench-actors`.
 *
 *   troupe_actors [--only NAME] [--reps N] [--workers N]
 *
 * Runs the Savina benchmarks, skynet, fan-in, latency after a wake-up (from a timer inside the
 * runtime, and from a thread outside it) and idle CPU, and prints one
 * `name: value unit` line each (timed benchmarks, and each latency row: the median of --reps
 * runs, default 5).
 * bench/peers/caf/savina_caf prints the same names for CAF; bench/actors/run.sh puts the two
 * side by side. Exits 1 if any benchmark computed a wrong result.
 */
#include "benches.h"

static const struct {
    const char *name;
    bench_fn fn;
} timed[] = {
    {"pingpong", bench_pingpong},
    {"counting", bench_counting},
    {"threadring", bench_threadring},
    {"chameneos", bench_chameneos},
    {"big", bench_big},
    {"fjthrput", bench_fjthrput},
    {"fib", bench_fib},
    {"skynet", bench_skynet},
};

int main(int argc, char **argv)
{
    bench_args_t a;
    if (bench_parse(argc, argv, &a) < 0) return 2;
    printf("# troupe: %u workers, median of %d reps\n", a.workers, a.reps);
    int failed = 0;
    for (size_t i = 0; i < sizeof(timed) / sizeof(timed[0]); i++)
        if (bench_selected(&a, timed[i].name) && bench_timed(&a, timed[i].name, timed[i].fn) < 0)
            failed = 1;
    if (bench_fanin(&a) < 0) failed = 1;
    if (bench_selected(&a, "latency") && bench_latency(&a) < 0) failed = 1;
    if (bench_selected(&a, "wakeup") && bench_wakeup(&a) < 0) failed = 1;
    if (bench_selected(&a, "wakeup_floor") && bench_wakeup_floor(&a) < 0) failed = 1;
    if (bench_selected(&a, "idle_cpu") && bench_idle_cpu(&a) < 0) failed = 1;
    return failed;
}
