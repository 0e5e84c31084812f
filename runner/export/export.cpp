#include "runner/export/export.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ops/convert.h"
#include "runner/atomic_output.h"
#include "runner/errors.h"
#include "runner/signals.h"
#include "runner/tokenize/tokenizer.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

struct OutTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // fp32, row-major
};

// The Hugging Face tensors, cut and transposed out of the logical ones.
std::vector<OutTensor> hf_out(const TrainedModel& m, HfStyle style) {
  std::vector<OutTensor> out;
  std::string staged_name;  // q, k and v (gate and up) cut from one fused tensor: staged once
  ops::Tensor staged;
  for (const HfTensor& h : hf_tensors(m.model(), style)) {
    if (h.source != staged_name) {
      staged = m.logical_tensor(h.source);  // the crossing "weights out"
      staged_name = h.source;
    }
    const ops::Tensor& src = staged;
    const auto& s = src.shape();
    const int64_t rows = s[0], cols = s.size() > 1 ? src.numel() / rows : 1;
    const int64_t n = h.rows < 0 ? rows : h.rows;
    RUNNER_CHECK(h.row_begin + n <= rows, "hf tensor " + h.name + " outside " + h.source);
    OutTensor t;
    t.name = h.name;
    const float* p = src.host_data<float>() + h.row_begin * cols;
    if (s.size() == 1) {
      t.shape = {n};
      t.data.assign(p, p + n);
    } else if (h.transpose) {
      t.shape = {cols, n};
      t.data.resize(static_cast<size_t>(n * cols));
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < cols; ++c) t.data[static_cast<size_t>(c * n + r)] = p[r * cols + c];
    } else {
      t.shape = {n, cols};
      t.data.assign(p, p + n * cols);
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<OutTensor> runner_out(const TrainedModel& m) {
  std::vector<OutTensor> out;
  for (const std::string& name : m.logical_names()) {
    const ops::Tensor v = m.logical_tensor(name);  // staged out of the device
    out.push_back({name, v.shape(), std::vector<float>(v.host_data<float>(), v.host_data<float>() + v.numel())});
  }
  return out;
}

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file()) out.insert(e.path().filename().string());
  return out;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) throw UserError({path, 0, 0}, "cannot write the export file", "check the directory's permissions and free space");
}

std::string safetensors_bytes(const std::vector<OutTensor>& ts, ops::DType dtype) {
  const size_t es = ops::dtype_size(dtype);
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}, {"producer", "runner export"}};
  size_t off = 0;
  for (const OutTensor& t : ts) {
    const size_t nb = t.data.size() * es;
    header[t.name] = {{"dtype", dtype == ops::DType::F32 ? "F32" : dtype == ops::DType::BF16 ? "BF16" : "F16"},
                      {"shape", t.shape},
                      {"data_offsets", {off, off + nb}}};
    off += nb;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t hl = h.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((hl >> (8 * i)) & 0xff);
  out += h;
  const size_t data0 = out.size();
  out.resize(data0 + off);
  char* d = out.data() + data0;
  for (const OutTensor& t : ts) {  // the host is little-endian (x86-64, aarch64), as the format is
    const int64_t n = static_cast<int64_t>(t.data.size());
    if (dtype == ops::DType::F32) std::memcpy(d, t.data.data(), static_cast<size_t>(n) * es);
    else ops::from_f32(d, dtype, t.data.data(), n);
    d += static_cast<size_t>(n) * es;
  }
  return out;
}

// ---- npz: a zip archive (stored, no compression) of .npy files ----
uint32_t crc32_zip(const char* p, size_t n) {  // the zip's CRC-32 (polynomial 0xEDB88320)
  static uint32_t table[256];
  static bool init = false;
  if (!init) {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    init = true;
  }
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ static_cast<uint8_t>(p[i])) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

void put16(std::string& s, uint32_t v) { s.push_back(static_cast<char>(v & 0xff)); s.push_back(static_cast<char>((v >> 8) & 0xff)); }
void put32(std::string& s, uint32_t v) { put16(s, v & 0xffff); put16(s, v >> 16); }

