/*
 * Error paths of the riftco C ABI: NULL pointers, invalid enums, wrong lengths, stale graphs,
 * buffers too small, handles used after the model handle was released, free(NULL), configs too
 * large for addressable memory.
 *
 *   test_errors SCRATCH_DIR
 *
 * Run by tests/c/run.sh under valgrind. Exits non-zero on the first failed expectation.
 */
#include "check.h"
#include "riftco.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { VOCAB = 256, BATCH = 2, SEQ_PLUS_ONE = 9, MAX_SEQ = 16 };

static rt_transformer_config small_config(void) {
    rt_transformer_config c;
    rt_transformer_config_default(&c);
    c.vocab_size = VOCAB;
    c.d_model = 16;
    c.n_heads = 2;
    c.n_layers = 1;
    c.d_ff = 32;
    c.max_seq_len = MAX_SEQ;
    c.seed = 7;
    return c;
}

static void fill_tokens(uint32_t *tokens, size_t n) {
    for (size_t i = 0; i < n; i++) {
        tokens[i] = (uint32_t)((i * 31 + 5) % VOCAB);
    }
}

static void test_version_and_messages(void) {
    uint32_t major = 0, minor = 0;
    EXPECT_OK(rt_abi_version(&major, &minor));
    EXPECT_TRUE(major == RT_ABI_VERSION_MAJOR && minor == RT_ABI_VERSION_MINOR);
    EXPECT(rt_abi_version(NULL, &minor), RT_ERROR_NULL_POINTER);
    EXPECT(rt_abi_version(&major, NULL), RT_ERROR_NULL_POINTER);
    EXPECT_MESSAGE_HAS("rt_abi_version: minor is NULL");

    /* Size query, too-small buffer (truncated, NUL-terminated), NULL buffer with a length. */
    size_t needed = 0;
    EXPECT(rt_last_error_message(NULL, 0, &needed), RT_ERROR_BUFFER_TOO_SMALL);
    EXPECT_TRUE(needed == strlen("rt_abi_version: minor is NULL") + 1);
    char small[8];
    memset(small, 'x', sizeof small);
    EXPECT(rt_last_error_message(small, sizeof small, &needed), RT_ERROR_BUFFER_TOO_SMALL);
    EXPECT_TRUE(strcmp(small, "rt_abi_") == 0);
    EXPECT(rt_last_error_message(NULL, 5, NULL), RT_ERROR_NULL_POINTER);
    char big[128];
    EXPECT_OK(rt_last_error_message(big, sizeof big, NULL));
    EXPECT_TRUE(strcmp(big, "rt_abi_version: minor is NULL") == 0);

    EXPECT_TRUE(strcmp(rt_status_name(RT_ERROR_SHAPE), "RT_ERROR_SHAPE") == 0);
    EXPECT_TRUE(strcmp(rt_status_name(9999), "RT_UNKNOWN_STATUS") == 0);
    EXPECT_TRUE(RT_OK == 0 && RT_ERROR_NULL_POINTER == 1 && RT_ERROR_INVALID_ENUM == 3 &&
                RT_ERROR_STALE_GRAPH == 7 && RT_ERROR_PANIC == 9 &&
                RT_ERROR_BUFFER_TOO_SMALL == 10);
}

/*
 * Statuses appended for error kinds the C layer used to fold into others: a checkpoint contract
 * violation (was RT_ERROR_INTERNAL) and operands on different devices (was RT_ERROR_SHAPE).
 * Neither can be triggered through this ABI today (the library's own checkpointed blocks declare
 * their dependencies, and every tensor lives on the CPU), so this checks the header's values
 * and their names in the library; crates/riftco-capi/src/error/kind_tests.rs checks that the
 * core errors reach the boundary with these statuses.
 */
static void test_new_statuses(void) {
    EXPECT_TRUE(RT_ERROR_INTERNAL == 13 && RT_ERROR_OUT_OF_MEMORY == 14 &&
                RT_ERROR_CHECKPOINT == 15 && RT_ERROR_DEVICE_MISMATCH == 16);
    EXPECT_TRUE(strcmp(rt_status_name(RT_ERROR_CHECKPOINT), "RT_ERROR_CHECKPOINT") == 0);
    EXPECT_TRUE(strcmp(rt_status_name(RT_ERROR_DEVICE_MISMATCH), "RT_ERROR_DEVICE_MISMATCH") == 0);
}

static void test_free_null(void) {
    rt_model_free(NULL);
    rt_graph_free(NULL);
    rt_adam_free(NULL);
    rt_decode_session_free(NULL);
    EXPECT_TRUE(1);
}

