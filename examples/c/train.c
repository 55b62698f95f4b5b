/*
 * riftco C ABI example: train a small byte-level model on a text file, switching the
 * activation-checkpointing policy to POLICY for steps 2 and 3 and back, save it, reload it and
 * decode a few tokens greedily.
 *
 *   train [TEXT_FILE [MODEL_PATH [POLICY [DEVICE]]]]
 *
 * TEXT_FILE defaults to this source file (TRAIN_DEFAULT_TEXT: the path the compiler was given,
 * relative to the folder it ran in, unless the build defines it, as the README's command does
 * with an absolute path), MODEL_PATH to riftco_train_c.safetensors in a fresh folder
 * $TMPDIR/riftco-train-c-XXXXXX (/tmp when TMPDIR is unset or relative; the program prints the
 * path), so that a run with the defaults never writes the model and its config.json into the
 * folder it runs in, such as the repository root; POLICY to
 * "block" (any spelling of rt_model_set_activation_checkpointing_policy: "segments:2", "auto",
 * "selective:dots", "disabled,block", "budget:1MiB", ...), DEVICE to "cpu" ("vulkan", "metal"
 * or "gpu" train, evaluate and decode on a GPU: rt_model_to_device, ABI 2.5; the optimizer is
 * created after the move, and the reloaded model is moved too). With the defaults the "step",
 * "eval" and "decode" lines are compared by tests/c/run.sh with the output of the Rust program
 * crates/riftco-capi/examples/reference_losses.rs (same seed, data and schedule). The "sample"
 * line shows the prompt and the decoded bytes as text (printable ASCII, other bytes as \xNN).
 *
 * Data: step s, row b uses bytes [start, start + SEQ_PLUS_ONE) with
 * start = ((s * BATCH + b) * STRIDE) % (n - SEQ_PLUS_ONE + 1).
 */
/* mkdtemp under -std=c11: POSIX.1-2008 declares it in <stdlib.h>; macOS, in the BSD part of
 * <unistd.h>, which _DARWIN_C_SOURCE keeps visible. */
#define _POSIX_C_SOURCE 200809L
#if defined(__APPLE__)
#define _DARWIN_C_SOURCE
#endif

#include "riftco.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { BATCH = 2, SEQ_PLUS_ONE = 17, STEPS = 6, STRIDE = 37, PROMPT = 8, GENERATE = 8 };
static const float LR = 1e-2f;
static const uint64_t SEED = 1234;

static void report(const char *call, rt_status status) {
    char message[512];
    size_t needed = 0;
    rt_status s = rt_last_error_message(message, sizeof message, &needed);
    fprintf(stderr, "%s failed: %s: %s%s\n", call, rt_status_name(status), message,
            s == RT_ERROR_BUFFER_TOO_SMALL ? " [truncated]" : "");
}

#define CHECK(call)                        \
    do {                                   \
        rt_status check_status_ = (call);  \
        if (check_status_ != RT_OK) {      \
            report(#call, check_status_);  \
            goto done;                     \
        }                                  \
    } while (0)

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

#ifndef TRAIN_DEFAULT_TEXT
#define TRAIN_DEFAULT_TEXT __FILE__
#endif

/* Prints bytes as text: printable ASCII as is, a backslash doubled, anything else as \xNN. */
static void print_text(const unsigned char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = bytes[i];
        if (c == '\\') {
            fputs("\\\\", stdout);
        } else if (c >= 0x20 && c < 0x7f) {
            putchar(c);
        } else {
            printf("\\x%02x", c);
        }
    }
}

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    unsigned char *data = NULL;
    size_t cap = 0, n = 0;
    if (f == NULL) {
        perror(path);
        return NULL;
    }
    for (;;) {
        if (n == cap) {
            size_t new_cap = cap == 0 ? 4096 : cap * 2;
            unsigned char *grown = realloc(data, new_cap);
            if (grown == NULL) {
                free(data);
                fclose(f);
                return NULL;
            }
            data = grown;
            cap = new_cap;
        }
        size_t got = fread(data + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            break;
        }
    }
    fclose(f);
    *len = n;
    return data;
}

/* MODEL_PATH's default: riftco_train_c.safetensors in a new folder made by mkdtemp (mode 0700,
 * a fresh name each run) under $TMPDIR, or /tmp. Returns a string to free, NULL on failure (said
 * on stderr). */
