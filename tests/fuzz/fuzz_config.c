/* fuzz_config.c: a libFuzzer target for the configuration parser. Any bytes go through
 * tr_config_from_string (parse, walk, resolve) and, when they load, tr_config_dump and the
 * dump is loaded back, which must succeed: the plain dump is a valid config. Built by
 * `make fuzz-config` (-DTR_FUZZ=ON, clang); the seed corpus is tests/fuzz/config/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "troupe/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    tr_config_t *cfg = NULL;
    int world = 1 + (int)(size % 8);
    if (tr_config_from_string((const char *)data, size, "fuzz.json", world, &cfg, &d) == 0) {
        char *text = tr_config_dump(cfg, 0);
        tr_config_t *again = NULL;
        if (text && tr_config_from_string(text, strlen(text), "dump", world, &again, NULL) != 0)
            abort(); /* a resolved config must load back */
        tr_config_destroy(again);
        free(text);
        free(tr_config_dump(cfg, TR_CONFIG_DUMP_MARK));
    }
    tr_config_destroy(cfg);
    tr_config_diag_close(&d);
    return 0;
}
