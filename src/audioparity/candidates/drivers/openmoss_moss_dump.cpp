// openmoss (pwilkin/openmoss) running MOSS-VoiceGenerator through its public C++ API, dumped as
// f32json pairs (<name>.f32 raw little-endian float32 row-major, <name>.json with its shape).
//
// openmoss-moss-dump --model X.gguf --prompt P.json --output-dir D [--threads N]
//                    [--flash-attn on|off]
//
// X.gguf is openmoss's backbone GGUF, X.extras.gguf beside it. P.json is the request
// {"text", "instruction", "language"}; openmoss builds the prompt's rows [S, 1+n_vq] itself
// (debug_build_prompt_grid) and every tensor below is computed on them. Written to D:
//   input_embeddings   [S, H]   Model::compute_input_embeddings
//   l_out-{i}          [S, H]   decoder layer i, every row: the eval callback of a second
//                               context over openmoss's backbone model with the settings of
//                               openmoss's own (its context has no callback); checked to give
//                               the same final hidden states as openmoss's, bit for bit
//   last_hidden        [H]      openmoss's backbone context, full prefill, row S-1
//   probe_hidden       [3, H]   the same prefill, rows 0, 1, S/2
//   text_logits        [V]      its logits at row S-1 (the backbone GGUF's output matrix)
//   audio_logits       [n_vq, audio_vocab+1]  Model::compute_audio_logits(last_hidden), the
//                               pad column set to -inf as generation masks it
//   step_last_hidden   [H]      rows 0..S-2, then row S-1 as one cached step
// and on stdout two lines: prompt: {"rows": [[...], ...]} and settings: {...}.
// Exit 1 with one line on stderr on any error.

#include "openmoss/model.h"
#include "openmoss/pipeline.h"

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

using json = nlohmann::json;

namespace {

std::string g_out;

void write_tensor(const std::string & name, const float * data, std::vector<long> shape) {
    size_t n = 1;
    for (long s : shape) n *= size_t(s);
    const std::string path = g_out + "/" + name + ".f32";
    FILE * f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(data, sizeof(float), n, f) != n) throw std::runtime_error("cannot write " + path);
    std::fclose(f);
    std::ofstream(g_out + "/" + name + ".json")
        << json{{"name", name}, {"shape", shape}, {"dtype", "f32"}, {"layout", "row-major"}}.dump()
        << "\n";
}

// Layer outputs as the graph computes them: every l_out-i tensor, all rows.
struct Taps {
    int n_layer = 0, n_embd = 0, n_rows = 0;
    std::vector<float> rows;  // [n_layer, n_rows, n_embd]
    std::vector<int> seen;
};

bool tap(ggml_tensor * t, bool ask, void * user) {
    auto * taps = static_cast<Taps *>(user);
    int layer = -1;
    if (std::strncmp(t->name, "l_out-", 6) != 0 || std::sscanf(t->name + 6, "%d", &layer) != 1 ||
        layer < 0 || layer >= taps->n_layer)
        return !ask;
    if (ask) return true;
    if (t->type != GGML_TYPE_F32 || t->ne[0] != taps->n_embd || t->ne[1] != taps->n_rows ||
        !ggml_is_contiguous(t))
        throw std::runtime_error(std::string("unexpected layer output ") + t->name);
    ggml_backend_tensor_get(t, taps->rows.data() + size_t(layer) * taps->n_rows * taps->n_embd, 0,
                            ggml_nbytes(t));
    taps->seen[layer] = 1;
    return true;
}

// Rows [first, first+n) of embd as one batch, outputs at the rows in `outs` and the last.
void decode(llama_context * ctx, const float * embd, int first, int n, int n_embd,
            const std::vector<int> & outs) {
    llama_batch b = llama_batch_init(n, n_embd, 1);
    std::memcpy(b.embd, embd + size_t(first) * n_embd, sizeof(float) * size_t(n) * n_embd);
    for (int i = 0; i < n; ++i) {
        b.pos[i] = first + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        bool out = i == n - 1;
        for (int r : outs) out = out || r == first + i;
        b.logits[i] = out;
    }
    b.n_tokens = n;
    const int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    if (rc != 0) throw std::runtime_error("llama_decode returned " + std::to_string(rc));
}

const float * hidden_at(llama_context * ctx, int row) {
    const float * h = llama_get_embeddings_ith(ctx, row);
    if (!h) throw std::runtime_error("no hidden state for row " + std::to_string(row));
    return h;
}

