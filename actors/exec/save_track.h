/* save_track.h: how far a background checkpoint save is on every rank, kept by the executor.
 *
 * A save has two phases. WRITING: every rank's checkpointer copies its part of the state (the
 * caller's save returns then) and writes its files. LATEST: once every rank's files are
 * durable, rank 0's checkpointer writes <dir>/latest. Each rank's checkpointer reports the end
 * of its part of a phase to its executor (WRITTEN); the executor learns every rank's at points
 * that are the same on every rank (a step's loss all-reduce, a wait's all-reduce: COMM_SCALAR
 * values that tr__save_values fills and tr__save_advance reads), so every rank moves from one
 * phase to the next at the same step, and a save called on some ranks only is found. On one
 * rank the reports are the agreement. At most one save is in flight: the embedding API waits
 * for the last before a save or a load.
 */
#ifndef TR_ACTORS_EXEC_SAVE_TRACK_H
#define TR_ACTORS_EXEC_SAVE_TRACK_H

#include <stdbool.h>
#include <stdint.h>

enum { TR__SAVE_NONE = 0, TR__SAVE_WRITING, TR__SAVE_LATEST };

typedef struct tr__save_track {
    int phase;        /* TR__SAVE_* */
    int local;        /* this rank's part of the phase: 0 going on, 1 done, < 0 failed */
    char why[512];    /* its failure */
    char where[4400]; /* <dir>/<tag>, for the messages */
    char dir[4096];
    uint64_t step;
    char latest[256]; /* the tag <dir>/latest named at this rank's last report ("": none) */
    bool discard;     /* the writing phase failed: the checkpointer removes the tag's files */
    int outcome;      /* the last finished save's: 0 or TR_E* (with outcome_why) */
    char outcome_why[1536];
} tr__save_track_t;

/* A save of dir/tag at step begins (WRITING, nothing reported yet). */
void tr__save_begin(tr__save_track_t *t, const char *dir, const char *tag, uint64_t step);

/* This rank's checkpointer reported its part of the phase: rc, why when it failed, and the tag
 * <dir>/latest names now ("" or NULL: none), for the failure's message. */
void tr__save_reported(tr__save_track_t *t, int rc, const char *why, const char *latest);

/* The two values this rank adds to an all-reduce (sum) that tells how far every rank is. */
void tr__save_values(const tr__save_track_t *t, double v[2]);

/* The sums v over `world` ranks (on one rank: this rank's own values): the phase ends when
 * every rank's part has, and the next begins. Returns TR__SAVE_LATEST when this rank
 * (rank 0) is to have latest written now, 1 when the save finished (t->outcome says how; a
 * failure is logged), 0 when nothing changed, TR_EFAILED (with t->outcome_why) when some
 * ranks are in a save and others are not. After a save whose writing failed on some rank,
 * t->discard is set: every rank's checkpointer is to remove the files it wrote for the tag. */
int tr__save_advance(tr__save_track_t *t, int rank, int world, const double v[2]);

/* Whether this rank's part of the current phase is over (its values will not change). */
static inline bool tr__save_local_done(const tr__save_track_t *t)
{
    return t->phase != TR__SAVE_NONE && t->local != 0;
}

#endif
