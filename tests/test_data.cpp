// Tests for runner/data: the addition task, the O(1) shuffle, the sharded prefetching
// loader (order, dp slicing, resume), the file sources and every user-facing error.
#include <doctest/doctest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ops/rng.h"
#include "runner/data/data.h"
#include "runner/data/data_internal.h"
#include "runner/errors.h"
#include "runner/hdf5/hdf5.h"
#include "tests/support/temp_dir.h"

using namespace runner;
namespace fs = std::filesystem;

namespace {

// A fresh directory under /tmp per test, removed at the end.
struct TempDir : test_support::TempDir {
  TempDir() : test_support::TempDir("test_data") {}
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void put_u16(std::string& s, uint16_t v) {
  s.push_back(static_cast<char>(v & 0xff));
  s.push_back(static_cast<char>(v >> 8));
}
void put_i32(std::string& s, int32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((static_cast<uint32_t>(v) >> (8 * i)) & 0xff));
}

// nanoGPT: raw little-endian uint16.
void write_nanogpt(const std::string& path, const std::vector<uint16_t>& toks) {
  std::string s;
  for (uint16_t t : toks) put_u16(s, t);
  write_bytes(path, s);
}

// llm.c: 256 int32 header (magic, version, count), then uint16 tokens.
void write_llmc(const std::string& path, const std::vector<uint16_t>& toks, int32_t declared = -1) {
  std::string s;
  put_i32(s, 20240520);
  put_i32(s, 1);
  put_i32(s, declared >= 0 ? declared : static_cast<int32_t>(toks.size()));
  for (int i = 3; i < 256; ++i) put_i32(s, 0);
  for (uint16_t t : toks) put_u16(s, t);
  write_bytes(path, s);
}

// A small HDF5 file with one dataset of `dims` (1-D unless given) in `mem_type`.
template <class E>
void write_h5(const std::string& path, const std::string& name, hid_t file_type, hid_t mem_type,
              const std::vector<E>& data, std::optional<int64_t> max_token_attr = std::nullopt,
              std::vector<hsize_t> dims = {}) {
  std::lock_guard<std::mutex> lock(h5::mutex());
  if (dims.empty()) dims = {static_cast<hsize_t>(data.size())};
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t sp = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t d = H5Dcreate2(f, name.c_str(), file_type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(d >= 0);
  REQUIRE(H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) >= 0);
  if (max_token_attr) {
    hid_t as = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(d, "max_token", H5T_STD_I64LE, as, H5P_DEFAULT, H5P_DEFAULT);
    int64_t v = *max_token_attr;
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Sclose(as);
  }
  H5Dclose(d);
  H5Sclose(sp);
  H5Fclose(f);
}

// Runs `fn`, requires a UserError whose message names `path` and contains `needle`.
template <class Fn>
void require_user_error(Fn&& fn, const std::string& path, const std::string& needle) {
  try {
    fn();
    FAIL("expected a UserError mentioning '" << needle << "'");
  } catch (const UserError& e) {
    INFO("message: " << e.what());
    CHECK(std::string(e.what()).find(path) != std::string::npos);
    CHECK(e.loc().file == path);
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
    CHECK(!e.fix().empty());
  }
}

// Sets the HDF5 in-memory threshold for one scope (0: stream every window from the file).
struct InMemoryLimit {
  int64_t saved;
  explicit InMemoryLimit(int64_t bytes) : saved(data_detail::hdf5_in_memory_limit().exchange(bytes)) {}
  ~InMemoryLimit() { data_detail::hdf5_in_memory_limit() = saved; }
};

DataConfig file_cfg(const std::string& kind, const std::string& path, double val_fraction = 0.0) {
  DataConfig c;
  c.kind = parse_enum<DataKind>(kind).value();
  c.path = path;
  c.val_fraction = val_fraction;
  return c;
}

// Sample i has tokens (i, i+1, ...), all targets i: the loader's order is readable.
class FakeSource final : public DataSource {
 public:
  FakeSource(int64_t n, int64_t T, int64_t throw_at = -1) : n_(n), T_(T), throw_at_(throw_at) {}
  std::string describe() const override { return "fake"; }
  int64_t num_samples() const override { return n_; }
  int64_t max_token() const override { return n_ + T_; }
  int64_t seq_len() const override { return T_; }
  void sample(int64_t index, int32_t* tokens, int32_t* targets) const override {
    if (index == throw_at_) throw UserError(SourceLoc{"fake.bin"}, "bad token", "fix it");
    for (int64_t t = 0; t < T_; ++t) {
      tokens[t] = static_cast<int32_t>(index + t);
      targets[t] = static_cast<int32_t>(index);
    }
  }

 private:
  int64_t n_, T_, throw_at_;
};

// The sample indices of a batch drawn from a FakeSource.
std::vector<int64_t> indices(const Batch& b) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < b.B; ++i) out.push_back(b.targets[static_cast<size_t>(i * b.T)]);
  return out;
}

