/* vec_impl.h: the template of the vector primitives, included once per ISA by vec.c.
 *
 * The includer defines W (lanes), VT (vector type), P(name) (the ISA's function name) and the
 * operations below as macros or static inline functions:
 *   LD(p) ST(p, v)              unaligned load / store of W floats
 *   LDT(p, k, fill) STT(p, v, k) the first k < W lanes, other lanes = fill / untouched
 *   SET1 ADD SUB MUL DIV FMA(a, b, c) = a b + c, VMAX VMIN, HSUM HMAX (horizontal)
 *   EXP2I(v)                    2^v for integral-valued v in [-126, 127], ROUND(v) to nearest
 *   ABS(v) COPYSIGN(mag, sign)
 * Every loop runs whole vectors, then one masked tail, so any n and alignment work. The
 * template undefines all of these at its end, ready for the next ISA's definitions.
 */

#define TAIL(i, n) ((n) - (i) < (size_t)W)

/* Cephes expf: e^x = 2^k e^r, r = x - k ln2 split in two parts, e^r by a degree-5 polynomial. */
static inline VT P(vexp)(VT x)
{
    x = VMIN(VMAX(x, SET1(-87.3f)), SET1(88.0f));
    VT k = ROUND(MUL(x, SET1(1.44269504088896341f)));
    x = SUB(x, MUL(k, SET1(0.693359375f)));
    x = SUB(x, MUL(k, SET1(-2.12194440e-4f)));
    VT y = SET1(1.9875691500e-4f);
    y = FMA(y, x, SET1(1.3981999507e-3f));
    y = FMA(y, x, SET1(8.3334519073e-3f));
    y = FMA(y, x, SET1(4.1665795894e-2f));
    y = FMA(y, x, SET1(1.6666665459e-1f));
    y = FMA(y, x, SET1(5.0000001201e-1f));
    y = FMA(y, MUL(x, x), ADD(x, SET1(1.0f)));
    return MUL(y, EXP2I(k));
}

/* tanh(u) = sign(u) (1 - e) / (1 + e), e = e^(-2|u|) <= 1: no overflow for any u. */
static inline VT P(vtanh)(VT u)
{
    VT e = P(vexp)(MUL(ABS(u), SET1(-2.0f)));
    return COPYSIGN(DIV(SUB(SET1(1.0f), e), ADD(SET1(1.0f), e)), u);
}

static float P(dot)(const float *a, const float *b, size_t n)
{
    VT acc0 = SET1(0.0f), acc1 = SET1(0.0f);
    size_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        acc0 = FMA(LD(a + i), LD(b + i), acc0);
        acc1 = FMA(LD(a + i + W), LD(b + i + W), acc1);
    }
    for (; i < n; i += W) {
        if (TAIL(i, n))
            acc0 = FMA(LDT(a + i, n - i, 0.0f), LDT(b + i, n - i, 0.0f), acc0);
        else
            acc0 = FMA(LD(a + i), LD(b + i), acc0);
    }
    return HSUM(ADD(acc0, acc1));
}

static float P(sum)(const float *x, size_t n)
{
    VT acc = SET1(0.0f);
    for (size_t i = 0; i < n; i += W)
        acc = ADD(acc, TAIL(i, n) ? LDT(x + i, n - i, 0.0f) : LD(x + i));
    return HSUM(acc);
}

static float P(max)(const float *x, size_t n)
{
    VT acc = SET1(-INFINITY);
    for (size_t i = 0; i < n; i += W)
        acc = VMAX(acc, TAIL(i, n) ? LDT(x + i, n - i, -INFINITY) : LD(x + i));
    return HMAX(acc);
}

static void P(axpy)(float a, const float *x, float *y, size_t n)
{
    VT va = SET1(a);
    for (size_t i = 0; i < n; i += W) {
        if (TAIL(i, n))
            STT(y + i, FMA(va, LDT(x + i, n - i, 0.0f), LDT(y + i, n - i, 0.0f)), n - i);
        else
            ST(y + i, FMA(va, LD(x + i), LD(y + i)));
    }
}

