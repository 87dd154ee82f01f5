/* file.h: the files and paths every folder needs: reading a whole file, joining a path and
 * making a directory with its parents (`mkdir -p`, for every output folder: traces, monitors,
 * checkpoints). Each explains its failure and names the path. */
#ifndef TR_BASE_FILE_H
#define TR_BASE_FILE_H

#include <stddef.h>

/* The bytes tr__file_read leaves after a file's content: the first is '\0', the rest are the
 * caller's (trace_load closes a cut-off trace in them). */
#define TR__FILE_SPARE 16

/* Reads the whole file at path into *out, a new buffer aligned to 64 bytes (free it with
 * free()) holding *len bytes and TR__FILE_SPARE more after them. Reads until end of file, so
 * pipes work as well. max: the largest size accepted, 0 for no limit. what: what the file
 * should be, for the messages ("a JSON file"). On failure *out is NULL and err (errlen bytes)
 * says "<path>: ...": -errno when it cannot be opened or read, TR_EISDIR for a directory,
 * TR_EFORMAT for a file over max, TR_ENOMEM. Any thread. */
int tr__file_read(const char *path, size_t max, const char *what, char **out, size_t *len,
                  char *err, size_t errlen);

/* Writes dir, a '/' and name into out (cap bytes). No '/' is added when dir already ends in
 * one, and a NULL or empty dir gives name alone. 0, or TR_EINVAL when the result does not fit
 * (out is then ""). Any thread. */
int tr__path_join(char *out, size_t cap, const char *dir, const char *name);

/* 0 when path is a directory afterwards (made now or already there); -errno from the first
 * component that could not be made; TR_EINVAL for an empty path or one of 4096 bytes or
 * more. Any thread. */
int tr__mkdir_p(const char *path);

#endif
