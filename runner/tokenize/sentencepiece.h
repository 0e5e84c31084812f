// SentencePiece .model files through libsentencepiece (sentencepiece.cpp).
#pragma once
#include <memory>
#include <string>

#include "runner/tokenize/tokenizer.h"

namespace runner::tok {

// `bytes`: the .model file's content; `path` names it in errors.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path, std::string bytes, std::string name);

}  // namespace runner::tok
