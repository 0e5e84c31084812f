// The built-in task: D-digit addition, byte-tokenized, generated on the fly.
//
// One problem is exactly P = 3D+4 tokens:  "aaa+bbb=" (2D+2) then the sum's D+1 digits
// REVERSED, least significant first, zero-padded, then '\n'. E.g. D=3, 457+68: "457+068=5250\n"
// (525 reversed, padded to 4 digits). Reversal is the point: a left-to-right model then
// emits each sum digit after the digits and carry it depends on, instead of having to
// predict the most significant digit (which depends on every carry) first.
//
// A sample packs consecutive problems from its start; the last one usually does not fit
// and is cut off. Loss (a target >= 0) sits only where the NEXT token is an answer token
// of a problem wholly inside the sample: at '=' and at each answer digit. Everything else,
// the operands and the cut-off problem, is context only.
//
// Sample i is a pure function of (seed, split, i): problem k of it is drawn from a
// counter-based generator keyed by (seed, split, i, k). Train draws reject held-out problems
// (addition_held_out), Val draws accept only them, so the two never meet.
#include <unordered_set>

#include "ops/rng.h"
#include "runner/data/data.h"
#include "runner/data/data_internal.h"
#include "runner/errors.h"

namespace runner {
namespace data_detail {

namespace {

constexpr uint64_t kHeldOutSalt = 0x4845'4c44'4f55'5421ull;
constexpr uint64_t kSampleSalt = 0x4144'4453'414d'504cull;
constexpr uint64_t kEvalSalt = 0x4144'4445'5641'4c21ull;
constexpr int64_t kMaxDraws = 1'000'000;  // rejection sampling; the held-out set is ~5% of pairs
constexpr int32_t kMaxAdditionToken = '9';  // '\n' '+' '0'..'9' '=' -> the largest is '9' (57)

uint64_t pow10(int64_t d) {
  uint64_t p = 1;
  for (int64_t i = 0; i < d; ++i) p *= 10;
  return p;
}

void check_digits(int64_t digits) {
  if (digits < 1 || digits > kAdditionMaxDigits)
    throw UserError(SourceLoc{}, "data.digits = " + std::to_string(digits) + " is out of range",
                    "use 1.." + std::to_string(kAdditionMaxDigits) + " (the sum must fit in 64 bits)");
}

// Draws a problem with held_out(a, b) == want_held_out from generator g.
void draw_problem(int64_t digits, bool want_held_out, ops::SplitMix& g, uint64_t& a, uint64_t& b) {
  const uint64_t range = pow10(digits);
  for (int64_t i = 0; i < kMaxDraws; ++i) {
    a = g.below(range);
    b = g.below(range);
    if (addition_held_out(digits, a, b) == want_held_out) return;
  }
  RUNNER_CHECK(false, "addition: no problem found in the requested split for digits=" + std::to_string(digits));
}

// Writes the P = 3D+4 tokens of a + b at out.
void write_problem(int64_t digits, uint64_t a, uint64_t b, int32_t* out) {
  int64_t k = 0;
  auto put_fixed = [&](uint64_t v) {  // most significant first, zero-padded to D digits
    for (int64_t i = digits - 1; i >= 0; --i) {
      out[k + i] = '0' + static_cast<int32_t>(v % 10);
      v /= 10;
    }
    k += digits;
  };
  put_fixed(a);
  out[k++] = '+';
  put_fixed(b);
  out[k++] = '=';
  uint64_t s = a + b;
  for (int64_t i = 0; i <= digits; ++i) {  // least significant first, D+1 digits
    out[k++] = '0' + static_cast<int32_t>(s % 10);
    s /= 10;
  }
  out[k++] = '\n';
}

class AdditionSource final : public DataSource {
 public:
  AdditionSource(int64_t digits, Split split, int64_t T, uint64_t seed)
      : D_(digits), P_(3 * digits + 4), split_(split), T_(T), seed_(seed) {}

  std::string describe() const override {
    return "addition: " + std::to_string(D_) + "-digit problems of " + std::to_string(P_) + " tokens, " +
           std::to_string(T_ / P_) + " per sample of T=" + std::to_string(T_) + ", loss on " +
           std::to_string(D_ + 2) + " answer tokens each; " +
           (split_ == Split::Train ? "train problems (1/20 of pairs held out)" : "held-out problems only");
  }
  // Effectively unbounded: a generated task never repeats an epoch in practice.
  int64_t num_samples() const override { return int64_t{1} << 40; }
  int64_t max_token() const override { return kMaxAdditionToken; }
  int64_t seq_len() const override { return T_; }