void quiet(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char ** argv) try {
    std::string model_path, prompt_path, flash = "on";
    int threads = 1;
    for (int i = 1; i < argc; i += 2) {
        const std::string key = argv[i];
        if (i + 1 >= argc) throw std::runtime_error("missing value for " + key);
        const std::string value = argv[i + 1];
        if (key == "--model") model_path = value;
        else if (key == "--prompt") prompt_path = value;
        else if (key == "--output-dir") g_out = value;
        else if (key == "--threads") threads = std::stoi(value);
        else if (key == "--flash-attn") flash = value;
        else throw std::runtime_error("unknown argument " + key);
    }
    if (model_path.empty() || prompt_path.empty() || g_out.empty())
        throw std::runtime_error("usage: --model X.gguf --prompt P.json --output-dir D");
    if (flash != "on" && flash != "off") throw std::runtime_error("--flash-attn: on or off");

    llama_log_set(quiet, nullptr);
    llama_backend_init();
    openmoss::LoadOptions opts;
    opts.skip_codec = true;
    opts.n_gpu_layers = 0;
    opts.aux_cpu = true;
    opts.n_threads = threads;
    opts.flash_attn = flash == "on";
    auto model = openmoss::Model::load(model_path, opts);
    const auto & dims = model->dims();
    const int n_vq = dims.n_vq, H = dims.hidden_size, cols = 1 + n_vq;
    llama_model * backbone = model->backbone_model();
    llama_context * ctx = model->backbone_ctx();
    const int n_layer = llama_model_n_layer(backbone);
    const int V = llama_vocab_n_tokens(llama_model_get_vocab(backbone));

    // the prompt's rows, as openmoss builds them
    const json request = json::parse(std::ifstream(prompt_path));
    openmoss::GenerateRequest req;
    req.text = request.at("text").get<std::string>();
    if (request.contains("instruction") && !request["instruction"].is_null())
        req.instruction = request["instruction"].get<std::string>();
    if (request.contains("language") && !request["language"].is_null())
        req.language = request["language"].get<std::string>();
    int S = 0;
    const std::vector<int32_t> rows = openmoss::debug_build_prompt_grid(*model, req, nullptr, 0, S);
    if (S < 3) throw std::runtime_error("the prompt has fewer than 3 rows");
    if (S > int(llama_n_batch(ctx))) throw std::runtime_error("the prompt is longer than openmoss's n_batch");
    json grid = json::array();
    for (int r = 0; r < S; ++r)
        grid.push_back(std::vector<int32_t>(rows.begin() + size_t(r) * cols,
                                            rows.begin() + size_t(r + 1) * cols));
    std::printf("prompt: %s\n", json{{"rows", grid}}.dump().c_str());

    const std::vector<float> embd = model->compute_input_embeddings(rows.data(), S);
    write_tensor("input_embeddings", embd.data(), {S, H});

    // openmoss's context: the full prefill, then the cached step
    const int probe[3] = {0, 1, S / 2};
    llama_memory_clear(llama_get_memory(ctx), true);
    decode(ctx, embd.data(), 0, S, H, {probe[0], probe[1], probe[2]});
    std::vector<float> probes(size_t(3) * H);
    for (int k = 0; k < 3; ++k) std::memcpy(&probes[size_t(k) * H], hidden_at(ctx, probe[k]), sizeof(float) * H);
    write_tensor("probe_hidden", probes.data(), {3, H});
    const std::vector<float> last(hidden_at(ctx, S - 1), hidden_at(ctx, S - 1) + H);
    write_tensor("last_hidden", last.data(), {H});
    const float * text_logits = llama_get_logits_ith(ctx, S - 1);
    if (!text_logits) throw std::runtime_error("no text logits for the last row");
    write_tensor("text_logits", text_logits, {V});
    std::vector<float> audio = model->compute_audio_logits(last.data());
    for (int k = 0; k < n_vq; ++k) audio[size_t(k) * (dims.audio_vocab_size + 1) + dims.audio_pad_code] = -INFINITY;
    write_tensor("audio_logits", audio.data(), {n_vq, dims.audio_vocab_size + 1});
    llama_memory_clear(llama_get_memory(ctx), true);
    decode(ctx, embd.data(), 0, S - 1, H, {});
    decode(ctx, embd.data(), S - 1, 1, H, {});
    write_tensor("step_last_hidden", hidden_at(ctx, -1), {H});

    // the layers: a context with openmoss's settings and the eval callback
    Taps taps;
    taps.n_layer = n_layer;
    taps.n_embd = H;
    taps.n_rows = S;
    taps.rows.assign(size_t(n_layer) * S * H, 0.0F);
    taps.seen.assign(n_layer, 0);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = llama_n_ctx(ctx);
    cp.n_batch = llama_n_batch(ctx);
    cp.n_ubatch = llama_n_ubatch(ctx);
    cp.n_threads = cp.n_threads_batch = threads;
    cp.embeddings = true;
    cp.pooling_type = LLAMA_POOLING_TYPE_NONE;
    cp.flash_attn_type = opts.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = tap;
    cp.cb_eval_user_data = &taps;
    llama_context * tapped = llama_init_from_model(backbone, cp);
    if (!tapped) throw std::runtime_error("cannot create the tapped context");
    decode(tapped, embd.data(), 0, S, H, {});
    if (std::memcmp(hidden_at(tapped, S - 1), last.data(), sizeof(float) * H) != 0)
        throw std::runtime_error("the tapped context's last hidden state differs from openmoss's");
    for (int l = 0; l < n_layer; ++l) {
        if (!taps.seen[l]) throw std::runtime_error("the eval callback saw no l_out tensor of a layer");
        write_tensor("l_out-" + std::to_string(l), &taps.rows[size_t(l) * S * H], {S, H});
    }

    const json settings = {{"flash_attn", opts.flash_attn}, {"kv_cache_type", ggml_type_name(cp.type_k)},
                           {"n_ctx", llama_n_ctx(ctx)}, {"n_ubatch", llama_n_ubatch(ctx)},
                           {"threads", threads}, {"rows", S}};
    std::printf("settings: %s\n", settings.dump().c_str());
    llama_free(tapped);
    model.reset();
    llama_backend_free();
    return 0;
} catch (const std::exception & e) {
    std::fprintf(stderr, "openmoss-moss-dump: %s\n", e.what());
    return 1;
}