static char *default_model_path(void) {
    static const char folder[] = "/riftco-train-c-XXXXXX";
    static const char file[] = "/riftco_train_c.safetensors";
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] != '/') {
        tmp = "/tmp";
    }
    size_t len = strlen(tmp);
    while (len > 1 && tmp[len - 1] == '/') {
        len--;
    }
    char *path = malloc(len + (sizeof folder - 1) + sizeof file);
    if (path == NULL) {
        fprintf(stderr, "out of memory\n");
        return NULL;
    }
    memcpy(path, tmp, len);
    memcpy(path + len, folder, sizeof folder);
    if (mkdtemp(path) == NULL) {
        fprintf(stderr, "cannot create a new folder in %.*s for the model: %s (pass MODEL_PATH)\n",
                (int)len, tmp, strerror(errno));
        free(path);
        return NULL;
    }
    memcpy(path + strlen(path), file, sizeof file);
    return path;
}

static void fill_block(const unsigned char *data, size_t n, size_t index, uint32_t *block) {
    for (size_t b = 0; b < BATCH; b++) {
        size_t start = ((index * BATCH + b) * STRIDE) % (n - SEQ_PLUS_ONE + 1);
        for (size_t t = 0; t < SEQ_PLUS_ONE; t++) {
            block[b * SEQ_PLUS_ONE + t] = data[start + t];
        }
    }
}

static size_t argmax(const float *x, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++) {
        if (x[i] > x[best]) {
            best = i;
        }
    }
    return best;
}

