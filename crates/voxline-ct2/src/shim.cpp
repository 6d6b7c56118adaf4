// voxline's C ABI over CTranslate2's Whisper model, built as its own shared
// object against CTranslate2's headers and loaded after the library (whose
// symbols it resolves) at run time. A transcription runs on the caller's
// thread, with the threads the caller grants for that call; replicas share
// the one loaded model; the caller's abort is polled between the encoder's
// layers and before the decoder. Exceptions never cross the boundary: they
// become the error text.
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <ctranslate2/layers/transformer.h>
#include <ctranslate2/models/whisper.h>
#include <ctranslate2/utils.h>

namespace {
namespace ct2 = ctranslate2;

struct Model {
  std::shared_ptr<const ct2::models::Model> model;
};

const ct2::ops::ActivationType kGelu = ct2::ops::ActivationType::GELU;

// whisper's encoder on the model's own weights (the layers CTranslate2's
// WhisperEncoder is made of, in its order), run one step at a time: the
// library runs it as one call that nothing stops, and it is ~3/4 of a
// transcription's time, so an attempt thrown away as it starts (speech
// resumed) cost the whole encoder. Stepped, it stops at the next layer.
class Encoder {
 public:
  explicit Encoder(const ct2::models::Model& m)
      : conv1_(m, "encoder/conv1", /*stride=*/1, /*padding=*/1, /*dilation=*/1, /*groups=*/1,
               &kGelu),
        conv2_(m, "encoder/conv2", /*stride=*/2, /*padding=*/1, /*dilation=*/1, /*groups=*/1,
               &kGelu),
        transpose_({0, 2, 1}),
        position_(m, "encoder/position_encodings"),
        layers_(ct2::layers::build_layers_list<const ct2::layers::TransformerEncoderLayer>(
            m, "encoder/layer", m.get_attribute_with_default<int32_t>("encoder/num_heads", 8),
            /*pre_norm=*/true, ct2::ops::ActivationType::GELU)),
        output_norm_(m, "encoder/layer_norm") {}

  // Encodes `features` [1, n_mels, frames] into `out`; false when `stop`
  // said so between two steps (`out` is then meaningless).
  template <typename Stop>
  bool run(ct2::StorageView features, ct2::StorageView& out, Stop&& stop) {
    const ct2::DataType dtype = output_norm_.output_type();
    features.move_to(ct2::Device::CPU, dtype);
    ct2::StorageView x(dtype, ct2::Device::CPU);
    conv1_(features, x);
    if (stop()) return false;
    conv2_(x, out);
    if (stop()) return false;
    transpose_(out, x);
    position_(x);
    for (const auto& layer : layers_) {
      (*layer)(x, nullptr, out);
      x = std::move(out);
      if (stop()) return false;
    }
    output_norm_(x, out);
    return true;
  }

 private:
  const ct2::layers::Conv1D conv1_;
  const ct2::layers::Conv1D conv2_;
  const ct2::ops::Transpose transpose_;
  ct2::layers::PositionEmbedding position_;
  const std::vector<std::unique_ptr<const ct2::layers::TransformerEncoderLayer>> layers_;
  const ct2::layers::LayerNorm output_norm_;
};

// A user's replica: the decoder's (CTranslate2's own), and the stepped encoder.
struct Replica {
  std::unique_ptr<ct2::models::WhisperReplica> whisper;
  Encoder encoder;
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

// A replica on the loaded weights (one per concurrent user).
void* vx_ct2_replica(const void* model, char* err, size_t errlen) {
  return guarded<void*>(nullptr, err, errlen, [&]() -> void* {
    const auto* m = static_cast<const Model*>(model);
    return new Replica{ct2::models::WhisperReplica::create_from_model(*m->model),
                       Encoder(*m->model)};
  });
}

void vx_ct2_free_replica(void* replica) { delete static_cast<Replica*>(replica); }

// Transcribes one window of log-mel features, row-major [n_mels][n_frames].
// Returns 0 when done, 1 when `abort_cb` stopped it (polled between the
// encoder's steps and before the decoder), -1 on an error (the reason in
// `err`). `ids` receives at most `ids_cap` token ids
// of the best hypothesis (prompt excluded).
int vx_ct2_transcribe(void* replica, size_t threads, float* mel, size_t n_mels,
                      size_t n_frames, size_t beam, size_t max_length,
                      int (*abort_cb)(void*), void* abort_data, const size_t* prompt,
                      size_t prompt_len, size_t* ids, size_t ids_cap, size_t* n_ids,
                      float* no_speech, float* score, char* err, size_t errlen) {
  return guarded<int>(-1, err, errlen, [&]() -> int {
    auto* r = static_cast<Replica*>(replica);
    ct2::set_num_threads(threads);
    ct2::StorageView features(
        {1, static_cast<ct2::dim_t>(n_mels), static_cast<ct2::dim_t>(n_frames)}, mel);
    const auto stop = [&] { return abort_cb != nullptr && abort_cb(abort_data) != 0; };
    ct2::StorageView memory;
    if (!r->encoder.run(std::move(features), memory, stop) || stop()) return 1;
    ct2::models::WhisperOptions options;
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
    // the encoder's output, which the replica takes as encoded (its shape
    // [1, frames / 2, d_model] is not that of features)
    auto results = r->whisper->generate(std::move(memory), prompts, options);
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
