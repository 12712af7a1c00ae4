#!/usr/bin/env python3
"""Every C++ block of README.md and docs/**/*.md, built as a reader would copy it, and every whole
program among them run.

What a block is, a reader sees on the rendered page:
  a whole program   a ```cpp block with a main(): built with the first compiler (g++) and run with
                    a time limit: it must exit by itself, with status 0; compiled (for its
                    warnings) with the others.
                    When a ```text block follows it, with nothing in between but at most one
                    paragraph that ends in ':' ("It prints:"), that block is what it must print
                    on stdout, line for line (trailing blanks ignored; a line `...` stands for
                    any number of lines).
  a fragment        a ```cpp block whose first line is a comment that starts with "Fragment",
                    e.g. `// Fragment: a function body; needs <delayq/delayq.hpp>`. Compiled, not
                    run. The headers named in <...> on that line, and the block's own #include
                    lines, go to the top of a file; the rest becomes the body of a function, or
                    stays at namespace scope when the line says "namespace scope". Nothing else is
                    added: a fragment declares whatever else it uses, and the comment tells the
                    reader what that is.
Any other ```cpp (```c++, ```cxx) block fails, and so does a word after `cpp` in the fence: what
tells a fragment from a program must be on the page, not in the invisible info string.

What a program needs is read from its #include lines: <delayq/redis/...> needs hiredis and a
Redis server, which the test starts on a free loopback port and passes as argv[1] (host) and
argv[2] (port); <delayq/sqlite/...> needs SQLite 3; <delayq/postgres/...> needs libpq and a
PostgreSQL server, started the same way (argv[1]: a libpq connection string); <boost/...> needs
Boost. A program runs in an empty temporary folder, its working directory.

  doc_blocks.py list --root SRC --out FILE.cmake -- CHECK-ARGS...
      writes one ctest per block, "docs: FILE:LINE" (LINE: the opening fence; label docs), each
      running `doc_blocks.py check` with CHECK-ARGS; ctest runs this when it starts, so the tests
      are the blocks the files hold then.
  doc_blocks.py check --root SRC --block FILE:LINE --cxx COMPILER... --include DIR...
                      [--have NAME [--link NAME=LIB;LIB...]]... [--redis-server PATH]
                      [--postgres-bin DIR] [--strict] [--run-timeout SECONDS]
      builds (and runs) that block. NAME is hiredis, sqlite, libpq or boost. Without --strict a
      block whose dependency is missing is skipped (exit 77, ctest says "Not Run"); with it (CI,
      scripts/test) it fails, naming what to install.
  doc_blocks.py count --root SRC
      prints how many blocks there are of each kind.
"""
import argparse, os, re, shutil, signal, socket, subprocess, sys, tempfile, time

SKIP = 77
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
CPP_LANGS = ("cpp", "c++", "cxx")
FRAGMENT = re.compile(r"^\s*//\s*fragment\b", re.IGNORECASE)
MAIN = re.compile(r"\bint\s+main\s*\(")
INSTALL = {"hiredis": "libhiredis-dev", "sqlite": "libsqlite3-dev", "libpq": "libpq-dev",
           "boost": "libboost-dev", "redis-server": "redis-server", "postgres": "postgresql"}


def markdown_files(root):
    files = [os.path.join(root, "README.md")] if os.path.exists(os.path.join(root, "README.md")) else []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "docs")):
        dirnames.sort()
        files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".md")]
    return files