static void P(add)(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i += W) {
        if (TAIL(i, n))
            STT(out + i, ADD(LDT(a + i, n - i, 0.0f), LDT(b + i, n - i, 0.0f)), n - i);
        else
            ST(out + i, ADD(LD(a + i), LD(b + i)));
    }
}

static void P(acc)(float *y, const float *x, size_t n)
{
    P(add)(y, y, x, n);
}

static void P(scale)(float *x, float s, size_t n)
{
    VT vs = SET1(s);
    for (size_t i = 0; i < n; i += W) {
        if (TAIL(i, n))
            STT(x + i, MUL(LDT(x + i, n - i, 0.0f), vs), n - i);
        else
            ST(x + i, MUL(LD(x + i), vs));
    }
}

static float P(exp_sum)(float *out, const float *x, float m, size_t n)
{
    VT vm = SET1(m), acc = SET1(0.0f);
    for (size_t i = 0; i < n; i += W) {
        if (TAIL(i, n)) {
            VT e = P(vexp)(SUB(LDT(x + i, n - i, -INFINITY), vm)); /* e^-inf = 0 in spare lanes */
            STT(out + i, e, n - i);
            acc = ADD(acc, e);
        } else {
            VT e = P(vexp)(SUB(LD(x + i), vm));
            ST(out + i, e);
            acc = ADD(acc, e);
        }
    }
    return HSUM(acc);
}

static float P(sqdev)(const float *x, float m, size_t n)
{
    VT vm = SET1(m), acc = SET1(0.0f);
    for (size_t i = 0; i < n; i += W) {
        VT d = SUB(TAIL(i, n) ? LDT(x + i, n - i, m) : LD(x + i), vm);
        acc = FMA(d, d, acc);
    }
    return HSUM(acc);
}

static void P(ln_row)(float *out, const float *x, const float *w, const float *b, float m, float s,
                      size_t n)
{
    VT vm = SET1(m), vs = SET1(s);
    for (size_t i = 0; i < n; i += W) {
        if (TAIL(i, n)) {
            size_t k = n - i;
            VT xh = MUL(SUB(LDT(x + i, k, 0.0f), vm), vs);
            STT(out + i, FMA(xh, LDT(w + i, k, 0.0f), LDT(b + i, k, 0.0f)), k);
        } else {
            VT xh = MUL(SUB(LD(x + i), vm), vs);
            ST(out + i, FMA(xh, LD(w + i), LD(b + i)));
        }
    }
}

static void P(ln_bwd_sums)(const float *dout, const float *x, const float *w, float m, float s,
                           size_t n, float *sg, float *sgx)
{
    VT vm = SET1(m), vs = SET1(s), a = SET1(0.0f), c = SET1(0.0f);
    for (size_t i = 0; i < n; i += W) {
        int t = TAIL(i, n);
        size_t k = n - i;
        VT g = MUL(t ? LDT(w + i, k, 0.0f) : LD(w + i), t ? LDT(dout + i, k, 0.0f) : LD(dout + i));
        VT xh = MUL(SUB(t ? LDT(x + i, k, m) : LD(x + i), vm), vs);
        a = ADD(a, g);
        c = FMA(g, xh, c);
    }
    *sg = HSUM(a);
    *sgx = HSUM(c);
}

static void P(ln_bwd_row)(float *dx, const float *dout, const float *x, const float *w, float m,
                          float s, float a, float c, size_t n)
{
    VT vm = SET1(m), vs = SET1(s), va = SET1(a), vc = SET1(c);
    for (size_t i = 0; i < n; i += W) {
        if (TAIL(i, n)) {
            size_t k = n - i;
            VT xh = MUL(SUB(LDT(x + i, k, 0.0f), vm), vs);
            VT g = MUL(LDT(w + i, k, 0.0f), LDT(dout + i, k, 0.0f));
            STT(dx + i, FMA(vs, SUB(SUB(g, va), MUL(xh, vc)), LDT(dx + i, k, 0.0f)), k);
        } else {
            VT xh = MUL(SUB(LD(x + i), vm), vs);
            VT g = MUL(LD(w + i), LD(dout + i));
            ST(dx + i, FMA(vs, SUB(SUB(g, va), MUL(xh, vc)), LD(dx + i)));
        }
    }
}

