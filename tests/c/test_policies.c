/*
 * Activation-checkpointing policies of the riftco C ABI 2.2: every policy form set through its
 * setter trains with the `disabled` loss (bit for bit) and reads back its form and spelling;
 * every bad input returns its documented status with a message naming the bad value. Also the
 * 2.4 config (grouped-query attention, tied embeddings): a GQA + tied model trains under
 * `block` with the `disabled` loss, reads its config back, and bad fields are named.
 *
 *   test_policies
 *
 * Run by tests/c/run.sh under valgrind. Exits non-zero when an expectation failed.
 */
#include "check.h"
#include "riftco.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { VOCAB = 256, N_LAYERS = 3, BATCH = 2, SEQ_PLUS_ONE = 9, MAX_SEQ = 16, STEPS = 2 };

static rt_transformer_config small_config(void) {
    rt_transformer_config c;
    rt_transformer_config_default(&c);
    c.vocab_size = VOCAB;
    c.d_model = 16;
    c.n_heads = 2;
    c.n_layers = N_LAYERS;
    c.d_ff = 32;
    c.max_seq_len = MAX_SEQ;
    c.seed = 5;
    return c;
}

static rt_model *new_model(void) {
    rt_transformer_config c = small_config();
    rt_model *model = NULL;
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
    return model;
}

/* The current policy spelling ("" when the getter failed). */
static const char *policy_of(const rt_model *model) {
    static char buf[256];
    size_t needed = 0;
    buf[0] = '\0';
    EXPECT_OK(rt_model_activation_checkpointing_policy(model, buf, sizeof buf, &needed));
    EXPECT_TRUE(needed == strlen(buf) + 1);
    return buf;
}

static uint32_t form_of(const rt_model *model) {
    uint32_t form = 99;
    EXPECT_OK(rt_model_activation_checkpointing(model, &form));
    return form;
}

/* The losses of STEPS training steps (train step, then an Adam step, lr 1e-2) on fixed blocks;
 * returns 0 when a call failed. */
static int train(rt_model *model, float losses[STEPS]) {
    uint32_t tokens[BATCH * SEQ_PLUS_ONE];
    rt_adam *adam = NULL;
    int ok = 1;
    if (rt_adam_create(model, 1e-2f, &adam) != RT_OK) {
        return 0;
    }
    for (size_t s = 0; s < STEPS && ok; s++) {
        for (size_t i = 0; i < BATCH * SEQ_PLUS_ONE; i++) {
            tokens[i] = (uint32_t)((i * 31 + s * 17 + 5) % VOCAB);
        }
        rt_status st = rt_model_train_step(model, tokens, BATCH * SEQ_PLUS_ONE, BATCH,
                                           SEQ_PLUS_ONE, &losses[s]);
        expect_status("rt_model_train_step", st, RT_OK, __LINE__);
        ok = st == RT_OK && rt_adam_step(adam) == RT_OK;
    }
    rt_adam_free(adam);
    return ok;
}

enum setter { INT_FORM, SEGMENTS, SELECTIVE, BUDGET, SPELLING };

struct policy_case {
    enum setter setter;
    uint32_t int_arg;   /* INT_FORM: the constant; SEGMENTS: K */
    uint64_t bytes;     /* BUDGET */
    const char *string; /* SELECTIVE: the name (NULL: the default); SPELLING: the spelling */
    uint32_t form;      /* what rt_model_activation_checkpointing reads back */
    const char *read_back;
};

static rt_status apply(rt_model *model, const struct policy_case *p) {
    switch (p->setter) {
    case INT_FORM:
        return rt_model_set_activation_checkpointing(model, p->int_arg);
    case SEGMENTS:
        return rt_model_set_activation_checkpointing_segments(model, p->int_arg);
    case SELECTIVE:
        return rt_model_set_activation_checkpointing_selective(model, p->string);
    case BUDGET:
        return rt_model_set_activation_memory_budget(model, p->bytes);
    case SPELLING:
        return rt_model_set_activation_checkpointing_policy(model, p->string);
    }
    return RT_ERROR_INTERNAL;
}

/*
 * Loss parity. The first step's loss is a forward only, and a checkpoint runs the same forward
 * arithmetic whatever it retains: bitwise. The second step's loss also depends on the gradients
 * and the Adam step of the first; it is compared bitwise too, and a mismatch is reported with
 * both values (the Rust tests allow 1e-6 relative for gradients where a replay could change
 * the accumulation order; this C check reports whether this ABI path is exact).
 */
