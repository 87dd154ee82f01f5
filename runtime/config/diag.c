/* diag.c: the list of configuration diagnostics (errors, warnings, notes), each one
 * formatted line. Loading appends to it; the caller reads and frees it. */
#include "runtime/config/schema.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void tr_config_diag_init(tr_config_diag_t *d)
{
    d->items = NULL;
    d->count = d->cap = 0;
    d->n_errors = d->n_warnings = 0;
}

void tr_config_diag_close(tr_config_diag_t *d)
{
    if (!d) return;
    for (size_t i = 0; i < d->count; i++)
        free(d->items[i].text);
    free(d->items);
    tr_config_diag_init(d);
}

/* The counters always move, so an allocation failure loses a line's text, never the fact
 * that an error happened. */
void tr__cfg_diag_add(tr_config_diag_t *d, tr_config_severity_t sev, const char *fmt, ...)
{
    if (!d) return;
    if (sev == TR_CONFIG_ERROR)
        d->n_errors++;
    else if (sev == TR_CONFIG_WARNING)
        d->n_warnings++;
    if (d->count == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 16;
        tr_config_diag_entry_t *items = realloc(d->items, cap * sizeof(*items));
        if (!items) return;
        d->items = items;
        d->cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    char *text = NULL;
    int n = vasprintf(&text, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    d->items[d->count].severity = sev;
    d->items[d->count].text = text;
    d->count++;
}