std::vector<int64_t> draw(DataLoader& L, int64_t micro_batches) {
  std::vector<int64_t> out;
  for (int64_t m = 0; m < micro_batches; ++m) {
    auto v = indices(L.next());
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<Batch> draw_batches(DataLoader& L, int64_t n) {
  std::vector<Batch> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(L.next());
  return out;
}

bool same(const Batch& a, const Batch& b) {
  return a.B == b.B && a.T == b.T && a.tokens == b.tokens && a.targets == b.targets;
}

uint64_t parse(const std::vector<int32_t>& t, size_t from, size_t n) {
  uint64_t v = 0;
  for (size_t i = from; i < from + n; ++i) {
    REQUIRE(t[i] >= '0');
    REQUIRE(t[i] <= '9');
    v = v * 10 + static_cast<uint64_t>(t[i] - '0');
  }
  return v;
}

// Decodes every problem of an addition sample, checks its arithmetic and the target mask;
// returns the (a, b) of the whole problems.
std::vector<std::pair<uint64_t, uint64_t>> check_addition_sample(int64_t D, int64_t T, const std::vector<int32_t>& tok,
                                                                 const std::vector<int32_t>& tgt) {
  const int64_t P = 3 * D + 4;
  std::vector<std::pair<uint64_t, uint64_t>> problems;
  std::vector<int32_t> expected_targets(static_cast<size_t>(T), -1);
  for (int64_t k = 0; (k + 1) * P <= T; ++k) {
    const size_t o = static_cast<size_t>(k * P);
    const uint64_t a = parse(tok, o, static_cast<size_t>(D));
    CHECK(tok[o + D] == '+');
    const uint64_t b = parse(tok, o + D + 1, static_cast<size_t>(D));
    CHECK(tok[o + 2 * D + 1] == '=');
    // The sum, least significant digit first, D+1 digits.
    uint64_t s = a + b;
    for (int64_t i = 0; i <= D; ++i) {
      CHECK(tok[o + 2 * D + 2 + i] == '0' + static_cast<int32_t>(s % 10));
      s /= 10;
    }
    CHECK(tok[o + P - 1] == '\n');
    for (int64_t off = 2 * D + 1; off < P - 1; ++off) expected_targets[o + off] = tok[o + off + 1];
    problems.emplace_back(a, b);
  }
  // The cut-off problem at the end still starts like a problem.
  const int64_t tail = (T / P) * P;
  for (int64_t t = tail; t < std::min(T, tail + D); ++t) CHECK((tok[t] >= '0' && tok[t] <= '9'));
  CHECK(tgt == expected_targets);
  return problems;
}

}  // namespace

// ---------------------------------------------------------------------------------------
TEST_CASE("byte tokenizer round-trips any bytes") {
  std::string s = "hello, w\xc3\xb6rld \xe2\x82\xac\n";
  s.push_back('\0');
  s.push_back(static_cast<char>(0xff));
  auto t = byte_tokenize(s);
  REQUIRE(t.size() == s.size());
  CHECK(t[9] == 0xb6);
  CHECK(t.back() == 255);
  CHECK(byte_detokenize(t) == s);
  CHECK(byte_detokenize({72, 300, -1, 105}) == "H??i");
}

TEST_CASE("permutation is a bijection") {
  using data_detail::IndexPermutation;
  for (uint64_t key : {0ull, 1ull, 0xdeadbeefull}) {
    for (uint64_t n = 1; n <= 300; ++n) {
      IndexPermutation p(n, key);
      std::vector<char> seen(n, 0);
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t v = p(i);
        REQUIRE(v < n);
        REQUIRE(!seen[v]);
        seen[v] = 1;
      }
    }
  }
  for (uint64_t n : {4096ull, 4097ull, 65539ull}) {
    IndexPermutation p(n, 42);
    std::vector<char> seen(n, 0);
    int64_t fixed = 0;
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t v = p(i);
      REQUIRE(v < n);
      REQUIRE(!seen[v]);
      seen[v] = 1;
      fixed += v == i;
    }
    CHECK(fixed < 20);  // a shuffle, not the identity (expected ~1 fixed point)
  }
  // Keys matter; huge ranges work in O(1).
  IndexPermutation a(1000, 1), b(1000, 2);
  int64_t differ = 0;
  for (uint64_t i = 0; i < 1000; ++i) differ += a(i) != b(i);
  CHECK(differ > 900);
  IndexPermutation huge(uint64_t{1} << 40, 7);
  std::set<uint64_t> vals;
  for (uint64_t i = 0; i < 1000; ++i) {
    uint64_t v = huge(i);
    CHECK(v < (uint64_t{1} << 40));
    vals.insert(v);
  }
  CHECK(vals.size() == 1000);
}

// ---------------------------------------------------------------------------------------
TEST_CASE("addition: sample format, arithmetic and target masking") {
  for (int64_t D : {1, 2, 3, 5, 18}) {
    const int64_t P = 3 * D + 4;
    for (int64_t T : {P, 2 * P, int64_t{64}, int64_t{100}, int64_t{257}}) {
      if (T < P) continue;
      DataConfig cfg;
      cfg.digits = D;
      auto src = open_source(cfg, Split::Train, T, 256, 1234);
      CHECK(src->seq_len() == T);
      CHECK(src->max_token() == '9');
      CHECK(src->num_samples() >= (int64_t{1} << 40));
      std::vector<int32_t> tok(static_cast<size_t>(T)), tgt(static_cast<size_t>(T));
      for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{77}, int64_t{1} << 39}) {
        src->sample(i, tok.data(), tgt.data());
        auto problems = check_addition_sample(D, T, tok, tgt);
        CHECK(static_cast<int64_t>(problems.size()) == T / P);
      }
    }
  }
  // The exact text of one problem: "457+068=" then 525 reversed and padded: "5250\n".
  auto eval = addition_eval_problems(3, 50, 9);
  for (const auto& p : eval) {
    REQUIRE(p.prompt.size() == 8);
    REQUIRE(p.answer.size() == 5);
    uint64_t a = parse(p.prompt, 0, 3), b = parse(p.prompt, 4, 3), s = a + b;
    std::string want;
    for (int i = 0; i < 4; ++i, s /= 10) want.push_back(static_cast<char>('0' + s % 10));
    CHECK(byte_detokenize(p.answer) == want + "\n");
    CHECK(byte_detokenize(p.prompt).substr(3, 1) == "+");
    CHECK(p.prompt.back() == '=');
  }
}