def blocks(path):
    """Yields (line of the opening fence, language, the words after it, the lines inside, the
    lines between the closing fence and the next opening fence)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    found = []
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
        j = i
        while j < len(lines) and not FENCE.match(lines[j]):
            j += 1
        lang = words[0].lower() if words else ""
        found.append((start, lang, words[1:], body, lines[i:j]))
    return found


def is_fragment(body):
    first = next((b for b in body if b.strip()), "")
    return bool(FRAGMENT.match(first))


def cpp_blocks(root):
    """Yields (file relative to root, line, words after the language, body, expected output or
    None)."""
    for path in markdown_files(root):
        rel = os.path.relpath(path, root)
        found = blocks(path)
        for k, (line, lang, rest, body, _) in enumerate(found):
            if lang not in CPP_LANGS:
                continue
            expected = None
            if k + 1 < len(found) and found[k + 1][1] == "text":
                between = "\n".join(found[k][4]).strip()
                if not between or ("\n\n" not in between and between.endswith(":")):
                    expected = found[k + 1][3]
            yield rel, line, rest, body, expected


def kind_of(rel, line, rest, body):
    """'program' or 'fragment'; ValueError (the message for the reader) for anything else."""
    if rest:
        raise ValueError(f"{rel}:{line}: ```{' '.join(['cpp'] + rest)}: a word after `cpp` is not "
                         "shown on a rendered page; write ```cpp and, for a fragment, a first line "
                         "`// Fragment: ...` that says what it needs")
    if is_fragment(body):
        return "fragment"
    if not MAIN.search("\n".join(body)):
        raise ValueError(f"{rel}:{line}: a ```cpp block is a whole program (with a main()) or a "
                         "fragment whose first line is a comment `// Fragment: ...` saying what "
                         "it needs; this one is neither")
    return "program"


def source_of(rel, line, kind, body):
    first = line + 1
    if kind == "program":
        return f"#line {first}\n" + "\n".join(body) + "\n"
    head = next(b for b in body if b.strip())
    named = re.findall(r"<([A-Za-z0-9_./+-]+)>", head)
    includes = [(first + k, b) for k, b in enumerate(body) if b.lstrip().startswith("#include")]
    out = [f"#include <{h}>" for h in named]
    out += [f"#line {n}\n{b}" for n, b in includes]
    scope = "namespace scope" in head.lower()
    if not scope:
        out += ["void delayq_docs_fragment() {"]
    out += [f"#line {first}"]
    out += ["" if b.lstrip().startswith("#include") else b for b in body]
    if not scope:
        out += ["}"]
    return "\n".join(out) + "\n"


def needs(text):
    wanted = []
    if re.search(r"#\s*include\s*<delayq/redis/", text):
        wanted += ["hiredis", "redis-server"]
    if re.search(r"#\s*include\s*<delayq/sqlite/", text):
        wanted.append("sqlite")
    if re.search(r"#\s*include\s*<delayq/postgres/", text):
        wanted += ["libpq", "postgres"]
    if re.search(r"#\s*include\s*<boost/", text):
        wanted.append("boost")
    return wanted


def cmake_quote(s):
    return "[==[" + s + "]==]"


def cmd_list(args, check_args):
    found = list(cpp_blocks(args.root))
    out = []
    me = os.path.abspath(__file__)
    for rel, line, _, _, _ in found:
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


def cmd_count(args):
    kinds = {"program": 0, "fragment": 0, "bad": 0, "with output": 0}
    for rel, line, rest, body, expected in cpp_blocks(args.root):
        try:
            k = kind_of(rel, line, rest, body)
        except ValueError as e:
            print(e)
            k = "bad"
        kinds[k] += 1
        if k == "program" and expected is not None:
            kinds["with output"] += 1
    print(f"{kinds['program']} whole programs ({kinds['with output']} with their output checked), "
          f"{kinds['fragment']} fragments, {kinds['bad']} neither")
    return 1 if kinds["bad"] else 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, seconds=20):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class redis_server:
    """A private redis-server on a free loopback port, no persistence, for one program."""

    def __init__(self, binary, workdir):
        self.binary, self.workdir, self.proc = binary, workdir, None

    def __enter__(self):
        self.port = free_port()
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", self.workdir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_for_port(self.port, self.proc):
            raise RuntimeError(f"{self.binary} did not start on port {self.port}")
        return ["127.0.0.1", str(self.port)]

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()


class postgres_server:
    """A private PostgreSQL server (initdb in a temporary folder, a free loopback port), for one
    program. As root it runs as the `postgres` user, as the server demands."""

    def __init__(self, bindir, workdir):
        self.bindir, self.workdir, self.proc = bindir, workdir, None

    def __enter__(self):
        data = os.path.join(self.workdir, "pgdata")
        os.makedirs(data)
        as_user = []
        if os.geteuid() == 0:
            shutil.chown(self.workdir, "postgres")
            shutil.chown(data, "postgres")
            as_user = ["runuser", "-u", "postgres", "--"]
        r = subprocess.run(as_user + [os.path.join(self.bindir, "initdb"), "-D", data, "-A", "trust",
                                      "-U", "postgres", "--no-sync"], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError("initdb failed: " + r.stdout + r.stderr)
        self.port = free_port()
        self.proc = subprocess.Popen(as_user + [os.path.join(self.bindir, "postgres"), "-D", data,
                                                "-k", self.workdir, "-p", str(self.port),
                                                "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_for_port(self.port, self.proc):
            raise RuntimeError(f"postgres did not start on port {self.port}")
        # The port opens before the server accepts logins ("the database system is starting up").
        end = time.monotonic() + 30
        while subprocess.run([os.path.join(self.bindir, "pg_isready"), "-q", "-h", "127.0.0.1",
                              "-p", str(self.port), "-U", "postgres"]).returncode != 0:
            if time.monotonic() > end or self.proc.poll() is not None:
                raise RuntimeError(f"postgres on port {self.port} did not accept connections")
            time.sleep(0.05)
        return [f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"]

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGINT)  # fast shutdown
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class no_server:
    def __enter__(self):
        return []

    def __exit__(self, *exc):
        pass


def compare_output(expected, got):
    """None if `got` (stdout) matches the expected lines; else a message."""
    want = [e.rstrip() for e in expected]
    while want and not want[-1]:
        want.pop()
    have = [g.rstrip() for g in got.split("\n")]
    while have and not have[-1]:
        have.pop()

    def match(i, j):
        if i == len(want):
            return j == len(have)
        if want[i] == "...":
            return any(match(i + 1, k) for k in range(j, len(have) + 1))
        return j < len(have) and want[i] == have[j] and match(i + 1, j + 1)

    if match(0, 0):
        return None
    return ("it printed:\n" + "\n".join("    " + h for h in have) +
            "\nwhere the text after it says:\n" + "\n".join("    " + w for w in want))


def cmd_check(args):
    rel, _, line = args.block.rpartition(":")
    line = int(line)
    match = [b for b in cpp_blocks(args.root) if b[0] == rel and b[1] == line]
    if not match:
        print(f"{rel}:{line}: no C++ block starts there any more (run ctest again: the files changed "
              "since it listed the tests)")
        return 1
    _, _, rest, body, expected = match[0]
    try:
        kind = kind_of(rel, line, rest, body)
    except ValueError as e:
        print(e)
        return 1
    src = source_of(rel, line, kind, body)
    have = set(args.have or [])
    if args.redis_server:
        have.add("redis-server")
    if args.postgres_bin:
        have.add("postgres")
    wanted = needs(src)
    if kind == "fragment":
        wanted = [w for w in wanted if w not in ("redis-server", "postgres")]
    missing = [n for n in wanted if n not in have]
    if missing:
        what = " and ".join(missing)
        pkgs = " ".join(INSTALL[n] for n in missing)
        if args.strict:
            print(f"FAILED: this block needs {what}, which this build did not find "
                  f"(apt-get install {pkgs}, then configure again)")
            return 1
        print(f"skipped: this block needs {what}, which this build did not find (apt-get install "
              f"{pkgs}); a build configured with -DDELAYQ_DOCS_STRICT=ON fails here instead")
        return SKIP
    if not args.cxx:
        print("FAILED: no C++ compiler" if args.strict else "skipped: no compiler")
        return 1 if args.strict else SKIP
    links = {}
    for spec in args.link or []:
        name, _, libs = spec.partition("=")
        links[name] = [l for l in libs.split(";") if l]
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        # The source is written under the markdown file's own name, so that diagnostics name it;
        # #line (without a file name, which would make g++ take the block for a header:
        # -Wsubobject-linkage) maps their lines to the markdown file's.
        os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(tmp, rel), "w", encoding="utf-8") as f:
            f.write(src)
        binaries = []
        for k, cxx in enumerate(args.cxx):
            cmd = [cxx, "-std=c++20", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
                   "-fdiagnostics-color=never"]
            cmd += [f"-I{os.path.abspath(d)}" for d in (args.include or [])]
            if kind == "fragment" or k > 0:  # the first compiler's build is the one that runs
                cmd += ["-fsyntax-only", "-x", "c++", rel]
            else:
                exe = os.path.join(tmp, f"program{k}")
                cmd += ["-O1", "-pthread", "-x", "c++", rel, "-x", "none", "-o", exe]
                for n in wanted:
                    cmd += links.get(n, [])
                binaries.append(exe)
            r = subprocess.run(cmd, text=True, capture_output=True, cwd=tmp)
            status = "ok" if r.returncode == 0 else f"FAILED (exit {r.returncode})"
            what = "built" if kind == "program" and k == 0 else "compiled"
            print(f"{os.path.basename(cxx)}: {rel}:{line}: {what}: {status}")
            if r.returncode != 0:
                failed.append(cxx)
                print(r.stdout + r.stderr)
        if failed:
            print("--- what was compiled (the block as a reader copies it"
                  + (", wrapped as every fragment is" if kind == "fragment" else "") + "):")
            print(src)
            return 1
        if kind == "fragment":
            return 0
        run_dir = os.path.join(tmp, "run")
        os.makedirs(run_dir)
        server = no_server()
        if "redis-server" in wanted:
            server = redis_server(args.redis_server, tmp)
        elif "postgres" in wanted:
            server = postgres_server(args.postgres_bin, tmp)
        with server as argv:
            started = time.monotonic()
            proc = subprocess.Popen([binaries[0]] + argv, cwd=run_dir, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
            try:
                out, err = proc.communicate(timeout=args.run_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
                print(f"FAILED: {rel}:{line}: the program did not exit within {args.run_timeout:g} s "
                      "(a program in the docs must end by itself); it printed:")
                print(out + err)
                return 1
            took = time.monotonic() - started
        if proc.returncode != 0:
            print(f"FAILED: {rel}:{line}: the program exited with status {proc.returncode}; it printed:")
            print(out + err)
            return 1
        print(f"ran: {rel}:{line}: exited 0 in {took:.1f} s")
        if expected is not None:
            diff = compare_output(expected, out)
            if diff:
                print(f"FAILED: {rel}:{line}: {diff}")
                return 1
            print(f"output: as the text after it says ({len([e for e in expected if e.strip()])} lines)")
        else:
            sys.stdout.write(out)
    return 0


def main():
    argv = sys.argv[1:]
    check_args = []
    if "--" in argv:
        k = argv.index("--")
        argv, check_args = argv[:k], argv[k + 1:]
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["list", "check", "count"])
    ap.add_argument("--root", required=True)
    ap.add_argument("--out")
    ap.add_argument("--block")
    ap.add_argument("--cxx", action="append")
    ap.add_argument("--include", action="append")
    ap.add_argument("--have", action="append")
    ap.add_argument("--link", action="append")
    ap.add_argument("--redis-server")
    ap.add_argument("--postgres-bin")
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--run-timeout", type=float, default=30)
    args = ap.parse_args(argv)
    if args.command == "list":
        return cmd_list(args, check_args)
    if args.command == "count":
        return cmd_count(args)
    return cmd_check(args)


if __name__ == "__main__":
    sys.exit(main())
