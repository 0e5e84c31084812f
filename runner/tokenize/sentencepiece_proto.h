// The few fields of a SentencePiece .model (a serialized ModelProto) that runner reads or
// rewrites itself, through a minimal protobuf wire-format walker: Debian's libsentencepiece
// ships no generated proto headers, and these fields decide whether a text may be encoded in
// segments, what an equivalent Hugging Face tokenizer.json holds, and which trainer fields
// (paths, thread count) must not enter the tokenizer's identity.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace runner::tok {

struct SpPiece {
  std::string piece;
  float score = 0;
  int type = 1;  // NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6
};

struct SpModelView {
  std::vector<SpPiece> pieces;
  int model_type = 1;  // UNIGRAM 1, BPE 2, WORD 3, CHAR 4
  bool byte_fallback = false, split_by_whitespace = true, treat_whitespace_as_suffix = false;
  std::string normalizer_name;
  bool charsmap_empty = true, add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
  bool denormalizer_empty = true;  // no denormalization rules
};

// nullopt when the bytes are not a well-formed ModelProto at the wire level.
std::optional<SpModelView> read_sp_model(std::string_view bytes);

// The model with NormalizerSpec.add_dummy_prefix set to `on` (every other byte kept).
std::string sp_with_dummy_prefix(std::string_view bytes, bool on);

// The model without the trainer fields that describe where and how it was trained rather
// than what it encodes: the input paths, the output prefix and the thread count.
std::string sp_without_training_paths(std::string_view bytes);

}  // namespace runner::tok
