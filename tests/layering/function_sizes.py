#!/usr/bin/python3
"""No function in runner/ grows past a limit (80 lines unless ALLOWED says why).

    tests/layering/function_sizes.py [SOURCE_DIR] [--list N] [--limit L]

A function here is a brace-delimited body that follows a parameter list at namespace or class
scope (free functions, member functions defined in or out of their class, constructors);
lambdas and control blocks inside a body count toward their function. Its size is the lines
from the signature's first line to the closing brace. Comments, string and character literals
(raw strings too) are blanked before braces are counted. --list N prints the N longest
functions (the before/after table of a refactor); without it the script fails on every
function over the limit that ALLOWED does not name.
"""
import os
import re
import sys

LIMIT = 80
# "file:function" -> why it may be longer.
ALLOWED = {}


def blank(src):
    """The source with comments and literals replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j])); i = j
        elif c == "R" and src.startswith('R"', i) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', src[i:])
            if not m:
                out.append(c); i += 1; continue
            end = src.find(")" + m.group(1) + '"', i + m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", src[i:end])); i = end
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            j = min(n, j + 1)
            if c == "'" and i > 0 and src[i - 1].isdigit():  # digit separator 1'000
                out.append(c); i += 1; continue
            out.append(re.sub(r"[^\n]", " ", src[i:j])); i = j
        else:
            out.append(c); i += 1
    return "".join(out)


def is_function_head(h):
    """Whether the text before a `{` opens a function body (a parameter list closes it)."""
    if ")" not in h or re.match(r"^(else\s+)?(if|for|while|switch|catch|do)\b", h):
        return False
    if re.search(r"=\s*\[", h) or re.search(r"\b(struct|class|enum|namespace|union)\b[^()]*$", h):
        return False
    tail = h[h.rindex(")") + 1:]  # qualifiers, a trailing return type, or nothing
    return re.fullmatch(r"(\s*(const|noexcept|override|final|mutable|->\s*[\w:<>,*& ]+))*\s*", tail) is not None


def function_name(h):
    h = re.sub(r"^template\s*<[^{]*?>\s*", "", h)
    m = re.search(r"(operator\s*[^\s(]+|~?[\w:]+)\s*\(", h)
    return m.group(1) if m else "?"


def functions(path):
    """(name, first line, last line) of each function body in the file."""
    text = blank(open(path, encoding="utf-8").read())
    found, stack = [], []  # stack: (kind, start line, name) per open brace
    head_start = 0         # where the text before the next brace began
    line = 1
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        if c in ";{}":
            head = text[head_start:i]
            if c == "{":
                h = " ".join(head.split())
                if not any(k == "func" for k, _, _ in stack) and is_function_head(h):
                    stack.append(("func", line - head.strip().count("\n"), function_name(h)))
                else:
                    stack.append(("block", line, ""))
            elif c == "}" and stack:
                kind, first, name = stack.pop()
                if kind == "func":
                    found.append((name, first, line))
            head_start = i + 1
    return found


def main():
    args = sys.argv[1:]
    listing = int(args[args.index("--list") + 1]) if "--list" in args else 0
    limit = int(args[args.index("--limit") + 1]) if "--limit" in args else LIMIT
    pos = [a for k, a in enumerate(args) if not a.startswith("--") and (k == 0 or args[k - 1] not in ("--list", "--limit"))]
    root = pos[0] if pos else os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rows = []
    for dirpath, _, names in os.walk(os.path.join(root, "runner")):
        for n in sorted(names):
            if n.endswith((".cpp", ".h")):
                p = os.path.join(dirpath, n)
                rel = os.path.relpath(p, root)
                for name, a, b in functions(p):
                    rows.append((b - a + 1, rel, name, a))
    rows.sort(reverse=True)
    if listing:
        for size, rel, name, a in rows[:listing]:
            print(f"{size:5d}  {rel}:{a}  {name}")
        return 0
    bad = [r for r in rows if r[0] > limit and f"{r[1]}:{r[2]}" not in ALLOWED]
    for size, rel, name, a in bad:
        print(f"{rel}:{a}: {name} is {size} lines (limit {limit}); split it, or name it in ALLOWED with the reason")
    print(f"{len(rows)} functions under runner/, {len(bad)} over {limit} lines")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
