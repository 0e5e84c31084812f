// Must NOT compile with the ops layer's include root: ops/ may not see runner/.
#include "ops/tensor.h"
#include "runner/errors.h"

int main() { return 0; }
