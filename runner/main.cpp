// Placeholder entry point; the CLI lands with runner/cli.cpp.
int main() { return 0; }
