/* Small value types shared by every public header: element types and devices. Every tensor
 * reference, buffer description and configured data type uses these, so a tensor's device is
 * always known (CPU now; CUDA and NVMe leave their place ready). */
#ifndef TR_INCLUDE_TROUPE_TYPES_H
#define TR_INCLUDE_TROUPE_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TR_DTYPE_F32 = 0,
    TR_DTYPE_F16 = 1,
    TR_DTYPE_BF16 = 2,
    TR_DTYPE_F64 = 3,
    TR_DTYPE_I32 = 4,
    TR_DTYPE_I64 = 5,
    TR_DTYPE_U16 = 6,
    TR_DTYPE_U8 = 7,
    TR_DTYPE_COUNT_
} tr_dtype_t;

/* Bytes per element of dt; 0 for an invalid value. */
static inline size_t tr_dtype_size(int dt)
{
    static const unsigned char sizes[TR_DTYPE_COUNT_] = {4, 2, 2, 8, 4, 8, 2, 1};
    return dt >= 0 && dt < TR_DTYPE_COUNT_ ? sizes[dt] : 0;
}

/* dt's short name, as messages print it: "f32", "f16", "bf16", "f64", "i32", "i64", "u16",
 * "u8"; "an invalid dtype" for any other value (one from another rank or a corrupt header). */
static inline const char *tr_dtype_name(int dt)
{
    static const char *const names[TR_DTYPE_COUNT_] = {"f32", "f16", "bf16", "f64",
                                                       "i32", "i64", "u16",  "u8"};
    return dt >= 0 && dt < TR_DTYPE_COUNT_ ? names[dt] : "an invalid dtype";
}

typedef enum {
    TR_DEVICE_CPU = 0,
    TR_DEVICE_CUDA = 1,
    TR_DEVICE_NVME = 2,
    TR_DEVICE_COUNT_
} tr_device_kind_t;

/* A device: its kind and, for several of a kind (GPUs), its index. */
typedef struct tr_device {
    tr_device_kind_t kind;
    int index;
} tr_device_t;

#ifdef __cplusplus
}
#endif
#endif