static void test_create(void) {
    rt_transformer_config c = small_config();
    rt_model *model = (rt_model *)&c; /* must be overwritten with NULL on failure */
    EXPECT(rt_model_create(NULL, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model),
           RT_ERROR_NULL_POINTER);
    EXPECT_TRUE(model == NULL);
    EXPECT(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, NULL),
           RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_create(&c, 7, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model),
           RT_ERROR_INVALID_ENUM);
    EXPECT_MESSAGE_HAS("attention kind 7");
    EXPECT(rt_model_create(&c, RT_ATTENTION_FLASH, 2, &model), RT_ERROR_INVALID_ENUM);
    EXPECT_MESSAGE_HAS("policy 2");
    EXPECT(rt_model_create(&c, RT_ATTENTION_FLASH, UINT32_MAX, &model), RT_ERROR_INVALID_ENUM);
    c.n_heads = 3;
    EXPECT(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("n_heads");
    c = small_config();
    c.rms_norm_eps = -1.0f;
    EXPECT(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("rms_norm_eps");
    EXPECT_TRUE(model == NULL);
    EXPECT(rt_transformer_config_default(NULL), RT_ERROR_NULL_POINTER);
}

static void test_policy_and_training(const char *scratch) {
    rt_transformer_config c = small_config();
    rt_model *model = NULL;
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_MATERIALIZED,
                              RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, &model));
    if (model == NULL) {
        return;
    }
    uint32_t policy = 99, attention = 99;
    EXPECT_OK(rt_model_activation_checkpointing(model, &policy));
    EXPECT_TRUE(policy == RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK);
    EXPECT(rt_model_set_activation_checkpointing(model, 5), RT_ERROR_INVALID_ENUM);
    EXPECT_OK(rt_model_activation_checkpointing(model, &policy));
    EXPECT_TRUE(policy == RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK); /* unchanged */
    EXPECT(rt_model_set_activation_checkpointing(NULL, 0), RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_activation_checkpointing(NULL, &policy), RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_activation_checkpointing(model, NULL), RT_ERROR_NULL_POINTER);
    EXPECT_OK(rt_model_set_activation_checkpointing(model, RT_ACTIVATION_CHECKPOINTING_DISABLED));
    EXPECT_OK(rt_model_attention(model, &attention));
    EXPECT_TRUE(attention == RT_ATTENTION_MATERIALIZED);
    EXPECT(rt_model_set_attention(model, 2), RT_ERROR_INVALID_ENUM);
    EXPECT(rt_model_config(model, NULL), RT_ERROR_NULL_POINTER);

    rt_graph_statistics stats;
    EXPECT(rt_model_last_graph_statistics(model, &stats), RT_ERROR_INVALID_STATE);

    uint32_t tokens[BATCH * SEQ_PLUS_ONE];
    fill_tokens(tokens, BATCH * SEQ_PLUS_ONE);
    float loss = 0.0f;
    const size_t n = BATCH * SEQ_PLUS_ONE;
    EXPECT(rt_model_train_step(NULL, tokens, n, BATCH, SEQ_PLUS_ONE, &loss),
           RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_train_step(model, NULL, n, BATCH, SEQ_PLUS_ONE, &loss),
           RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_train_step(model, tokens, n, BATCH, SEQ_PLUS_ONE, NULL),
           RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_train_step(model, tokens, n - 1, BATCH, SEQ_PLUS_ONE, &loss), RT_ERROR_SHAPE);
    EXPECT_MESSAGE_HAS("tokens_len 17");
    EXPECT(rt_model_train_step(model, tokens, n, 0, SEQ_PLUS_ONE, &loss), RT_ERROR_SHAPE);
    EXPECT(rt_model_train_step(model, tokens, n, n, 1, &loss), RT_ERROR_SHAPE);
    EXPECT(rt_model_train_step(model, NULL, 0, 0, 0, &loss), RT_ERROR_SHAPE);
    EXPECT(rt_model_train_step(model, tokens, n, SIZE_MAX, 2, &loss), RT_ERROR_SHAPE);
    {
        uint32_t long_block[MAX_SEQ + 2];
        fill_tokens(long_block, MAX_SEQ + 2);
        EXPECT(rt_model_train_step(model, long_block, MAX_SEQ + 2, 1, MAX_SEQ + 2, &loss),
               RT_ERROR_SHAPE);
        EXPECT_MESSAGE_HAS("max_seq_len");
    }
    tokens[3] = VOCAB + 44;
    EXPECT(rt_model_train_step(model, tokens, n, BATCH, SEQ_PLUS_ONE, &loss),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("300");
    tokens[3] = 1;

    rt_adam *adam = (rt_adam *)&c;
    EXPECT(rt_adam_create(model, -1.0f, &adam), RT_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(adam == NULL);
    EXPECT(rt_adam_create(model, (float)NAN, &adam), RT_ERROR_INVALID_ARGUMENT);
    EXPECT(rt_adam_create(NULL, 1e-3f, &adam), RT_ERROR_NULL_POINTER);
    EXPECT(rt_adam_create(model, 1e-3f, NULL), RT_ERROR_NULL_POINTER);
    EXPECT_OK(rt_adam_create(model, 1e-3f, &adam));
    EXPECT(rt_adam_step(NULL), RT_ERROR_NULL_POINTER);
    /* No gradient yet: the step changes nothing and is not counted. */
    uint64_t steps = 99;
    EXPECT_OK(rt_adam_step(adam));
    EXPECT_OK(rt_adam_steps(adam, &steps));
    EXPECT_TRUE(steps == 0);

    /* A graph recorded before an Adam step is stale. */
    rt_graph *graph = NULL;
    EXPECT(rt_model_loss(model, tokens, n, BATCH, SEQ_PLUS_ONE, NULL), RT_ERROR_NULL_POINTER);
    EXPECT_OK(rt_model_loss(model, tokens, n, BATCH, SEQ_PLUS_ONE, &graph));
    EXPECT_OK(rt_model_last_graph_statistics(model, &stats));
    EXPECT_TRUE(stats.node_count > 0 && stats.element_count > 0);
    EXPECT_OK(rt_model_train_step(model, tokens, n, BATCH, SEQ_PLUS_ONE, &loss));
    EXPECT_TRUE(loss > 0.0f && isfinite(loss));
    EXPECT_OK(rt_adam_step(adam));
    EXPECT_OK(rt_adam_steps(adam, &steps));
    EXPECT_TRUE(steps == 1);
    EXPECT(rt_graph_backward(graph), RT_ERROR_STALE_GRAPH);
    EXPECT_MESSAGE_HAS("stale graph");
    EXPECT(rt_graph_backward(NULL), RT_ERROR_NULL_POINTER);
    EXPECT(rt_graph_loss(graph, NULL), RT_ERROR_NULL_POINTER);
    EXPECT(rt_graph_get_statistics(graph, NULL), RT_ERROR_NULL_POINTER);
    rt_graph_free(graph);

    /* A graph stays valid after its model handle is released. */
    graph = NULL;
    EXPECT_OK(rt_model_loss(model, tokens, n, BATCH, SEQ_PLUS_ONE, &graph));
    rt_model *retained = NULL;
    EXPECT(rt_model_retain(NULL, &retained), RT_ERROR_NULL_POINTER);
    EXPECT_OK(rt_model_retain(model, &retained));
    rt_model_free(model);
    model = NULL;
    EXPECT_OK(rt_graph_backward(graph));
    float graph_loss = 0.0f;
    EXPECT_OK(rt_graph_loss(graph, &graph_loss));
    EXPECT_TRUE(graph_loss > 0.0f);
    EXPECT_OK(rt_graph_get_statistics(graph, &stats));
    EXPECT_TRUE(stats.node_count > 0);
    /* ... and the optimizer too; the retained handle is the same model. */
    EXPECT_OK(rt_adam_step(adam));
    EXPECT_OK(rt_model_activation_checkpointing(retained, &policy));
    EXPECT_TRUE(policy == RT_ACTIVATION_CHECKPOINTING_DISABLED);
    rt_graph_free(graph);
    rt_adam_free(adam);

    /* LoRA. */
    rt_lora_config lora = {4, 8.0f, RT_LORA_TARGET_ATTENTION, 3};
    lora.targets = 4;
    EXPECT(rt_model_enable_lora(retained, &lora), RT_ERROR_INVALID_ENUM);
    lora.targets = 0;
    EXPECT(rt_model_enable_lora(retained, &lora), RT_ERROR_INVALID_ARGUMENT);
    lora.targets = RT_LORA_TARGET_ATTENTION | RT_LORA_TARGET_MLP;
    lora.rank = 0;
    EXPECT(rt_model_enable_lora(retained, &lora), RT_ERROR_INVALID_ARGUMENT);
    lora.rank = 4;
    EXPECT(rt_model_enable_lora(retained, NULL), RT_ERROR_NULL_POINTER);
    EXPECT_OK(rt_model_enable_lora(retained, &lora));
    EXPECT(rt_model_enable_lora(retained, &lora), RT_ERROR_INVALID_STATE);
    EXPECT_OK(rt_adam_create(retained, 1e-3f, &adam));
    EXPECT_OK(rt_model_train_step(retained, tokens, n, BATCH, SEQ_PLUS_ONE, &loss));
    EXPECT_OK(rt_adam_step(adam));
    rt_adam_free(adam);

    /* Save and load. */
    char path[1024];
    EXPECT(rt_model_save(retained, NULL), RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_save(NULL, "x.safetensors"), RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_save(retained, ""), RT_ERROR_INVALID_STRING);
    snprintf(path, sizeof path, "%s/missing-folder/model.safetensors", scratch);
    EXPECT(rt_model_save(retained, path), RT_ERROR_IO);
    snprintf(path, sizeof path, "%s/model.safetensors", scratch);
    EXPECT_OK(rt_model_save(retained, path));
    rt_model *loaded = (rt_model *)&c;
    EXPECT(rt_model_load(path, 9, RT_ACTIVATION_CHECKPOINTING_DISABLED, &loaded),
           RT_ERROR_INVALID_ENUM);
    EXPECT_TRUE(loaded == NULL);
    EXPECT(rt_model_load(path, RT_ATTENTION_FLASH, 9, &loaded), RT_ERROR_INVALID_ENUM);
    EXPECT(rt_model_load(NULL, RT_ATTENTION_FLASH, 0, &loaded), RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_load(path, RT_ATTENTION_FLASH, 0, NULL), RT_ERROR_NULL_POINTER);
    EXPECT_OK(rt_model_load(path, RT_ATTENTION_FLASH,
                            RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, &loaded));
    EXPECT_OK(rt_model_activation_checkpointing(loaded, &policy));
    EXPECT_TRUE(policy == RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK);
    rt_model_free(loaded);
    loaded = NULL;
    snprintf(path, sizeof path, "%s/no-such-file.safetensors", scratch);
    EXPECT(rt_model_load(path, RT_ATTENTION_FLASH, 0, &loaded), RT_ERROR_IO);
    snprintf(path, sizeof path, "%s/garbage.safetensors", scratch);
    FILE *f = fopen(path, "wb");
    if (f != NULL) {
        fputs("this is not a safetensors file at all", f);
        fclose(f);
    }
    EXPECT(rt_model_load(path, RT_ATTENTION_FLASH, 0, &loaded), RT_ERROR_FORMAT);
    EXPECT_TRUE(loaded == NULL);
    rt_model_free(retained);
}

static void test_decode(void) {
    rt_transformer_config c = small_config();
    rt_model *model = NULL;
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
    rt_decode_session *session = NULL;
    EXPECT(rt_decode_session_create(NULL, &session), RT_ERROR_NULL_POINTER);
    EXPECT(rt_decode_session_create(model, NULL), RT_ERROR_NULL_POINTER);
    EXPECT_OK(rt_decode_session_create(model, &session));

    float logits[VOCAB];
    size_t position = 99;
    EXPECT(rt_decode_session_decode_token(NULL, 1, logits, VOCAB), RT_ERROR_NULL_POINTER);
    EXPECT(rt_decode_session_decode_token(session, 1, NULL, VOCAB), RT_ERROR_NULL_POINTER);
    EXPECT(rt_decode_session_decode_token(session, 1, logits, VOCAB - 1),
           RT_ERROR_BUFFER_TOO_SMALL);
    EXPECT_MESSAGE_HAS("logits_len 255");
    EXPECT(rt_decode_session_decode_token(session, VOCAB, logits, VOCAB),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(rt_decode_session_position(session, &position));
    EXPECT_TRUE(position == 0); /* failed calls leave the session unchanged */
    EXPECT(rt_decode_session_position(session, NULL), RT_ERROR_NULL_POINTER);

    /* The model handle is released while the session lives: the session keeps working. */
    EXPECT_OK(rt_model_set_activation_checkpointing(model,
                                                    RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK));
    rt_model_free(model);
    for (size_t i = 0; i < MAX_SEQ; i++) {
        EXPECT_OK(rt_decode_session_decode_token(session, (uint32_t)(i * 7 % VOCAB), logits,
                                                 VOCAB));
    }
    EXPECT_TRUE(isfinite(logits[0]) && isfinite(logits[VOCAB - 1]));
    EXPECT(rt_decode_session_decode_token(session, 1, logits, VOCAB), RT_ERROR_INVALID_STATE);
    EXPECT_MESSAGE_HAS("full");
    EXPECT_OK(rt_decode_session_reset(session));
    EXPECT(rt_decode_session_reset(NULL), RT_ERROR_NULL_POINTER);
    EXPECT_OK(rt_decode_session_decode_token(session, 1, logits, VOCAB));
    EXPECT_OK(rt_decode_session_position(session, &position));
    EXPECT_TRUE(position == 1);
    rt_decode_session_free(session);

    /* A session created before rt_model_enable_lora refuses to decode with the old weights. */
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
    EXPECT_OK(rt_decode_session_create(model, &session));
    EXPECT_OK(rt_decode_session_decode_token(session, 1, logits, VOCAB));
    rt_lora_config lora = {4, 8.0f, RT_LORA_TARGET_ATTENTION, 3};
    EXPECT_OK(rt_model_enable_lora(model, &lora));
    EXPECT(rt_decode_session_decode_token(session, 2, logits, VOCAB), RT_ERROR_INVALID_STATE);
    EXPECT_MESSAGE_HAS("enable_lora");
    rt_decode_session_free(session);
    rt_model_free(model);
}

/* Sizes that cannot fit in addressable memory are rejected before anything is allocated (they
 * used to abort the process in the allocator, or, for max_seq_len = 2^62, grow without bound). */
static void test_oversized_configs(void) {
    struct {
        const char *field;
        size_t d_model, n_heads, n_layers, d_ff, max_seq_len;
    } cases[] = {
        {"d_model", (size_t)1 << 40, 1, 1, 32, MAX_SEQ},
        {"d_model", (size_t)1 << 62, 1, 1, 32, MAX_SEQ},
        {"n_layers", 16, 2, (size_t)1 << 40, 32, MAX_SEQ},
        {"d_ff", 16, 2, 1, (size_t)1 << 40, MAX_SEQ},
        {"max_seq_len", 16, 2, 1, 32, (size_t)1 << 40},
        {"max_seq_len", 16, 2, 1, 32, (size_t)1 << 62},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rt_transformer_config c = small_config();
        c.d_model = cases[i].d_model;
        c.n_heads = cases[i].n_heads;
        c.n_layers = cases[i].n_layers;
        c.d_ff = cases[i].d_ff;
        c.max_seq_len = cases[i].max_seq_len;
        rt_model *model = NULL;
        EXPECT(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED,
                               &model),
               RT_ERROR_INVALID_ARGUMENT);
        EXPECT_TRUE(model == NULL);
        char want[64];
        snprintf(want, sizeof want, "invalid config: %s = ", cases[i].field);
        checks++;
        if (strstr(last_error(), want) == NULL || strstr(last_error(), "bytes") == NULL) {
            failures++;
            fprintf(stderr, "case %zu: last error does not name %s and the bytes: %s\n", i,
                    cases[i].field, last_error());
        }
    }
    EXPECT_TRUE(RT_ERROR_OUT_OF_MEMORY == 14);
    EXPECT_TRUE(strcmp(rt_status_name(RT_ERROR_OUT_OF_MEMORY), "RT_ERROR_OUT_OF_MEMORY") == 0);
}

/* A config that passes validation (64 TiB with gradients and Adam state, under the 2^47-byte
 * bound) but whose 8 TiB embedding no machine's allocator grants returns RT_ERROR_OUT_OF_MEMORY
 * instead of aborting. Only under vm.overcommit_memory = 1 could the allocation succeed (and
 * the weights then be written), so the check is left out there, saying so. */
static void test_out_of_memory(void) {
    FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
    int mode = -1;
    if (f != NULL) {
        if (fscanf(f, "%d", &mode) != 1) {
            mode = -1;
        }
        fclose(f);
    }
    if (mode == 1) {
        printf("test_errors: out-of-memory check not run: vm.overcommit_memory = 1 would grant "
               "an 8 TiB allocation\n");
        return;
    }
    rt_transformer_config c = small_config();
    c.vocab_size = (size_t)1 << 30;
    c.d_model = (size_t)1 << 11;
    c.n_heads = 16;
    rt_model *model = NULL;
    EXPECT(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model),
           RT_ERROR_OUT_OF_MEMORY);
    EXPECT_TRUE(model == NULL);
    EXPECT_MESSAGE_HAS("out of memory: could not allocate 8796093022208 bytes");
}

