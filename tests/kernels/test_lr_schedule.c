/* LR schedules against tables of expected values. The tables were computed with a Python
 * transcription of DeepSpeed's lr_schedules.py (WarmupLR, WarmupDecayLR, WarmupCosineLR,
 * OneCycle with and without stairs, LRRangeTest continuous and staircase) at the
 * last_batch_iteration values in `its`; several were checked by hand (see comments). Both
 * sides evaluate the same double expressions in the same order; 1e-12 relative leaves room
 * only for libm's log/cos differing in the last bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "kernels/cpu/lr_schedule.h"
#include "troupe/error.h"

#define N_ITS 16
static const int64_t its[N_ITS] = {-1, 0, 1, 2, 5, 9, 10, 11, 50, 99, 100, 101, 150, 199, 200, 250};

static const double want_warmup_log[N_ITS] = {0.0001,
                                              0.0001,
                                              0.0030801969570734135,
                                              0.004823500421724658,
                                              0.007803697378798072,
                                              0.009999999999999998,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01};
static const double want_warmup_lin[N_ITS] = {0.0001,
                                              0.0001,
                                              0.0010900000000000003,
                                              0.0020800000000000003,
                                              0.005050000000000001,
                                              0.00901,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01,
                                              0.01};
static const double want_decay[N_ITS] = {0.0,
                                         0.0,
                                         0.001,
                                         0.002,
                                         0.005,
                                         0.009000000000000001,
                                         0.01,
                                         0.009947368421052632,
                                         0.007894736842105263,
                                         0.00531578947368421,
                                         0.005263157894736842,
                                         0.005210526315789474,
                                         0.002631578947368421,
                                         5.2631578947368424e-05,
                                         0.0,
                                         0.0};
static const double want_cosine[N_ITS] = {0.0,
                                          0.00030000000000000003,
                                          0.0011127809882927491,
                                          0.0015882273877430883,
                                          0.0024010083760358375,
                                          0.0029999999999999996,
                                          0.0029997970079138165,
                                          0.002999188087151275,
                                          0.0026716327589617374,
                                          0.0016376303280264137,
                                          0.0016131445177236636,
                                          0.001588631875689735,
                                          0.0004913101874589298,
                                          3e-05,
                                          3e-05,
                                          3e-05};
static const double want_oc_lr[N_ITS] = {0.001,
                                         0.0012250000000000002,
                                         0.0014500000000000006,
                                         0.0016750000000000007,
                                         0.0023500000000000014,
                                         0.0032500000000000025,
                                         0.0034750000000000024,
                                         0.0037000000000000028,
                                         0.00835,
                                         0.001,
                                         0.0009756097560975611,
                                         0.0009523809523809524,
                                         0.00043956043956043956,
                                         0.00028571428571428574,
                                         0.00028368794326241134,
                                         0.0002094240837696335};
static const double want_oc_mom[N_ITS] = {0.85,
                                          0.9475,
                                          0.945,
                                          0.9425,
                                          0.9349999999999999,
                                          0.9249999999999999,
                                          0.9225,
                                          0.9199999999999999,
                                          0.8683333333333333,
                                          0.95,
                                          0.9547499999999999,
                                          0.9594999999999999,
                                          1.1922499999999998,
                                          1.4249999999999998,
                                          1.4297499999999999,
                                          1.66725};
static const double want_ocs_lr[N_ITS] = {0.001,
                                          0.001,
                                          0.001,
                                          0.001,
                                          0.001,
                                          0.0032500000000000003,
                                          0.0032500000000000003,
                                          0.0032500000000000003,
                                          0.0055000000000000005,
                                          0.001,
                                          0.001,
                                          0.001,
                                          0.001,
                                          0.001,
                                          0.001,
                                          0.001};
static const double want_ocs_mom[N_ITS] = {0.85,
                                           0.95,
                                           0.95,
                                           0.95,
                                           0.95,
                                           0.9249999999999999,
                                           0.9249999999999999,
                                           0.9249999999999999,
                                           0.8999999999999999,
                                           0.95,
                                           0.95,
                                           0.95,
                                           0.95,
                                           0.95,
                                           0.95,
                                           0.95};
static const double want_rt[N_ITS] = {
    0.001,    0.0010249999999999999, 0.0010500000000000002, 0.001075, 0.00115,
    0.00125,  0.0012749999999999999, 0.0013000000000000002, 0.002275, 0.0035,
    0.003525, 0.0035499999999999998, 0.004775000000000001,  0.006,    0.006025000000000001,
    0.007275};
static const double want_rts[N_ITS] = {0.001,
                                       0.001,
                                       0.001,
                                       0.001,
                                       0.001,
                                       0.001,
                                       0.001,
                                       0.001,
                                       0.002,
                                       0.0035,
                                       0.0035,
                                       0.0035,
                                       0.0045000000000000005,
                                       0.006,
                                       0.006,
                                       0.007};

static void check_lr(const char *name, const tr_lr_schedule_opts_t *o, const double *want)
{
    assert_int_equal(tr_lr_schedule_check(o, NULL, 0), 0);
    for (int i = 0; i < N_ITS; i++) {
        double got = tr_lr_schedule_lr(o, its[i]);
        if (!(fabs(got - want[i]) <= 1e-12 * fabs(want[i]) + 1e-300))
            printf("%s at %lld: %.17g, want %.17g\n", name, (long long)its[i], got, want[i]);
        assert_true(fabs(got - want[i]) <= 1e-12 * fabs(want[i]) + 1e-300);
    }
}

static void check_mom(const char *name, const tr_lr_schedule_opts_t *o, const double *want)
{
    for (int i = 0; i < N_ITS; i++) {
        double got = -1.0;
        assert_int_equal(tr_lr_schedule_momentum(o, its[i], &got), 1);
        if (!(fabs(got - want[i]) <= 1e-12 * fabs(want[i])))
            printf("%s at %lld: %.17g, want %.17g\n", name, (long long)its[i], got, want[i]);
        assert_true(fabs(got - want[i]) <= 1e-12 * fabs(want[i]));
    }
}

/* min 1e-4, max 1e-2, 10 warmup steps; linear at it = 1: 1e-4 + 9.9e-3·0.1 = 1.09e-3. */
static void test_lr_schedule_warmup_lr_log_and_linear(void **state)
{
    tr_lr_schedule_opts_t o;
    tr_lr_schedule_opts_default(&o, TR_LR_WARMUP_LR);
    o.warmup_min_lr = 0.0001;
    o.warmup_max_lr = 0.01;
    o.warmup_num_steps = 10;
    check_lr("warmup log", &o, want_warmup_log);
    o.warmup_type = TR_WARMUP_LINEAR;
    check_lr("warmup linear", &o, want_warmup_lin);
    double beta1 = 0.5;
    assert_int_equal(tr_lr_schedule_momentum(&o, 3, &beta1), 0);
    assert_true(beta1 == 0.5);
}

