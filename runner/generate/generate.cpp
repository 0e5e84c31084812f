#include "runner/generate/generate.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "ops/backend.h"
#include "ops/executor.h"
#include "ops/rng.h"
#include "runner/data/data.h"
#include "runner/errors.h"
#include "runner/generate/decoder.h"

namespace runner {

int32_t sample_token(const float* L, int64_t V, const SamplingConfig& s, float u) {
  if (s.temperature <= 0.0 || s.top_k == 1) return static_cast<int32_t>(std::max_element(L, L + V) - L);
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  // Most likely first; equal logits by id, so the order (and the draw) is deterministic.
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return L[a] > L[b]; });
  size_t keep = s.top_k > 0 ? std::min<size_t>(static_cast<size_t>(s.top_k), ids.size()) : ids.size();
  std::vector<double> p(keep);
  const double mx = L[ids[0]];
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp((L[ids[i]] - mx) / s.temperature);
  if (s.top_p < 1.0) {
    double c = 0;
    size_t n = 0;
    while (n < keep) {
      c += p[n++] / sum;
      if (c >= s.top_p) break;
    }
    keep = n;
    sum = std::accumulate(p.begin(), p.begin() + static_cast<int64_t>(keep), 0.0);
  }
  double target = static_cast<double>(u) * sum, c = 0;
  for (size_t i = 0; i < keep; ++i) {
    c += p[i];
    if (target < c) return ids[i];
  }
  return ids[keep - 1];
}

namespace {

// Bytes of `s` up to its last complete UTF-8 character (a trailing lead byte without all its
// continuation bytes is cut) and before a trailing U+FFFD (EF BF BD).
size_t final_end(const std::string& s) {
  size_t n = s.size();
  if (n >= 3 && s.compare(n - 3, 3, "\xEF\xBF\xBD") == 0) return n - 3;
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto b = static_cast<unsigned char>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back for its lead
    const size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    return back < need && b >= 0xC0 && b <= 0xF4 ? n - back : n;
  }
  return n;
}

}  // namespace

std::string TextStream::push(int32_t id) {
  ids_.push_back(id);
  if (tk_) text_ = tk_->decode(ids_);
  else text_.push_back(static_cast<char>(id));
  const size_t end = final_end(text_);
  if (end <= out_) return {};
  std::string out = text_.substr(out_, end - out_);
  out_ = end;
  return out;
}

std::string TextStream::finish() {
  std::string out = out_ < text_.size() ? text_.substr(out_) : std::string();
  out_ = text_.size();
  return out;
}

