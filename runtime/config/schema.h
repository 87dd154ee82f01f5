/* The configuration schema: one table of sections and keys (kind, field, default, range,
 * choices) that drives validation, unknown-key detection, defaults, the dump and the docs.
 * Private to runtime/config_*.c. */
#ifndef TR_RUNTIME_CONFIG_SCHEMA_H
#define TR_RUNTIME_CONFIG_SCHEMA_H

#include <stddef.h>

#include "troupe/config.h"

typedef enum {
    TR__K_BOOL,
    TR__K_INT,     /* int64_t; integral reals (5e8) accepted */
    TR__K_DOUBLE,  /* double */
    TR__K_STRING,  /* const char *, points into the resolved tree */
    TR__K_ENUM,    /* int: index into choices (+1 with TR__F_ENUM1) */
    TR__K_PAIR,    /* double[2] */
    TR__K_STRLIST, /* tr_config_strlist_t */
    TR__K_SECTION, /* nested object: sub */
    TR__K_VARIANT, /* nested object whose schema is variants[enum at variant_of] */
    TR__K_ALIAS,   /* another name for alias_of (a warning with TR__F_DEPRECATED) */
    TR__K_IGNORED, /* known to DeepSpeed, not implemented: accepted with a warning */
    TR__K_REJECT,  /* known, and an error: doc says what to do instead */
} tr__cfg_kind_t;

enum {
    TR__F_REQUIRED = 1u << 0,   /* no default: must be given when the section is */
    TR__F_NULLABLE = 1u << 1,   /* null means the default */
    TR__F_NOCASE = 1u << 2,     /* enum matched case-insensitively */
    TR__F_ENUM1 = 1u << 3,      /* enum stored as index + 1 (0 = none) */
    TR__F_DEPRECATED = 1u << 4, /* alias: warn */
    TR__F_BATCH = 1u << 5,      /* one of the batch triple: resolved after the walk */
    TR__F_AUTO_ZERO = 1u << 6,  /* "auto" is a legal value, stored as 0 */
    TR__F_OPTIONAL = 1u << 7,   /* section: absent means absent, no defaults dumped */
    TR__F_IF_ENABLED = 1u << 8, /* ignored section: an error when its "enabled" is true */
    TR__F_DERIVED = 1u << 9,    /* default is computed after the walk (origin "derived") */
    TR__F_MIN_EXCL = 1u << 10,  /* number: min itself is excluded (DeepSpeed's gt=) */
};

/* What Troupe does with a key's value: every key of the table has one state, and
 * test_config_schema fails on a key without one. Sections and variants are containers (their
 * keys carry the states); an alias has the state of the key it stands for. */
typedef enum {
    TR__S_NONE,     /* not classified: a bug in the table */
    TR__S_ACTED,    /* the engine and its actors act on the value */
    TR__S_INERT,    /* accepted; a value other than the default draws a warning: "accepted:
                     * <why>; no effect yet" (TR__K_IGNORED: any value, "not supported") */
    TR__S_REJECTED, /* an error (TR__K_REJECT) */
} tr__cfg_state_t;

typedef struct tr__cfg_section tr__cfg_section_t;

typedef struct tr__cfg_key {
    const char *name;
    tr__cfg_kind_t kind;
    size_t offset;     /* of the field in tr_config_t */
    const char *field; /* that field as written: "aio.queue_depth" (test_config_states) */
    double def;        /* bool, int, double, enum default; PAIR: def, def2 */
    double def2;
    const char *def_str;                      /* string default; NULL = null */
    double min, max;                          /* inclusive range of numbers */
    const char *const *choices;               /* ENUM: NULL-terminated */
    const tr__cfg_section_t *sub;             /* SECTION */
    const tr__cfg_section_t *const *variants; /* VARIANT: indexed by the enum value */
    size_t variant_of;                        /* VARIANT: offset of the int enum field */
    const char *alias_of;                     /* ALIAS: the key it stands for */
    const char *expect;                       /* wording of "must be ..."; NULL = generated */
    unsigned flags;
    const char *doc; /* one line for docs/config.md */
    tr__cfg_state_t state;
    const char *why; /* TR__S_INERT: why the value has no effect yet */
} tr__cfg_key_t;

struct tr__cfg_section {
    const char *name; /* dotted path from the top, "" for the top */
    const tr__cfg_key_t *keys;
    size_t n_keys;
};

/* The top of the schema. */
extern const tr__cfg_section_t tr__cfg_top;

/* Bounds of the integers the engine narrows to C int (batch sizes, loss-scale window). */
#define TR__CFG_INT_MAX 2147483647.0

/* "accepted: <why>; no effect yet" or "" for an acted-upon key: what the docs say about k. */
const char *tr__cfg_state_text(const tr__cfg_key_t *k, char *b, size_t n);

/* Finds name in sec (exact). NULL when absent. */
const tr__cfg_key_t *tr__cfg_find(const tr__cfg_section_t *sec, const char *name);

#define TR__CFG_WHERE_MAX 3

/* Where else in the schema a key called name lives: fills places with up to
 * TR__CFG_WHERE_MAX + 1 distinct dotted paths (section not_in skipped) and returns how many;
 * more than TR__CFG_WHERE_MAX means "too common to hint at". */
int tr__cfg_where(const char *name, const tr__cfg_section_t *not_in, char places[][256]);

/* The key of sec closest to name by edit distance, or NULL when none is close enough. */
const char *tr__cfg_closest(const tr__cfg_section_t *sec, const char *name);

/* Levenshtein distance between a and b (bytes), capped at 255-byte inputs. */
int tr__cfg_edit_distance(const char *a, const char *b);

/* Appends a diagnostic line, printf-style; ENOMEM is remembered in d and later reported. */
void tr__cfg_diag_add(tr_config_diag_t *d, tr_config_severity_t sev, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
