// The byte tokenizer: ids are the UTF-8 bytes of the text.
#include <filesystem>
#include <fstream>

#include "runner/errors.h"
#include "runner/tokenize/tokenizer.h"

namespace runner::tok {

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out(text.size());
    for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
    return out;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    s.reserve(ids.size());
    for (int32_t id : ids) s.push_back(static_cast<char>(id & 0xff));
    return s;
  }
  TokenizerInfo info() const override { return {"byte", "byte", 256, "byte"}; }
  std::optional<int32_t> eos_id() const override { return 0; }
  void save(const std::string& dir) const override {
    std::filesystem::create_directories(dir);
    std::ofstream(std::filesystem::path(dir) / "tokenizer_config.json") << "{\"runner_tokenizer\": \"byte\"}\n";
  }
};

}  // namespace

std::unique_ptr<Tokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace runner::tok