/* total 200: at it = 11, 0.01·(200 − 11)/190 = 0.0099473...; zero from 200 on. */
static void test_lr_schedule_warmup_decay_lr(void **state)
{
    tr_lr_schedule_opts_t o;
    tr_lr_schedule_opts_default(&o, TR_LR_WARMUP_DECAY_LR);
    o.total_num_steps = 200;
    o.warmup_max_lr = 0.01;
    o.warmup_num_steps = 10;
    o.warmup_type = TR_WARMUP_LINEAR;
    check_lr("warmup decay", &o, want_decay);
}

/* base lr 3e-3, warmup from ratio 0.1 (log), cosine to ratio 0.01 at 200, held after. */
static void test_lr_schedule_warmup_cosine_lr(void **state)
{
    tr_lr_schedule_opts_t o;
    tr_lr_schedule_opts_default(&o, TR_LR_WARMUP_COSINE_LR);
    o.base_lr = 0.003;
    o.total_num_steps = 200;
    o.warmup_min_ratio = 0.1;
    o.warmup_num_steps = 10;
    o.cos_min_ratio = 0.01;
    check_lr("cosine", &o, want_cosine);
}

/* Cycle 40 up + 60 down between 1e-3 and 1e-2, then lr decay 0.5 and momentum decay 0.1
 * every 20 steps. At it = 0: s = 0.01/0.4, lr = 1e-3 + 9e-3·0.025 = 1.225e-3, mom 0.9475;
 * at it = 100: lr = 1e-3/(1 + 0.5·1/20). */
