/* pyfmt.c: Python's repr() of a float, because DeepSpeed's lines and CSV files print floats
 * with str()/format("{}"), and "byte for byte" means the same digits.
 *
 * repr gives the shortest decimal string that reads back as the same double. We find it by
 * trying %.*e precisions from 1 to 17 digits until strtod returns the value (glibc rounds
 * correctly, so the first that round-trips is the shortest and the nearest), then lay the
 * digits out as Python does: positional when the decimal exponent is in [-4, 16), otherwise
 * d.ddde+XX with at least two exponent digits; integers keep a ".0".
 */
#include "troupe/monitor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The shortest round-tripping digits of |v| > 0 into digits (no dot), and the exponent of
 * the first digit. */
static void shortest_digits(double v, char digits[24], int *exp10)
{
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, v);
        if (strtod(tmp, NULL) == v) break;
    }
    char *e = strchr(tmp, 'e');
    *exp10 = atoi(e + 1);
    int n = 0;
    for (char *p = tmp; p < e; p++)
        if (*p >= '0' && *p <= '9') digits[n++] = *p;
    while (n > 1 && digits[n - 1] == '0')
        n--;
    digits[n] = 0;
}

static void layout(char *out, size_t cap, const char *sign, const char *d, int exp10)
{
    int n = (int)strlen(d), decpt = exp10 + 1;
    if (decpt <= -4 || decpt > 16) {
        snprintf(out, cap, "%s%c%s%se%c%02d", sign, d[0], n > 1 ? "." : "", d + 1,
                 exp10 < 0 ? '-' : '+', abs(exp10));
        return;
    }
    char *p = out + snprintf(out, cap, "%s", sign); /* cap is 64: room for 16 + 17 digits */
    if (decpt <= 0) {
        p += sprintf(p, "0.");
        for (int i = 0; i < -decpt; i++)
            *p++ = '0';
        sprintf(p, "%s", d);
    } else if (decpt >= n) {
        p += sprintf(p, "%s", d);
        for (int i = n; i < decpt; i++)
            *p++ = '0';
        sprintf(p, ".0");
    } else {
        sprintf(p, "%.*s.%s", decpt, d, d + decpt);
    }
}

size_t tr_pyfloat_format(double v, char *buf, size_t cap)
{
    char out[64];
    if (isnan(v))
        snprintf(out, sizeof(out), "nan");
    else if (isinf(v))
        snprintf(out, sizeof(out), v < 0 ? "-inf" : "inf");
    else if (v == 0)
        snprintf(out, sizeof(out), signbit(v) ? "-0.0" : "0.0");
    else {
        char d[24];
        int exp10;
        shortest_digits(fabs(v), d, &exp10);
        layout(out, sizeof(out), v < 0 ? "-" : "", d, exp10);
    }
    return (size_t)snprintf(buf, cap, "%s", out);
}
