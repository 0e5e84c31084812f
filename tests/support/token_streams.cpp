#include "tests/support/token_streams.h"

namespace test_support {

std::vector<int32_t> token_stream(const std::string& dir, runner::Split split, int64_t vocab, runner::DataKind kind) {
  runner::DataConfig c;
  c.kind = kind;
  c.path = dir;
  auto src = runner::open_source(c, split, 1, vocab, 0);
  std::vector<int32_t> out;
  int32_t t = 0, g = 0;
  for (int64_t i = 0; i < src->num_samples(); ++i) {
    src->sample(i, &t, &g);
    out.push_back(t);
  }
  out.push_back(g);
  return out;
}

}  // namespace test_support
