// `runner generate SOURCE --prompt TEXT`: completions of prompts by a trained model
// (runner/generate/), streamed for one prompt, else printed at the end, or as JSON records;
// --stats and --logits-out report beside them. The text is encoded and decoded with the run's
// tokenizer (RUN_DIR/tokenizer/, tok::load_tokenizer; none: the bytes); --tokens takes and
// prints raw ids instead.
//
// One process: any layout's checkpoint (tp, pp included) loads into one rank. Under mpirun:
// the recipe's tensor-parallel layout (dp = ranks / tp replicas, every rank the same tokens,
// rank 0 prints); a pp recipe is refused there (docs/generate.md). The model runs on the
// device the stored recipe names (hardware.device; --set hardware.device=cpu to run a GPU
// run's model on the CPU), chosen once as `runner train` chooses it.
#include <unistd.h>

#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ops/tensor.h"
#include "runner/cli/command.h"
#include "runner/errors.h"
#include "runner/generate/generate.h"
#include "runner/tokenize/tokenizer.h"
#include "runner/trained/trained_model.h"

namespace runner::cli {

namespace {

// One JSON line on stderr: the device, prefill and decode tokens and seconds, KV-cache bytes,
// peak bytes per memory account, beside the plan's inference figures.
void print_stats(const TrainedModel& m, const GenerateRequest& gen, const GenerateStats& gstats) {
  auto& mt = ops::MemoryTracker::instance();
  nlohmann::json peak;
  for (int a = 0; a < ops::kAccounts; ++a)
    peak[ops::account_name(static_cast<ops::Account>(a))] = mt.peak(static_cast<ops::Account>(a));
  nlohmann::json j{{"device", m.backend->name()}, {"batch", gen.prompts.size()}, {"kv_cache", gen.kv_cache},
                   {"prefill_tokens", gstats.prefill_tokens}, {"prefill_s", gstats.prefill_s},
                   {"decode_tokens", gstats.decode_tokens}, {"decode_s", gstats.decode_s},
                   {"kv_cache_bytes", gstats.kv_cache_bytes}, {"peak_bytes", peak}};
  if (m.plan.inference)
    j["plan"] = {{"batch", m.plan.inference->batch}, {"context", m.plan.inference->context},
                 {"kv_dtype", m.plan.inference->kv_dtype}, {"kv_cache_bytes", m.plan.inference->kv_cache},
                 {"weights_bytes", m.plan.inference->weights}, {"max_batch", m.plan.inference->max_batch}};
  std::cerr << j.dump() << std::endl;
}

// A completion's bytes as a terminal should get them. A byte-level model can emit any byte, and
// an undertrained or hot-sampled one does: ESC sequences that change the terminal, BEL, bytes
// that are no UTF-8. On a terminal, control bytes other than newline and tab, and bytes that do
// not form UTF-8, are written as \xNN; a pipe or a file gets the bytes as they are.
class TerminalBytes {
 public:
  explicit TerminalBytes(bool escape) : escape_(escape) {}
  // What to write for the next byte (a UTF-8 sequence is held until it is complete).
  std::string put(unsigned char b) {
    if (!escape_) return std::string(1, static_cast<char>(b));
    std::string out;
    if (need_ > 0) {
      if ((b & 0xC0) == 0x80) {
        pending_ += static_cast<char>(b);
        if (--need_ == 0) out.swap(pending_);
        return out;
      }
      out = flush();  // a broken sequence: its bytes escaped, then this one on its own
    }
    if (b < 0x80) return out + (b == '\n' || b == '\t' || (b >= 0x20 && b != 0x7f) ? std::string(1, static_cast<char>(b)) : hex(b));
    const int n = (b & 0xE0) == 0xC0 ? 1 : (b & 0xF0) == 0xE0 ? 2 : (b & 0xF8) == 0xF0 ? 3 : 0;
    if (n == 0 || b == 0xC0 || b == 0xC1 || b > 0xF4) return out + hex(b);
    pending_ = std::string(1, static_cast<char>(b));
    need_ = n;
    return out;
  }
  // The end of the completion: an unfinished sequence escaped.
  std::string flush() {
    std::string out;
    for (char c : pending_) out += hex(static_cast<unsigned char>(c));
    pending_.clear();
    need_ = 0;
    return out;
  }

