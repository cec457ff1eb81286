/* The MOSS-VoiceGenerator backbone (Qwen3) on libllama, fed input embeddings, dumped as
 * f32json pairs (<name>.f32 raw little-endian float32 row-major, <name>.json with its shape).
 *
 * llama-moss-dump --model M.gguf --embeddings E.f32 --output-dir D [--threads N]
 *                 [--flash-attn off|on] [--kv-type f32|f16] [--gpu-layers N]
 *
 * E.f32 holds the prompt's S rows of input embeddings [S, H] (the text embedding plus the
 * codebook embeddings, summed on the host). Written to D:
 *   l_out-{i}          [S, H]  layer i's output, every row (the eval callback's l_out-i)
 *   last_hidden        [H]     the final normed hidden state at the last row (embeddings=true)
 *   probe_hidden       [3, H]  the same at rows 0, 1, S/2
 *   text_logits        [V]     the text head (the GGUF's output matrix) at the last row
 *   step_last_hidden   [H]     row S-1 as one cached step after a prefill of rows 0..S-2
 * and on stdout one line, settings: {...}, the context's settings as llama.cpp took them.
 * Exit 1 with one line on stderr on any error. */

#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what, const char *detail) {
    fprintf(stderr, "llama-moss-dump: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(1);
}

static void write_tensor(const char *dir, const char *name, const float *data, int rows,
                         int cols) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.f32", dir, name);
    const size_t count = (size_t)(rows > 0 ? rows : 1) * cols; /* rows 0: a vector */
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, sizeof(float), count, f) != count)
        die("cannot write", path);
    fclose(f);
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    f = fopen(path, "w");
    if (!f) die("cannot write", path);
    if (rows > 0)
        fprintf(f, "{\"name\": \"%s\", \"shape\": [%d, %d], \"dtype\": \"f32\", "
                   "\"layout\": \"row-major\"}\n", name, rows, cols);
    else
        fprintf(f, "{\"name\": \"%s\", \"shape\": [%d], \"dtype\": \"f32\", "
                   "\"layout\": \"row-major\"}\n", name, cols);
    fclose(f);
}

/* Layer outputs as the graph computes them: the callback asks for every l_out-i tensor and
 * copies it (all rows) when its node has run. */
struct taps {
    int on, n_layer, n_embd, n_rows;
    float *rows; /* [n_layer, n_rows, n_embd] */
    int *seen;
};

static bool tap(struct ggml_tensor *t, bool ask, void *user) {
    struct taps *taps = user;
    int layer;
    if (!taps->on || strncmp(t->name, "l_out-", 6) != 0 || sscanf(t->name + 6, "%d", &layer) != 1 ||
        layer < 0 || layer >= taps->n_layer)
        return ask ? false : true;
    if (ask) return true;
    if (t->type != GGML_TYPE_F32 || t->ne[0] != taps->n_embd || t->ne[1] != taps->n_rows ||
        !ggml_is_contiguous(t))
        die("unexpected layer output", t->name);
    ggml_backend_tensor_get(t, taps->rows + (size_t)layer * taps->n_rows * taps->n_embd, 0,
                            ggml_nbytes(t));
    taps->seen[layer] = 1;
    return true;
}