static void test_memory(void) {
    rt_memory_stats stats;
    EXPECT(rt_get_memory_stats(NULL), RT_ERROR_NULL_POINTER);
    rt_transformer_config c = small_config();
    rt_model *model = NULL;
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
    EXPECT_OK(rt_reset_peak_memory_stats());
    EXPECT_OK(rt_get_memory_stats(&stats));
    EXPECT_TRUE(stats.parameter.current_bytes > 0);
    EXPECT_TRUE(stats.parameter.peak_bytes >= stats.parameter.current_bytes);
    EXPECT_TRUE(stats.total.current_bytes >= stats.parameter.current_bytes);
    rt_model_free(model);

    uint64_t cached = 1, released = 0;
    EXPECT(rt_get_cached_bytes(NULL), RT_ERROR_NULL_POINTER);
    EXPECT_OK(rt_get_cached_bytes(&cached));
    EXPECT_OK(rt_empty_cache(&released));
    EXPECT_TRUE(released == cached);
    EXPECT_OK(rt_get_cached_bytes(&cached));
    EXPECT_TRUE(cached == 0);
    EXPECT_OK(rt_empty_cache(NULL));
}

/* Dropout (2.3): setters instead of new config fields; validation names the field; the
 * probabilities are saved with the model; the dropout step counts dropping training forwards. */