static void test_every_form_trains_with_the_disabled_loss(void) {
    static const struct policy_case cases[] = {
        {INT_FORM, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, 0, NULL,
         RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, "block"},
        {INT_FORM, RT_ACTIVATION_CHECKPOINTING_AUTO, 0, NULL, RT_ACTIVATION_CHECKPOINTING_AUTO,
         "auto"},
        {SEGMENTS, 2, 0, NULL, RT_ACTIVATION_CHECKPOINTING_SEGMENTS, "segments:2"},
        {SEGMENTS, N_LAYERS, 0, NULL, RT_ACTIVATION_CHECKPOINTING_SEGMENTS, "segments:3"},
        {SELECTIVE, 0, 0, NULL, RT_ACTIVATION_CHECKPOINTING_SELECTIVE, "selective:attention_ffn"},
        {SELECTIVE, 0, 0, "dots", RT_ACTIVATION_CHECKPOINTING_SELECTIVE, "selective:dots"},
        {SELECTIVE, 0, 0, "attention", RT_ACTIVATION_CHECKPOINTING_SELECTIVE,
         "selective:attention"},
        {SELECTIVE, 0, 0, "q+k+v+swiglu", RT_ACTIVATION_CHECKPOINTING_SELECTIVE,
         "selective:q+k+v+swiglu"},
        {BUDGET, 0, (uint64_t)1 << 30, NULL, RT_ACTIVATION_CHECKPOINTING_BUDGET,
         "budget:1073741824"},
        {SPELLING, 0, 0, "disabled,block,selective:dots", RT_ACTIVATION_CHECKPOINTING_PER_BLOCK,
         "disabled,block,selective:dots"},
        {SPELLING, 0, 0, "segments:2", RT_ACTIVATION_CHECKPOINTING_SEGMENTS, "segments:2"},
        {SPELLING, 0, 0, "selective", RT_ACTIVATION_CHECKPOINTING_SELECTIVE,
         "selective:attention_ffn"},
        {SPELLING, 0, 0, "auto", RT_ACTIVATION_CHECKPOINTING_AUTO, "auto"},
        {SPELLING, 0, 0, "budget:64MiB", RT_ACTIVATION_CHECKPOINTING_BUDGET, "budget:67108864"},
        {SPELLING, 0, 0, "disabled", RT_ACTIVATION_CHECKPOINTING_DISABLED, "disabled"},
    };
    float reference[STEPS];
    rt_model *model = new_model();
    if (model == NULL || !train(model, reference)) {
        rt_model_free(model);
        return;
    }
    EXPECT_TRUE(strcmp(policy_of(model), "disabled") == 0);
    rt_model_free(model);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct policy_case *p = &cases[i];
        float losses[STEPS];
        model = new_model();
        if (model == NULL) {
            return;
        }
        EXPECT_OK(apply(model, p));
        EXPECT_TRUE(form_of(model) == p->form);
        const char *read_back = policy_of(model);
        checks++;
        if (strcmp(read_back, p->read_back) != 0) {
            failures++;
            fprintf(stderr, "case %zu: policy reads back as \"%s\", expected \"%s\"\n", i,
                    read_back, p->read_back);
        }
        /* The plan names the policy first. */
        char plan[512];
        size_t needed = 0;
        EXPECT_OK(rt_model_activation_checkpointing_plan(model, BATCH, SEQ_PLUS_ONE - 1, plan,
                                                         sizeof plan, &needed));
        EXPECT_TRUE(strncmp(plan, p->read_back, strlen(p->read_back)) == 0 &&
                    strstr(plan, " \xe2\x86\x92 ") != NULL); /* " → " */
        printf("test_policies: %-30s plan %s\n", p->read_back, plan);
        if (train(model, losses)) {
            for (size_t s = 0; s < STEPS; s++) {
                checks++;
                if (memcmp(&losses[s], &reference[s], sizeof(float)) != 0) {
                    failures++;
                    fprintf(stderr, "%s: step %zu loss %.9g differs from disabled's %.9g\n",
                            p->read_back, s, (double)losses[s], (double)reference[s]);
                }
            }
        }
        rt_model_free(model);
    }
}

