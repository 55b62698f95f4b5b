/*
 * Devices through the riftco C ABI 2.5 (rt_model_to_device, rt_model_device): the error paths
 * (an unknown name, NULL, a size query), then, on the GPU named by RIFTCO_TEST_GPU (the variable
 * of the Rust GPU tests; default "gpu"), one training step of a tiny model on the CPU and on the
 * GPU from the same seed with the losses compared within 1e-4, an Adam step and a second step,
 * decoding, and a save (read back to the host) loaded and moved to the GPU again.
 *
 *   test_device SCRATCH_DIR
 *
 * Without a GPU adapter the GPU part prints "SKIPPED" with the reason and passes, except under
 * CI=true, where it fails (CI installs Mesa's software Vulkan: scripts/gpu_setup.sh). Run by
 * tests/c/run.sh (without valgrind: the Vulkan driver's own allocations are not ours to check).
 * Exits non-zero when an expectation failed.
 */
#include "check.h"
#include "riftco.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { VOCAB = 64, BATCH = 2, SEQ_PLUS_ONE = 9, MAX_SEQ = 16, DECODED = 4 };

static rt_model *new_model(void) {
    rt_transformer_config c;
    rt_transformer_config_default(&c);
    c.vocab_size = VOCAB;
    c.d_model = 16;
    c.n_heads = 2;
    c.n_layers = 2;
    c.d_ff = 32;
    c.max_seq_len = MAX_SEQ;
    c.seed = 3;
    rt_model *model = NULL;
    EXPECT_OK(rt_model_create(&c, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &model));
    return model;
}

static void device_of(const rt_model *model, char *buf, size_t cap) {
    buf[0] = '\0';
    EXPECT_OK(rt_model_device(model, buf, cap, NULL));
}

static void test_errors(void) {
    rt_model *model = new_model();
    char name[32];
    size_t needed = 0;
    EXPECT(rt_model_device(model, NULL, 0, &needed), RT_ERROR_BUFFER_TOO_SMALL);
    EXPECT_TRUE(needed == strlen("cpu") + 1);
    device_of(model, name, sizeof name);
    EXPECT_TRUE(strcmp(name, "cpu") == 0);

    EXPECT(rt_model_to_device(model, "tpu"), RT_ERROR_INVALID_ARGUMENT);
    EXPECT_MESSAGE_HAS("rt_model_to_device: ");
    EXPECT_MESSAGE_HAS("\"tpu\"");
    EXPECT_MESSAGE_HAS("\"vulkan\"");
    EXPECT_MESSAGE_HAS("\"gpu\"");
    EXPECT(rt_model_to_device(model, NULL), RT_ERROR_NULL_POINTER);
    EXPECT_MESSAGE_HAS("rt_model_to_device: device is NULL");
    EXPECT(rt_model_to_device(NULL, "cpu"), RT_ERROR_NULL_POINTER);
    EXPECT_MESSAGE_HAS("rt_model_to_device: model is NULL");
    EXPECT(rt_model_device(NULL, name, sizeof name, NULL), RT_ERROR_NULL_POINTER);
    device_of(model, name, sizeof name);
    EXPECT_TRUE(strcmp(name, "cpu") == 0);
    rt_model_free(model);
}

static void tokens(uint32_t *out) {
    for (uint32_t i = 0; i < BATCH * SEQ_PLUS_ONE; i++) {
        out[i] = (i * 7 + 3) % VOCAB;
    }
}

static float train_step(rt_model *model) {
    uint32_t block[BATCH * SEQ_PLUS_ONE];
    tokens(block);
    float loss = NAN;
    EXPECT_OK(rt_model_train_step(model, block, BATCH * SEQ_PLUS_ONE, BATCH, SEQ_PLUS_ONE, &loss));
    return loss;
}

/* Greedy logits of a fixed prompt, DECODED positions, into `logits` [DECODED, VOCAB]. */
static void decode(const rt_model *model, float *logits) {
    static const uint32_t prompt[DECODED] = {1, 5, 9, 2};
    rt_decode_session *session = NULL;
    EXPECT_OK(rt_decode_session_create(model, &session));
    for (int p = 0; p < DECODED; p++) {
        EXPECT_OK(rt_decode_session_decode_token(session, prompt[p], logits + p * VOCAB, VOCAB));
    }
    rt_decode_session_free(session);
}