/* The chunked loss's setting (2.6): default, set, refused 0 with the setting unchanged,
 * unfused, and the same loss chunked and unfused. */
static void test_loss_chunking(void) {
    rt_transformer_config c = small_config();
    rt_model *model = NULL;
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
    if (model == NULL) {
        return;
    }
    uint64_t bytes = 0;
    EXPECT_OK(rt_model_loss_chunk_bytes(model, &bytes));
    EXPECT_TRUE(bytes == 64u << 20);
    uint32_t tokens[BATCH * SEQ_PLUS_ONE];
    fill_tokens(tokens, BATCH * SEQ_PLUS_ONE);
    float chunked = 0.0f, unfused = -1.0f;
    rt_graph *graph = NULL;
    EXPECT_OK(rt_model_set_loss_chunk_bytes(model, 4 * (c.vocab_size + 1) * 3)); /* 3 tokens */
    EXPECT_OK(rt_model_loss(model, tokens, BATCH * SEQ_PLUS_ONE, BATCH, SEQ_PLUS_ONE, &graph));
    EXPECT_OK(rt_graph_loss(graph, &chunked));
    rt_graph_free(graph);
    EXPECT(rt_model_set_loss_chunk_bytes(model, 0), RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("loss_chunk_bytes");
    EXPECT_OK(rt_model_loss_chunk_bytes(model, &bytes));
    EXPECT_TRUE(bytes == 4 * (c.vocab_size + 1) * 3);
    EXPECT_OK(rt_model_set_loss_unfused(model));
    EXPECT_OK(rt_model_loss_chunk_bytes(model, &bytes));
    EXPECT_TRUE(bytes == 0);
    graph = NULL;
    EXPECT_OK(rt_model_loss(model, tokens, BATCH * SEQ_PLUS_ONE, BATCH, SEQ_PLUS_ONE, &graph));
    EXPECT_OK(rt_graph_loss(graph, &unfused));
    rt_graph_free(graph);
    EXPECT_TRUE(chunked == unfused);
    EXPECT(rt_model_set_loss_unfused(NULL), RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_loss_chunk_bytes(model, NULL), RT_ERROR_NULL_POINTER);
    rt_model_free(model);
}

/* The loss over labelled targets (2.9): labels equal to the tokens give rt_model_loss's value;
 * RT_IGNORE_INDEX positions are left out; bad labels are errors naming the value. */
static void test_loss_with_labels(void) {
    rt_transformer_config c = small_config();
    rt_model *model = NULL;
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
    if (model == NULL) {
        return;
    }
    enum { N = BATCH * SEQ_PLUS_ONE };
    uint32_t tokens[N];
    int64_t labels[N];
    fill_tokens(tokens, N);
    for (int i = 0; i < N; i++) {
        labels[i] = tokens[i];
    }
    float plain = 0.0f, same = -1.0f, masked = -1.0f;
    rt_graph *graph = NULL;
    EXPECT_OK(rt_model_loss(model, tokens, N, BATCH, SEQ_PLUS_ONE, &graph));
    EXPECT_OK(rt_graph_loss(graph, &plain));
    rt_graph_free(graph);
    graph = NULL;
    EXPECT_OK(rt_model_loss_with_labels(model, tokens, N, labels, N, BATCH, SEQ_PLUS_ONE, &graph));
    EXPECT_OK(rt_graph_loss(graph, &same));
    EXPECT_OK(rt_graph_backward(graph));
    rt_graph_free(graph);
    EXPECT_TRUE(same == plain);
    for (int i = 0; i < SEQ_PLUS_ONE / 2; i++) {
        labels[i] = RT_IGNORE_INDEX; /* the first row's prompt */
    }
    graph = NULL;
    EXPECT_OK(rt_model_loss_with_labels(model, tokens, N, labels, N, BATCH, SEQ_PLUS_ONE, &graph));
    EXPECT_OK(rt_graph_loss(graph, &masked));
    rt_graph_free(graph);
    EXPECT_TRUE(isfinite(masked) && masked != plain);
    graph = NULL;
    EXPECT(rt_model_loss_with_labels(model, tokens, N, labels, N - 1, BATCH, SEQ_PLUS_ONE, &graph),
           RT_ERROR_SHAPE);
    EXPECT_MESSAGE_HAS("labels_len");
    EXPECT(rt_model_loss_with_labels(model, tokens, N, NULL, N, BATCH, SEQ_PLUS_ONE, &graph),
           RT_ERROR_NULL_POINTER);
    labels[N - 1] = -7;
    EXPECT(rt_model_loss_with_labels(model, tokens, N, labels, N, BATCH, SEQ_PLUS_ONE, &graph),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("label -7 at index");
    for (int i = 0; i < N; i++) {
        labels[i] = RT_IGNORE_INDEX;
    }
    EXPECT(rt_model_loss_with_labels(model, tokens, N, labels, N, BATCH, SEQ_PLUS_ONE, &graph),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("every target position");
    EXPECT_TRUE(graph == NULL);
    rt_model_free(model);
}

/* The loss of a packed batch (2.10): one example per row with positions 0.. is rt_model_loss's
 * value; two examples in a row give the mean of the two alone, weighted by their targets;
 * bad position ids are errors naming the value. */
static void test_loss_packed(void) {
    rt_transformer_config c = small_config();
    rt_model *model = NULL;
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, &model));
    if (model == NULL) {
        return;
    }
    enum { N = BATCH * SEQ_PLUS_ONE, A = SEQ_PLUS_ONE / 2, B = SEQ_PLUS_ONE - A };
    uint32_t tokens[N];
    int64_t positions[N];
    fill_tokens(tokens, N);
    for (int i = 0; i < N; i++) {
        positions[i] = i % SEQ_PLUS_ONE;
    }
    float plain = 0.0f, packed = -1.0f, a = 0.0f, b = 0.0f;
    rt_graph *graph = NULL;
    EXPECT_OK(rt_model_loss(model, tokens, N, BATCH, SEQ_PLUS_ONE, &graph));
    EXPECT_OK(rt_graph_loss(graph, &plain));
    rt_graph_free(graph);
    graph = NULL;
    EXPECT_OK(rt_model_loss_packed(model, tokens, N, NULL, 0, positions, N, BATCH, SEQ_PLUS_ONE, &graph));
    EXPECT_OK(rt_graph_loss(graph, &packed));
    EXPECT_OK(rt_graph_backward(graph));
    rt_graph_free(graph);
    EXPECT_TRUE(packed == plain);
    /* Row 0 as two examples of A and B tokens. */
    for (int i = 0; i < B; i++) {
        positions[A + i] = i;
    }
    graph = NULL;
    EXPECT_OK(rt_model_loss_packed(model, tokens, SEQ_PLUS_ONE, NULL, 0, positions, SEQ_PLUS_ONE, 1, SEQ_PLUS_ONE, &graph));
    EXPECT_OK(rt_graph_loss(graph, &packed));
    rt_graph_free(graph);
    graph = NULL;
    EXPECT_OK(rt_model_loss(model, tokens, A, 1, A, &graph));
    EXPECT_OK(rt_graph_loss(graph, &a));
    rt_graph_free(graph);
    graph = NULL;
    EXPECT_OK(rt_model_loss(model, tokens + A, B, 1, B, &graph));
    EXPECT_OK(rt_graph_loss(graph, &b));
    rt_graph_free(graph);
    float want = (a * (A - 1) + b * (B - 1)) / (float)(A + B - 2);
    EXPECT_TRUE(fabsf(packed - want) <= 1e-5f * fabsf(want));
    graph = NULL;
    EXPECT(rt_model_loss_packed(model, tokens, N, NULL, 0, positions, N - 1, BATCH, SEQ_PLUS_ONE, &graph),
           RT_ERROR_SHAPE);
    EXPECT_MESSAGE_HAS("position_ids_len");
    EXPECT(rt_model_loss_packed(model, tokens, N, NULL, 0, NULL, N, BATCH, SEQ_PLUS_ONE, &graph),
           RT_ERROR_NULL_POINTER);
    positions[1] = 5;
    EXPECT(rt_model_loss_packed(model, tokens, N, NULL, 0, positions, N, BATCH, SEQ_PLUS_ONE, &graph),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("position_ids[0, 1] is 5");
    EXPECT_TRUE(graph == NULL);
    rt_model_free(model);
}

/* A freeing backward (2.7): PyTorch's retain_graph=False; the graph can then not be
 * differentiated again, and saying so is an error, not a crash. */
static void test_backward_free_graph(void) {
    rt_transformer_config c = small_config();
    rt_model *model = NULL;
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, &model));
    if (model == NULL) {
        return;
    }
    uint32_t tokens[BATCH * SEQ_PLUS_ONE];
    fill_tokens(tokens, BATCH * SEQ_PLUS_ONE);
    rt_graph *graph = NULL;
    EXPECT_OK(rt_model_loss(model, tokens, BATCH * SEQ_PLUS_ONE, BATCH, SEQ_PLUS_ONE, &graph));
    EXPECT_OK(rt_graph_backward_ex(graph, true));
    EXPECT_OK(rt_graph_backward_ex(graph, false));
    EXPECT(rt_graph_backward_ex(graph, false), RT_ERROR_INVALID_STATE);
    EXPECT_MESSAGE_HAS("retain_graph");
    EXPECT(rt_graph_backward(graph), RT_ERROR_INVALID_STATE);
    float loss = 0.0f;
    EXPECT_OK(rt_graph_loss(graph, &loss));
    EXPECT_TRUE(loss > 0.0f);
    rt_graph_free(graph);
    EXPECT(rt_graph_backward_ex(NULL, false), RT_ERROR_NULL_POINTER);
    rt_model_free(model);
}

