// `runner data prepare INPUT... OUT [--tokenizer T] ...`: text files, directories and JSONL
// tokenized in parallel into a dataset directory (runner/data/prepare.cpp). The single-file
// form of before, `data prepare TEXT OUT.h5` without --tokenizer, still writes one byte-level
// HDF5 file. A signal stops either cleanly (no half-written output).
#include <iostream>

#include "runner/atomic_output.h"
#include "runner/cli/command.h"
#include "runner/data/data.h"
#include "runner/signals.h"

namespace runner::cli {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

class DataCommand final : public Command {
 public:
  explicit DataCommand(CLI::App& app) {
    CLI::App* data = app.add_subcommand("data", "data utilities");
    data->require_subcommand(1);
    sub_ = data->add_subcommand("prepare",
                                "tokenize text files, directories and JSONL into a dataset directory (token shards, "
                                "train/val split, tokenizer, dataset.json)");
    sub_->add_option("paths", paths_, "INPUT... OUT: text files, directories (walked), .jsonl files; then the output directory")
        ->required()
        ->expected(2, -1);
    tokenizer_opt_ = sub_->add_option("--tokenizer", opt_.tokenizer,
                                      "tokenizer: byte, or a directory/file runner reads (tokenizer.json, vocab.json + "
                                      "merges.txt, tokenizer.model); default byte");
    val_opt_ = sub_->add_option("--val-fraction", opt_.val_fraction, "share of documents held out for validation (default 0.05)");
    format_opt_ = sub_->add_option("--format", opt_.format, "shard format: h5 (default) or bin (llm.c uint16)");
    field_opt_ = sub_->add_option("--field", opt_.field, "JSONL field holding the text (default text)");
    shard_opt_ = sub_->add_option("--shard-tokens", opt_.shard_tokens, "tokens per shard file (default 134217728)");
    threads_opt_ = sub_->add_option("--threads", opt_.threads, "tokenizing threads (default: every core)");
    force_opt_ = sub_->add_flag("--force", opt_.force, "replace OUT when it is not empty");
    special_opt_ = sub_->add_flag("--special-as-text", opt_.special_as_text,
                                  "encode a special token's text in the corpus (a literal <|endoftext|>) as ordinary text, as "
                                  "tiktoken does (default: the special id, as Hugging Face does)");
    sub_->add_flag("--binary-ok", opt_.binary_ok, "tokenize the bytes of a file that is not text (refused otherwise)");
  }

  int run(std::optional<Launch>&) override {
    install_signal_handlers(StopWork::data_prepare);
    const std::string out = paths_.back();
    if (legacy()) {  // `data prepare TEXT OUT.h5`: one byte-level HDF5 file (the original form, kept for old scripts)
      // It replaces OUT.h5 whole, as it always has; one writer at a time, and a killed one's
      // temporary removed here.
      OutputLock lock(out, "data prepare");
      sweep_stale_temporaries(out);
      int64_t n = prepare_text_to_hdf5(paths_[0], out, &stop_flag(), opt_.binary_ok);
      std::cout << "wrote " << n << " tokens to " << out << "\n";
      return 0;
    }
    opt_.inputs.assign(paths_.begin(), paths_.end() - 1);
    opt_.out = out;
    opt_.stop = &stop_flag();
    const PrepareResult r = prepare_dataset(opt_);
    std::cout << "wrote " << out << ": " << r.documents << " train documents (" << r.tokens << " tokens), "
              << r.val_documents << " val documents (" << r.val_tokens << " tokens); manifest " << out << "/"
              << kDatasetManifest << "\n";
    return 0;
  }

 private:
  // The single-file form: one input, an .h5 output and none of the dataset options.
  bool legacy() const {
    const std::string& out = paths_.back();
    const bool h5_name = ends_with(out, ".h5") || ends_with(out, ".hdf5");
    for (const CLI::Option* o : {tokenizer_opt_, val_opt_, format_opt_, field_opt_, shard_opt_, threads_opt_, force_opt_, special_opt_})
      if (o->count() > 0) return false;
    return paths_.size() == 2 && h5_name;
  }

  std::vector<std::string> paths_;
  PrepareOptions opt_;
  CLI::Option *tokenizer_opt_ = nullptr, *val_opt_ = nullptr, *format_opt_ = nullptr, *field_opt_ = nullptr,
              *shard_opt_ = nullptr, *threads_opt_ = nullptr, *force_opt_ = nullptr, *special_opt_ = nullptr;
};

}  // namespace

std::unique_ptr<Command> data_command(CLI::App& app) { return std::make_unique<DataCommand>(app); }

}  // namespace runner::cli