std::string npy_bytes(const OutTensor& t) {
  std::string shape = "(";
  for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape[i]);
  shape += t.shape.size() == 1 ? ",)" : ")";
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t pre = 10;  // magic (6), version (2), header length (2)
  size_t total = pre + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  put16(out, static_cast<uint32_t>(dict.size()));
  out += dict;
  const size_t d0 = out.size();
  out.resize(d0 + t.data.size() * sizeof(float));
  std::memcpy(out.data() + d0, t.data.data(), t.data.size() * sizeof(float));
  return out;
}

std::string npz_bytes(const std::vector<OutTensor>& ts, const std::string& path) {
  std::string out, central;
  for (const OutTensor& t : ts) {
    const std::string name = t.name + ".npy";
    const std::string data = npy_bytes(t);
    if (out.size() + data.size() > 0xfffffff0ull)
      throw UserError({path, 0, 0}, "the model is over 4 GiB, more than a zip without zip64 extensions holds",
                      "export it with --format safetensors");
    const uint32_t crc = crc32_zip(data.data(), data.size()), size = static_cast<uint32_t>(data.size());
    const uint32_t offset = static_cast<uint32_t>(out.size());
    put32(out, 0x04034b50); put16(out, 20); put16(out, 0); put16(out, 0);  // signature, version, flags, stored
    put16(out, 0); put16(out, 0x21);                                          // time, date (1980-01-01)
    put32(out, crc); put32(out, size); put32(out, size);
    put16(out, static_cast<uint32_t>(name.size())); put16(out, 0);
    out += name;
    out += data;
    put32(central, 0x02014b50); put16(central, 20); put16(central, 20); put16(central, 0); put16(central, 0);
    put16(central, 0); put16(central, 0x21);
    put32(central, crc); put32(central, size); put32(central, size);
    put16(central, static_cast<uint32_t>(name.size())); put16(central, 0); put16(central, 0);
    put16(central, 0); put16(central, 0); put32(central, 0); put32(central, offset);
    central += name;
  }
  const uint32_t cd_off = static_cast<uint32_t>(out.size()), cd_size = static_cast<uint32_t>(central.size());
  out += central;
  put32(out, 0x06054b50); put16(out, 0); put16(out, 0);
  put16(out, static_cast<uint32_t>(ts.size())); put16(out, static_cast<uint32_t>(ts.size()));
  put32(out, cd_size); put32(out, cd_off); put16(out, 0);
  return out;
}

nlohmann::ordered_json id_json(std::optional<int32_t> id) { return id ? nlohmann::ordered_json(*id) : nlohmann::ordered_json(nullptr); }

// The run's tokenizer (read before anything is written); null when the run read bytes without
// one (RUN_DIR/tokenizer/ absent: the addition task, raw text), which has no special ids at all.
std::unique_ptr<tok::Tokenizer> run_tokenizer(const TrainedModel& m, ExportResult& r) {
  r.tokenizer_kind = "byte";
  if (m.tokenizer_dir.empty()) return nullptr;
  std::unique_ptr<tok::Tokenizer> tk = tok::load_tokenizer(m.tokenizer_dir);
  const tok::TokenizerInfo info = tk->info();
  r.tokenizer_kind = info.kind;
  if (info.vocab_size > m.model().vocab_size)
    r.notes.push_back(fmt::format("the tokenizer has {} tokens, more than the model's vocabulary of {}: ids past {} "
                                  "have no embedding", info.vocab_size, m.model().vocab_size, m.model().vocab_size - 1));
  return tk;
}