static void decode(struct llama_context *ctx, const float *embd, int first, int n, int n_embd,
                   bool all_outputs) {
    struct llama_batch batch = llama_batch_init(n, n_embd, 1);
    memcpy(batch.embd, embd + (size_t)first * n_embd, sizeof(float) * n * n_embd);
    for (int i = 0; i < n; i++) {
        batch.pos[i] = first + i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = all_outputs || i == n - 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) die("llama_decode failed", NULL);
    llama_batch_free(batch);
}

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *embd_path = NULL, *out = NULL, *flash = "off", *kv = "f32";
    int threads = 1, gpu_layers = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) die("missing value for", a);
        if (!strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--embeddings")) embd_path = v;
        else if (!strcmp(a, "--output-dir")) out = v;
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--flash-attn")) flash = v;
        else if (!strcmp(a, "--kv-type")) kv = v;
        else if (!strcmp(a, "--gpu-layers")) gpu_layers = atoi(v);
        else die("unknown argument", a);
        i++;
    }
    if (!model_path || !embd_path || !out) die("usage", "--model --embeddings --output-dir");
    if (strcmp(flash, "off") && strcmp(flash, "on")) die("--flash-attn: expected off or on", flash);
    if (strcmp(kv, "f32") && strcmp(kv, "f16")) die("--kv-type: expected f32 or f16", kv);

    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = gpu_layers;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) die("cannot load", model_path);
    const int n_embd = llama_model_n_embd(model), n_layer = llama_model_n_layer(model);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    FILE *f = fopen(embd_path, "rb");
    if (!f) die("cannot read", embd_path);
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (bytes <= 0 || bytes % ((long)sizeof(float) * n_embd))
        die("embeddings: size is not a whole number of rows of n_embd floats", embd_path);
    const int n = (int)(bytes / ((long)sizeof(float) * n_embd));
    if (n < 3) die("embeddings: need at least 3 rows", embd_path);
    float *embd = malloc(bytes);
    if (fread(embd, 1, bytes, f) != (size_t)bytes) die("cannot read", embd_path);
    fclose(f);

    struct taps taps = {1, n_layer, n_embd, n, calloc((size_t)n_layer * n * n_embd, sizeof(float)),
                        calloc(n_layer, sizeof(int))};
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n + 16;
    cp.n_batch = cp.n_ubatch = n; /* one graph for the prompt: the taps see every row */
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.embeddings = true;
    cp.pooling_type = LLAMA_POOLING_TYPE_NONE;
    cp.flash_attn_type = strcmp(flash, "on") ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                             : LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.type_k = cp.type_v = strcmp(kv, "f16") ? GGML_TYPE_F32 : GGML_TYPE_F16;
    cp.cb_eval = tap;
    cp.cb_eval_user_data = &taps;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create a context", NULL);

    /* the full prefill: every row an output */
    decode(ctx, embd, 0, n, n_embd, true);
    char name[64];
    for (int l = 0; l < n_layer; l++) {
        if (!taps.seen[l]) die("the eval callback saw no l_out tensor of a layer", NULL);
        const float *rows = taps.rows + (size_t)l * n * n_embd;
        snprintf(name, sizeof name, "l_out-%d", l);
        write_tensor(out, name, rows, n, n_embd);
    }
    const int probe[3] = {0, 1, n / 2};
    float *probes = malloc(sizeof(float) * 3 * n_embd);
    for (int k = 0; k < 3; k++) {
        const float *h = llama_get_embeddings_ith(ctx, probe[k]);
        if (!h) die("no hidden state for a probe row", NULL);
        memcpy(probes + (size_t)k * n_embd, h, sizeof(float) * n_embd);
    }
    write_tensor(out, "probe_hidden", probes, 3, n_embd);
    const float *last = llama_get_embeddings_ith(ctx, n - 1);
    const float *logits = llama_get_logits_ith(ctx, n - 1);
    if (!last || !logits) die("no hidden state or logits for the last row", NULL);
    write_tensor(out, "last_hidden", last, 0, n_embd);
    write_tensor(out, "text_logits", logits, 0, n_vocab);

    /* the cached path: rows 0..S-2, then row S-1 as one step */
    taps.on = 0;
    llama_memory_clear(llama_get_memory(ctx), true);
    decode(ctx, embd, 0, n - 1, n_embd, false);
    decode(ctx, embd, n - 1, 1, n_embd, false);
    const float *step = llama_get_embeddings_ith(ctx, 0);
    if (!step) die("no hidden state for the cached step", NULL);
    write_tensor(out, "step_last_hidden", step, 0, n_embd);

    /* the settings as llama.cpp took them, one line on stdout */
    printf("settings: {\"flash_attn\": \"%s\", \"type_k\": \"%s\", \"type_v\": \"%s\", "
           "\"n_ubatch\": %u, \"n_threads\": %d, \"n_gpu_layers\": %d, \"rows\": %d}\n",
           llama_flash_attn_type_name(cp.flash_attn_type), ggml_type_name(cp.type_k),
           ggml_type_name(cp.type_v), llama_n_ubatch(ctx), threads, gpu_layers, n);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(embd);
    free(probes);
    free(taps.rows);
    free(taps.seen);
    return 0;
}
