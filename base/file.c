#include "base/file.h"

#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "troupe/error.h"

int tr__mkdir_p(const char *path)
{
    char tmp[4096];
    if (!*path || snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp))
        return TR_EINVAL;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, 0777) && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(tmp, 0777) && errno != EEXIST)
        return -errno;
    struct stat st; /* EEXIST also for a file of that name */
    return stat(tmp, &st) == 0 && !S_ISDIR(st.st_mode) ? -ENOTDIR : 0;
}