std::vector<int32_t> parse_token_ids(const std::string& text, size_t prompt) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j == i) break;
    const std::string w = text.substr(i, j - i);
    int64_t v = -1;
    if (w.size() <= 10 && w.find_first_not_of("0123456789") == std::string::npos) v = std::stoll(w);
    if (v < 0 || v > INT32_MAX)
      throw UserError({}, fmt::format("prompt {}: \"{}\" is not a token id", prompt, w),
                      "with --tokens a prompt is token ids separated by spaces, e.g. \"15496 11 995\"");
    ids.push_back(static_cast<int32_t>(v));
    i = j;
  }
  return ids;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Every mistake in a request is reported before any graph is built (docs/invariants.md,
// invariant 6).
void check_request(const TrainedModel& m, const GenerateRequest& req) {
  const SamplingConfig& s = req.sampling;
  if (req.prompts.empty() && req.prompt_ids.empty()) throw UserError({}, "no prompt", "pass --prompt TEXT or --prompts FILE");
  if (req.max_new_tokens < 1)
    throw UserError({}, fmt::format("--max-new-tokens {} is not positive", req.max_new_tokens), "ask for at least 1");
  if (s.temperature < 0 || !std::isfinite(s.temperature))
    throw UserError({}, fmt::format("--temperature {} is negative", s.temperature), "use 0 (greedy) or more");
  if (s.top_k < 0) throw UserError({}, fmt::format("--top-k {} is negative", s.top_k), "use 0 (no cut) or more");
  if (!(s.top_p > 0 && s.top_p <= 1)) throw UserError({}, fmt::format("--top-p {} is outside (0, 1]", s.top_p), "use a value in (0, 1]");
  const int64_t B = static_cast<int64_t>(std::max(req.prompts.size(), req.prompt_ids.size()));
  if (m.plan.inference && B > m.plan.inference->max_batch)
    throw UserError({m.checkpoint, 0, 0},
                    fmt::format("{} prompts are more than the plan's largest inference batch, {} (KV cache {} per sequence "
                                "beside {} of weights)", B, m.plan.inference->max_batch,
                                format_bytes(m.plan.inference->kv_per_sequence), format_bytes(m.plan.inference->weights)),
                    "pass fewer prompts per call");
}

// The prompts as tokens (the tokenizer's, the bytes without one, or the raw ids), each checked
// against the vocabulary and the context; `longest` gets the longest prompt plus the new tokens.
std::vector<std::vector<int32_t>> tokenize_prompts(const TrainedModel& m, const GenerateRequest& req, int64_t& longest) {
  const ModelConfig& mc = m.model();
  const bool raw = !req.prompt_ids.empty();
  const size_t B = raw ? req.prompt_ids.size() : req.prompts.size();
  std::vector<std::vector<int32_t>> seq(B);
  longest = 0;
  for (size_t k = 0; k < B; ++k) {
    const size_t n = k + 1;  // prompts are numbered from 1 in messages
    seq[k] = raw ? req.prompt_ids[k] : req.tokenizer ? req.tokenizer->encode(req.prompts[k]) : byte_tokenize(req.prompts[k]);
    if (seq[k].empty()) throw UserError({}, fmt::format("prompt {} is empty", n), "give every prompt at least one token");
    const char* unit = raw || req.tokenizer ? "token" : "byte";
    for (int32_t t : seq[k])
      if (t < 0 || t >= mc.vocab_size)
        throw UserError({}, fmt::format("prompt {} has {} {} outside the model's vocabulary of {}", n, unit, t, mc.vocab_size),
                        fmt::format("use {}s below the vocabulary size", unit));
    const int64_t len = static_cast<int64_t>(seq[k].size()), need = len + req.max_new_tokens;
    if (need > mc.seq_len)
      throw UserError({}, fmt::format("prompt {} ({} tokens) plus --max-new-tokens {} is {} tokens, over the model's "
                                      "context of {}", n, len, req.max_new_tokens, need, mc.seq_len),
                      len >= mc.seq_len
                          ? fmt::format("the prompt alone fills the context: shorten it to at most {} tokens, leaving room "
                                        "for the new ones", mc.seq_len - 1)
                          : fmt::format("shorten the prompt or ask for at most {} new tokens", mc.seq_len - len));
    longest = std::max(longest, need);
  }
  return seq;
}

// The rows being completed: each row's tokens so far, its completion, and whether it is done.
struct Rows {
  const GenerateRequest& req;
  const std::function<void(size_t, int32_t)>& on_token;
  int64_t V;
  std::vector<std::vector<int32_t>> seq;
  std::vector<Completion> out;
  std::vector<bool> done;
  std::vector<TextStream> text;  // each row's completion decoded

  int64_t size() const { return static_cast<int64_t>(seq.size()); }
  // Every unfinished row's next token from its row of the logits `L` (row_of(i): the row of
  // L that row i's next token is chosen from), sampled on the host: those rows, and only
  // they, cross out of the device (logits_rows_to_host). False once every row is done.
  bool choose(int64_t step, const ops::Tensor& L, const std::function<int64_t(int64_t)>& row_of) {
    std::vector<int64_t> rows, at(seq.size(), -1);
    for (int64_t i = 0; i < size(); ++i)
      if (!done[static_cast<size_t>(i)]) {
        at[static_cast<size_t>(i)] = static_cast<int64_t>(rows.size());
        rows.push_back(row_of(i));
      }
    const std::vector<float> host = logits_rows_to_host(L, rows, V);
    bool any = false;
    for (int64_t i = 0; i < size(); ++i) {
      const size_t k = static_cast<size_t>(i);
      if (done[k]) continue;
      const float u = ops::rng_uniform(ops::rng_key(req.sampling.seed, static_cast<uint64_t>(i)), static_cast<uint64_t>(step));
      const float* Lrow = host.data() + at[k] * V;
      if (req.on_logits) req.on_logits(k, Lrow, V);
      const int32_t t = sample_token(Lrow, V, req.sampling, u);
      seq[k].push_back(t);
      Completion& c = out[k];
      c.tokens.push_back(t);
      text[k].push(t);
      c.completion = text[k].text();
      if (on_token) on_token(k, t);
      const std::string& stop = req.stop;
      if (!stop.empty() && c.completion.size() >= stop.size() &&
          c.completion.compare(c.completion.size() - stop.size(), stop.size(), stop) == 0) {
        done[k] = true;
        c.finish = "stop";
      }
      any = any || !done[k];
    }
    return any;
  }
};

// Prefill: every prompt in one (B, longest prompt) graph, padded with '\n' (causal: padding
// after a row's prompt never reaches it, and decode overwrites those cache positions before
// any query reads them). Then one token per row per step.
void decode_cached(TrainedModel& m, Rows& rows, int64_t longest, GenerateStats& st) {
  const int64_t B = rows.size();
  auto& seq = rows.seq;
  CachedDecoder dec(m, B, longest);
  st.kv_cache_bytes = dec.cache().bytes();
  auto t0 = Clock::now();
  int64_t Tp = 0;
  for (auto& q : seq) Tp = std::max<int64_t>(Tp, static_cast<int64_t>(q.size()));
  std::vector<int32_t> tokens(static_cast<size_t>(B * Tp), '\n');
  for (int64_t i = 0; i < B; ++i) std::copy(seq[i].begin(), seq[i].end(), tokens.begin() + i * Tp);
  const ops::Tensor& L0 = dec.prefill(tokens, Tp);
  bool any = rows.choose(0, L0, [&](int64_t i) { return i * Tp + static_cast<int64_t>(seq[static_cast<size_t>(i)].size()) - 1; });
  st.prefill_tokens = B * Tp;
  st.prefill_s = seconds(t0, Clock::now());
  t0 = Clock::now();
  std::vector<int32_t> last(static_cast<size_t>(B)), pos(static_cast<size_t>(B));
  for (int64_t step = 1; any && step < rows.req.max_new_tokens; ++step) {
    for (size_t k = 0; k < seq.size(); ++k) {  // a finished row repeats its last position (rewrites the same K, V)
      last[k] = seq[k].back();
      pos[k] = static_cast<int32_t>(seq[k].size()) - 1;
    }
    any = rows.choose(step, dec.step(last, pos), [](int64_t i) { return i; });
    st.decode_tokens += B;
  }
  st.decode_s = seconds(t0, Clock::now());
}

// The reference path (--no-kv-cache): one graph for the whole request, rows of `longest`
// positions, every step a full forward pass over the prefix.
void decode_full(TrainedModel& m, Rows& rows, int64_t longest, GenerateStats& st) {
  const int64_t B = rows.size(), T = longest;
  auto& seq = rows.seq;
  FullForward full(m, B, T);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  for (int64_t step = 0; step < rows.req.max_new_tokens; ++step) {
    const auto t0 = Clock::now();
    std::fill(tokens.begin(), tokens.end(), '\n');
    for (int64_t i = 0; i < B; ++i) std::copy(seq[i].begin(), seq[i].end(), tokens.begin() + i * T);
    const bool any = rows.choose(step, full.logits(tokens.data()), [&](int64_t i) {
      return i * T + static_cast<int64_t>(seq[static_cast<size_t>(i)].size()) - 1;
    });
    (step == 0 ? st.prefill_s : st.decode_s) += seconds(t0, Clock::now());
    (step == 0 ? st.prefill_tokens : st.decode_tokens) += B * T;
    if (!any) break;
  }
}

}  // namespace

std::vector<Completion> generate(TrainedModel& m, const GenerateRequest& req,
                                 const std::function<void(size_t, int32_t)>& on_token, GenerateStats* stats) {
  check_request(m, req);
  int64_t longest = 0;
  Rows rows{req, on_token, m.model().vocab_size, tokenize_prompts(m, req, longest), {}, {}};
  rows.out.resize(rows.seq.size());
  rows.done.assign(rows.seq.size(), false);
  rows.text.assign(rows.seq.size(), TextStream(req.prompt_ids.empty() ? req.tokenizer : nullptr));
  for (size_t k = 0; k < rows.out.size(); ++k) rows.out[k].prompt = k < req.prompts.size() ? req.prompts[k] : "";
  GenerateStats st;
  if (req.kv_cache) decode_cached(m, rows, longest, st);
  else decode_full(m, rows, longest, st);
  if (stats) *stats = st;
  for (Completion& c : rows.out)
    if (c.finish.empty()) c.finish = "length";
  return rows.out;
}

}  // namespace runner