 private:
  static std::string hex(unsigned char b) { return fmt::format("\\x{:02x}", b); }
  bool escape_;
  std::string pending_;
  int need_ = 0;
};

// The completions on stdout: JSON records, or the text (a streamed completion is already out;
// `terminal`: escaped as TerminalBytes says).
std::string ids_text(const std::vector<int32_t>& ids) { return fmt::format("{}", fmt::join(ids, " ")); }

void print_completions(const std::vector<Completion>& done, bool json, bool streamed, bool terminal, bool ids) {
  for (size_t i = 0; i < done.size(); ++i) {
    const Completion& c = done[i];
    if (ids && !json) {  // --tokens: the new ids, one line per prompt
      if (!streamed) std::cout << ids_text(c.tokens);
      std::cout << "\n";
    } else if (json) {
      nlohmann::json j{{"index", i}, {"prompt", c.prompt}, {"completion", ids ? ids_text(c.tokens) : c.completion},
                       {"new_tokens", c.tokens.size()}, {"tokens", c.tokens}, {"finish", c.finish}};
      std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
      if (!streamed) {
        TerminalBytes tb(terminal);
        std::cout << c.prompt;
        for (char b : c.completion) std::cout << tb.put(static_cast<unsigned char>(b));
        std::cout << tb.flush();
      }
      if (c.completion.empty() || c.completion.back() != '\n') std::cout << "\n";
    }
  }
}

// A model trained on the built-in addition task answers as it learned: operands zero-padded to
// data.digits, the sum written least significant digit first (runner/data/addition.cpp), so
// "123+456=" completes as "9750". Said on stderr (stdout holds only the completions) so that a
// right answer is not read as a wrong one.
void note_addition_format(const TrainedModel& m) {
  const DataConfig& d = m.plan.recipe.data;
  if (d.kind != DataKind::addition || d.digits < 1 || d.digits > 18) return;
  const auto D = static_cast<size_t>(d.digits);
  const std::string a = std::string("123456789123456789").substr(0, D), b = std::string("456789123456789123").substr(0, D);
  const std::string sum = fmt::format("{:0{}d}", std::stoull(a) + std::stoull(b), D + 1);
  std::cerr << fmt::format("note: this model learned data.kind addition ({} digits): prompts are written as \"{}+{}=\" "
                           "(operands zero-padded to {} digits) and the sum comes least significant digit first, "
                           "padded to {}: \"{}\" means {}\n",
                           D, a, b, D, D + 1, std::string(sum.rbegin(), sum.rend()), std::stoull(sum));
}

class GenerateCommand final : public Command {
 public:
  explicit GenerateCommand(CLI::App& app) {
    sub_ = app.add_subcommand("generate", "complete prompts with a trained model (the run's tokenizer, or bytes)");
    sub_->add_option("source", src_, "run directory (its latest checkpoint) or checkpoint .h5 file")->required();
    prompt_opt_ = sub_->add_option("--prompt", prompt_, "the prompt text");
    auto* gpf = sub_->add_option("--prompts", prompts_file_, "a file of prompts, one per line, completed as one batch");
    prompt_opt_->excludes(gpf);
    sub_->add_option("--max-new-tokens", gen_.max_new_tokens, "tokens to generate per prompt (default 32)");
    sub_->add_option("--temperature", gen_.sampling.temperature, "0 (default): greedy; > 0: sample");
    sub_->add_option("--top-k", gen_.sampling.top_k, "sample among the k most likely tokens (0: all)");
    sub_->add_option("--top-p", gen_.sampling.top_p, "sample within the smallest set of probability >= p (1: all)");
    sub_->add_option("--seed", gen_.sampling.seed, "sampling seed (default 0)");
    sub_->add_option("--stop", gen_.stop, "end a completion once it ends with this text, e.g. --stop $'\\n'");
    sub_->add_option("--set", sets_, "override a field of the stored recipe, e.g. --set inference.batch=8")->take_all();
    sub_->add_flag("--tokens", tokens_, "prompts are token ids separated by spaces, and the new tokens are printed as "
                   "ids (no tokenizer either way)");
    sub_->add_flag("--json", json_, "one JSON record per prompt instead of the text");
    sub_->add_flag("--stats", stats_, "print one JSON line to stderr: prefill and decode tokens and seconds, KV-cache bytes, "
                   "peak bytes per memory account beside the plan's inference figures");
    sub_->add_flag("--no-kv-cache", no_cache_, "no KV cache: every step a full forward pass over the prefix (the reference)");
    sub_->add_option("--logits-out", logits_path_, "write the logits each token was chosen from (fp32, the real vocabulary, "
                     "in the order the tokens are chosen) to this file (rank 0)");
  }

