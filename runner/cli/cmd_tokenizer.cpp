// `runner data tokenizer train|encode|info`: train a SentencePiece tokenizer on a corpus,
// encode a file with any tokenizer (ids on stdout, speed on stderr), describe a tokenizer.
// It hangs below the `data` command (data.cpp), which main builds first.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runner/atomic_output.h"
#include "runner/cli/command.h"
#include "runner/errors.h"
#include "runner/signals.h"
#include "runner/tokenize/sentencepiece.h"
#include "runner/tokenize/tokenizer.h"

namespace runner::cli {

namespace {

namespace fs = std::filesystem;

// A directory's regular files, in name order (so a run over the same tree is repeatable).
std::vector<std::string> expand_inputs(const std::vector<std::string>& in) {
  std::vector<std::string> out;
  for (const std::string& p : in) {
    std::error_code ec;
    if (!fs::is_directory(p, ec)) {
      out.push_back(p);
      continue;
    }
    std::vector<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(p, ec))
      if (e.is_regular_file()) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty()) throw UserError({p, 0, 0}, "the directory holds no files", "name text files or directories of text files");
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError({path, 0, 0}, "cannot read the file", "check that it exists and is readable");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class TokenizerCommand final : public Command {
 public:
  explicit TokenizerCommand(CLI::App& app) {
    CLI::App* data = app.get_subcommand("data");
    CLI::App* tok = data->add_subcommand("tokenizer", "train, try and describe tokenizers");
    tok->require_subcommand(1);
    train_ = tok->add_subcommand("train", "train a SentencePiece tokenizer (BPE or Unigram) on text files");
    train_->add_option("corpus", train_opt_.inputs, "text files or directories")->required();
    train_->add_option("--vocab", train_opt_.vocab_size, "vocabulary size")->required();
    train_->add_option("--out", train_opt_.out_dir, "directory for tokenizer.model and tokenizer_config.json")->required();
    train_->add_flag("--force", force_, "replace a non-empty --out (only once the new tokenizer is complete)");
    train_->add_option("--model", train_opt_.model_type, "bpe or unigram")->default_val("bpe");
    train_->add_option("--field", train_opt_.field, "JSONL field holding the text (.jsonl/.ndjson inputs)")->default_val("text");
    train_->add_option("--threads", train_opt_.threads, "trainer threads (0: every core)")->default_val(0);
    train_->add_option("--character-coverage", train_opt_.character_coverage,
                       "share of the corpus's characters that get their own piece (the rarest are spelt in bytes)")
        ->default_val(0.9995);
    encode_ = tok->add_subcommand("encode", "encode a text file: ids on stdout, speed on stderr");
    encode_->add_option("file", file_, "text file")->required();
    encode_->add_option("--tokenizer", tokenizer_, "tokenizer directory or file, or byte")->required();
    encode_->add_flag("--quiet", quiet_, "print only the speed (for benchmarks)");
    encode_->add_flag("--documents", documents_, "the file is a JSON array of strings: encode each (one line of ids each)");
    info_ = tok->add_subcommand("info", "describe a tokenizer: kind, vocabulary, hash, special ids");
    info_->add_option("tokenizer", tokenizer_, "tokenizer directory or file, or byte")->required();
    sub_ = tok;
  }

  int run(std::optional<Launch>&) override {
    if (train_->parsed()) return train();
    const auto tok = tok::load_tokenizer(tokenizer_);
    if (info_->parsed()) return print_info(*tok);
    std::vector<std::string> docs;
    if (documents_) {
      const auto j = nlohmann::json::parse(read_text(file_), nullptr, false);
      if (!j.is_array()) throw UserError({file_, 0, 0}, "not a JSON array of strings", "drop --documents to encode the file as one text");
      for (const auto& d : j) docs.push_back(d.is_string() ? d.get<std::string>() : std::string());
    } else {
      docs.push_back(read_text(file_));
    }
    size_t bytes = 0, tokens = 0;
    std::string out;
    const auto t0 = std::chrono::steady_clock::now();
    for (const std::string& d : docs) {
      const std::vector<int32_t> ids = tok->encode(d);
      bytes += d.size();
      tokens += ids.size();
      if (quiet_) continue;
      for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
      out += "\n";
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << out << std::flush;
    std::fprintf(stderr, "encoded %.2f MB into %zu tokens in %.3f s: %.2f MB/s on one thread\n", bytes / 1e6, tokens, s,
                 bytes / 1e6 / std::max(s, 1e-9));
    return 0;
  }

 private:
  static int print_info(const tok::Tokenizer& t) {
    const tok::TokenizerInfo i = t.info();
    auto special = [&](std::optional<int32_t> id) {
      if (!id) return std::string("none");
      const int32_t one[1] = {*id};
      const std::string text = t.decode(one);  // SentencePiece decodes its control tokens to nothing
      return std::to_string(*id) + (text.empty() ? "" : " (" + text + ")");
    };
    std::cout << "kind " << i.kind << "\nname " << i.name << "\nvocab_size " << i.vocab_size << "\nhash " << i.hash
              << "\neos " << special(t.eos_id()) << "\nbos " << special(t.bos_id()) << "\n";
    return 0;
  }

  // Trains into a directory staged beside --out and swaps it in (runner/atomic_output.h). The
  // trainer is a library call that cannot be interrupted, so it runs in a child process: a
  // stop signal ends the child, the staged directory is removed, --out is left as it was, and
  // the command exits 3 at once instead of after the training.
  int train() {
    install_signal_handlers(StopWork::output);
    train_opt_.inputs = expand_inputs(train_opt_.inputs);
    StagedDir staged(train_opt_.out_dir, force_, "tokenizer training", "--force", train_opt_.inputs);
    tok::TrainOptions opt = train_opt_;
    opt.final_dir = staged.target();
    opt.out_dir = staged.path();
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t child = ::fork();
    if (child < 0) throw UserError({}, std::string("cannot start the trainer: ") + std::strerror(errno), "retry");
    if (child == 0) {
      int rc = 0;
      try {
        tok::train_sentencepiece(opt);
      } catch (const UserError& e) {
        std::fprintf(stderr, "%s\n", e.what());
        rc = kExitUserError;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        rc = kExitUserError;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(rc);
    }
    int status = 0;
    for (;;) {
      const pid_t w = ::waitpid(child, &status, WNOHANG);
      if (w == child) break;
      if (w < 0 && errno != EINTR) throw UserError({}, std::string("lost the trainer: ") + std::strerror(errno), "retry");
      if (stop_requested()) {
        ::kill(child, SIGKILL);
        while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
        throw_if_stopped(staged.target());
      }
      ::usleep(20000);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      throw_if_stopped(staged.target());
      staged.commit();
      return 0;
    }
    if (WIFSIGNALED(status))
      throw UserError({staged.target()}, std::string("the tokenizer trainer died on signal ") + strsignal(WTERMSIG(status)),
                      "nothing was written; retry, with fewer --threads if it ran out of memory");
    return WEXITSTATUS(status);  // its error is printed; the staged directory goes with `staged`
  }

  bool force_ = false;
  CLI::App *train_ = nullptr, *encode_ = nullptr, *info_ = nullptr;
  tok::TrainOptions train_opt_;
  std::string file_, tokenizer_;
  bool quiet_ = false, documents_ = false;
};

}  // namespace

std::unique_ptr<Command> tokenizer_command(CLI::App& app) { return std::make_unique<TokenizerCommand>(app); }

}  // namespace runner::cli
