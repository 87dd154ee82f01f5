/* save_track.c: a background save's phases, agreed over the ranks (see the header).
 *
 * Values each rank adds: v[0] = 1 while it is in a save; v[1] = 1 when its part of the phase
 * is done, 2^20 when it failed. Summed over W ranks: v[0] = W means every rank is in the save
 * (0 < v[0] < W: some are not, an API misuse); the phase ends when every rank's part has
 * (done + failed = W); any failure ends the save as failed on every rank. */
#include "actors/exec/save_track.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/file.h"
#include "troupe/error.h"
#include "troupe/log.h"

#define FAILED_UNIT 1048576.0

void tr__save_begin(tr__save_track_t *t, const char *dir, const char *tag, uint64_t step)
{
    t->phase = TR__SAVE_WRITING;
    t->local = 0;
    t->why[0] = '\0';
    t->latest[0] = '\0';
    t->discard = false;
    t->step = step;
    snprintf(t->dir, sizeof(t->dir), "%s", dir);
    char step_tag[40];
    snprintf(step_tag, sizeof(step_tag), "global_step%llu", (unsigned long long)step);
    const char *name = tag && tag[0] ? tag : step_tag;
    /* A request's dir (4095 bytes at most) and tag (255) always fit; a longer pair is marked,
     * not cut silently (the messages show 300 bytes of it). */
    if (tr__path_join(t->where, sizeof(t->where), dir, name))
        snprintf(t->where, sizeof(t->where), "%.300s/%.60s (path too long)", dir, name);
}

void tr__save_reported(tr__save_track_t *t, int rc, const char *why, const char *latest)
{
    t->local = rc < 0 ? rc : 1;
    snprintf(t->why, sizeof(t->why), "%s", rc < 0 && why ? why : "");
    snprintf(t->latest, sizeof(t->latest), "%s", latest ? latest : "");
}

/* What a failed save leaves: the tag latest still names, or that there is none yet; after a
 * failure to write latest, also that the tag's files are whole. */
static void say_latest(const tr__save_track_t *t, char *buf, size_t cap)
{
    bool whole = t->phase == TR__SAVE_LATEST; /* every file of the tag was written: kept */
    if (t->latest[0])
        snprintf(buf, cap, "latest still names %.255s", t->latest);
    else if (whole)
        snprintf(buf, cap, "%.300s has no latest", t->dir);
    else
        snprintf(buf, cap, "no checkpoint is saved in %.300s yet (it has no latest)", t->dir);
    if (whole)
        snprintf(buf + strlen(buf), cap - strlen(buf),
                 "; the tag's files are whole (load it by its tag)");
}

void tr__save_values(const tr__save_track_t *t, double v[2])
{
    v[0] = t->phase != TR__SAVE_NONE;
    v[1] = t->phase == TR__SAVE_NONE ? 0 : t->local > 0 ? 1 : t->local < 0 ? FAILED_UNIT : 0;
}

static int finish(tr__save_track_t *t, int rc)
{
    t->phase = TR__SAVE_NONE;
    t->outcome = rc;
    if (rc < 0)
        tr_log(TR_LOG_ERROR, "checkpoint: %s", t->outcome_why);
    else
        t->outcome_why[0] = '\0';
    return 1;
}

int tr__save_advance(tr__save_track_t *t, int rank, int world, const double v[2])
{
    int in = (int)lround(v[0]), failed = (int)(v[1] / FAILED_UNIT);
    int done = (int)lround(v[1] - failed * FAILED_UNIT);
    if (in > 0 && in < world) {
        snprintf(t->outcome_why, sizeof(t->outcome_why),
                 "a checkpoint save was called on %d of %d ranks: every rank must call "
                 "tr_engine_save_checkpoint at the same step; no latest was written",
                 in, world);
        t->phase = TR__SAVE_NONE;
        t->outcome = TR_EFAILED;
        return TR_EFAILED;
    }
    if (t->phase == TR__SAVE_NONE || done + failed < world) return 0;
    const char *what = t->phase == TR__SAVE_WRITING ? "write its checkpoint files" : "write latest";
    char left[480];
    say_latest(t, left, sizeof(left));
    if (failed && t->local < 0)
        snprintf(t->outcome_why, sizeof(t->outcome_why), "save of %.300s failed: %.511s; %s",
                 t->where, t->why, left);
    else if (failed)
        snprintf(t->outcome_why, sizeof(t->outcome_why),
                 "save of %.300s failed: %d rank(s) could "
                 "not %s (their own errors say why); %s",
                 t->where, failed, what, left);
    if (failed) t->discard = t->phase == TR__SAVE_WRITING; /* a whole tag, latest aside, stays */
    if (failed) return finish(t, TR_EFAILED);
    if (t->phase == TR__SAVE_LATEST) return finish(t, 0);
    t->phase = TR__SAVE_LATEST;
    t->local = rank == 0 ? 0 : 1; /* rank 0 writes latest; the others have nothing to do */
    return rank == 0 ? TR__SAVE_LATEST : 0;
}