  Start start() const override { return Start::ranks_if_launched; }

  int run(std::optional<Launch>& launch) override {
    read_prompts();
    gen_.kv_cache = !no_cache_;
    TrainedModel m = load_trained_model(src_, sets_, launch ? launch->take_world() : nullptr);
    std::unique_ptr<tok::Tokenizer> tk;  // the run's; none: bytes
    if (tokens_) {
      for (size_t k = 0; k < gen_.prompts.size(); ++k) gen_.prompt_ids.push_back(parse_token_ids(gen_.prompts[k], k + 1));
    } else if (!m.tokenizer_dir.empty()) {
      tk = tok::load_tokenizer(m.tokenizer_dir);
      gen_.tokenizer = tk.get();
    }
    const bool printer = !(launch && launch->rank() != 0);
    std::ofstream logits_out;
    if (printer && !logits_path_.empty()) {
      logits_out.open(logits_path_, std::ios::binary);
      if (!logits_out) throw UserError({logits_path_, 0, 0}, "cannot write the logits file", "pass a writable path");
      gen_.on_logits = [&](size_t, const float* L, int64_t V) {
        logits_out.write(reinterpret_cast<const char*>(L), static_cast<std::streamsize>(V * sizeof(float)));
      };
    }
    const bool stream = printer && !json_ && gen_.prompts.size() == 1;
    const bool terminal = ::isatty(STDOUT_FILENO) == 1;  // escape what would garble it (TerminalBytes)
    TerminalBytes streamed_bytes(terminal);
    TextStream streamed_text(gen_.tokenizer);  // whole characters only, as they become final
    bool started = false;  // the prompt is echoed with the first token: an error prints nothing on stdout
    GenerateStats gstats;
    ops::MemoryTracker::instance().reset_peaks();
    auto done = generate(m, gen_, [&](size_t, int32_t t) {
      if (!stream) return;
      if (tokens_) {
        std::cout << (started ? " " : "") << t << std::flush;
        started = true;
        return;
      }
      if (!started) std::cout << gen_.prompts[0];
      started = true;
      for (char b : streamed_text.push(t)) std::cout << streamed_bytes.put(static_cast<unsigned char>(b));
      std::cout << std::flush;
    }, &gstats);
    if (!printer) return 0;
    if (stats_) print_stats(m, gen_, gstats);
    for (char b : streamed_text.finish()) std::cout << streamed_bytes.put(static_cast<unsigned char>(b));
    std::cout << streamed_bytes.flush();
    print_completions(done, json_, stream, terminal, tokens_);
    std::cout << std::flush;
    note_addition_format(m);
    return 0;
  }

 private:
  void read_prompts() {
    if (!prompts_file_.empty()) {
      std::ifstream pf(prompts_file_);
      if (!pf) throw UserError({prompts_file_, 0, 0}, "cannot read the prompts file", "pass a text file, one prompt per line");
      for (std::string line; std::getline(pf, line);)
        if (!line.empty()) gen_.prompts.push_back(line);
    } else if (!prompt_opt_->empty()) {
      gen_.prompts.push_back(prompt_);
    }
  }

  std::string src_, prompt_, prompts_file_, logits_path_;
  CLI::Option* prompt_opt_ = nullptr;
  GenerateRequest gen_;
  std::vector<std::string> sets_;
  bool json_ = false, stats_ = false, no_cache_ = false, tokens_ = false;
};

}  // namespace

std::unique_ptr<Command> generate_command(CLI::App& app) { return std::make_unique<GenerateCommand>(app); }

}  // namespace runner::cli
