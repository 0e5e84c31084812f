// Must NOT compile with the ops layer's include root: ops/ may not see parallel/.
#include "ops/tensor.h"
#include "parallel/comm.h"

int main() { return 0; }
