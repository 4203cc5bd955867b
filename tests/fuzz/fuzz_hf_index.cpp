// A Hugging Face directory's model.safetensors.index.json, read with the shards it names
// (model.init_from): JSON (nesting bounded, each key once), every weight_map entry a file of the
// directory that holds that tensor, every tensor in the file its index names. The directory is a
// tiny llama written once by ptrain's own exporter, in several shards; each input replaces its
// index. An index that is accepted must give exactly the weights that were written.
#include <cstdlib>
#include <stdexcept>

#include "checkpoint/hf_directory.h"
#include "checkpoint/hf_layout.h"
#include "core/output_file.h"
#include "fuzz_util.h"
#include "model/param_layout.h"

namespace {

struct Exported {
  std::string dir;
  ptrain::ModelConfig model;
  std::vector<float> weights;  // as read back through the index the exporter wrote
};

const Exported& exported() {
  static const Exported e = [] {
    Exported out;
    ptrain::ModelConfig& m = out.model;
    m.arch = ptrain::Arch::llama;
    m.n_layer = 2;
    m.n_head = 4;
    m.n_kv_head = 2;
    m.n_embd = 16;
    m.seq_len = 8;
    m.vocab_size = 32;
    m.mlp_hidden = 24;
    std::vector<float> written(static_cast<size_t>(ptrain::param_count(ptrain::ModelShape::of(m))));
    for (size_t i = 0; i < written.size(); ++i) written[i] = 0.001f * static_cast<float>(i % 997);
    char scratch[] = "/tmp/fuzz-hf-index-XXXXXX";
    if (!::mkdtemp(scratch)) throw std::runtime_error("mkdtemp failed");
    out.dir = std::string(scratch) + "/hf";
    ptrain::HfDirectoryContents c;
    c.specs = ptrain::hf_tensor_specs(m);
    c.flat = written.data();
    c.max_shard_bytes = 2000;  // several shards, and an index
    c.text_files["config.json"] = ptrain::hf_config_json(m, -1, "float32").dump();
    ptrain::write_hf_directory(out.dir, c);
    out.weights = ptrain::read_hf_directory(out.dir, m, "model.init_from").params;
    return out;
  }();
  return e;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Exported& e = exported();
  ptrain::write_file_atomic(e.dir + "/model.safetensors.index.json",
                            std::string(reinterpret_cast<const char*>(data), size));
  ptrain::HfWeights read;
  if (!ptrain::fuzz::accepted([&] { read = ptrain::read_hf_directory(e.dir, e.model, "model.init_from"); })) return 0;
  if (read.params != e.weights) throw std::logic_error("an accepted index gives other weights than were written");
  return 0;
}
