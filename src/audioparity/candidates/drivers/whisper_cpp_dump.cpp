/* whisper.cpp's Whisper through its C API (whisper.h): its own greedy transcript, and its
 * decoder's logits teacher-forced along given tokens, dumped as f32json pairs (<name>.f32 raw
 * little-endian float32 row-major, <name>.json with its shape).
 *
 * whisper-cpp-dump --model M.bin --audio A.wav --tokens T.i32 --output-dir D [--threads N]
 *                  [--flash-attn on|off] [--language en] [--task transcribe|translate]
 *                  [--mel MEL.f32]
 *
 * A.wav is read by whisper.cpp's own reader (examples/common-whisper: miniaudio, 16 kHz mono).
 * T.i32 holds the S tokens to teacher-force, raw little-endian int32 (the reference's decoder
 * prompt, then its decoded ids). Written to D:
 *   decoder_logits  [S, V]  the logits at every position of the tokens (row j predicts token
 *                           j+1), one cached step at a time: whisper_decode of token j with
 *                           n_past = j, then whisper_get_logits
 * and on stdout one line, decode: {"ids": [...], "text": "..."}: whisper_full's transcript
 * (greedy, one decoder, temperature 0 without fallback, no timestamps, the language and task
 * given, which a model without languages ignores, suppress_blank and suppress_nst on; as
 * `whisper-cli -bs 1 -bo 1 -tp 0 -nf -nt -sns -l en`),
 * ids its text tokens (below <|endoftext|>), text its segments joined.
 * With --mel, the teacher-forced pass encodes MEL.f32 (raw float32 [n_mels, T], T >= 3000)
 * through whisper_set_mel instead of its own log-mel of the audio; the transcript still comes
 * from whisper_full on the audio.
 * Exit 1 with one line on stderr on any error. */

#include "whisper.h"
#include "common-whisper.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static void die(const std::string & what, const std::string & detail = "") {
    fprintf(stderr, "whisper-cpp-dump: %s%s%s\n", what.c_str(), detail.empty() ? "" : ": ",
            detail.c_str());
    exit(1);
}

template <typename T>
static std::vector<T> read_raw(const std::string & path) {
    FILE * f = fopen(path.c_str(), "rb");
    if (!f) die("cannot read", path);
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (size < 0 || size % sizeof(T) != 0) die("size not a multiple of the element", path);
    std::vector<T> data(size / sizeof(T));
    if (!data.empty() && fread(data.data(), sizeof(T), data.size(), f) != data.size())
        die("cannot read", path);
    fclose(f);
    return data;
}

static void write_tensor(const std::string & dir, const char * name, const float * data,
                         int rows, int cols) {
    const std::string base = dir + "/" + name;
    FILE * f = fopen((base + ".f32").c_str(), "wb");
    const size_t count = (size_t) rows * cols;
    if (!f || fwrite(data, sizeof(float), count, f) != count) die("cannot write", base + ".f32");
    fclose(f);
    f = fopen((base + ".json").c_str(), "w");
    if (!f) die("cannot write", base + ".json");
    fprintf(f, "{\"name\": \"%s\", \"shape\": [%d, %d], \"dtype\": \"f32\", "
               "\"layout\": \"row-major\"}\n", name, rows, cols);
    fclose(f);
}

static std::string json_string(const std::string & text) {
    std::string out = "\"";
    for (unsigned char c : text) {
        if (c == '"' || c == '\\') { out += '\\'; out += (char) c; }
        else if (c < 0x20) { char buf[8]; snprintf(buf, sizeof buf, "\\u%04x", c); out += buf; }
        else out += (char) c;
    }
    return out + "\"";
}

/* whisper_full's greedy transcript, printed as one line. */
static void transcribe(whisper_context * ctx, const std::vector<float> & pcm, int threads,
                       const std::string & language, bool translate) {
    whisper_full_params params = whisper_full_default_params(WHISPER_SAMPLING_GREEDY);
    params.n_threads = threads;
    params.print_realtime = params.print_progress = params.print_timestamps = false;
    params.print_special = false;
    params.no_timestamps = true;
    params.language = language.c_str();
    params.translate = translate;
    params.detect_language = false;
    params.greedy.best_of = 1;
    params.temperature = 0.0f;
    params.temperature_inc = 0.0f;  /* no fallback */
    params.suppress_blank = true;
    params.suppress_nst = true;
    if (whisper_full(ctx, params, pcm.data(), (int) pcm.size()) != 0) die("whisper_full failed");
    const whisper_token eot = whisper_token_eot(ctx);
    std::string ids, text;
    for (int s = 0; s < whisper_full_n_segments(ctx); s++) {
        text += whisper_full_get_segment_text(ctx, s);
        for (int t = 0; t < whisper_full_n_tokens(ctx, s); t++) {
            const whisper_token id = whisper_full_get_token_id(ctx, s, t);
            if (id < eot) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
        }
    }
    printf("decode: {\"ids\": [%s], \"text\": %s}\n", ids.c_str(), json_string(text).c_str());
}

