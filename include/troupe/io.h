/* Troupe file formats: llm.c's GPT-2 checkpoints and token shards, read and written as-is.
 *
 * Checkpoint (llm.c train_gpt2.c, version 3, fp32): 256 int32 header (magic 20240326,
 * version 3, max_seq_len, vocab_size, num_layers, num_heads, channels, padded_vocab_size,
 * rest 0), then every parameter in fp32 in llm.c's order: wte (Vp, C), wpe (maxT, C), then
 * ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb each for
 * all L layers at once ((L, ...) tensors), then lnfw, lnfb. Troupe's model keeps each block's
 * tensors together instead (one range per layer); these functions translate.
 * Token shard (llm.c data loaders): 256 int32 header (magic 20240520, version 1, token
 * count), then count uint16 tokens.
 * Errors: -errno from the system, TR_EFORMAT for a bad magic, version, header field or size
 * (why, when not NULL, names the file and the field and says what was expected),
 * TR_EMISMATCH when a checkpoint's config differs from the model it is loaded into.
 * All functions may be called from any thread; the model must not be in use meanwhile.
 */
#ifndef TR_INCLUDE_TROUPE_IO_H
#define TR_INCLUDE_TROUPE_IO_H

#include <stddef.h>
#include <stdint.h>

#include "troupe/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TR_LLMC_HEADER_INTS    256
#define TR_LLMC_MODEL_MAGIC    20240326
#define TR_LLMC_MODEL_VERSION  3
#define TR_LLMC_TOKENS_MAGIC   20240520
#define TR_LLMC_TOKENS_VERSION 1

/* Reads only the checkpoint's header and checks it and the file size. */
int tr_llmc_gpt2_read_config(const char *path, tr_gpt2_config_t *config, char *why, size_t why_len);

/* Creates a GPT-2 model from a checkpoint. *out is set only on success. */
int tr_llmc_gpt2_load(const char *path, tr_model_t **out, char *why, size_t why_len);

/* Loads a checkpoint's parameters into an existing GPT-2 model of the same config. */
int tr_llmc_gpt2_load_into(tr_model_t *model, const char *path, char *why, size_t why_len);

/* Writes a GPT-2 model's parameters as an llm.c checkpoint (to path.tmp, then renamed, so a
 * crash never leaves a half-written file under path). TR_EINVAL if model is not a GPT-2. */
int tr_llmc_gpt2_save(const tr_model_t *model, const char *path, char *why, size_t why_len);

/* Reads a token shard; *tokens (free() it) holds *count tokens. */
int tr_llmc_tokens_load(const char *path, uint16_t **tokens, size_t *count, char *why,
                        size_t why_len);

/* Writes a token shard (path.tmp, then renamed). TR_EINVAL if count exceeds INT32_MAX. */
int tr_llmc_tokens_save(const char *path, const uint16_t *tokens, size_t count, char *why,
                        size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