static void test_integer_forms(void) {
    rt_model *model = new_model();
    if (model == NULL) {
        return;
    }
    static const struct {
        uint32_t form;
        const char *setter;
    } with_parameters[] = {
        {RT_ACTIVATION_CHECKPOINTING_SEGMENTS, "rt_model_set_activation_checkpointing_segments"},
        {RT_ACTIVATION_CHECKPOINTING_SELECTIVE, "rt_model_set_activation_checkpointing_selective"},
        {RT_ACTIVATION_CHECKPOINTING_PER_BLOCK, "rt_model_set_activation_checkpointing_policy"},
        {RT_ACTIVATION_CHECKPOINTING_BUDGET, "rt_model_set_activation_memory_budget"},
    };
    EXPECT_TRUE(RT_ACTIVATION_CHECKPOINTING_DISABLED == 0 &&
                RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK == 1 &&
                RT_ACTIVATION_CHECKPOINTING_SEGMENTS == 2 && RT_ACTIVATION_CHECKPOINTING_AUTO == 3 &&
                RT_ACTIVATION_CHECKPOINTING_SELECTIVE == 4 &&
                RT_ACTIVATION_CHECKPOINTING_PER_BLOCK == 5 &&
                RT_ACTIVATION_CHECKPOINTING_BUDGET == 6);
    EXPECT_TRUE(RT_ABI_VERSION_MAJOR == 2 && RT_ABI_VERSION_MINOR >= 2);
    EXPECT_OK(rt_model_set_activation_checkpointing_segments(model, 2));
    for (size_t i = 0; i < sizeof with_parameters / sizeof with_parameters[0]; i++) {
        EXPECT(rt_model_set_activation_checkpointing(model, with_parameters[i].form),
               RT_ERROR_INVALID_ENUM);
        checks++;
        if (strstr(last_error(), with_parameters[i].setter) == NULL) {
            failures++;
            fprintf(stderr, "form %" PRIu32 ": the message does not name %s: %s\n",
                    with_parameters[i].form, with_parameters[i].setter, last_error());
        }
        EXPECT_TRUE(strcmp(policy_of(model), "segments:2") == 0); /* unchanged */
        rt_transformer_config c = small_config();
        rt_model *other = (rt_model *)&c;
        EXPECT(rt_model_create(&c, RT_ATTENTION_FLASH, with_parameters[i].form, &other),
               RT_ERROR_INVALID_ENUM);
        EXPECT_TRUE(other == NULL);
    }
    EXPECT(rt_model_set_activation_checkpointing(model, 7), RT_ERROR_INVALID_ENUM);
    EXPECT_MESSAGE_HAS("policy 7 is unknown");
    EXPECT_MESSAGE_HAS("RT_ACTIVATION_CHECKPOINTING_AUTO (3)");
    EXPECT(rt_model_set_activation_checkpointing(model, UINT32_MAX), RT_ERROR_INVALID_ENUM);
    EXPECT_MESSAGE_HAS("4294967295");
    rt_model_free(model);

    rt_transformer_config c = small_config();
    model = NULL;
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_MATERIALIZED, RT_ACTIVATION_CHECKPOINTING_AUTO,
                              &model));
    if (model != NULL) {
        EXPECT_TRUE(form_of(model) == RT_ACTIVATION_CHECKPOINTING_AUTO);
        EXPECT_TRUE(strcmp(policy_of(model), "auto") == 0);
    }
    rt_model_free(model);
}