/* The decoder's logits at every position of the tokens, one cached step at a time. */
static std::vector<float> teacher_forced(whisper_context * ctx, const std::vector<float> & pcm,
                                         const std::string & mel_path,
                                         const std::vector<whisper_token> & tokens, int threads) {
    if (mel_path.empty()) {
        if (whisper_pcm_to_mel(ctx, pcm.data(), (int) pcm.size(), threads) != 0)
            die("whisper_pcm_to_mel failed");
    } else {
        const std::vector<float> mel = read_raw<float>(mel_path);
        const int n_mels = whisper_model_n_mels(ctx);
        if (mel.size() % n_mels != 0) die("mel not [n_mels, T]", mel_path);
        if (whisper_set_mel(ctx, mel.data(), (int) (mel.size() / n_mels), n_mels) != 0)
            die("whisper_set_mel failed", mel_path);
    }
    if (whisper_encode(ctx, 0, threads) != 0) die("whisper_encode failed");
    const int n_vocab = whisper_n_vocab(ctx);
    std::vector<float> logits((size_t) tokens.size() * n_vocab);
    for (size_t j = 0; j < tokens.size(); j++) {
        if (whisper_decode(ctx, &tokens[j], 1, (int) j, threads) != 0)
            die("whisper_decode failed at position " + std::to_string(j));
        memcpy(logits.data() + j * n_vocab, whisper_get_logits(ctx), sizeof(float) * n_vocab);
    }
    return logits;
}

int main(int argc, char ** argv) {
    std::string model, audio, tokens_path, output, mel_path, flash = "on", language = "en",
                task = "transcribe";
    int threads = 1;
    for (int i = 1; i < argc; i++) {
        const std::string arg = argv[i];
        if (i + 1 >= argc) die("missing a value after", arg);
        const std::string value = argv[++i];
        if (arg == "--model") model = value;
        else if (arg == "--audio") audio = value;
        else if (arg == "--tokens") tokens_path = value;
        else if (arg == "--output-dir") output = value;
        else if (arg == "--threads") threads = atoi(value.c_str());
        else if (arg == "--flash-attn") flash = value;
        else if (arg == "--mel") mel_path = value;
        else if (arg == "--language") language = value;
        else if (arg == "--task") task = value;
        else die("unknown argument", arg);
    }
    if (model.empty() || audio.empty() || tokens_path.empty() || output.empty())
        die("usage: whisper-cpp-dump --model M --audio A --tokens T.i32 --output-dir D "
            "[--threads N] [--flash-attn on|off] [--language L] [--task T] [--mel MEL.f32]");
    if (flash != "on" && flash != "off") die("--flash-attn: expected on or off, got", flash);
    if (threads < 1) die("--threads: expected a positive count");
    if (task != "transcribe" && task != "translate")
        die("--task: expected transcribe or translate, got", task);
    if (whisper_lang_id(language.c_str()) < 0) die("--language: not a Whisper language", language);

    std::vector<float> pcm;
    std::vector<std::vector<float>> stereo;
    if (!read_audio_data(audio, pcm, stereo, false)) die("cannot read audio", audio);
    const std::vector<int32_t> forced = read_raw<int32_t>(tokens_path);

    whisper_context_params cparams = whisper_context_default_params();
    cparams.use_gpu = false;
    cparams.flash_attn = flash == "on";
    whisper_context * ctx = whisper_init_from_file_with_params(model.c_str(), cparams);
    if (!ctx) die("cannot load the model", model);

    if (forced.empty()) die("no tokens to teacher-force", tokens_path);
    std::vector<whisper_token> tokens;
    for (int32_t id : forced) {
        if (id < 0 || id >= whisper_n_vocab(ctx)) die("token id out of the vocabulary", tokens_path);
        tokens.push_back(id);
    }

    transcribe(ctx, pcm, threads, language, task == "translate");
    const std::vector<float> logits = teacher_forced(ctx, pcm, mel_path, tokens, threads);
    write_tensor(output, "decoder_logits", logits.data(), (int) tokens.size(), whisper_n_vocab(ctx));
    whisper_free(ctx);
    return 0;
}
