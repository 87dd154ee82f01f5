/* pipe_partition.c: DeepSpeed's ways of cutting a model's layers into pipeline stages
 * (deepspeed/runtime/pipe/module.py _partition_layers, runtime/utils.py partition_uniform and
 * partition_balanced): "uniform" spreads the layers, "parameters" balances parameter counts,
 * "type:REGEX" balances the layers whose kind or name matches. Balanced: contiguous parts,
 * the heaviest as light as possible (a binary search over the bound, each bound checked
 * greedily; each part filled as far as the bound allows).
 */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/errf.h"
#include "troupe/error.h"
#include "troupe/model.h"
#include "troupe/pipeline.h"

/* DeepSpeed's partition_uniform: chunks of n / S, the first n % S one larger. */
static void uniform(int n, int S, int *b)
{
    int chunk = n / S, rest = n % S;
    b[0] = 0;
    for (int p = 0; p < S; p++)
        b[p + 1] = b[p] + chunk + (p < rest);
}

/* Whether w cuts into at most S contiguous parts of weight <= cap; the cuts into b. */
static int fits(const double *w, int n, int S, double cap, int *b)
{
    int p = 0;
    double sum = 0;
    b[0] = 0;
    for (int i = 0; i < n; i++) {
        if (w[i] > cap) return 0;
        if (sum + w[i] > cap) {
            if (++p >= S) return 0;
            b[p] = i;
            sum = 0;
        }
        sum += w[i];
    }
    while (p + 1 < S)
        b[++p] = n; /* fewer parts needed: the rest end empty, fixed below */
    b[S] = n;
    return 1;
}

/* Every stage gets at least one layer: an empty tail part takes layers from before it. */
static void no_empty(int n, int S, int *b)
{
    for (int p = S - 1; p >= 1; p--)
        if (b[p] > n - (S - p)) b[p] = n - (S - p);
    for (int p = 1; p <= S - 1; p++)
        if (b[p] <= b[p - 1]) b[p] = b[p - 1] + 1;
}

static void balanced(const double *w, int n, int S, int *b)
{
    double lo = 0, hi = 0;
    for (int i = 0; i < n; i++) {
        hi += w[i];
        lo = w[i] > lo ? w[i] : lo;
    }
    for (int it = 0; it < 100 && hi - lo > 1e-9 * (hi > 1 ? hi : 1); it++) {
        double mid = (lo + hi) / 2;
        if (fits(w, n, S, mid, b))
            hi = mid;
        else
            lo = mid;
    }
    fits(w, n, S, hi, b);
    no_empty(n, S, b);
}

int tr_pipe_partition(const tr_model_t *model, const char *method, int S, int *b, char *err,
                      size_t len)
{
    int n = model ? tr_model_num_layers(model) : 0;
    if (!method) method = "parameters";
    if (S < 1 || S > n)
        return tr__errf(err, len, TR_EINVAL,
                        "pipeline: %d stages for a model of %d layers "
                        "(each stage needs a layer)",
                        S, n);
    if (!strcasecmp(method, "uniform")) {
        uniform(n, S, b);
        return 0;
    }
    double *w = calloc((size_t)n, sizeof(double));
    if (!w) return tr__errf(err, len, TR_ENOMEM, "pipeline: out of memory");
    int rc = 0;
    if (!strcasecmp(method, "parameters") || !strcasecmp(method, "best")) {
        for (int i = 0; i < n; i++)
            w[i] = (double)tr_model_layer(model, i)->param_count;
    } else if (!strncasecmp(method, "type:", 5)) {
        regex_t re;
        if (regcomp(&re, method + 5, REG_EXTENDED | REG_ICASE | REG_NOSUB) != 0) {
            free(w);
            return tr__errf(err, len, TR_EINVAL,
                            "pipeline.partition: '%s': not a regular "
                            "expression",
                            method + 5);
        }
        int hits = 0;
        for (int i = 0; i < n; i++) {
            const tr_layer_t *l = tr_model_layer(model, i);
            hits += (int)(w[i] = !regexec(&re, l->ops->kind, 0, NULL, 0) ||
                                 !regexec(&re, l->name, 0, NULL, 0));
        }
        regfree(&re);
        if (hits < S)
            rc = tr__errf(err, len, TR_EINVAL,
                          "pipeline.partition: '%s' matches %d layers, "
                          "fewer than the %d stages",
                          method, hits, S);
    } else {
        rc = tr__errf(err, len, TR_EINVAL,
                      "pipeline.partition: '%s': expected \"parameters\", "
                      "\"uniform\" or \"type:REGEX\"",
                      method);
    }
    if (rc == 0) balanced(w, n, S, b);
    free(w);
    return rc;
}
