// load_tokenizer: recognises the kind of tokenizer from its files.
#include <filesystem>

#include "runner/errors.h"
#include "runner/tokenize/tokenizer.h"

namespace runner::tok {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (path.empty() || path == "byte") return byte_tokenizer();
  // The other kinds arrive with issue 25's tokenizer work.
  throw UserError({path, 0, 0}, "tokenizer files are not supported yet", "use tokenizer byte");
}

}  // namespace runner::tok
