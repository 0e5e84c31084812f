// Trial runs of the search's top layouts (verify.h). [i27: V fills this in; skeleton stub]
#include "runner/run/verify.h"

namespace runner {

void verify_layouts(SearchResult&, const VerifyOptions&) {}

}  // namespace runner