static void P(ln_bwd_params)(float *dw, float *db, const float *dout, const float *x, float m,
                             float s, size_t n)
{
    VT vm = SET1(m), vs = SET1(s);
    for (size_t i = 0; i < n; i += W) {
        if (TAIL(i, n)) {
            size_t k = n - i;
            VT d = LDT(dout + i, k, 0.0f), xh = MUL(SUB(LDT(x + i, k, 0.0f), vm), vs);
            STT(dw + i, FMA(xh, d, LDT(dw + i, k, 0.0f)), k);
            STT(db + i, ADD(LDT(db + i, k, 0.0f), d), k);
        } else {
            VT d = LD(dout + i), xh = MUL(SUB(LD(x + i), vm), vs);
            ST(dw + i, FMA(xh, d, LD(dw + i)));
            ST(db + i, ADD(LD(db + i), d));
        }
    }
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

static inline VT P(vgelu)(VT x)
{
    VT u = MUL(SET1(GELU_K), FMA(MUL(SET1(GELU_A), MUL(x, x)), x, x));
    return MUL(MUL(SET1(0.5f), x), ADD(SET1(1.0f), P(vtanh)(u)));
}

/* d/dx 0.5 x (1 + tanh u) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 a x^2) */
static inline VT P(vgelu_grad)(VT x)
{
    VT x2 = MUL(x, x);
    VT t = P(vtanh)(MUL(SET1(GELU_K), FMA(MUL(SET1(GELU_A), x2), x, x)));
    VT du = MUL(SET1(GELU_K), FMA(SET1(3.0f * GELU_A), x2, SET1(1.0f)));
    VT sech2 = SUB(SET1(1.0f), MUL(t, t));
    VT half = SET1(0.5f);
    return FMA(MUL(MUL(half, x), sech2), du, MUL(half, ADD(SET1(1.0f), t)));
}

static void P(gelu_fwd)(float *out, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i += W) {
        if (TAIL(i, n))
            STT(out + i, P(vgelu)(LDT(x + i, n - i, 0.0f)), n - i);
        else
            ST(out + i, P(vgelu)(LD(x + i)));
    }
}

static void P(gelu_bwd)(float *dx, const float *x, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i += W) {
        if (TAIL(i, n)) {
            size_t k = n - i;
            VT g = MUL(P(vgelu_grad)(LDT(x + i, k, 0.0f)), LDT(dout + i, k, 0.0f));
            STT(dx + i, ADD(LDT(dx + i, k, 0.0f), g), k);
        } else {
            ST(dx + i, FMA(P(vgelu_grad)(LD(x + i)), LD(dout + i), LD(dx + i)));
        }
    }
}

/* The same product as gelu_bwd into a zeroed dx, in place: d = GELU'(x) d. */
static void P(gelu_mul)(float *d, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i += W) {
        if (TAIL(i, n)) {
            size_t k = n - i;
            STT(d + i, MUL(P(vgelu_grad)(LDT(x + i, k, 0.0f)), LDT(d + i, k, 0.0f)), k);
        } else {
            ST(d + i, MUL(P(vgelu_grad)(LD(x + i)), LD(d + i)));
        }
    }
}

#undef GELU_K
#undef GELU_A
#undef TAIL

static const tr__vec_ops_t P(ops) = {
    P(dot),           P(sum),      P(max),      P(axpy),     P(add),         P(acc),
    P(scale),         P(exp_sum),  P(sqdev),    P(ln_row),   P(ln_bwd_sums), P(ln_bwd_row),
    P(ln_bwd_params), P(gelu_fwd), P(gelu_bwd), P(gelu_mul),
};

#undef W
#undef VT
#undef P
#undef LD
#undef ST
#undef LDT
#undef STT
#undef SET1
#undef ADD
#undef SUB
#undef MUL
#undef DIV
#undef FMA
#undef VMAX
#undef VMIN
#undef HSUM
#undef HMAX
#undef EXP2I
#undef ROUND
#undef ABS
#undef COPYSIGN