TEST_CASE("addition: train and held-out problems never meet") {
  using data_detail::addition_held_out;
  // The held-out rule covers about 1/20 of all pairs, and is never empty.
  for (int64_t D : {1, 2, 3}) {
    uint64_t range = 1, held = 0;
    for (int64_t i = 0; i < D; ++i) range *= 10;
    for (uint64_t a = 0; a < range; ++a)
      for (uint64_t b = 0; b < range; ++b) held += addition_held_out(D, a, b);
    CHECK(held > 0);
    if (D >= 2) CHECK(std::abs(static_cast<double>(held) / (range * range) - 0.05) < 0.02);
  }
  for (int64_t D : {1, 2, 3, 4}) {
    DataConfig cfg;
    cfg.digits = D;
    const int64_t T = 128;
    auto train = open_source(cfg, Split::Train, T, 256, 5);
    auto val = open_source(cfg, Split::Val, T, 256, 5);
    std::vector<int32_t> tok(T), tgt(T);
    for (int64_t i = 0; i < 200; ++i) {
      train->sample(i, tok.data(), tgt.data());
      for (auto [a, b] : check_addition_sample(D, T, tok, tgt)) REQUIRE(!addition_held_out(D, a, b));
      val->sample(i, tok.data(), tgt.data());
      for (auto [a, b] : check_addition_sample(D, T, tok, tgt)) REQUIRE(addition_held_out(D, a, b));
    }
    for (const auto& p : addition_eval_problems(D, 100, 3))
      CHECK(addition_held_out(D, parse(p.prompt, 0, D), parse(p.prompt, D + 1, D)));
  }
  // Eval problems: deterministic in the seed, distinct while the held-out set allows.
  auto e1 = addition_eval_problems(3, 200, 11), e2 = addition_eval_problems(3, 200, 11),
       e3 = addition_eval_problems(3, 200, 12);
  std::set<std::vector<int32_t>> distinct;
  for (size_t i = 0; i < e1.size(); ++i) {
    CHECK(e1[i].prompt == e2[i].prompt);
    distinct.insert(e1[i].prompt);
  }
  CHECK(distinct.size() == 200);
  CHECK(e1[0].prompt != e3[0].prompt);
  CHECK(addition_eval_problems(1, 50, 1).size() == 50);  // 1 digit: a handful of pairs, repeated
}

TEST_CASE("addition: samples are a pure function of (seed, index)") {
  DataConfig cfg;
  auto a = open_source(cfg, Split::Train, 96, 256, 1), b = open_source(cfg, Split::Train, 96, 256, 1),
       c = open_source(cfg, Split::Train, 96, 256, 2);
  std::vector<int32_t> ta(96), ga(96), tb(96), gb(96), tc(96), gc(96);
  for (int64_t i : {0, 5, 123456}) {
    a->sample(i, ta.data(), ga.data());
    b->sample(i, tb.data(), gb.data());
    c->sample(i, tc.data(), gc.data());
    CHECK(ta == tb);
    CHECK(ga == gb);
    CHECK(ta != tc);
  }
  a->sample(6, tb.data(), gb.data());
  a->sample(5, tc.data(), gc.data());
  CHECK(tb != tc);
}

TEST_CASE("addition: configuration errors") {
  DataConfig cfg;
  cfg.digits = 3;
  require_user_error([&] { open_source(cfg, Split::Train, 12, 256, 0); }, "", "shorter than one 3-digit");
  require_user_error([&] { open_source(cfg, Split::Train, 64, 57, 0); }, "", "vocab_size >= 58");
  CHECK_NOTHROW(open_source(cfg, Split::Train, 64, 58, 0));
  cfg.digits = 19;
  require_user_error([&] { open_source(cfg, Split::Train, 256, 256, 0); }, "", "data.digits = 19");
  cfg.digits = 0;
  require_user_error([&] { addition_eval_problems(0, 5, 0); }, "", "data.digits = 0");
  cfg.kind = static_cast<DataKind>(99);  // no such kind: only a cast makes one
  require_user_error([&] { open_source(cfg, Split::Train, 256, 256, 0); }, "", "unknown data.kind");
}

