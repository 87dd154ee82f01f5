/* mlp.c: a multi-layer perceptron classifier built from the generic layers.
 *
 * widths[0] inputs per position, then for each next width a linear layer (with bias),
 * GELU after every linear but the last, and cross-entropy over widths[n-1] classes with
 * TR_IGNORE_INDEX. Layers are named fc0, gelu0, fc1, ..., loss.
 */
#include "troupe/model.h"

#include <stdio.h>
#include <stdlib.h>

#include "model/model_internal.h"
#include "troupe/error.h"
#include "base/errf.h"

int tr_model_mlp_create(tr_model_t **out, const int *widths, int n, char *why, size_t why_len)
{
    if (n < 2) return tr__errf(why, why_len, TR_EINVAL, "MLP: %d widths given, need at least 2", n);
    for (int i = 0; i < n; i++)
        if (widths[i] < 1)
            return tr__errf(why, why_len, TR_EINVAL, "MLP: widths[%d] = %d, need >= 1", i,
                            widths[i]);
    int n_layers = 2 * (n - 1), k = 0, err = 0;
    tr_layer_t **layers = calloc((size_t)n_layers, sizeof(*layers));
    if (!layers) return TR_ENOMEM;
    for (int i = 0; i + 1 < n && !err; i++) {
        char name[TR_LAYER_NAME_MAX];
        snprintf(name, sizeof(name), "fc%d", i);
        err = tr_layer_linear_create(&layers[k++], name, widths[i], widths[i + 1], 1);
        if (!err && i + 2 < n) {
            snprintf(name, sizeof(name), "gelu%d", i);
            err = tr_layer_gelu_create(&layers[k++], name, widths[i + 1]);
        }
    }
    if (!err)
        err = tr_layer_crossentropy_create(&layers[k++], "loss", widths[n - 1], TR_IGNORE_INDEX);
    if (err) {
        for (int i = 0; i < n_layers; i++)
            tr__layer_free(layers[i]);
        free(layers);
        return tr__errf(why, why_len, err, "MLP: building layer %d failed", k - 1);
    }
    err = tr_model_create(out, layers, n_layers, why, why_len);
    free(layers);
    return err;
}
