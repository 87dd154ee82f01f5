/* mkdir_p: creates a directory and its missing parents, like `mkdir -p` (mode 0777 before the
 * umask). Used for every output folder: traces, monitors, checkpoints. */
#ifndef TR_BASE_FILE_H
#define TR_BASE_FILE_H

/* 0 when path is a directory afterwards (made now or already there); -errno from the first
 * component that could not be made; TR_EINVAL for an empty path or one of 4096 bytes or
 * more. Any thread. */
int tr__mkdir_p(const char *path);

#endif
