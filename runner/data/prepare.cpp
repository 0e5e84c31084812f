// `runner data prepare INPUT... OUT --tokenizer T`: text files, directories and JSONL turned
// into a directory of token shards with a train/validation split (see data.h).
//
// Design: one reading thread's worth of work (a lock around the reader) hands numbered chunks
// of about 1 MiB of documents to a pool of tokenizing threads; the main thread writes the
// results strictly in chunk order. Chunks are cut by the input alone (never by timing or the
// thread count), so the output is byte-identical on 1 or 64 threads. A document's split is
// decided by the writer from its index among the documents kept (evenly spaced: document i is
// held out when floor((i+1)f) > floor(i f)), so bad JSONL lines shift nothing but themselves.
// Everything is written in a temporary directory beside OUT and renamed into place at the end:
// an error or a Ctrl-C leaves OUT as it was.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "runner/atomic_output.h"
#include "runner/data/data.h"
#include "runner/data/data_internal.h"
#include "runner/errors.h"
#include "runner/signals.h"

namespace runner {

namespace {

namespace fs = std::filesystem;
using data_detail::not_text;
using data_detail::ShardWriter;

constexpr size_t kChunkBytes = 1 << 20;  // text per chunk handed to a thread
constexpr size_t kMaxNotes = 20;         // skipped files / bad lines printed one by one
// A JSONL record longer than this is skipped as a bad line (named, and never held whole in
// memory): one record is one document, tokenized by one thread, and a tokenizer's time and
// memory on one piece of text grow with its length. A text file's lines have no bound: the
// reader cuts a long one at character boundaries into pieces of kChunkBytes.
constexpr size_t kMaxJsonlLine = 8u << 20;

struct InputFile {
  std::string path;
  bool jsonl = false;
  int64_t bytes = 0;
  size_t arg = 0;  // which INPUT argument it came from
};

struct InputArg {
  std::string path;
  int64_t files = 0, bytes = 0, documents = 0, bad_lines = 0;
  std::vector<std::string> skipped;  // "name (why)"
};

bool is_jsonl(const fs::path& p) { return p.extension() == ".jsonl" || p.extension() == ".ndjson"; }

// Why a file found in a directory is left out (empty: it is read).
std::string skip_reason(const fs::path& p, int64_t size) {
  if (size == 0) return "empty";
  std::ifstream in(p, std::ios::binary);
  std::vector<unsigned char> head(static_cast<size_t>(std::min<int64_t>(size, 1 << 16)));
  in.read(reinterpret_cast<char*>(head.data()), static_cast<std::streamsize>(head.size()));
  if (!in) return "unreadable";
  if (auto bin = not_text(head.data(), static_cast<int64_t>(head.size()))) return "not text";
  return "";
}

void add_directory(const fs::path& dir, size_t arg, InputArg& a, std::vector<InputFile>& out) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {  // .git, .DS_Store: never a corpus
      if (it->is_directory(ec)) it.disable_recursion_pending();
      a.skipped.push_back(fs::relative(it->path(), dir).string() + " (hidden)");
      continue;
    }
    if (it->is_regular_file(ec)) files.push_back(it->path());
  }
  if (ec) throw UserError(SourceLoc{dir.string()}, "cannot walk the directory: " + ec.message(), "check its permissions");
  std::sort(files.begin(), files.end());
  for (const fs::path& p : files) {
    const int64_t size = static_cast<int64_t>(fs::file_size(p, ec));
    const std::string why = ec ? "unreadable" : is_jsonl(p) ? (size == 0 ? "empty" : "") : skip_reason(p, size);
    if (!why.empty()) {
      a.skipped.push_back(fs::relative(p, dir).string() + " (" + why + ")");
      continue;
    }
    out.push_back({p.string(), is_jsonl(p), size, arg});
  }
}