// Its files beside the weights (none for bytes): saved into a scratch folder, then moved up, so
// the result names exactly the tokenizer's files.
void save_tokenizer(const tok::Tokenizer& tk, const std::string& out_dir, ExportResult& r) {
  if (tk.info().kind == "byte") return;
  const fs::path tmp = fs::path(out_dir) / ".tokenizer.tmp";
  fs::remove_all(tmp);
  tk.save(tmp.string());
  for (const std::string& f : files_in(tmp.string())) {
    fs::rename(tmp / f, fs::path(out_dir) / f);
    r.tokenizer_files.push_back(f);
  }
  fs::remove_all(tmp);
}

std::string generation_config_json(const TrainedModel& m, const SpecialTokens& ids) {
  nlohmann::ordered_json j;
  j["bos_token_id"] = id_json(ids.bos);
  j["eos_token_id"] = id_json(ids.eos);
  j["max_length"] = m.model().seq_len;
  return j.dump(2) + "\n";
}

const char* torch_dtype(ops::DType d) {
  return d == ops::DType::BF16 ? "bfloat16" : d == ops::DType::F16 ? "float16" : "float32";
}

}  // namespace

std::string export_config_json(const TrainedModel& tm, ExportFormat format, ops::DType dtype, const SpecialTokens& ids) {
  const ModelConfig& m = tm.model();
  nlohmann::ordered_json j;
  HfStyle style{};
  bool has_style = true;
  try {
    style = hf_style(m);
  } catch (const std::invalid_argument&) {
    has_style = false;
  }
  if (format == ExportFormat::npz) {
    j["format"] = "runner npz: logical tensors under the runner's names, fp32";
    if (has_style) j["hf_style"] = to_string(style);
    else j["hf_style"] = nullptr;
    j["model"] = {{"family", to_string(m.family)}, {"vocab_size", m.vocab_size}, {"seq_len", m.seq_len},
                  {"d_model", m.d_model}, {"n_layers", m.n_layers}, {"n_heads", m.n_heads}, {"n_kv_heads", m.kv_heads()},
                  {"mlp_hidden", m.mlp_hidden()}, {"norm", to_string(m.norm)}, {"activation", to_string(m.activation)},
                  {"position", to_string(m.position)}, {"tie_embeddings", m.tie_embeddings}, {"bias", m.bias},
                  {"norm_eps", m.norm_eps}, {"rope_theta", m.rope_theta}, {"dropout", m.dropout}, {"init_std", m.init_std}};
    j["step"] = tm.step;
    return j.dump(2) + "\n";
  }
  if (style == HfStyle::gpt2) {
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["vocab_size"] = m.vocab_size;
    j["n_positions"] = m.seq_len;
    j["n_ctx"] = m.seq_len;
    j["n_embd"] = m.d_model;
    j["n_layer"] = m.n_layers;
    j["n_head"] = m.n_heads;
    j["n_inner"] = m.mlp_hidden();
    j["activation_function"] = std::string(activation_facts(m.activation).hf);
    j["layer_norm_epsilon"] = m.norm_eps;
    // The runner drops out where GPT-2 does, at its one rate: the embeddings, the attention
    // probabilities and each residual branch (runner/model/gpt.cpp).
    j["resid_pdrop"] = m.dropout;
    j["embd_pdrop"] = m.dropout;
    j["attn_pdrop"] = m.dropout;
    j["initializer_range"] = m.init_std;
    j["scale_attn_weights"] = true;
    // The run's tokenizer's; bytes without a tokenizer have none (GPT-2's defaults, 50256, lie
    // outside a 256-token vocabulary).
    j["bos_token_id"] = id_json(ids.bos);
    j["eos_token_id"] = id_json(ids.eos);
    j["tie_word_embeddings"] = m.tie_embeddings;
  } else {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["vocab_size"] = m.vocab_size;
    j["hidden_size"] = m.d_model;
    j["intermediate_size"] = m.mlp_hidden();
    j["num_hidden_layers"] = m.n_layers;
    j["num_attention_heads"] = m.n_heads;
    j["num_key_value_heads"] = m.kv_heads();
    j["head_dim"] = m.d_model / m.n_heads;
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = m.seq_len;
    j["rms_norm_eps"] = m.norm_eps;
    j["rope_theta"] = m.rope_theta;
    j["attention_bias"] = m.bias;
    j["mlp_bias"] = m.bias;
    j["attention_dropout"] = m.dropout;  // Llama has no embedding or residual dropout (export_model notes it)
    j["initializer_range"] = m.init_std;
    j["bos_token_id"] = id_json(ids.bos);  // bytes: none (the defaults, 1 and 2, would end generation at 0x01, 0x02)
    j["eos_token_id"] = id_json(ids.eos);
    j["tie_word_embeddings"] = m.tie_embeddings;
  }
  j["torch_dtype"] = torch_dtype(dtype);
  j["runner_step"] = tm.step;
  return j.dump(2) + "\n";
}