// ---------------------------------------------------------------------------------------
TEST_CASE("loader: same seed same batches, different seed different") {
  DataConfig cfg;
  auto src = std::shared_ptr<const DataSource>(open_source(cfg, Split::Train, 64, 256, 7));
  LoaderConfig lc;
  lc.global_batch = 8;
  lc.micro = 4;
  DataLoader a(src, lc, 99), b(src, lc, 99), c(src, lc, 100);
  auto ba = draw_batches(a, 6), bb = draw_batches(b, 6), bc = draw_batches(c, 6);
  for (size_t i = 0; i < ba.size(); ++i) {
    CHECK(ba[i].B == 4);
    CHECK(ba[i].T == 64);
    CHECK(same(ba[i], bb[i]));
    CHECK(!same(ba[i], bc[i]));
  }
  // A different source seed changes the problems themselves.
  auto src2 = std::shared_ptr<const DataSource>(open_source(cfg, Split::Train, 64, 256, 8));
  DataLoader d(src2, lc, 99);
  CHECK(!same(d.next(), ba[0]));
}

TEST_CASE("loader: order is the permutation, epoch by epoch; shuffle=false is the identity") {
  const int64_t N = 10;
  auto src = std::make_shared<FakeSource>(N, 3);
  LoaderConfig lc;
  lc.global_batch = 5;
  lc.micro = 5;
  DataLoader L(src, lc, 3);
  CHECK(L.epoch() == 0);
  auto order = draw(L, 8);  // 40 samples = 4 epochs
  CHECK(L.epoch() == 4);
  CHECK(L.state().sample_cursor == 40);
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < 4; ++e) {
    std::vector<int64_t> ep(order.begin() + e * N, order.begin() + (e + 1) * N);
    std::set<int64_t> s(ep.begin(), ep.end());
    CHECK(s.size() == N);
    CHECK(*s.begin() == 0);
    CHECK(*s.rbegin() == N - 1);
    epochs.push_back(ep);
  }
  CHECK((epochs[0] != epochs[1] || epochs[1] != epochs[2]));
  lc.shuffle = false;
  DataLoader I(src, lc, 3);
  auto ident = draw(I, 4);
  for (int64_t i = 0; i < 20; ++i) CHECK(ident[i] == i % N);
}

TEST_CASE("loader: dp ranks' micro-batches together are the single-rank global batch") {
  auto src = std::make_shared<FakeSource>(1000, 4);
  const int64_t G = 24, steps = 5;
  LoaderConfig one;
  one.global_batch = G;
  one.micro = G;
  DataLoader ref(src, one, 17);
  auto global = draw(ref, steps);
  for (int dp : {1, 2, 3, 4}) {
    for (int64_t micro : {int64_t{1}, int64_t{2}, G / dp}) {
      if ((G / dp) % micro) continue;
      const int64_t accum = G / dp / micro;
      std::vector<std::unique_ptr<DataLoader>> ranks;
      for (int r = 0; r < dp; ++r) {
        LoaderConfig lc;
        lc.global_batch = G;
        lc.micro = micro;
        lc.dp_rank = r;
        lc.dp_size = dp;
        lc.workers = 2;
        ranks.push_back(std::make_unique<DataLoader>(src, lc, 17));
      }
      std::vector<int64_t> got;
      for (int64_t s = 0; s < steps; ++s) {
        for (int r = 0; r < dp; ++r) {
          auto v = draw(*ranks[r], accum);
          got.insert(got.end(), v.begin(), v.end());
        }
        for (int r = 0; r < dp; ++r) CHECK(ranks[r]->state().sample_cursor == (s + 1) * G);
      }
      INFO("dp=" << dp << " micro=" << micro);
      CHECK(got == global);
    }
  }
}

TEST_CASE("loader: save and restore mid-run replays exactly the same batches") {
  DataConfig cfg;
  auto src = std::shared_ptr<const DataSource>(open_source(cfg, Split::Train, 48, 256, 21));
  for (int dp : {1, 2}) {
    LoaderConfig lc;
    lc.global_batch = 8;
    lc.micro = 2;
    lc.dp_size = dp;
    lc.dp_rank = dp - 1;
    lc.workers = 3;
    lc.prefetch = 5;
    const int64_t accum = 8 / dp / 2;
    DataLoader A(src, lc, 5);
    draw_batches(A, 3 * accum);  // three steps
    CHECK(A.state() == LoaderState{24, 5});
    draw_batches(A, 1);  // one micro-batch into the fourth step
    const LoaderState mid = A.state();
    CHECK(mid.sample_cursor == 24 + 2 * dp);
    auto expect = draw_batches(A, 7);
    // A fresh loader (other thread count) restored there replays them.
    lc.workers = 1;
    lc.prefetch = 1;
    DataLoader B(src, lc, 12345);  // the checkpoint's seed wins
    draw_batches(B, 2);
    B.restore(mid);
    CHECK(B.state() == mid);
    auto got = draw_batches(B, 7);
    for (size_t i = 0; i < expect.size(); ++i) CHECK(same(expect[i], got[i]));
    // Restoring the running loader drops what it prefetched and replays too.
    A.restore(mid);
    auto again = draw_batches(A, 7);
    for (size_t i = 0; i < expect.size(); ++i) CHECK(same(expect[i], again[i]));
  }
  // A cursor that is not a micro-batch boundary of this layout is a user error.
  LoaderConfig lc;
  lc.global_batch = 8;
  lc.micro = 4;
  DataLoader C(src, lc, 5);
  require_user_error([&] { C.restore(LoaderState{10, 5}); }, "", "micro-batch boundary");
  CHECK_NOTHROW(C.restore(LoaderState{12, 5}));
}