static int close_to(float got, float want) {
    return fabsf(got - want) <= 1e-4f * fmaxf(fabsf(want), 1.0f);
}

/* Returns 0 when the GPU part ran, 1 when it was skipped. */
static int test_gpu(const char *scratch) {
    const char *name = getenv("RIFTCO_TEST_GPU");
    if (name == NULL || name[0] == '\0') {
        name = "gpu";
    }
    const char *ci = getenv("CI");
    rt_model *gpu = new_model();
    rt_status s = rt_model_to_device(gpu, name);
    if (s == RT_ERROR_DEVICE_UNAVAILABLE && !(ci != NULL && strcmp(ci, "true") == 0)) {
        printf("SKIPPED test_device GPU part: no GPU (%s); set CI=true to make this a failure\n",
               last_error());
        rt_model_free(gpu);
        return 1;
    }
    EXPECT_OK(s);
    if (s != RT_OK) {
        fprintf(stderr, "RIFTCO_TEST_GPU=%s could not be opened%s\n", name,
                s == RT_ERROR_DEVICE_UNAVAILABLE
                    ? " under CI=true (install mesa-vulkan-drivers: scripts/gpu_setup.sh)"
                    : "");
        rt_model_free(gpu);
        return 0;
    }
    char device[32];
    device_of(gpu, device, sizeof device);
    EXPECT_TRUE(strcmp(device, "vulkan") == 0 || strcmp(device, "metal") == 0);

    rt_model *cpu = new_model();
    rt_adam *gpu_adam = NULL, *cpu_adam = NULL;
    EXPECT_OK(rt_adam_create(gpu, 1e-2f, &gpu_adam));
    EXPECT_OK(rt_adam_create(cpu, 1e-2f, &cpu_adam));
    for (int step = 0; step < 2; step++) {
        float g = train_step(gpu), c = train_step(cpu);
        printf("step %d: loss cpu %.7f, %s %.7f, |diff| %.2e\n", step, (double)c, device,
               (double)g, (double)fabsf(g - c));
        EXPECT_TRUE(close_to(g, c));
        EXPECT_OK(rt_adam_step(gpu_adam));
        EXPECT_OK(rt_adam_step(cpu_adam));
    }
    static float gpu_logits[DECODED * VOCAB], cpu_logits[DECODED * VOCAB];
    decode(gpu, gpu_logits);
    decode(cpu, cpu_logits);
    float worst = 0.0f;
    for (int i = 0; i < DECODED * VOCAB; i++) {
        worst = fmaxf(worst, fabsf(gpu_logits[i] - cpu_logits[i]));
        EXPECT_TRUE(close_to(gpu_logits[i], cpu_logits[i]));
    }
    printf("decode, %d positions: max |logit diff| %.2e\n", DECODED, (double)worst);

    /* Save reads the weights back to the host; the loaded model starts on the CPU. */
    char path[4096];
    snprintf(path, sizeof path, "%s/gpu_model.safetensors", scratch);
    EXPECT_OK(rt_model_save(gpu, path));
    rt_model *loaded = NULL;
    EXPECT_OK(rt_model_load(path, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &loaded));
    char where[32];
    device_of(loaded, where, sizeof where);
    EXPECT_TRUE(strcmp(where, "cpu") == 0);
    EXPECT_OK(rt_model_to_device(loaded, device));
    static float loaded_logits[DECODED * VOCAB];
    decode(loaded, loaded_logits);
    EXPECT_TRUE(memcmp(loaded_logits, gpu_logits, sizeof gpu_logits) == 0);

    rt_model_free(loaded);
    rt_adam_free(gpu_adam);
    rt_adam_free(cpu_adam);
    rt_model_free(cpu);
    rt_model_free(gpu);
    return 0;
}

int main(int argc, char **argv) {
    const char *scratch = argc > 1 ? argv[1] : ".";
    test_errors();
    int skipped = test_gpu(scratch);
    if (failures != 0) {
        fprintf(stderr, "test_device: %d of %d checks failed\n", failures, checks);
        return EXIT_FAILURE;
    }
    printf("test_device: %d checks passed%s\n", checks, skipped ? " (GPU part skipped)" : "");
    return EXIT_SUCCESS;
}