static void test_bad_inputs(void) {
    rt_model *model = new_model();
    if (model == NULL) {
        return;
    }
    EXPECT_OK(rt_model_set_activation_checkpointing_policy(model, "block"));

    EXPECT(rt_model_set_activation_checkpointing_segments(model, 0), RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("\"segments:0\"");
    EXPECT(rt_model_set_activation_checkpointing_segments(model, N_LAYERS + 1),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("\"segments:4\"");
    EXPECT_MESSAGE_HAS("n_layers = 3");
    EXPECT(rt_model_set_activation_checkpointing_selective(model, "fast"),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("\"fast\"");
    EXPECT_MESSAGE_HAS("\"attention_ffn\", \"dots\", \"attention\"");
    EXPECT(rt_model_set_activation_checkpointing_selective(model, ""), RT_ERROR_INVALID_ARGUMENT);
    EXPECT(rt_model_set_activation_checkpointing_selective(model, "\xff"), RT_ERROR_INVALID_STRING);
    EXPECT(rt_model_set_activation_checkpointing_policy(model, "block,disabled"),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("\"block,disabled\"");
    EXPECT_MESSAGE_HAS("2 given, n_layers = 3");
    EXPECT(rt_model_set_activation_checkpointing_policy(model, "budget:12XB"),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("\"12XB\"");
    EXPECT(rt_model_set_activation_checkpointing_policy(model, "segments:0"),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("\"segments:0\"");
    EXPECT(rt_model_set_activation_checkpointing_policy(model, "segments:-1"),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("\"segments:-1\"");
    EXPECT(rt_model_set_activation_checkpointing_policy(model, "selective:q+nope"),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("\"nope\"");
    EXPECT(rt_model_set_activation_checkpointing_policy(model, "full"), RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("\"full\"");
    EXPECT_MESSAGE_HAS("\"budget:SIZE\"");
    EXPECT_TRUE(strcmp(policy_of(model), "block") == 0); /* every failed setter left it */

    /* NULL pointers. */
    EXPECT(rt_model_set_activation_checkpointing_segments(NULL, 1), RT_ERROR_NULL_POINTER);
    EXPECT_MESSAGE_HAS("rt_model_set_activation_checkpointing_segments: model is NULL");
    EXPECT(rt_model_set_activation_checkpointing_selective(NULL, "dots"), RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_set_activation_memory_budget(NULL, 1), RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_set_activation_checkpointing_policy(NULL, "block"), RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_set_activation_checkpointing_policy(model, NULL), RT_ERROR_NULL_POINTER);
    EXPECT_MESSAGE_HAS("spec is NULL");
    char buf[64];
    size_t needed = 0;
    EXPECT(rt_model_activation_checkpointing_policy(NULL, buf, sizeof buf, &needed),
           RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_activation_checkpointing_policy(model, NULL, 8, &needed),
           RT_ERROR_NULL_POINTER);
    EXPECT_MESSAGE_HAS("buf is NULL but cap is 8");
    EXPECT(rt_model_activation_checkpointing_plan(NULL, BATCH, 8, buf, sizeof buf, &needed),
           RT_ERROR_NULL_POINTER);
    EXPECT(rt_model_activation_checkpointing_plan(model, BATCH, 8, NULL, 8, &needed),
           RT_ERROR_NULL_POINTER);

    /* Too-small buffers: the size (NUL included) and a truncated NUL-terminated prefix. */
    EXPECT_OK(rt_model_set_activation_checkpointing_selective(model, "dots"));
    EXPECT(rt_model_activation_checkpointing_policy(model, NULL, 0, &needed),
           RT_ERROR_BUFFER_TOO_SMALL);
    EXPECT_TRUE(needed == strlen("selective:dots") + 1);
    EXPECT_MESSAGE_HAS("cap 0 is too small: the policy needs 15 bytes");
    char small[5];
    memset(small, 'x', sizeof small);
    EXPECT(rt_model_activation_checkpointing_policy(model, small, sizeof small, &needed),
           RT_ERROR_BUFFER_TOO_SMALL);
    EXPECT_TRUE(strcmp(small, "sele") == 0 && needed == 15);
    EXPECT_MESSAGE_HAS("cap 5");
    EXPECT(rt_model_activation_checkpointing_plan(model, BATCH, 8, small, sizeof small, &needed),
           RT_ERROR_BUFFER_TOO_SMALL);
    EXPECT_TRUE(strcmp(small, "sele") == 0 && needed > sizeof small);
    EXPECT_MESSAGE_HAS("the plan needs");
    {
        char *plan = malloc(needed);
        size_t again = 0;
        if (plan != NULL) {
            EXPECT_OK(rt_model_activation_checkpointing_plan(model, BATCH, 8, plan, needed, &again));
            EXPECT_TRUE(again == needed && strlen(plan) + 1 == needed);
            EXPECT_TRUE(strcmp(plan, "selective:dots \xe2\x86\x92 selective:dots[0] "
                                     "selective:dots[1] selective:dots[2]") == 0);
        }
        free(plan);
    }

    /* Plan shapes. */
    EXPECT(rt_model_activation_checkpointing_plan(model, 0, 8, buf, sizeof buf, &needed),
           RT_ERROR_SHAPE);
    EXPECT_MESSAGE_HAS("[batch 0, seq 8]");
    EXPECT(rt_model_activation_checkpointing_plan(model, BATCH, MAX_SEQ + 1, buf, sizeof buf,
                                                  &needed),
           RT_ERROR_SHAPE);
    EXPECT_MESSAGE_HAS("max_seq_len 16");
    EXPECT(rt_model_activation_checkpointing_plan(model, SIZE_MAX, MAX_SEQ, buf, sizeof buf,
                                                  &needed),
           RT_ERROR_SHAPE);

    /* A budget of 1 byte is accepted by the setter and refused when planned, naming the smallest
     * achievable peak; a training step reports the same. */
    EXPECT_OK(rt_model_set_activation_memory_budget(model, 1));
    EXPECT_TRUE(form_of(model) == RT_ACTIVATION_CHECKPOINTING_BUDGET);
    EXPECT_TRUE(strcmp(policy_of(model), "budget:1") == 0);
    EXPECT(rt_model_activation_checkpointing_plan(model, BATCH, 8, buf, sizeof buf, &needed),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("activation_memory_budget = 1 bytes");
    EXPECT_MESSAGE_HAS("smallest achievable peak activation at batch 2, seq 8 is ");
    uint32_t tokens[BATCH * SEQ_PLUS_ONE];
    for (size_t i = 0; i < BATCH * SEQ_PLUS_ONE; i++) {
        tokens[i] = (uint32_t)(i % VOCAB);
    }
    float loss = 0.0f;
    EXPECT(rt_model_train_step(model, tokens, BATCH * SEQ_PLUS_ONE, BATCH, SEQ_PLUS_ONE, &loss),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("rt_model_train_step: ");
    EXPECT_MESSAGE_HAS("smallest achievable peak");
    rt_model_free(model);
}

/* A saved model loads with AUTO (the policy is not part of the state). */
static void test_load_with_auto(const char *scratch) {
    rt_model *model = new_model();
    rt_model *loaded = NULL;
    char path[1024];
    if (model == NULL) {
        return;
    }
    snprintf(path, sizeof path, "%s/policies.safetensors", scratch);
    EXPECT_OK(rt_model_save(model, path));
    EXPECT_OK(rt_model_load(path, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_AUTO, &loaded));
    if (loaded != NULL) {
        EXPECT_TRUE(strcmp(policy_of(loaded), "auto") == 0);
    }
    rt_model_free(loaded);
    loaded = (rt_model *)&path; /* must be overwritten with NULL on failure */
    EXPECT(rt_model_load(path, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_BUDGET, &loaded),
           RT_ERROR_INVALID_ENUM);
    EXPECT_TRUE(loaded == NULL);
    EXPECT_MESSAGE_HAS("rt_model_set_activation_memory_budget");
    rt_model_free(model);
}

static void test_gqa_tied_config_v2(void) {
    rt_transformer_config_v2 c;
    EXPECT_OK(rt_transformer_config_v2_default(&c));
    EXPECT_TRUE(c.n_kv_heads == c.base.n_heads && c.tie_word_embeddings == 0);
    c.base = small_config();
    c.n_kv_heads = 1;
    c.tie_word_embeddings = 1;
    float losses[2][STEPS];
    const uint32_t policies[2] = {RT_ACTIVATION_CHECKPOINTING_DISABLED,
                                  RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK};
    for (size_t i = 0; i < 2; i++) {
        rt_model *model = NULL;
        EXPECT_OK(rt_model_create_v2(&c, RT_ATTENTION_FLASH, policies[i], &model));
        if (model == NULL) {
            return;
        }
        rt_transformer_config_v2 back;
        EXPECT_OK(rt_model_config_v2(model, &back));
        EXPECT_TRUE(back.n_kv_heads == 1 && back.tie_word_embeddings == 1);
        EXPECT_TRUE(back.base.n_heads == 2 && back.base.d_model == 16);
        EXPECT_TRUE(train(model, losses[i]));
        rt_model_free(model);
    }
    EXPECT_TRUE(memcmp(losses[0], losses[1], sizeof losses[0]) == 0);

    rt_model *model = NULL;
    c.n_kv_heads = 3;
    EXPECT(rt_model_create_v2(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("n_kv_heads = 3");
    EXPECT_MESSAGE_HAS("n_heads 2");
    EXPECT_TRUE(model == NULL);
    c.n_kv_heads = 0;
    EXPECT(rt_model_create_v2(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("n_kv_heads = 0");
    c.n_kv_heads = 2;
    c.tie_word_embeddings = 2;
    EXPECT(rt_model_create_v2(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model),
           RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("tie_word_embeddings = 2");
    EXPECT(rt_model_create_v2(NULL, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model),
           RT_ERROR_NULL_POINTER);
    EXPECT(rt_transformer_config_v2_default(NULL), RT_ERROR_NULL_POINTER);
}

int main(int argc, char **argv) {
    const char *scratch = argc > 1 ? argv[1] : ".";
    test_gqa_tied_config_v2();
    test_every_form_trains_with_the_disabled_loss();
    test_integer_forms();
    test_bad_inputs();
    test_load_with_auto(scratch);
    if (failures != 0) {
        fprintf(stderr, "test_policies: %d of %d checks failed\n", failures, checks);
        return EXIT_FAILURE;
    }
    printf("test_policies: %d checks passed\n", checks);
    return EXIT_SUCCESS;
}