TEST_CASE("loader: several prefetch workers give the same order as one") {
  auto src = std::make_shared<FakeSource>(777, 8);
  LoaderConfig lc;
  lc.global_batch = 12;
  lc.micro = 3;
  lc.dp_size = 2;
  lc.dp_rank = 1;
  lc.workers = 1;
  lc.prefetch = 1;
  DataLoader one(src, lc, 8);
  auto want = draw(one, 200);
  for (int64_t workers : {0, 2, 4, 8}) {
    lc.workers = workers;
    lc.prefetch = 6;
    DataLoader many(src, lc, 8);
    CHECK(draw(many, 200) == want);
    CHECK(many.take_wait_ms() >= 0.0);
    CHECK(many.take_wait_ms() == 0.0);
  }
}

TEST_CASE("loader: an error inside a worker surfaces from next()") {
  auto src = std::make_shared<FakeSource>(50, 2, /*throw_at=*/7);
  LoaderConfig lc;
  lc.global_batch = 50;
  lc.micro = 5;
  lc.shuffle = false;
  lc.workers = 3;
  DataLoader L(src, lc, 0);
  L.next();  // samples 0..4
  require_user_error([&] { L.next(); }, "fake.bin", "bad token");
  require_user_error([&] { L.next(); }, "fake.bin", "bad token");  // stuck, not skipped
}

// ---------------------------------------------------------------------------------------
TEST_CASE("text source: windows of T+1 at stride T, val split at the end or from val_path") {
  TempDir dir;
  std::string text;
  ops::SplitMix g{3, 0};
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>(' ' + g.below(95)));
  text += "caf\xc3\xa9";
  write_bytes(dir.file("a.txt"), text);
  const int64_t T = 16, n = static_cast<int64_t>(text.size()), n_val = static_cast<int64_t>(n * 0.1);
  auto cfg = file_cfg("text", dir.file("a.txt"), 0.1);
  auto train = open_source(cfg, Split::Train, T, 256, 0);
  auto val = open_source(cfg, Split::Val, T, 256, 0);
  CHECK(train->num_samples() == (n - n_val - 1) / T);
  CHECK(val->num_samples() == (n_val - 1) / T);
  CHECK(val->max_token() == 0xc3);
  std::vector<int32_t> tok(T), tgt(T);
  for (int64_t i = 0; i < train->num_samples(); ++i) {
    train->sample(i, tok.data(), tgt.data());
    CHECK(byte_detokenize(tok) == text.substr(i * T, T));
    CHECK(byte_detokenize(tgt) == text.substr(i * T + 1, T));
  }
  val->sample(0, tok.data(), tgt.data());
  CHECK(byte_detokenize(tok) == text.substr(n - n_val, T));
  CHECK(train->describe().find("a.txt") != std::string::npos);

  write_bytes(dir.file("v.txt"), text.substr(0, 100));
  cfg.val_path = dir.file("v.txt");
  auto train2 = open_source(cfg, Split::Train, T, 256, 0);
  auto val2 = open_source(cfg, Split::Val, T, 256, 0);
  CHECK(train2->num_samples() == (n - 1) / T);  // all of path trains when val_path is given
  CHECK(val2->num_samples() == (100 - 1) / T);
  val2->sample(1, tok.data(), tgt.data());
  CHECK(byte_detokenize(tok) == text.substr(T, T));
}

TEST_CASE("bin sources: nanoGPT and llm.c files round-trip") {
  TempDir dir;
  std::vector<uint16_t> toks;
  ops::SplitMix g{5, 0};
  for (int i = 0; i < 5000; ++i) toks.push_back(static_cast<uint16_t>(g.below(50257)));
  toks[1234] = 50256;
  write_nanogpt(dir.file("nano.bin"), toks);
  write_llmc(dir.file("llmc.bin"), toks);
  const int64_t T = 64;
  for (const char* name : {"nano.bin", "llmc.bin"}) {
    auto src = open_source(file_cfg("bin", dir.file(name)), Split::Train, T, 50304, 0);
    CHECK(src->num_samples() == (5000 - 1) / T);
    CHECK(src->max_token() == 50256);
    CHECK(src->describe().find(std::string(name) == "llmc.bin" ? "llm.c" : "nanoGPT") != std::string::npos);
    std::vector<int32_t> tok(T), tgt(T);
    for (int64_t i = 0; i < src->num_samples(); i += 7) {
      src->sample(i, tok.data(), tgt.data());
      for (int64_t t = 0; t < T; ++t) {
        REQUIRE(tok[t] == toks[i * T + t]);
        REQUIRE(tgt[t] == toks[i * T + t + 1]);
      }
    }
  }
  // Both formats through the loader give the same batches.
  LoaderConfig lc;
  lc.global_batch = 4;
  lc.micro = 2;
  DataLoader a(open_source(file_cfg("bin", dir.file("nano.bin")), Split::Train, T, 50304, 0), lc, 1);
  DataLoader b(open_source(file_cfg("bin", dir.file("llmc.bin")), Split::Train, T, 50304, 0), lc, 1);
  for (int i = 0; i < 5; ++i) CHECK(same(a.next(), b.next()));
}

