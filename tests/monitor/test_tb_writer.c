/* TensorBoard event files parse back with an independent reader written here: TFRecord
 * framing with both masked CRC-32Cs verified (a bitwise CRC, not the library's table), and
 * a generic protobuf walk of Event and Summary. A flipped byte is caught by the CRC. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe/monitor.h"

static uint32_t crc32c_bitwise(const uint8_t *p, size_t n)
{
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1)));
    }
    return ~crc;
}

static uint32_t masked(const uint8_t *p, size_t n)
{
    uint32_t c = crc32c_bitwise(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t varint(const uint8_t **p, const uint8_t *end)
{
    uint64_t v = 0;
    for (int shift = 0; *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) break;
    }
    return v;
}

typedef struct event {
    double wall_time;
    int64_t step;
    char file_version[32];
    char tag[64];
    float value;
    int has_value;
} event_t;

/* Summary{value{tag=1, simple_value=2}} */
static void parse_summary(const uint8_t *p, const uint8_t *end, event_t *e)
{
    while (p < end) {
        uint64_t key = varint(&p, end);
        assert_int_equal(key, 1 << 3 | 2);
        uint64_t len = varint(&p, end);
        const uint8_t *v = p, *vend = p + len;
        while (v < vend) {
            uint64_t k = varint(&v, vend);
            if (k == (1 << 3 | 2)) {
                uint64_t n = varint(&v, vend);
                memcpy(e->tag, v, n);
                e->tag[n] = 0;
                v += n;
            } else {
                assert_int_equal(k, 2 << 3 | 5);
                uint32_t bits = (uint32_t)le(v, 4);
                memcpy(&e->value, &bits, 4);
                e->has_value = 1;
                v += 4;
            }
        }
        p = vend;
    }
}

static void parse_event(const uint8_t *p, const uint8_t *end, event_t *e)
{
    memset(e, 0, sizeof(*e));
    while (p < end) {
        uint64_t key = varint(&p, end);
        if (key == (1 << 3 | 1)) {
            uint64_t bits = le(p, 8);
            memcpy(&e->wall_time, &bits, 8);
            p += 8;
        } else if (key == (2 << 3 | 0)) {
            e->step = (int64_t)varint(&p, end);
        } else if (key == (3 << 3 | 2)) {
            uint64_t n = varint(&p, end);
            memcpy(e->file_version, p, n);
            p += n;
        } else {
            assert_int_equal(key, 5 << 3 | 2);
            uint64_t n = varint(&p, end);
            parse_summary(p, p + n, e);
            p += n;
        }
    }
}

/* Reads every record; returns how many, or -1 at the first CRC mismatch. */
static int read_records(const char *path, event_t *events, int max)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    int n = 0;
    uint8_t head[12];
    while (fread(head, 1, 12, f) == 12 && n < max) {
        uint64_t len = le(head, 8);
        if ((uint32_t)le(head + 8, 4) != masked(head, 8)) {
            fclose(f);
            return -1;
        }
        uint8_t *data = malloc(len + 4);
        assert_int_equal(fread(data, 1, len + 4, f), len + 4);
        if ((uint32_t)le(data + len, 4) != masked(data, len)) {
            free(data);
            fclose(f);
            return -1;
        }
        parse_event(data, data + len, &events[n++]);
        free(data);
    }
    fclose(f);
    return n;
}

static void test_tb_writer_crc32c_known_value(void **state)
{
    assert_int_equal(tr_crc32c(0, "123456789", 9), 0xe3069283u);
    assert_int_equal(crc32c_bitwise((const uint8_t *)"123456789", 9), 0xe3069283u);
}

static void test_tb_writer_file_parses_back(void **state)
{
    char dir[128];
    snprintf(dir, sizeof(dir), "/tmp/tr_test_tb_%d", (int)getpid());
    tr_tb_writer_t *w;
    assert_int_equal(tr_tb_writer_create(dir, "job", &w), 0);
    assert_non_null(strstr(tr_tb_writer_path(w), "/job/events.out.tfevents."));
    const char *tags[] = {"Train/Samples/train_loss", "Train/Samples/lr"};
    for (int64_t s = 1; s <= 50; s++)
        for (int k = 0; k < 2; k++)
            assert_int_equal(tr_tb_writer_scalar(w, tags[k], 1.0f / (float)s + (float)k, s * 32,
                                                 1.7e9 + (double)s),
                             0);
    assert_int_equal(tr_tb_writer_scalar(w, "negative/step", -2.5f, -3, 1.7e9), 0);
    assert_int_equal(tr_tb_writer_flush(w), 0);
    char path[512];
    snprintf(path, sizeof(path), "%s", tr_tb_writer_path(w));
    tr_tb_writer_destroy(w);

    static event_t ev[200];
    int n = read_records(path, ev, 200);
    assert_int_equal(n, 1 + 100 + 1);
    assert_string_equal(ev[0].file_version, "brain.Event:2");
    assert_true(ev[0].wall_time > 1.6e9);
    for (int i = 1; i <= 100; i++) {
        int64_t s = (i + 1) / 2;
        int k = (i + 1) % 2;
        assert_string_equal(ev[i].tag, tags[k]);
        assert_true(ev[i].has_value);
        assert_true(ev[i].value == 1.0f / (float)s + (float)k);
        assert_int_equal(ev[i].step, s * 32);
        assert_true(ev[i].wall_time == 1.7e9 + (double)s);
    }
    assert_int_equal(ev[101].step, -3);
    assert_true(ev[101].value == -2.5f);

    /* flip one byte of a record's data: the reader must see a CRC mismatch */
    FILE *f = fopen(path, "r+b");
    fseek(f, 200, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 200, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
    assert_int_equal(read_records(path, ev, 200), -1);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tb_writer_crc32c_known_value),
        cmocka_unit_test(test_tb_writer_file_parses_back),
    };
    return cmocka_run_group_tests_name("tb_writer", tests, NULL, NULL);
}