/* The optimizer's state in a file (2.8): saved, loaded into a fresh optimizer (the same step
 * count), refused for another model's parameters and for a file that is not such a state. */
static void test_adam_state(const char *scratch) {
    rt_transformer_config c = small_config();
    rt_model *model = NULL, *other = NULL;
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
    c.n_layers += 1;
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &other));
    if (model == NULL || other == NULL) {
        rt_model_free(model);
        rt_model_free(other);
        return;
    }
    rt_adam *adam = NULL, *fresh = NULL, *wrong = NULL;
    EXPECT_OK(rt_adam_create(model, 1e-2f, &adam));
    EXPECT_OK(rt_adam_create(model, 0.5f, &fresh));
    EXPECT_OK(rt_adam_create(other, 1e-2f, &wrong));
    uint32_t tokens[BATCH * SEQ_PLUS_ONE];
    fill_tokens(tokens, BATCH * SEQ_PLUS_ONE);
    float loss = 0.0f;
    EXPECT_OK(rt_model_train_step(model, tokens, BATCH * SEQ_PLUS_ONE, BATCH, SEQ_PLUS_ONE, &loss));
    EXPECT_OK(rt_adam_step(adam));
    char path[1024], weights[1024];
    snprintf(path, sizeof path, "%s/optimizer.safetensors", scratch);
    EXPECT_OK(rt_adam_save(adam, path));
    EXPECT_OK(rt_adam_load(fresh, path));
    uint64_t steps = 0;
    EXPECT_OK(rt_adam_steps(fresh, &steps));
    EXPECT_TRUE(steps == 1);
    EXPECT(rt_adam_load(wrong, path), RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("optimizer state");
    EXPECT_OK(rt_adam_steps(wrong, &steps));
    EXPECT_TRUE(steps == 0);
    snprintf(weights, sizeof weights, "%s/adam-model.safetensors", scratch);
    EXPECT_OK(rt_model_save(model, weights));
    EXPECT(rt_adam_load(fresh, weights), RT_ERROR_FORMAT);
    EXPECT_MESSAGE_HAS("riftco_optimizer");
    snprintf(path, sizeof path, "%s/missing-folder/optimizer.safetensors", scratch);
    EXPECT(rt_adam_save(adam, path), RT_ERROR_IO);
    EXPECT(rt_adam_save(NULL, path), RT_ERROR_NULL_POINTER);
    EXPECT(rt_adam_load(fresh, NULL), RT_ERROR_NULL_POINTER);
    rt_adam_free(adam);
    rt_adam_free(fresh);
    rt_adam_free(wrong);
    rt_model_free(model);
    rt_model_free(other);
}

