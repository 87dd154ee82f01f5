/* crc32c: the Castagnoli CRC (iSCSI polynomial 0x1EDC6F41, reflected) used by checkpoint
 * files and TFRecord framing. Hardware instruction when the CPU has SSE4.2, else tables. */
#ifndef TR_BASE_CRC32C_H
#define TR_BASE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over n bytes. Any thread. */
uint32_t tr__crc32c(uint32_t crc, const void *data, size_t n);

#endif
