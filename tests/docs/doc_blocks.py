#!/usr/bin/env python3
"""Every C++ block of README.md and docs/**/*.md, compiled as a reader would copy it.

A block's fence says what it is:
  ```cpp            a whole translation unit: compiled exactly as written.
  ```cpp fragment   statements, wrapped the same way every time: its #include lines go to the top
                    of a file (a fragment without any gets <delayq/delayq.hpp>), and the rest
                    becomes the body of a function. Nothing else is added, `using namespace
                    std::chrono_literals;` neither: a fragment declares whatever else it uses (the
                    reader's own types and objects, the literals), so that a reader who copies it
                    into a function of their own has all it needs.
Any other word after `cpp` (or a `c++`/`cxx` fence) fails the block, so that no C++ block goes
untested by accident.

  doc_blocks.py list --root SRC --out FILE.cmake -- CHECK-ARGS...
      writes one ctest per block, named "docs: FILE:LINE" (LINE: the opening fence), each running
      `doc_blocks.py check` with CHECK-ARGS; ctest runs this when it starts, so the tests are the
      blocks the files hold then.
  doc_blocks.py check --root SRC --block FILE:LINE --cxx COMPILER... --include DIR...
                      [--have hiredis] [--have sqlite] [--have boost]
      compiles that block with each compiler (-std=c++20 -Wall -Wextra -Wpedantic -Werror
      -fsyntax-only). Diagnostics name the markdown file and its line. A block that needs
      hiredis (<delayq/redis/...>), SQLite (<delayq/sqlite/...>) or Boost (<boost/...>) is
      skipped (exit 77) when it is missing.
"""
import argparse, os, re, subprocess, sys, tempfile

SKIP = 77
KINDS = ("", "fragment")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
CPP_LANGS = ("cpp", "c++", "cxx")


def markdown_files(root):
    files = [os.path.join(root, "README.md")] if os.path.exists(os.path.join(root, "README.md")) else []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "docs")):
        dirnames.sort()
        files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".md")]
    return files


def blocks(path):
    """Yields (line of the opening fence, language, the words after it, the lines inside)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m.group("fence"), len(m.group("indent"))
        words = m.group("info").split()
        start, body = i + 1, []
        i += 1
        while i < len(lines):
            close = FENCE.match(lines[i])
            if close and close.group("fence")[0] == fence[0] and \
                    len(close.group("fence")) >= len(fence) and not close.group("info").strip():
                break
            # a fence indented (in a list item) indents its content alike
            line = lines[i]
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
            i += 1
        i += 1
        lang = words[0].lower() if words else ""
        yield start, lang, words[1:], body


def cpp_blocks(root):
    for path in markdown_files(root):
        rel = os.path.relpath(path, root)
        for line, lang, rest, body in blocks(path):
            if lang in CPP_LANGS:
                yield rel, line, rest, body


def source_of(rel, line, rest, body):
    kind = " ".join(rest)
    if kind not in KINDS:
        raise ValueError(f"{rel}:{line}: unknown block kind ```{' '.join(['cpp'] + rest)}; "
                         "use ```cpp (a whole file) or ```cpp fragment (statements)")
    first = line + 1
    if kind == "":
        return f"#line {first}\n" + "\n".join(body) + "\n"
    includes = [(first + k, b) for k, b in enumerate(body) if b.lstrip().startswith("#include")]
    out = [] if includes else ["#include <delayq/delayq.hpp>"]
    out += [f"#line {n}\n{b}" for n, b in includes]
    out += ["void delayq_docs_fragment() {", f"#line {first}"]
    out += ["" if b.lstrip().startswith("#include") else b for b in body]
    out += ["}"]
    return "\n".join(out) + "\n"


def needs(body):
    text = "\n".join(body)
    wanted = []
    if re.search(r"#\s*include\s*<delayq/redis/", text):
        wanted.append("hiredis")
    if re.search(r"#\s*include\s*<delayq/sqlite/", text):
        wanted.append("sqlite")
    if re.search(r"#\s*include\s*<boost/", text):
        wanted.append("boost")
    return wanted


def cmake_quote(s):
    return "[==[" + s + "]==]"


def cmd_list(args, check_args):
    found = list(cpp_blocks(args.root))
    out = []
    me = os.path.abspath(__file__)
    for rel, line, _, _ in found:
        name = f"docs: {rel}:{line}"
        cmd = [sys.executable, me, "check", "--root", args.root, "--block", f"{rel}:{line}"] + check_args
        out.append("add_test(" + " ".join(cmake_quote(c) for c in [name] + cmd) + ")")
        out.append(f"set_tests_properties({cmake_quote(name)} PROPERTIES LABELS docs "
                   f"SKIP_RETURN_CODE {SKIP} TIMEOUT 300)")
    if not found:  # the extraction itself broke: say so rather than test nothing
        out.append(f"add_test({cmake_quote('docs: no C++ blocks found')} {cmake_quote(sys.executable)} "
                   "-c [==[import sys; sys.exit('no C++ block found in README.md or docs/')]==])")
    with open(args.out, "w") as f:
        f.write("\n".join(out) + "\n")


def cmd_check(args):
    rel, _, line = args.block.rpartition(":")
    line = int(line)
    match = [b for b in cpp_blocks(args.root) if b[0] == rel and b[1] == line]
    if not match:
        print(f"{rel}:{line}: no C++ block starts there any more (run ctest again: the files changed "
              "since it listed the tests)")
        return 1
    _, _, rest, body = match[0]
    try:
        src = source_of(rel, line, rest, body)
    except ValueError as e:
        print(e)
        return 1
    missing = [n for n in needs(body) if n not in (args.have or [])]
    if missing:
        print(f"skipped: this block needs {' and '.join(missing)}, which this build did not find")
        return SKIP
    if not args.cxx:
        print("skipped: no compiler")
        return SKIP
    failed = []
    for cxx in args.cxx:
        cmd = [cxx, "-std=c++20", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-fsyntax-only",
               "-fdiagnostics-color=never"]
        cmd += [f"-I{os.path.abspath(d)}" for d in (args.include or [])] + ["-x", "c++", rel]
        with tempfile.TemporaryDirectory() as tmp:
            # The source is written under the markdown file's own name, so that diagnostics name
            # it; #line (without a file name, which would make g++ take the block for a header:
            # -Wsubobject-linkage) maps their lines to the markdown file's.
            os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w", encoding="utf-8") as f:
                f.write(src)
            r = subprocess.run(cmd, text=True, capture_output=True, cwd=tmp)
        status = "ok" if r.returncode == 0 else f"FAILED (exit {r.returncode})"
        print(f"{os.path.basename(cxx)}: {rel}:{line}: {status}")
        if r.returncode != 0:
            failed.append(cxx)
            print(r.stdout + r.stderr)
    if failed:
        print("--- what was compiled (the block as a reader copies it"
              + (", wrapped as every fragment is" if rest else "") + "):")
        print(src)
    return 1 if failed else 0


def main():
    argv = sys.argv[1:]
    check_args = []
    if "--" in argv:
        k = argv.index("--")
        argv, check_args = argv[:k], argv[k + 1:]
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["list", "check"])
    ap.add_argument("--root", required=True)
    ap.add_argument("--out")
    ap.add_argument("--block")
    ap.add_argument("--cxx", action="append")
    ap.add_argument("--include", action="append")
    ap.add_argument("--have", action="append")
    args = ap.parse_args(argv)
    if args.command == "list":
        return cmd_list(args, check_args)
    return cmd_check(args)


if __name__ == "__main__":
    sys.exit(main())