static void test_dropout(const char *scratch) {
    rt_transformer_config c = small_config();
    rt_model *model = NULL;
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
    if (model == NULL) {
        return;
    }
    float a = -1.0f, r = -1.0f, l = -1.0f;
    EXPECT_OK(rt_model_dropout(model, &a, &r, &l));
    EXPECT_TRUE(a == 0.0f && r == 0.0f && l == 0.0f);
    EXPECT(rt_model_set_dropout(model, 1.5f, 0.0f, 0.0f), RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("attention_dropout = 1.5: expected a probability in [0, 1)");
    EXPECT(rt_model_set_dropout(model, 0.0f, NAN, 0.0f), RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("residual_dropout = NaN");
    EXPECT(rt_model_set_dropout(model, 0.0f, 0.0f, -0.5f), RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("lora_dropout = -0.5");
    /* Large and tiny floats in exponent form, not as 31-digit decimals. */
    EXPECT(rt_model_set_dropout(model, 1e30f, 0.0f, 0.0f), RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("attention_dropout = 1e30: expected");
    EXPECT(rt_model_set_dropout(model, 0.0f, -1e-30f, 0.0f), RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("residual_dropout = -1e-30: expected");
    EXPECT(rt_model_set_dropout(model, 0.1f, 0.1f, 0.1f), RT_ERROR_INVALID_STATE);
    EXPECT_MESSAGE_HAS("no LoRA adapters");
    EXPECT_OK(rt_model_dropout(model, &a, &r, &l));
    EXPECT_TRUE(a == 0.0f && r == 0.0f && l == 0.0f); /* unchanged on every error */
    EXPECT(rt_model_set_dropout(NULL, 0.0f, 0.0f, 0.0f), RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_dropout(model, &a, NULL, &l), RT_ERROR_NULL_POINTER);

    EXPECT_OK(rt_model_set_dropout(model, 0.1f, 0.2f, 0.0f));
    rt_lora_config lora = {.rank = 2, .alpha = 4.0f, .targets = RT_LORA_TARGET_ATTENTION, .seed = 1};
    EXPECT_OK(rt_model_enable_lora(model, &lora));
    EXPECT_OK(rt_model_set_dropout(model, 0.1f, 0.2f, 0.05f));
    EXPECT_OK(rt_model_dropout(model, &a, &r, &l));
    EXPECT_TRUE(a == 0.1f && r == 0.2f && l == 0.05f);

    bool training = false;
    EXPECT_OK(rt_model_training(model, &training));
    EXPECT_TRUE(training);
    uint64_t step = 99;
    EXPECT_OK(rt_model_dropout_step(model, &step));
    EXPECT_TRUE(step == 0);
    uint32_t tokens[BATCH * SEQ_PLUS_ONE];
    fill_tokens(tokens, BATCH * SEQ_PLUS_ONE);
    rt_graph *graph = NULL;
    EXPECT_OK(rt_model_loss(model, tokens, BATCH * SEQ_PLUS_ONE, BATCH, SEQ_PLUS_ONE, &graph));
    rt_graph_free(graph);
    EXPECT_OK(rt_model_dropout_step(model, &step));
    EXPECT_TRUE(step == 1);
    EXPECT_OK(rt_model_set_training(model, false));
    EXPECT_OK(rt_model_training(model, &training));
    EXPECT_TRUE(!training);
    graph = NULL;
    EXPECT_OK(rt_model_loss(model, tokens, BATCH * SEQ_PLUS_ONE, BATCH, SEQ_PLUS_ONE, &graph));
    rt_graph_free(graph);
    EXPECT_OK(rt_model_dropout_step(model, &step));
    EXPECT_TRUE(step == 1); /* eval mode: no dropout, no step */
    EXPECT_OK(rt_model_set_dropout_step(model, 41));
    EXPECT_OK(rt_model_dropout_step(model, &step));
    EXPECT_TRUE(step == 41);
    EXPECT(rt_model_training(NULL, &training), RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_dropout_step(model, NULL), RT_ERROR_NULL_POINTER);

    /* Saved with the model (riftco_config); adapters are not part of the model file. */
    char path[4096];
    snprintf(path, sizeof path, "%s/dropout.safetensors", scratch);
    EXPECT_OK(rt_model_save(model, path));
    rt_model *loaded = NULL;
    EXPECT_OK(rt_model_load(path, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED,
                            &loaded));
    if (loaded != NULL) {
        EXPECT_OK(rt_model_dropout(loaded, &a, &r, &l));
        EXPECT_TRUE(a == 0.1f && r == 0.2f && l == 0.0f);
    }
    rt_model_free(loaded);
    rt_model_free(model);
}

int main(int argc, char **argv) {
    const char *scratch = argc > 1 ? argv[1] : ".";
    test_version_and_messages();
    test_new_statuses();
    test_free_null();
    test_create();
    test_policy_and_training(scratch);
    test_decode();
    test_oversized_configs();
    test_out_of_memory();
    test_memory();
    test_loss_chunking();
    test_loss_with_labels();
    test_loss_packed();
    test_backward_free_graph();
    test_dropout(scratch);
    test_adam_state(scratch);
    if (failures != 0) {
        fprintf(stderr, "test_errors: %d of %d checks failed\n", failures, checks);
        return EXIT_FAILURE;
    }
    printf("test_errors: %d checks passed\n", checks);
    return EXIT_SUCCESS;
}