int main(int argc, char **argv) {
    const char *text_path = argc > 1 ? argv[1] : TRAIN_DEFAULT_TEXT;
    const char *model_path = argc > 2 ? argv[2] : NULL; /* NULL: default_model_path() */
    char *default_path = NULL;
    const char *checkpointed = argc > 3 ? argv[3] : "block";
    const char *device = argc > 4 ? argv[4] : "cpu";
    int ok = 0;
    size_t n = 0;
    unsigned char *data = NULL;
    rt_model *model = NULL, *reloaded = NULL;
    rt_adam *adam = NULL;
    rt_graph *eval = NULL, *eval_reloaded = NULL;
    rt_decode_session *session = NULL;
    float *logits = NULL;
    uint32_t block[BATCH * SEQ_PLUS_ONE];

    uint32_t major = 0, minor = 0;
    CHECK(rt_abi_version(&major, &minor));
    printf("riftco C ABI %" PRIu32 ".%" PRIu32 " (header %d.%d)\n", major, minor,
           RT_ABI_VERSION_MAJOR, RT_ABI_VERSION_MINOR);
    if (major != RT_ABI_VERSION_MAJOR) {
        fprintf(stderr, "ABI major version mismatch\n");
        goto done;
    }

    data = read_file(text_path, &n);
    if (data == NULL) {
        if (argc <= 1) {
            fprintf(stderr,
                    "no TEXT_FILE given, and the default (this program's source, %s) cannot be "
                    "read from this folder: pass a text file (train some.txt), run it from the "
                    "repository root, or compile with -DTRAIN_DEFAULT_TEXT='\"/abs/path\"'\n",
                    text_path);
        }
        goto done;
    }
    if (n < SEQ_PLUS_ONE) {
        fprintf(stderr, "%s: %zu bytes, need at least %d\n", text_path, n, SEQ_PLUS_ONE);
        goto done;
    }
    printf("data: %s (%zu bytes)\n", text_path, n);

    rt_transformer_config config;
    CHECK(rt_transformer_config_default(&config));
    config.vocab_size = 256;
    config.d_model = 32;
    config.n_heads = 4;
    config.n_layers = 2;
    config.d_ff = 64;
    config.max_seq_len = 32;
    config.seed = SEED;
    CHECK(rt_model_create(&config, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED,
                          &model));
    /* Before the optimizer: it keeps its moments on the device the parameters have. */
    CHECK(rt_model_to_device(model, device));
    char device_name[32];
    CHECK(rt_model_device(model, device_name, sizeof device_name, NULL));
    printf("device %s\n", device_name);
    CHECK(rt_adam_create(model, LR, &adam));

    for (size_t step = 0; step < STEPS; step++) {
        /* Steps 2 and 3 run with POLICY, the others without checkpointing. */
        if (step == 2 || step == 3) {
            CHECK(rt_model_set_activation_checkpointing_policy(model, checkpointed));
        } else {
            CHECK(rt_model_set_activation_checkpointing(model,
                                                        RT_ACTIVATION_CHECKPOINTING_DISABLED));
        }
        char policy[256]; /* the spelling read back: "selective" reads "selective:attention_ffn" */
        size_t needed = 0;
        CHECK(rt_model_activation_checkpointing_policy(model, policy, sizeof policy, &needed));
        if (step == 2) {
            char plan[1024];
            CHECK(rt_model_activation_checkpointing_plan(model, BATCH, SEQ_PLUS_ONE - 1, plan,
                                                         sizeof plan, &needed));
            printf("plan %s\n", plan);
        }
        fill_block(data, n, step, block);
        float loss = 0.0f;
        CHECK(rt_model_train_step(model, block, BATCH * SEQ_PLUS_ONE, BATCH, SEQ_PLUS_ONE, &loss));
        rt_graph_statistics graph;
        CHECK(rt_model_last_graph_statistics(model, &graph));
        CHECK(rt_adam_step(adam));
        printf("step %zu policy %s loss %.6f bits 0x%08" PRIx32 "\n", step, policy,
               (double)loss, float_bits(loss));
        printf("  graph nodes %" PRIu64 " elements %" PRIu64 "\n", graph.node_count,
               graph.element_count);
    }

    rt_memory_stats memory; /* the counters of the device the model trained on */
    CHECK(rt_get_memory_stats_for_device(device_name, &memory));
    printf("memory bytes on %s (current/peak): parameter %" PRIu64 "/%" PRIu64 " gradient %" PRIu64
           "/%" PRIu64 " optimizer_state %" PRIu64 "/%" PRIu64 " activation %" PRIu64 "/%" PRIu64
           " total %" PRIu64 "/%" PRIu64 "\n",
           device_name, memory.parameter.current_bytes, memory.parameter.peak_bytes,
           memory.gradient.current_bytes, memory.gradient.peak_bytes,
           memory.optimizer_state.current_bytes, memory.optimizer_state.peak_bytes,
           memory.activation.current_bytes, memory.activation.peak_bytes,
           memory.total.current_bytes, memory.total.peak_bytes);

    /* Save, reload, and check that the reloaded model computes the same loss. */
    if (model_path == NULL) {
        default_path = default_model_path();
        if (default_path == NULL) {
            goto done;
        }
        model_path = default_path;
        printf("no MODEL_PATH given: saving to %s (a new folder)\n", model_path);
    }
    CHECK(rt_model_save(model, model_path));
    CHECK(rt_model_load(model_path, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED,
                        &reloaded));
    /* A model is loaded onto the CPU; the eval loss below is compared on one device. */
    CHECK(rt_model_to_device(reloaded, device_name));
    fill_block(data, n, STEPS, block);
    float eval_loss = 0.0f, eval_loss_reloaded = 0.0f;
    CHECK(rt_model_loss(model, block, BATCH * SEQ_PLUS_ONE, BATCH, SEQ_PLUS_ONE, &eval));
    CHECK(rt_graph_loss(eval, &eval_loss));
    CHECK(rt_model_loss(reloaded, block, BATCH * SEQ_PLUS_ONE, BATCH, SEQ_PLUS_ONE,
                        &eval_reloaded));
    CHECK(rt_graph_loss(eval_reloaded, &eval_loss_reloaded));
    printf("saved %s and reloaded it\n", model_path);
    printf("eval loss %.6f bits 0x%08" PRIx32 "\n", (double)eval_loss, float_bits(eval_loss));
    printf("eval reloaded loss %.6f bits 0x%08" PRIx32 "\n", (double)eval_loss_reloaded,
           float_bits(eval_loss_reloaded));
    if (float_bits(eval_loss) != float_bits(eval_loss_reloaded)) {
        fprintf(stderr, "the reloaded model computes another loss\n");
        goto done;
    }

    /* Greedy decoding from the reloaded model; the trained model's handle is released first. */
    rt_model_free(model);
    model = NULL;
    rt_transformer_config loaded_config;
    CHECK(rt_model_config(reloaded, &loaded_config));
    logits = malloc(loaded_config.vocab_size * sizeof *logits);
    if (logits == NULL) {
        goto done;
    }
    CHECK(rt_decode_session_create(reloaded, &session));
    printf("decode");
    uint32_t token = 0;
    unsigned char text[PROMPT + GENERATE + 1];
    size_t text_len = 0;
    for (size_t i = 0; i < PROMPT + GENERATE; i++) {
        token = i < PROMPT ? data[i] : token;
        if (i < PROMPT) {
            text[text_len++] = data[i];
        }
        CHECK(rt_decode_session_decode_token(session, token, logits, loaded_config.vocab_size));
        token = (uint32_t)argmax(logits, loaded_config.vocab_size);
        if (i >= PROMPT - 1) {
            printf(" %" PRIu32, token);
            /* Byte-level vocabulary: token ids below 256 are bytes. */
            text[text_len++] = (unsigned char)(token < 256 ? token : '?');
        }
    }
    printf("\n");
    printf("sample (greedy, prompt = the first %d bytes of the data): \"", PROMPT);
    print_text(text, text_len);
    printf("\"\n");
    ok = 1;

done:
    free(logits);
    rt_decode_session_free(session);
    rt_graph_free(eval);
    rt_graph_free(eval_reloaded);
    rt_adam_free(adam);
    rt_model_free(model);
    rt_model_free(reloaded);
    free(data);
    free(default_path);
    return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