void check_export_request(ExportFormat format, ops::DType dtype) {
  if (dtype != ops::DType::F32 && dtype != ops::DType::BF16 && dtype != ops::DType::F16)
    throw UserError({}, std::string("--dtype ") + ops::dtype_name(dtype) + " is not a floating-point export type",
                    "use fp32, bf16 or fp16");
  if (format == ExportFormat::npz && dtype != ops::DType::F32)
    throw UserError({}, "npz export is fp32 only (numpy has no bfloat16)", "drop --dtype, or use --format safetensors");
}

ExportResult export_model(const TrainedModel& m, ExportFormat format, StagedDir& staged, ops::DType dtype) {
  check_export_request(format, dtype);
  ExportResult r;
  std::vector<OutTensor> ts;
  if (format == ExportFormat::safetensors) {
    HfStyle style;
    try {
      style = hf_style(m.model());
    } catch (const std::invalid_argument& e) {
      throw UserError({m.checkpoint, 0, 0}, std::string("this model has no Hugging Face layout: ") + e.what(),
                      "export it with --format npz (the runner's own tensor names)");
    }
    r.style = to_string(style);
    ts = hf_out(m, style);
    if (style == HfStyle::llama && m.model().dropout > 0)
      r.notes.push_back(fmt::format("training dropped out at {:g} on the embeddings and residual branches too; Hugging Face "
                                    "Llama has attention_dropout only (set to {:g}), so fine-tuning it there drops out less",
                                    m.model().dropout, m.model().dropout));
  } else {
    r.style = "runner";
    ts = runner_out(m);
  }
  const std::unique_ptr<tok::Tokenizer> tk = format == ExportFormat::safetensors ? run_tokenizer(m, r) : nullptr;
  // Written into the staged directory beside OUT, which replaces OUT only once every file is
  // complete and synced: an interrupted or failed export leaves the previous one as it was.
  const std::string out_dir = staged.target(), tmp_dir = staged.path();
  const std::string weights = format == ExportFormat::safetensors ? "model.safetensors" : "model.npz";
  r.weights_path = (fs::path(out_dir) / weights).string();
  r.config_path = (fs::path(out_dir) / "config.json").string();
  const std::string bytes = format == ExportFormat::safetensors ? safetensors_bytes(ts, dtype) : npz_bytes(ts, r.weights_path);
  SpecialTokens ids;
  if (format == ExportFormat::safetensors) {
    if (tk) save_tokenizer(*tk, tmp_dir, r);
    if (tk) ids = {tk->bos_id(), tk->eos_id()};
    r.generation_config_path = (fs::path(out_dir) / "generation_config.json").string();
    write_file((fs::path(tmp_dir) / "generation_config.json").string(), generation_config_json(m, ids));
  }
  throw_if_stopped(out_dir);
  write_file((fs::path(tmp_dir) / weights).string(), bytes);
  write_file((fs::path(tmp_dir) / "config.json").string(), export_config_json(m, format, dtype, ids));
  throw_if_stopped(out_dir);
  staged.commit();
  r.tensors = static_cast<int64_t>(ts.size());
  r.bytes = static_cast<int64_t>(bytes.size());
  return r;
}

}  // namespace runner
