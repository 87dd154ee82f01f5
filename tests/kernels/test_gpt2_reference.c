/* GPT-2's forward against an independent NumPy implementation (tests/reference).
 *
 * argv[1] is tests/reference, argv[2] a Python with NumPy or "none". With NumPy the script
 * runs now, into a temporary folder, and its output must equal the committed fixture (so the
 * fixture is what the script makes); without, the committed fixture alone is used. The model
 * is loaded from the script's llm.c checkpoint (so the loader is part of the check) and its
 * logits must match to 2e-6 of the logits' scale and the loss to 1e-6 relative (float vs float64).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe/io.h"
#include "troupe/model.h"

static const char *ref_dir, *python;

typedef struct {
    int B, T, V;
    int tokens[256], targets[256];
    double loss;
    double logits[4096];
} expected;

static int read_ints(FILE *f, const char *tag, int *x, int n)
{
    char word[32];
    if (fscanf(f, "%31s", word) != 1 || strcmp(word, tag) != 0) return -1;
    for (int i = 0; i < n; i++)
        if (fscanf(f, "%d", &x[i]) != 1) return -1;
    return 0;
}

static void load_expected(const char *path, expected *e)
{
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    assert_int_equal(fscanf(f, "B %d T %d V %d", &e->B, &e->T, &e->V), 3);
    int n = e->B * e->T;
    assert_true(n <= 256 && n * e->V <= 4096);
    assert_int_equal(read_ints(f, "tokens", e->tokens, n), 0);
    assert_int_equal(read_ints(f, "targets", e->targets, n), 0);
    assert_int_equal(fscanf(f, " loss %lf logits", &e->loss), 1);
    for (int i = 0; i < n * e->V; i++)
        assert_int_equal(fscanf(f, "%lf", &e->logits[i]), 1);
    fclose(f);
}

static void check_against(const char *dir)
{
    char path[512], why[256];
    expected *e = calloc(1, sizeof(*e));
    snprintf(path, sizeof(path), "%s/gpt2_tiny_expected.txt", dir);
    load_expected(path, e);
    snprintf(path, sizeof(path), "%s/gpt2_tiny.bin", dir);
    tr_model_t *m;
    if (tr_llmc_gpt2_load(path, &m, why, sizeof(why))) fail_msg("%s", why);
    int Vp = tr_model_gpt2_config(m)->padded_vocab_size, N = e->B * e->T;
    tr_batch_t b = {.B = e->B, .T = e->T, .tokens = e->tokens};
    assert_int_equal(tr_model_forward(m, &b, NULL), 0); // no targets: logits stay logits
    const float *logits = tr_model_gpt2_logits(m);
    double worst = 0, scale = 0;
    for (int r = 0; r < N; r++)
        for (int v = 0; v < e->V; v++) {
            worst = fmax(worst, fabs(logits[r * Vp + v] - e->logits[r * e->V + v]));
            scale = fmax(scale, fabs(e->logits[r * e->V + v]));
        }
    print_message("gpt2 vs numpy: max logit error %.2e (scale %.2f)\n", worst, scale);
    assert_true(worst <= 2e-6 * scale);
    float loss;
    b.targets = e->targets;
    assert_int_equal(tr_model_forward(m, &b, &loss), 0);
    print_message("gpt2 vs numpy: loss %.7f vs %.7f\n", loss, e->loss);
    assert_true(fabs(loss - e->loss) <= 1e-6 * e->loss);
    tr_model_destroy(m);
    free(e);
}

static void test_gpt2_reference_matches_committed_fixture(void **state)
{
    check_against(ref_dir);
}

static int same_file(const char *a, const char *b)
{
    char cmd[1400];
    snprintf(cmd, sizeof(cmd), "cmp -s '%s' '%s'", a, b);
    return system(cmd) == 0;
}

static void test_gpt2_reference_matches_fresh_numpy_run(void **state)
{
    char cmd[1200], tmp[] = "/tmp/test_gpt2_ref_XXXXXX", a[600], b[600];
    snprintf(cmd, sizeof(cmd), "'%s' -c 'import numpy' 2>/dev/null", python);
    if (strcmp(python, "none") == 0 || system(cmd) != 0)
        skip(); // no NumPy: the committed fixture stands alone
    assert_non_null(mkdtemp(tmp));
    snprintf(cmd, sizeof(cmd), "'%s' '%s/gpt2_reference.py' '%s'", python, ref_dir, tmp);
    assert_int_equal(system(cmd), 0);
    check_against(tmp);
    const char *files[] = {"gpt2_tiny.bin", "gpt2_tiny_expected.txt"};
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof(a), "%s/%s", tmp, files[i]);
        snprintf(b, sizeof(b), "%s/%s", ref_dir, files[i]);
        if (!same_file(a, b))
            fail_msg("%s differs from the committed fixture: rerun %s/gpt2_reference.py", b,
                     ref_dir);
        unlink(a);
    }
    rmdir(tmp);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s REFERENCE_DIR PYTHON|none\n", argv[0]);
        return 2;
    }
    ref_dir = argv[1];
    python = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_reference_matches_committed_fixture),
        cmocka_unit_test(test_gpt2_reference_matches_fresh_numpy_run),
    };
    return cmocka_run_group_tests_name("gpt2_reference", tests, NULL, NULL);
}
