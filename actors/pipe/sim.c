/* pipe_sim.c: S stages' schedules run against each other in virtual time (troupe/pipeline.h).
 *
 * Each stage has a clock and a position in its instruction stream (its steps, one after the
 * other, no barrier between them). A send records the sender's clock under (link, micro-batch);
 * a receive waits for that record and moves the receiver's clock to it; compute adds its cost;
 * loads and the step's collectives cost nothing. Stages are advanced in turn until every stream
 * ends; a pass in which no stage moves means some receive's send never comes. Since a stream is
 * executed in order and a receive's time is its send's, the result does not depend on the
 * order the stages are advanced in: it is the earliest each instruction can run.
 */
#include <math.h>
#include <stdlib.h>

#include "actors/pipe/schedule.h"
#include "base/errf.h"
#include "troupe/error.h"

typedef struct lane {
    const tr_pipe_instr_t *x;
    int n, pos;
    double clock, busy;
} lane_t;

typedef struct sim {
    int M, S;
    lane_t *lane;
    double *act, *grad; /* [s * M + mb]: when stage s sent its activation / input gradient */
} sim_t;

static double cost_of(const tr_pipe_costs_t *c, int op)
{
    switch (op) {
    case TR_PIPE_FORWARD:
        return c->forward;
    case TR_PIPE_BACKWARD:
        return c->backward;
    case TR_PIPE_BACKWARD_INPUT:
        return c->backward_input;
    case TR_PIPE_BACKWARD_WEIGHT:
        return c->backward_weight;
    default:
        return 0;
    }
}

/* Stage s's next instruction, if it can run now: 1 (it ran), 0 (it waits). */
static int advance(sim_t *m, int s, const tr_pipe_costs_t *c)
{
    lane_t *l = &m->lane[s];
    const tr_pipe_instr_t *x = &l->x[l->pos];
    double *sent = NULL;
    if (x->op == TR_PIPE_RECV_ACTIVATION) sent = &m->act[(s - 1) * m->M + x->micro_batch];
    if (x->op == TR_PIPE_RECV_GRAD) sent = &m->grad[(s + 1) * m->M + x->micro_batch];
    if (sent && isnan(*sent)) return 0;
    if (sent && *sent > l->clock) l->clock = *sent;
    if (x->op == TR_PIPE_SEND_ACTIVATION) m->act[s * m->M + x->micro_batch] = l->clock;
    if (x->op == TR_PIPE_SEND_GRAD) m->grad[s * m->M + x->micro_batch] = l->clock;
    double t = cost_of(c, x->op);
    l->clock += t;
    l->busy += t;
    l->pos++;
    return 1;
}

/* Checks that the schedules are one pipeline's stages 0..S-1 and fills the lanes. */
static int lanes(sim_t *m, const tr_pipe_schedule_t *const *st, int n, char *err, size_t len)
{
    int kind0 = 0;
    for (int s = 0; s < n; s++) {
        int kind, M, S, stage;
        m->lane[s].n = tr__pipe_schedule_shape(st[s], &kind, &M, &S, &stage);
        m->lane[s].x = tr__pipe_schedule_all(st[s]);
        if (s == 0) {
            kind0 = kind;
            m->M = M;
            m->S = S;
        }
        if (kind != kind0 || M != m->M || S != n || stage != s)
            return tr__errf(err, len, TR_EINVAL,
                            "pipeline simulation: schedule %d is stage %d "
                            "of %d (kind %d, %d micro-batches); expected stage %d of %d (kind %d, "
                            "%d micro-batches)",
                            s, stage, S, kind, M, s, n, kind0, m->M);
    }
    return 0;
}

static int run(sim_t *m, const tr_pipe_costs_t *c, char *err, size_t len)
{
    for (;;) {
        int moved = 0, left = 0;
        for (int s = 0; s < m->S; s++) {
            while (m->lane[s].pos < m->lane[s].n && advance(m, s, c))
                moved = 1;
            left += m->lane[s].pos < m->lane[s].n;
        }
        if (!left) return 0;
        if (moved) continue;
        for (int s = 0; s < m->S; s++)
            if (m->lane[s].pos < m->lane[s].n) {
                const tr_pipe_instr_t *x = &m->lane[s].x[m->lane[s].pos];
                return tr__errf(err, len, TR_EINVAL,
                                "pipeline simulation: deadlock: stage %d "
                                "waits in %s of micro-batch %d, which no stage sends",
                                s, tr_pipe_op_name(x->op), x->micro_batch);
            }
    }
}

int tr_pipe_simulate(const tr_pipe_schedule_t *const *stages, int n_stages,
                     const tr_pipe_costs_t *costs, tr_pipe_sim_t *out, char *err, size_t errlen)
{
    if (n_stages < 1 || !stages || !costs)
        return tr__errf(err, errlen, TR_EINVAL, "pipeline simulation: no stages");
    sim_t m = {0};
    m.lane = calloc((size_t)n_stages, sizeof(*m.lane));
    int rc = m.lane ? lanes(&m, stages, n_stages, err, errlen) : TR_ENOMEM;
    size_t cells = (size_t)n_stages * (size_t)(m.M > 0 ? m.M : 1);
    if (!rc) {
        m.act = malloc(cells * sizeof(double));
        m.grad = malloc(cells * sizeof(double));
        if (!m.act || !m.grad) rc = TR_ENOMEM;
    }
    for (size_t i = 0; !rc && i < cells; i++)
        m.act[i] = m.grad[i] = NAN;
    if (!rc) rc = run(&m, costs, err, errlen);
    if (!rc) {
        *out = (tr_pipe_sim_t){0};
        for (int s = 0; s < n_stages; s++) {
            out->busy += m.lane[s].busy;
            if (m.lane[s].clock > out->makespan) out->makespan = m.lane[s].clock;
        }
        out->bubble = out->makespan > 0 ? 1 - out->busy / (n_stages * out->makespan) : 0;
        out->theory = (double)(n_stages - 1) / (m.M + n_stages - 1);
    }
    if (rc == TR_ENOMEM) tr__errf(err, errlen, rc, "pipeline simulation: out of memory");
    free(m.lane);
    free(m.act);
    free(m.grad);
    return rc;
}
