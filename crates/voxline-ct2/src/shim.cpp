// voxline's C ABI over CTranslate2's Whisper model, built as its own shared
// object against CTranslate2's headers and loaded after the library (whose
// symbols it resolves) at run time. A transcription runs on the caller's
// thread, with the threads the caller grants for that call; replicas share
// the one loaded model; the caller's abort is polled between the encoder and
// the decoder. Exceptions never cross the boundary: they become the error text.
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <ctranslate2/models/whisper.h>
#include <ctranslate2/utils.h>

namespace {
struct Model {
  std::shared_ptr<const ctranslate2::models::Model> model;
};

void write_error(const char* what, char* err, size_t errlen) {
  if (err != nullptr && errlen > 0) std::snprintf(err, errlen, "%s", what);
}

// Runs `f`; an exception becomes the error text and `on_error` is returned.
template <typename R, typename F>
R guarded(R on_error, char* err, size_t errlen, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    write_error(e.what(), err, errlen);
  } catch (...) {
    write_error("unknown C++ exception", err, errlen);
  }
  return on_error;
}
}  // namespace

extern "C" {

// The version of the headers this shim was compiled against.
const char* vx_ct2_headers_version() { return CT2_HEADERS_VERSION; }

// Loads the model directory on the CPU, its weights in float32 or (`int8`
// not 0) quantised to int8 as they load, with `threads` threads. Null on
// failure, with the reason in `err`.
void* vx_ct2_load(const char* dir, size_t threads, int int8, char* err, size_t errlen) {
  return guarded<void*>(nullptr, err, errlen, [&]() -> void* {
    ctranslate2::set_num_threads(threads);
    ctranslate2::models::ModelLoader loader{std::string(dir)};
    loader.device = ctranslate2::Device::CPU;
    loader.compute_type =
        int8 != 0 ? ctranslate2::ComputeType::INT8 : ctranslate2::ComputeType::FLOAT32;
    auto models = loader.load();
    if (models.empty()) {
      write_error("the model directory loaded no model", err, errlen);
      return nullptr;
    }
    return new Model{models.front()};
  });
}

void vx_ct2_free_model(void* model) { delete static_cast<Model*>(model); }

// A decoding replica on the loaded weights (one per concurrent user).
void* vx_ct2_replica(const void* model, char* err, size_t errlen) {
  return guarded<void*>(nullptr, err, errlen, [&]() -> void* {
    const auto* m = static_cast<const Model*>(model);
    return ctranslate2::models::WhisperReplica::create_from_model(*m->model).release();
  });
}

void vx_ct2_free_replica(void* replica) {
  delete static_cast<ctranslate2::models::WhisperReplica*>(replica);
}

// Transcribes one window of log-mel features, row-major [n_mels][n_frames].
// Returns 0 when done, 1 when `abort_cb` stopped it after the encoder, -1 on
// an error (the reason in `err`). `ids` receives at most `ids_cap` token ids
// of the best hypothesis (prompt excluded).
int vx_ct2_transcribe(void* replica, size_t threads, float* mel, size_t n_mels,
                      size_t n_frames, size_t beam, size_t max_length,
                      int (*abort_cb)(void*), void* abort_data, const size_t* prompt,
                      size_t prompt_len, size_t* ids, size_t ids_cap, size_t* n_ids,
                      float* no_speech, float* score, char* err, size_t errlen) {
  return guarded<int>(-1, err, errlen, [&]() -> int {
    auto* r = static_cast<ctranslate2::models::WhisperReplica*>(replica);
    ctranslate2::set_num_threads(threads);
    ctranslate2::StorageView features(
        {1, static_cast<ctranslate2::dim_t>(n_mels), static_cast<ctranslate2::dim_t>(n_frames)},
        mel);
    ctranslate2::StorageView memory = r->encode(std::move(features), /*to_cpu=*/false);
    if (abort_cb != nullptr && abort_cb(abort_data) != 0) return 1;
    ctranslate2::models::WhisperOptions options;
    options.beam_size = beam;
    options.max_length = max_length;
    options.return_scores = true;
    options.return_no_speech_prob = true;
    // nothing suppressed but a blank start, as whisper.cpp decodes: the
    // model may then write a sound as an annotation ("(buzzing)"), which the
    // pipeline knows is no words; with CTranslate2's default list (symbols
    // and brackets) it wrote a whistle as "That's the right way."
    options.suppress_tokens.clear();
    std::vector<std::vector<size_t>> prompts{std::vector<size_t>(prompt, prompt + prompt_len)};
    auto results = r->generate(std::move(memory), prompts, options);
    if (results.empty() || results.front().sequences_ids.empty()) {
      *n_ids = 0;
      *no_speech = 0.f;
      *score = 0.f;
      return 0;
    }
    const auto& best = results.front().sequences_ids.front();
    *n_ids = best.size() < ids_cap ? best.size() : ids_cap;
    if (*n_ids > 0) std::memcpy(ids, best.data(), *n_ids * sizeof(size_t));
    *no_speech = results.front().no_speech_prob;
    *score = results.front().scores.empty() ? 0.f : results.front().scores.front();
    return 0;
  });
}
}