TEST_CASE("hdf5 source: prepare_text_to_hdf5 round-trips, and hand-written uint16/int32 files load") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "line " + std::to_string(i) + " \xe2\x9c\x93\n";
  write_bytes(dir.file("t.txt"), text);
  const int64_t n = prepare_text_to_hdf5(dir.file("t.txt"), dir.file("out/t.h5"));
  CHECK(n == static_cast<int64_t>(text.size()));
  for (const auto& e : fs::directory_iterator(dir.path / "out")) CHECK(e.path().filename() == "t.h5");
  {
    std::lock_guard<std::mutex> lock(h5::mutex());
    hid_t f = H5Fopen(dir.file("out/t.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    REQUIRE(f >= 0);
    hid_t d = H5Dopen2(f, "tokens", H5P_DEFAULT);
    hid_t t = H5Dget_type(d);
    CHECK(H5Tget_size(t) == 2);
    CHECK(H5Tget_sign(t) == H5T_SGN_NONE);
    hid_t dcpl = H5Dget_create_plist(d);
    CHECK(H5Pget_layout(dcpl) == H5D_CHUNKED);
    CHECK(H5Pget_nfilters(dcpl) >= 1);
    int64_t v = 0;
    hid_t a = H5Aopen(d, "vocab_size", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_INT64, &v);
    CHECK(v == 256);
    H5Aclose(a);
    a = H5Aopen(d, "max_token", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_INT64, &v);
    CHECK(v == 0xe2);
    H5Aclose(a);
    a = H5Aopen(d, "tokenizer", H5P_DEFAULT);
    hid_t at = H5Aget_type(a);
    std::string s(H5Tget_size(at), '\0');
    H5Aread(a, at, s.data());
    CHECK(s == "byte");
    H5Tclose(at);
    H5Aclose(a);
    CHECK(H5Aexists(d, "source") > 0);
    H5Pclose(dcpl);
    H5Tclose(t);
    H5Dclose(d);
    H5Fclose(f);
  }
  const int64_t T = 100;
  bool streamed = false;
  SUBCASE("split held in memory") { streamed = false; }
  SUBCASE("streamed window by window") { streamed = true; }
  CAPTURE(streamed);
  InMemoryLimit limit(streamed ? 0 : int64_t{512} << 20);
  auto h = open_source(file_cfg("hdf5", dir.file("out/t.h5"), 0.05), Split::Train, T, 256, 0);
  CHECK(h->describe().find(streamed ? "streamed" : "in memory") != std::string::npos);
  auto x = open_source(file_cfg("text", dir.file("t.txt"), 0.05), Split::Train, T, 256, 0);
  auto hv = open_source(file_cfg("hdf5", dir.file("out/t.h5"), 0.05), Split::Val, T, 256, 0);
  auto xv = open_source(file_cfg("text", dir.file("t.txt"), 0.05), Split::Val, T, 256, 0);
  CHECK(h->num_samples() == x->num_samples());
  CHECK(hv->num_samples() == xv->num_samples());
  CHECK(h->max_token() == 0xe2);
  std::vector<int32_t> t1(T), g1(T), t2(T), g2(T);
  for (int64_t i = 0; i < h->num_samples(); i += 3) {
    h->sample(i, t1.data(), g1.data());
    x->sample(i, t2.data(), g2.data());
    REQUIRE(t1 == t2);
    REQUIRE(g1 == g2);
  }
  hv->sample(hv->num_samples() - 1, t1.data(), g1.data());
  xv->sample(xv->num_samples() - 1, t2.data(), g2.data());
  CHECK(t1 == t2);
  // Through the loader with several workers (reads serialize on the HDF5 lock).
  LoaderConfig lc;
  lc.global_batch = 8;
  lc.micro = 4;
  lc.workers = 4;
  DataLoader la(std::move(h), lc, 3), lb(std::move(x), lc, 3);
  for (int i = 0; i < 20; ++i) CHECK(same(la.next(), lb.next()));

  // Hand-written files without attributes (scanned at open), in both token dtypes.
  std::vector<uint16_t> u16;
  std::vector<int32_t> i32;
  for (int i = 0; i < 3000; ++i) {
    u16.push_back(static_cast<uint16_t>((i * 37) % 60000));
    i32.push_back((i * 7919) % 100000);
  }
  write_h5(dir.file("u16.h5"), "ids", H5T_STD_U16LE, H5T_NATIVE_UINT16, u16);
  write_h5(dir.file("i32.h5"), "tokens", H5T_STD_I32BE, H5T_NATIVE_INT32, i32);
  auto cu = file_cfg("hdf5", dir.file("u16.h5"));
  cu.dataset = "ids";
  auto su = open_source(cu, Split::Train, 50, 60000, 0);
  auto si = open_source(file_cfg("hdf5", dir.file("i32.h5")), Split::Train, 50, 100000, 0);
  CHECK(su->max_token() == 59977);
  CHECK(si->max_token() == *std::max_element(i32.begin(), i32.end()));
  std::vector<int32_t> tok(50), tgt(50);
  su->sample(10, tok.data(), tgt.data());
  for (int t = 0; t < 50; ++t) CHECK(tok[t] == u16[500 + t]);
  CHECK(si->num_samples() == 59);
  si->sample(58, tok.data(), tgt.data());
  for (int t = 0; t < 50; ++t) CHECK(tgt[t] == i32[2900 + t + 1]);
}

TEST_CASE("prepare_text_to_hdf5: interruption leaves nothing behind; missing input") {
  TempDir dir;
  write_bytes(dir.file("t.txt"), std::string(3 << 20, 'x'));
  std::atomic<bool> stop{true};
  require_user_error([&] { prepare_text_to_hdf5(dir.file("t.txt"), dir.file("t.h5"), &stop); }, dir.file("t.txt"),
                     "interrupted");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.path().filename() != "t.txt";
  CHECK(files == 0);
  require_user_error([&] { prepare_text_to_hdf5(dir.file("none.txt"), dir.file("t.h5")); }, dir.file("none.txt"),
                     "not found");
  write_bytes(dir.file("empty.txt"), "");
  require_user_error([&] { prepare_text_to_hdf5(dir.file("empty.txt"), dir.file("e.h5")); }, dir.file("empty.txt"),
                     "empty");
  CHECK(!fs::exists(dir.file("e.h5")));
  stop = false;
  CHECK(prepare_text_to_hdf5(dir.file("t.txt"), dir.file("t.h5"), &stop) == (3 << 20));
}

// ---------------------------------------------------------------------------------------
TEST_CASE("every data error is a UserError naming the file") {
  TempDir dir;
  const int64_t T = 32;
  auto open = [&](const DataConfig& c, int64_t vocab = 256, Split s = Split::Train) {
    return open_source(c, s, T, vocab, 0);
  };

  SUBCASE("missing file, each kind, and a missing val_path even for the train split") {
    for (const char* kind : {"text", "hdf5", "bin"}) {
      auto missing = dir.file(std::string("missing.") + kind);
      require_user_error([&] { open(file_cfg(kind, missing)); }, missing, "not found");
    }
    write_bytes(dir.file("ok.txt"), std::string(1000, 'a'));
    auto c = file_cfg("text", dir.file("ok.txt"));
    c.val_path = dir.file("nope.txt");
    require_user_error([&] { open(c); }, dir.file("nope.txt"), "not found");
    // The missing file is reported first, before any other check (seq_len here).
    require_user_error([&] { open_source(file_cfg("bin", dir.file("x.bin")), Split::Train, -1, 0, 0); },
                       dir.file("x.bin"), "not found");
  }
  SUBCASE("not an HDF5 file") {
    write_bytes(dir.file("fake.h5"), "this is text, not HDF5");
    require_user_error([&] { open(file_cfg("hdf5", dir.file("fake.h5"))); }, dir.file("fake.h5"),
                       "not an HDF5 file");
  }
  SUBCASE("wrong dataset name: the message lists what is there") {
    write_h5(dir.file("a.h5"), "ids", H5T_STD_U16LE, H5T_NATIVE_UINT16, std::vector<uint16_t>(100, 1));
    require_user_error([&] { open(file_cfg("hdf5", dir.file("a.h5"))); }, dir.file("a.h5"),
                       "no dataset 'tokens' (expected a 1-D uint16 or int32 token dataset; found: ids)");
  }
  SUBCASE("wrong dtype and rank") {
    write_h5(dir.file("f.h5"), "tokens", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, std::vector<float>(100, 1.f));
    require_user_error([&] { open(file_cfg("hdf5", dir.file("f.h5"))); }, dir.file("f.h5"),
                       "holds float32; expected uint16 or int32");
    write_h5(dir.file("i64.h5"), "tokens", H5T_STD_I64LE, H5T_NATIVE_INT64, std::vector<int64_t>(100, 1));
    require_user_error([&] { open(file_cfg("hdf5", dir.file("i64.h5"))); }, dir.file("i64.h5"), "holds int64");
    write_h5(dir.file("r2.h5"), "tokens", H5T_STD_U16LE, H5T_NATIVE_UINT16, std::vector<uint16_t>(100, 1),
             std::nullopt, {10, 10});
    require_user_error([&] { open(file_cfg("hdf5", dir.file("r2.h5"))); }, dir.file("r2.h5"),
                       "rank 2 (shape 10x10)");
  }
  SUBCASE("token >= vocab_size, each kind") {
    std::vector<int32_t> big(200, 5);
    big[150] = 300;
    write_h5(dir.file("big.h5"), "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, big);
    require_user_error([&] { open(file_cfg("hdf5", dir.file("big.h5"))); }, dir.file("big.h5"),
                       "tokens up to 300 but model.vocab_size is 256");
    CHECK_NOTHROW(open(file_cfg("hdf5", dir.file("big.h5")), 301));
    write_h5(dir.file("attr.h5"), "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, big, 1000);
    require_user_error([&] { open(file_cfg("hdf5", dir.file("attr.h5")), 512); }, dir.file("attr.h5"),
                       "up to 1000 (its max_token attribute)");
    std::vector<int32_t> neg(200, 5);
    neg[100] = -3;
    write_h5(dir.file("neg.h5"), "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, neg);
    require_user_error([&] { open(file_cfg("hdf5", dir.file("neg.h5"))); }, dir.file("neg.h5"), "negative token -3");
    std::vector<uint16_t> u(200, 5);
    u[10] = 50256;
    write_nanogpt(dir.file("n.bin"), u);
    require_user_error([&] { open(file_cfg("bin", dir.file("n.bin")), 50000); }, dir.file("n.bin"),
                       "holds token 50256");
    write_llmc(dir.file("l.bin"), u);
    require_user_error([&] { open(file_cfg("bin", dir.file("l.bin")), 50000); }, dir.file("l.bin"),
                       "set model.vocab_size >= 50257");
    write_bytes(dir.file("u.txt"), std::string(100, 'a') + "\xc3\xa9");
    require_user_error([&] { open(file_cfg("text", dir.file("u.txt")), 128); }, dir.file("u.txt"), "holds byte 195");
  }
  SUBCASE("a max_token attribute that lies is caught when the window is read") {
    std::vector<uint16_t> toks(300000, 7);
    toks[150000] = 200;  // in the middle: not among the blocks verified at open
    write_h5(dir.file("lie.h5"), "tokens", H5T_STD_U16LE, H5T_NATIVE_UINT16, toks, 10);
    // Held in memory, the whole split is verified at open.
    require_user_error([&] { open(file_cfg("hdf5", dir.file("lie.h5"))); }, dir.file("lie.h5"),
                       "token 200 at index 150000");
    InMemoryLimit streamed(0);
    auto src = open(file_cfg("hdf5", dir.file("lie.h5")));
    CHECK(src->max_token() == 10);
    std::vector<int32_t> tok(T), tgt(T);
    src->sample(0, tok.data(), tgt.data());
    require_user_error([&] { src->sample(150000 / T, tok.data(), tgt.data()); }, dir.file("lie.h5"),
                       "exceeds its max_token attribute 10");
    toks[5] = 200;  // at the start: caught at open
    write_h5(dir.file("lie2.h5"), "tokens", H5T_STD_U16LE, H5T_NATIVE_UINT16, toks, 10);
    require_user_error([&] { open(file_cfg("hdf5", dir.file("lie2.h5"))); }, dir.file("lie2.h5"),
                       "token 200 at index 5");
  }
  SUBCASE("llm.c header: truncated, wrong version, odd raw size") {
    std::vector<uint16_t> u(1000, 1);
    write_llmc(dir.file("t.bin"), std::vector<uint16_t>(u.begin(), u.begin() + 900), 1000);
    require_user_error([&] { open(file_cfg("bin", dir.file("t.bin"))); }, dir.file("t.bin"),
                       "truncated: header says 1000 tokens, file holds 900");
    std::string h;
    put_i32(h, 20240520);
    put_i32(h, 1);
    write_bytes(dir.file("h.bin"), h);
    require_user_error([&] { open(file_cfg("bin", dir.file("h.bin"))); }, dir.file("h.bin"), "truncated llm.c header");
    std::string v2;
    put_i32(v2, 20240520);
    put_i32(v2, 2);
    put_i32(v2, 0);
    v2.resize(1024, '\0');
    write_bytes(dir.file("v2.bin"), v2);
    require_user_error([&] { open(file_cfg("bin", dir.file("v2.bin"))); }, dir.file("v2.bin"), "version 2");
    write_bytes(dir.file("odd.bin"), std::string(101, '\1'));
    require_user_error([&] { open(file_cfg("bin", dir.file("odd.bin"))); }, dir.file("odd.bin"), "odd");
  }
  SUBCASE("file shorter than T+1 tokens, each kind, and splits too small") {
    write_bytes(dir.file("s.txt"), std::string(T, 'a'));  // T tokens: one short
    require_user_error([&] { open(file_cfg("text", dir.file("s.txt"))); }, dir.file("s.txt"),
                       "seq_len+1 = 33 tokens");
    write_bytes(dir.file("s1.txt"), std::string(T + 1, 'a'));
    CHECK(open(file_cfg("text", dir.file("s1.txt")))->num_samples() == 1);
    write_nanogpt(dir.file("s.bin"), std::vector<uint16_t>(T, 1));
    require_user_error([&] { open(file_cfg("bin", dir.file("s.bin"))); }, dir.file("s.bin"), "holds 32 tokens");
    write_llmc(dir.file("sl.bin"), std::vector<uint16_t>(10, 1));
    require_user_error([&] { open(file_cfg("bin", dir.file("sl.bin"))); }, dir.file("sl.bin"), "holds 10 tokens");
    write_h5(dir.file("s.h5"), "tokens", H5T_STD_U16LE, H5T_NATIVE_UINT16, std::vector<uint16_t>(T, 1));
    require_user_error([&] { open(file_cfg("hdf5", dir.file("s.h5"))); }, dir.file("s.h5"), "holds 32 tokens");
    write_bytes(dir.file("m.txt"), std::string(400, 'a'));
    require_user_error([&] { open(file_cfg("text", dir.file("m.txt"), 0.05), 256, Split::Val); }, dir.file("m.txt"),
                       "validation split");
    require_user_error([&] { open(file_cfg("text", dir.file("m.txt"), 0.0), 256, Split::Val); }, dir.file("m.txt"),
                       "no validation data");
    require_user_error([&] { open(file_cfg("text", dir.file("m.txt"), 0.95)); }, dir.file("m.txt"), "train split");
    require_user_error([&] { open(file_cfg("text", dir.file("m.txt"), 1.5)); }, dir.file("m.txt"), "val_fraction");
  }
}