  void sample(int64_t index, int32_t* tokens, int32_t* targets) const override {
    const int64_t whole = T_ / P_;                       // problems wholly inside the sample
    const int64_t drawn = whole + (T_ % P_ ? 1 : 0);     // plus the cut-off one
    const uint64_t key = ops::rng_key(seed_, kSampleSalt, static_cast<uint64_t>(split_), static_cast<uint64_t>(index));
    thread_local std::vector<int32_t> buf;
    buf.resize(static_cast<size_t>(drawn * P_));
    for (int64_t k = 0; k < drawn; ++k) {
      ops::SplitMix g{ops::mix64(key ^ static_cast<uint64_t>(k)), 0};
      uint64_t a = 0, b = 0;
      draw_problem(D_, split_ == Split::Val, g, a, b);
      write_problem(D_, a, b, buf.data() + k * P_);
    }
    for (int64_t t = 0; t < T_; ++t) {
      tokens[t] = buf[static_cast<size_t>(t)];
      targets[t] = -1;
    }
    // Inside problem k: '=' sits at offset 2D+1, the answer at 2D+2 .. P-1.
    for (int64_t k = 0; k < whole; ++k)
      for (int64_t o = 2 * D_ + 1; o < P_ - 1; ++o) targets[k * P_ + o] = buf[static_cast<size_t>(k * P_ + o + 1)];
  }

 private:
  int64_t D_, P_;
  Split split_;
  int64_t T_;
  uint64_t seed_;
};

}  // namespace

bool addition_held_out(int64_t digits, uint64_t a, uint64_t b) {
  return ops::rng_key(kHeldOutSalt, static_cast<uint64_t>(digits), a, b) % kAdditionHeldOutModulus == 0;
}

std::unique_ptr<DataSource> open_addition(const DataConfig& cfg, Split split, int64_t T, int64_t vocab_size,
                                          uint64_t seed) {
  check_digits(cfg.digits);
  const int64_t P = 3 * cfg.digits + 4;
  if (T < P)
    throw UserError(SourceLoc{}, "model.seq_len = " + std::to_string(T) + " is shorter than one " +
                                     std::to_string(cfg.digits) + "-digit addition problem (3*digits+4 = " +
                                     std::to_string(P) + " tokens)",
                    "use model.seq_len >= " + std::to_string(P) + " (several problems per sample train better)");
  if (vocab_size <= kMaxAdditionToken)
    throw UserError(SourceLoc{}, "model.vocab_size = " + std::to_string(vocab_size) +
                                     " is too small for the addition task: its byte tokens go up to " +
                                     std::to_string(kMaxAdditionToken) + " ('9')",
                    "set model.vocab_size >= " + std::to_string(kMaxAdditionToken + 1) +
                        " (256 covers the whole byte tokenizer)");
  return std::make_unique<AdditionSource>(cfg.digits, split, T, seed);
}

}  // namespace data_detail

std::vector<AdditionProblem> addition_eval_problems(int64_t digits, int64_t count, uint64_t seed) {
  using namespace data_detail;
  check_digits(digits);
  std::vector<AdditionProblem> out;
  if (count <= 0) return out;
  out.reserve(static_cast<size_t>(count));
  ops::SplitMix g{ops::rng_key(seed, kEvalSalt, static_cast<uint64_t>(digits)), 0};
  // Distinct problems while the held-out set allows (with 1 or 2 digits it may hold fewer
  // than `count`): after too many duplicates in a row, repeats are accepted.
  std::unordered_set<uint64_t> seen;
  const uint64_t range = pow10(digits);
  int64_t duplicates_in_a_row = 0;
  bool allow_repeats = false;
  std::vector<int32_t> text(static_cast<size_t>(3 * digits + 4));
  while (static_cast<int64_t>(out.size()) < count) {
    uint64_t a = 0, b = 0;
    draw_problem(digits, true, g, a, b);
    // a*range+b may wrap for 18 digits; as a set key that only risks a rare false duplicate.
    if (!seen.insert(a * range + b).second && !allow_repeats) {
      allow_repeats = ++duplicates_in_a_row >= 1000;
      continue;
    }
    duplicates_in_a_row = 0;
    write_problem(digits, a, b, text.data());
    AdditionProblem p;
    p.prompt.assign(text.begin(), text.begin() + 2 * digits + 2);
    p.answer.assign(text.begin() + 2 * digits + 2, text.end());
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace runner