static void test_lr_schedule_one_cycle_lr_and_momentum(void **state)
{
    tr_lr_schedule_opts_t o;
    tr_lr_schedule_opts_default(&o, TR_LR_ONE_CYCLE);
    o.cycle_min_lr = 0.001;
    o.cycle_max_lr = 0.01;
    o.decay_lr_rate = 0.5;
    o.cycle_first_step_size = 40;
    o.cycle_second_step_size = 60;
    o.decay_step_size = 20;
    o.cycle_min_mom = 0.85;
    o.cycle_max_mom = 0.95;
    o.decay_mom_rate = 0.1;
    check_lr("one cycle", &o, want_oc_lr);
    check_mom("one cycle mom", &o, want_oc_mom);
}

/* Symmetric 40 + 40 cycle, 4 stairs up and 2 down, no decay. */
static void test_lr_schedule_one_cycle_stairs(void **state)
{
    tr_lr_schedule_opts_t o;
    tr_lr_schedule_opts_default(&o, TR_LR_ONE_CYCLE);
    o.cycle_min_lr = 0.001;
    o.cycle_max_lr = 0.01;
    o.cycle_first_step_size = 40;
    o.cycle_first_stair_count = 4;
    o.cycle_second_stair_count = 2;
    o.cycle_min_mom = 0.85;
    o.cycle_max_mom = 0.95;
    check_lr("one cycle stairs", &o, want_ocs_lr);
    check_mom("one cycle stairs mom", &o, want_ocs_mom);
}

/* 1e-3·(1 + 0.5·(it + 1)/20), floored intervals with staircase. */
static void test_lr_schedule_range_test(void **state)
{
    tr_lr_schedule_opts_t o;
    tr_lr_schedule_opts_default(&o, TR_LR_RANGE_TEST);
    o.lr_range_test_step_size = 20;
    o.lr_range_test_step_rate = 0.5;
    check_lr("range test", &o, want_rt);
    o.lr_range_test_staircase = 1;
    check_lr("range test staircase", &o, want_rts);
}

static void test_lr_schedule_check_names_bad_params(void **state)
{
    tr_lr_schedule_opts_t o;
    char msg[128];
    tr_lr_schedule_opts_default(&o, TR_LR_WARMUP_DECAY_LR);
    assert_int_equal(tr_lr_schedule_check(&o, msg, sizeof(msg)), TR_EINVAL);
    assert_non_null(strstr(msg, "total_num_steps"));
    tr_lr_schedule_opts_default(&o, TR_LR_ONE_CYCLE);
    assert_int_equal(tr_lr_schedule_check(&o, msg, sizeof(msg)), TR_EINVAL);
    assert_non_null(strstr(msg, "cycle_min_lr"));
    tr_lr_schedule_opts_default(&o, TR_LR_WARMUP_LR);
    o.warmup_num_steps = 0;
    assert_int_equal(tr_lr_schedule_check(&o, msg, sizeof(msg)), TR_EINVAL);
    assert_non_null(strstr(msg, "warmup_num_steps"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lr_schedule_warmup_lr_log_and_linear),
        cmocka_unit_test(test_lr_schedule_warmup_decay_lr),
        cmocka_unit_test(test_lr_schedule_warmup_cosine_lr),
        cmocka_unit_test(test_lr_schedule_one_cycle_lr_and_momentum),
        cmocka_unit_test(test_lr_schedule_one_cycle_stairs),
        cmocka_unit_test(test_lr_schedule_range_test),
        cmocka_unit_test(test_lr_schedule_check_names_bad_params),
    };
    return cmocka_run_group_tests_name("lr_schedule", tests, NULL, NULL);
}