// The INPUT arguments as the files to read, in order: each argument in the order given, a
// directory's files sorted by path. Every missing or unreadable input is an error here.
std::vector<InputFile> expand_inputs(const PrepareOptions& opt, std::vector<InputArg>& args) {
  std::vector<InputFile> out;
  for (size_t i = 0; i < opt.inputs.size(); ++i) {
    const fs::path p(opt.inputs[i]);
    InputArg& a = args.emplace_back();
    std::error_code ec;
    a.path = fs::absolute(p, ec).lexically_normal().string();
    if (!fs::exists(p, ec))
      throw UserError(SourceLoc{p.string()}, "input not found", "give text files, directories or .jsonl files");
    if (fs::is_directory(p, ec)) {
      add_directory(p, i, a, out);
      continue;
    }
    const int64_t size = static_cast<int64_t>(fs::file_size(p, ec));
    if (ec || !fs::is_regular_file(p, ec))
      throw UserError(SourceLoc{p.string()}, "not a regular file", "give text files, directories or .jsonl files");
    const std::string why = is_jsonl(p) ? "" : skip_reason(p, size);
    if (why == "not text" && !opt.binary_ok) {
      std::vector<unsigned char> head(static_cast<size_t>(std::min<int64_t>(size, data_detail::kNotTextSample)));
      std::ifstream(p, std::ios::binary).read(reinterpret_cast<char*>(head.data()), static_cast<std::streamsize>(head.size()));
      throw UserError(SourceLoc{p.string()}, not_text(head.data(), static_cast<int64_t>(head.size()))->what,
                      "give the text itself, or pass --binary-ok to tokenize its bytes anyway");
    }
    if (size == 0) {
      a.skipped.push_back(p.filename().string() + " (empty)");
      continue;
    }
    out.push_back({p.string(), is_jsonl(p), size, i});
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Reading: documents in chunks.

struct Piece {
  std::string text;       // a text file's piece, or one JSONL line
  size_t file = 0;        // index into the input files
  int64_t line = 0;       // JSONL: 1-based line number (0: text)
  bool ends_doc = true;   // a document's end-of-document id follows this piece
  bool continues = false; // a later piece of a text file (cut after a newline)
  int64_t too_long = 0;   // JSONL: the length of a line over kMaxJsonlLine (its text dropped)
};

struct Chunk {
  int64_t seq = 0;
  std::vector<Piece> pieces;
};

// Where a text file may be cut without changing how it tokenizes, in practice: before a line
// that starts with a non-space character (a pre-tokenizer never joins across that). Failing
// that (one giant line), at a UTF-8 character boundary.
size_t cut_point(const std::string& s) {
  for (size_t i = s.size() - 1; i > s.size() / 2; --i)
    if (s[i - 1] == '\n' && !std::isspace(static_cast<unsigned char>(s[i]))) return i;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;  // before a character's first byte
  return i > 0 ? i : s.size();
}

class Reader {
 public:
  explicit Reader(const std::vector<InputFile>& files) : files_(files) {}

  // The next chunk; false at the end of the inputs (and on every call after).
  bool next(Chunk& c) {
    size_t bytes = 0;
    while (bytes < kChunkBytes && file_ < files_.size()) {
      if (!in_.is_open()) open();
      Piece p;
      p.file = file_;
      if (files_[file_].jsonl ? read_line(p) : read_piece(p)) {
        bytes += p.text.size() + 1;
        c.pieces.push_back(std::move(p));
      } else {
        in_.close();
        ++file_;
      }
    }
    return !c.pieces.empty();
  }
  int64_t bytes_read() const { return bytes_read_; }

 private:
  void open() {
    in_.open(files_[file_].path, std::ios::binary);
    if (!in_) throw UserError(SourceLoc{files_[file_].path}, "cannot open for reading", "check the file's permissions");
    line_ = 0;
    carry_.clear();
    at_eof_ = false;
    started_ = false;
  }
  bool read_line(Piece& p) {
    p.text.clear();
    int64_t len = 0;
    bool any = false, newline = false;
    std::streambuf* sb = in_.rdbuf();  // byte by byte through the buffer: no line is held past the bound
    for (int c; (c = sb->sbumpc()) != std::char_traits<char>::eof();) {
      any = true;
      if (c == '\n') {
        newline = true;
        break;
      }
      if (++len <= static_cast<int64_t>(kMaxJsonlLine)) p.text.push_back(static_cast<char>(c));
    }
    if (!any) return false;
    bytes_read_ += len + (newline ? 1 : 0);
    p.line = ++line_;
    if (len > static_cast<int64_t>(kMaxJsonlLine)) {
      p.text.clear();
      p.too_long = len;
      return true;
    }
    if (!p.text.empty() && p.text.back() == '\r') p.text.pop_back();
    return true;
  }
  // Up to kChunkBytes of a text file; the last piece ends the document.
  bool read_piece(Piece& p) {
    if (at_eof_ && carry_.empty()) return false;
    std::string buf = std::move(carry_);
    carry_.clear();
    if (!at_eof_) {
      const size_t have = buf.size();
      buf.resize(have + kChunkBytes);
      in_.read(buf.data() + have, static_cast<std::streamsize>(kChunkBytes));
      buf.resize(have + static_cast<size_t>(in_.gcount()));
      bytes_read_ += in_.gcount();
      if (in_.bad()) throw UserError(SourceLoc{files_[file_].path}, "read error", "check the file and the disk");
      at_eof_ = in_.eof() || in_.gcount() == 0;
    }
    if (!at_eof_ && buf.size() > 1) {
      const size_t cut = cut_point(buf);
      carry_ = buf.substr(cut);
      buf.resize(cut);
    }
    p.text = std::move(buf);
    p.ends_doc = at_eof_ && carry_.empty();
    p.continues = started_;
    started_ = true;
    return !p.text.empty() || p.ends_doc;
  }

  const std::vector<InputFile>& files_;
  size_t file_ = 0;
  std::ifstream in_;
  int64_t line_ = 0, bytes_read_ = 0;
  std::string carry_;
  bool at_eof_ = false, started_ = false;
};

// ---------------------------------------------------------------------------------------
// Tokenizing a chunk (on any thread).

struct PieceResult {
  std::vector<int32_t> ids;  // end-of-document id included
  bool ends_doc = true;
  std::string bad;           // JSONL: why the line was skipped
  size_t file = 0;
};

struct ChunkResult {
  std::vector<PieceResult> pieces;
  int64_t bytes = 0;
  int64_t special_text = 0;  // occurrences of a special token's text
};

ChunkResult tokenize_chunk(const Chunk& c, const tok::Tokenizer& t, int32_t eos, const std::string& field,
                           const std::vector<InputFile>& files, bool special_as_text) {
  ChunkResult out;
  for (const Piece& p : c.pieces) {
    PieceResult& r = out.pieces.emplace_back();
    r.file = p.file;
    r.ends_doc = p.ends_doc;
    out.bytes += static_cast<int64_t>(p.too_long ? p.too_long : p.text.size()) + (p.line ? 1 : 0);
    std::string_view text = p.text;
    std::string value;
    if (p.line) {
      const std::string where = files[p.file].path + ":" + std::to_string(p.line) + ": ";
      if (p.too_long) {
        r.bad = where + "a line of " + std::to_string(p.too_long) + " bytes, longer than the bound of " +
                std::to_string(kMaxJsonlLine) + " bytes for one record (split the record into several)";
        continue;
      }
      if (p.text.find_first_not_of(" \t") == std::string::npos) {
        r.bad = where + "blank line";
        continue;
      }
      nlohmann::json j = nlohmann::json::parse(p.text, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        r.bad = where + (j.is_discarded() ? "not valid JSON" : "not a JSON object");
        continue;
      }
      auto it = j.find(field);
      if (it == j.end() || !it->is_string()) {
        r.bad = where + (it == j.end() ? "no field '" + field + "'" : "field '" + field + "' is not a string") +
                " (--field names the text field)";
        continue;
      }
      value = it->get<std::string>();
      text = value;
    }
    tok::EncodeOptions eo;
    eo.continues = p.continues;
    eo.special_as_text = special_as_text;
    out.special_text += t.encode_part(text, eo, r.ids);
    if (p.ends_doc) r.ids.push_back(eos);
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Writing: one split's shards.

struct SplitWriter {
  std::string name;  // train | val
  std::string dir, ext;
  bool wide = false;
  int64_t shard_tokens = 0, vocab = 0;
  std::string tokenizer;
  std::vector<DatasetShard> shards;
  std::unique_ptr<ShardWriter> cur;
  int64_t in_cur = 0, max_cur = 0, tokens = 0, documents = 0, max_token = 0;

  void append(const std::vector<int32_t>& ids) {
    for (int32_t id : ids)
      RUNNER_CHECK(id >= 0 && id < vocab, "the tokenizer produced id " + std::to_string(id) + " outside its vocabulary of " +
                                              std::to_string(vocab));
    for (size_t at = 0; at < ids.size();) {
      if (!cur) open();
      const size_t n = std::min(ids.size() - at, static_cast<size_t>(shard_tokens - in_cur));
      cur->append(ids.data() + at, static_cast<int64_t>(n));
      for (size_t i = at; i < at + n; ++i) max_cur = std::max<int64_t>(max_cur, ids[i]);
      at += n;
      in_cur += static_cast<int64_t>(n);
      tokens += static_cast<int64_t>(n);
      if (in_cur == shard_tokens) close();
    }
  }
  void open() {
    char file[64];
    std::snprintf(file, sizeof file, "%s-%05zu.%s", name.c_str(), shards.size(), ext.c_str());
    const std::string path = (fs::path(dir) / file).string();
    cur = ext == "bin" ? data_detail::bin_shard_writer(path) : data_detail::h5_shard_writer(path, wide, vocab, tokenizer);
    shards.push_back({file, 0});
    in_cur = max_cur = 0;
  }
  void close() {
    if (!cur) return;
    cur->finish(max_cur);
    cur.reset();
    shards.back().tokens = in_cur;
    max_token = std::max(max_token, max_cur);
  }
};

// ---------------------------------------------------------------------------------------
// Progress on stderr: rewritten in place on a terminal, a line every few seconds otherwise.

std::string count_text(double v) {
  char b[32];
  if (v >= 1e9) std::snprintf(b, sizeof b, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(b, sizeof b, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(b, sizeof b, "%.1fk", v / 1e3);
  else std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

class Progress {
 public:
  Progress(std::FILE* f, int64_t total_bytes, double every_s)
      : f_(f), tty_(f && ::isatty(::fileno(f))), total_(total_bytes), every_(tty_ ? 0.2 : every_s), t0_(now()), last_(t0_) {}
  void update(int64_t bytes, int64_t tokens, bool final) {
    if (!f_) return;
    const double t = now();
    if (!final && t - last_ < every_) return;
    last_ = t;
    const double el = std::max(t - t0_, 1e-9), mbs = static_cast<double>(bytes) / 1e6 / el;
    const double left = mbs > 0 ? static_cast<double>(total_ - bytes) / 1e6 / mbs : 0;
    char line[256];
    std::snprintf(line, sizeof line, "prepare: %sB/%sB (%.0f%%) | %.1f MB/s | %s tokens | %s %.1f s",
                  count_text(static_cast<double>(bytes)).c_str(), count_text(static_cast<double>(total_)).c_str(),
                  total_ ? 100.0 * static_cast<double>(bytes) / static_cast<double>(total_) : 100.0, mbs,
                  count_text(static_cast<double>(tokens)).c_str(), final ? "took" : "ETA", final ? el : left);
    std::fprintf(f_, tty_ ? "\r%s\033[K%s" : "%s%s\n", line, tty_ && final ? "\n" : "");
    std::fflush(f_);
  }
  double elapsed() const { return now() - t0_; }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  std::FILE* f_;
  bool tty_;
  int64_t total_;
  double every_, t0_, last_;
};

// ---------------------------------------------------------------------------------------
// The output directory: checked first (again under its lock by StagedDir), written beside, swapped in.

void check_out(const PrepareOptions& opt) {
  std::error_code ec;
  const fs::path out(opt.out);
  if (out.empty()) throw UserError(SourceLoc{}, "no output directory given", "name OUT, e.g. data/corpus");
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw UserError(SourceLoc{opt.out}, "exists and is not a directory (data prepare writes a dataset directory)",
                    "choose another OUT, or remove the file");
  if (fs::is_directory(out, ec) && !fs::is_empty(out, ec) && !opt.force)
    throw UserError(SourceLoc{opt.out}, "is not empty: data prepare does not overwrite a dataset",
                    "pass --force to replace it, or choose another OUT");
  if (opt.format != "h5" && opt.format != "bin")
    throw UserError(SourceLoc{"--format"}, "unknown format '" + opt.format + "'", "use --format h5 or --format bin");
  if (!(opt.val_fraction >= 0 && opt.val_fraction < 1))
    throw UserError(SourceLoc{"--val-fraction"}, "must be in [0, 1)", "use a small fraction such as 0.05");
  if (opt.shard_tokens < 1024 || (opt.format == "bin" && opt.shard_tokens > INT32_MAX))
    throw UserError(SourceLoc{"--shard-tokens"}, "must be between 1024 and " + std::string(opt.format == "bin" ? "2^31-1 (the llm.c header's count is int32)" : "any size"),
                    "use the default (134217728)");
}

// What replacing OUT must not delete: the inputs and a tokenizer read from a path.
std::vector<std::string> protected_inputs(const PrepareOptions& opt) {
  std::vector<std::string> in = opt.inputs;
  if (!opt.tokenizer.empty() && opt.tokenizer != "byte") in.push_back(opt.tokenizer);
  return in;
}

SplitWriter split_writer(const std::string& name, const std::string& dir, const PrepareOptions& opt, bool wide,
                         const tok::TokenizerInfo& ti) {
  SplitWriter w;
  w.name = name;
  w.dir = dir;
  w.ext = opt.format;
  w.wide = wide;
  w.shard_tokens = opt.shard_tokens;
  w.vocab = ti.vocab_size;
  w.tokenizer = ti.name;
  return w;
}

nlohmann::json split_json(const SplitWriter& w) {
  nlohmann::json shards = nlohmann::json::array();
  for (const DatasetShard& s : w.shards) shards.push_back({{"file", s.file}, {"tokens", s.tokens}});
  return {{"documents", w.documents}, {"tokens", w.tokens}, {"shards", shards}};
}

void write_manifest(const fs::path& dir, const PrepareOptions& opt, const tok::Tokenizer& t, int32_t eos,
                    const SplitWriter& train, const SplitWriter& val, const std::vector<InputArg>& args, int64_t special_text) {
  const tok::TokenizerInfo ti = t.info();
  nlohmann::json inputs = nlohmann::json::array();
  for (const InputArg& a : args)
    inputs.push_back({{"path", a.path}, {"files", a.files}, {"bytes", a.bytes}, {"documents", a.documents},
                      {"bad_lines", a.bad_lines}, {"skipped", a.skipped.size()}});
  nlohmann::json j{{"runner_dataset", 1},
                   {"format", opt.format},
                   {"dtype", train.wide ? "int32" : "uint16"},
                   {"documents", train.documents + val.documents},
                   {"tokens", train.tokens + val.tokens},
                   {"max_token", std::max(train.max_token, val.max_token)},
                   {"eos_id", eos},
                   {"val_fraction", opt.val_fraction},
                   {"tokenizer", {{"kind", ti.kind}, {"name", ti.name}, {"vocab_size", ti.vocab_size}, {"hash", ti.hash}}},
                   {"train", split_json(train)},
                   {"val", split_json(val)},
                   {"field", opt.field},
                   {"special_text", {{"as_text", opt.special_as_text}, {"occurrences", special_text}}},
                   {"inputs", inputs}};
  std::ofstream f(dir / kDatasetManifest);
  f << j.dump(2) << "\n";
  f.close();
  if (!f) throw UserError(SourceLoc{(dir / kDatasetManifest).string()}, "cannot write the manifest (disk full?)", "check free space");
}

// ---------------------------------------------------------------------------------------
// The pipeline: workers tokenize chunks, the caller's thread writes them in order.

struct Pipeline {
  Reader reader;
  const tok::Tokenizer& tok;
  int32_t eos;
  const PrepareOptions& opt;
  const std::vector<InputFile>& files;
  std::mutex mu;
  std::condition_variable cv;
  int64_t next_seq = 0, next_write = 0, depth = 0;
  bool done_reading = false, abort = false;
  std::exception_ptr error;
  std::map<int64_t, ChunkResult> ready;

  Pipeline(const std::vector<InputFile>& f, const tok::Tokenizer& t, int32_t e, const PrepareOptions& o, int threads)
      : reader(f), tok(t), eos(e), opt(o), files(f), depth(4 * static_cast<int64_t>(threads)) {}

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = e;
    abort = true;
    cv.notify_all();
  }

  void worker() {
    for (;;) {
      Chunk c;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return abort || next_seq < next_write + depth; });
        if (abort) return;
        try {
          if (!reader.next(c)) {
            done_reading = true;
            cv.notify_all();
            return;
          }
        } catch (...) {
          lock.unlock();
          return fail(std::current_exception());
        }
        c.seq = next_seq++;
      }
      try {
        ChunkResult r = tokenize_chunk(c, tok, eos, opt.field, files, opt.special_as_text);
        std::lock_guard<std::mutex> lock(mu);
        ready.emplace(c.seq, std::move(r));
        cv.notify_all();
      } catch (...) {
        return fail(std::current_exception());
      }
    }
  }

  // The next chunk in order; nullopt at the end. Throws on a worker's error or a stop request.
  std::optional<ChunkResult> take() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (error) std::rethrow_exception(error);
      if (opt.stop && opt.stop->load())
        throw UserError(SourceLoc{opt.out}, "interrupted", "nothing was written to " + opt.out + "; run the command again");
      if (auto it = ready.find(next_write); it != ready.end()) {
        ChunkResult r = std::move(it->second);
        ready.erase(it);
        ++next_write;
        cv.notify_all();
        return r;
      }
      if (done_reading && next_write == next_seq) return std::nullopt;
      cv.wait_for(lock, std::chrono::milliseconds(100));
    }
  }
};

struct Writers {
  SplitWriter train, val;
  std::vector<InputArg>& args;
  const std::vector<InputFile>& files;
  double f;
  std::FILE* notes;
  int64_t kept = 0, tokens = 0, special_text = 0;
  size_t bad_shown = 0;
  SplitWriter* in_doc = nullptr;  // the split of the document being written (pieces of one file)

  void write(const ChunkResult& c) {
    special_text += c.special_text;
    for (const PieceResult& p : c.pieces) {
      InputArg& a = args[files[p.file].arg];
      if (!p.bad.empty()) {
        ++a.bad_lines;
        if (notes && bad_shown++ < kMaxNotes) std::fprintf(notes, "%s: skipped\n", p.bad.c_str());
        continue;
      }
      if (!in_doc) {  // a new document: evenly spaced ones are held out
        const double i = static_cast<double>(kept);
        in_doc = std::floor((i + 1) * f) > std::floor(i * f) ? &val : &train;
      }
      in_doc->append(p.ids);
      tokens += static_cast<int64_t>(p.ids.size());
      if (p.ends_doc) {
        ++in_doc->documents;
        ++a.documents;
        ++kept;
        in_doc = nullptr;
      }
    }
  }
};

void say_skipped(std::FILE* notes, const std::vector<InputArg>& args) {
  if (!notes) return;
  for (const InputArg& a : args) {
    if (a.skipped.empty()) continue;
    std::string list;
    for (size_t i = 0; i < a.skipped.size() && i < kMaxNotes; ++i) list += (i ? ", " : "") + a.skipped[i];
    if (a.skipped.size() > kMaxNotes) list += ", ... (" + std::to_string(a.skipped.size() - kMaxNotes) + " more)";
    std::fprintf(notes, "%s: skipped %zu file(s): %s\n", a.path.c_str(), a.skipped.size(), list.c_str());
  }
}

// The end-of-document token's text, to name in messages.
std::string special_example(const tok::Tokenizer& t) {
  if (!t.eos_id()) return "<|endoftext|>";
  const int32_t one[1] = {*t.eos_id()};
  const std::string s = t.decode(one);
  return s.empty() ? "<|endoftext|>" : s;
}

int32_t end_of_document(const tok::Tokenizer& t, const PrepareOptions& opt) {
  const auto eos = t.eos_id();
  if (!eos)
    throw UserError(SourceLoc{opt.tokenizer}, "the tokenizer has no end-of-document token (data prepare appends one after each document)",
                    "use a tokenizer that defines one (</s>, <|endoftext|>)");
  return *eos;
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& opt) {
  check_out(opt);  // before loading a tokenizer: the cheap mistakes first
  return prepare_dataset(opt, *tok::load_tokenizer(opt.tokenizer));
}

PrepareResult prepare_dataset(const PrepareOptions& opt, const tok::Tokenizer& tok) {
  check_out(opt);
  std::vector<InputArg> args;
  const std::vector<InputFile> files = expand_inputs(opt, args);
  int64_t total = 0;
  for (const InputFile& f : files) total += f.bytes, ++args[f.arg].files, args[f.arg].bytes += f.bytes;
  if (files.empty()) throw UserError(SourceLoc{opt.inputs.empty() ? "" : opt.inputs[0]}, "no text or JSONL files to prepare",
                                     "give text files, directories holding them, or .jsonl files");
  const tok::Tokenizer* tokenizer = &tok;
  const int32_t eos = end_of_document(*tokenizer, opt);
  const tok::TokenizerInfo ti = tokenizer->info();
  if (opt.format == "bin" && ti.vocab_size > 65536)
    throw UserError(SourceLoc{"--format"}, "bin shards hold uint16 ids, but the tokenizer's vocabulary is " + std::to_string(ti.vocab_size),
                    "use --format h5 (int32 ids)");
  say_skipped(opt.progress, args);

  // OUT has one writer (a second prepare into it is refused while this one runs) and is built
  // beside, then swapped in whole (runner/atomic_output.h); a killed prepare's temporary is
  // removed by the next one.
  StagedDir staged(opt.out, opt.force, "data prepare", "--force", protected_inputs(opt));
  const fs::path tmp_path = staged.path();

  const int threads = opt.threads > 0 ? opt.threads : std::max(1u, std::thread::hardware_concurrency());
  const bool wide = ti.vocab_size > 65536;
  Writers w{split_writer("train", tmp_path.string(), opt, wide, ti), split_writer("val", tmp_path.string(), opt, wide, ti),
            args, files, opt.val_fraction, opt.progress};
  Progress progress(opt.progress, total, opt.progress_every_s);
  Pipeline pipe(files, *tokenizer, eos, opt, threads);
  std::vector<std::thread> pool;
  int64_t bytes = 0;
  try {
    for (int i = 0; i < threads; ++i) pool.emplace_back([&] { pipe.worker(); });
    while (auto c = pipe.take()) {
      w.write(*c);
      bytes += c->bytes;
      progress.update(bytes, w.tokens, false);
    }
  } catch (...) {
    pipe.fail(nullptr);
    for (auto& t : pool) t.join();
    throw;
  }
  for (auto& t : pool) t.join();
  w.train.close();
  w.val.close();
  if (w.kept == 0)
    throw UserError(SourceLoc{opt.inputs[0]}, "no documents: every input was empty or every JSONL line was skipped",
                    "check the inputs (and --field for JSONL)");
  tokenizer->save((tmp_path / "tokenizer").string());
  write_manifest(tmp_path, opt, *tokenizer, eos, w.train, w.val, args, w.special_text);
  throw_if_stopped(opt.out);
  staged.commit();
  progress.update(bytes, w.tokens, true);
  PrepareResult r{w.train.documents, w.val.documents, w.train.tokens, w.val.tokens, bytes, progress.elapsed()};
  int64_t bad = 0;
  for (const InputArg& a : args) bad += a.bad_lines;
  if (opt.progress && bad > 0) std::fprintf(opt.progress, "%lld JSONL line(s) skipped in all (see above)\n", static_cast<long long>(bad));
  r.special_text = w.special_text;
  if (opt.progress && w.special_text > 0)
    std::fprintf(opt.progress,
                 opt.special_as_text ? "%lld occurrence(s) of a special token's text (such as %s) were encoded as ordinary text (--special-as-text)\n"
                                     : "note: %lld occurrence(s) of a special token's text (such as %s) in the inputs became the special id, "
                                       "as Hugging Face does (a literal end-of-document text adds a document boundary); "
                                       "--special-as-text encodes them as text, as tiktoken does\n",
                 static_cast<long long>(w.special_text), special_example(*tokenizer).c_str());
  if (opt.progress && opt.val_fraction > 0 && r.val_documents == 0)  // training on it would stop at its first check
    std::fprintf(opt.progress, "note: no document was held out for validation (%lld documents x --val-fraction %g < 1); "
                 "a run evaluates on the val split: prepare again with a larger --val-fraction, or split the corpus "
                 "into more documents (files or JSONL records)\n", static_cast<long long>(r.documents), opt.val_fraction);
  return r;
}

}  // namespace runner
