#!/usr/bin/env python3
"""The heap-vs-wheels comparison, and every figure the docs cite from the committed results.

usage: bench/compare.py [--quick | --all] [--build DIR] [--repetitions K] [--filter REGEX]
                        [--out DIR | --commit-results [--skip-lateness] [--machine TEXT]]
       bench/compare.py --from-json FILE [--out DIR]
       bench/compare.py --docs          # rewrite the figures README.md and docs/ cite
       bench/compare.py --check-docs    # exit 1 when one is stale or not in the results

A run of bench_compare (build it first: scripts/demo, or the release preset) writes a markdown
table of ns/op per structure x workload x N with ratios to the locked heap, a log-log PNG plot
(with gnuplot) and the raw JSON to build/results/ (--out DIR: there instead), so that a run leaves
the checkout as it was. The default run covers N = 1k .. 1M, and 10M for random inserts, cancel
and reschedule; --all runs every workload at 10M too; --quick takes about half a minute. While it
runs it shows which benchmark runs, how many of how many are done and the time so far.

--commit-results replaces the committed run, bench/results/compare.{json,md,png}, recording in
compare.json the command, the commit (with "+changes" when the tree differs from it), the date and
the machine; then it runs `build/release/bench/lateness 100000 5` into bench/results/lateness.txt
(with the same record in its first lines; --skip-lateness keeps the committed one) and rewrites
the docs' figures (--docs). Commit the results and the docs together.

The docs' figures. README.md and docs/**/*.md cite the committed results through markers that a
rendered page does not show, and this script writes what is between them:
  <!-- figures: NAME -->  ...  <!-- end of figures -->   a whole table (NAME: see TABLES below),
                                                         with a line naming its source
  <!--fig SOURCE KEY-->value<!--/fig-->                  one figure in a sentence
SOURCE and KEY: `compare W/S/N` (ns per operation of workload W, structure S, N pending),
`compare W/S/N bytes` (bytes per pending timer), `compare W/S/N ratio` (to the locked heap),
`compare W/S/N ratio W2/S2/N2` (to another row); `lateness SECTION|LABEL|FIELD` (SECTION dense or
sparse, LABEL as bench/results/lateness.txt names the structure, FIELD p50, p99, max or early;
`lateness idle|LABEL|wakeups`); `backends RUN NAME` (bench/results/backends.json: the job queues'
runs, RUN's figure NAME; `backends RUN source` names the run's command, commit and date).
--check-docs (ctest: "docs: figures", label docs) fails when a marker's key is not in the results
or its text is not what the results give: change a result, run --docs, and every doc that cites it
follows.
"""
import argparse, json, os, re, subprocess, sys, collections, shutil, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--quick", action="store_true", help="about half a minute: N <= 100k, short runs")
ap.add_argument("--all", action="store_true", help="every benchmark, 10M expiry included (long)")
ap.add_argument("--build", default="build/release")
ap.add_argument("--out", default=None, help="where the results go (default: build/results)")
ap.add_argument("--commit-results", action="store_true",
                help="write into bench/results/, replacing the committed run the docs quote")
ap.add_argument("--skip-lateness", action="store_true",
                help="with --commit-results: keep the committed lateness run")
ap.add_argument("--machine", default=None, help="with --commit-results: how to name the machine")
ap.add_argument("--repetitions", type=int, default=None)
ap.add_argument("--filter", default=None, help="a Google Benchmark filter regex")
ap.add_argument("--from-json", default=None, help="only render the table and plot of an earlier run")
ap.add_argument("--docs", action="store_true", help="rewrite the figures the docs cite")
ap.add_argument("--check-docs", action="store_true", help="fail when a figure the docs cite is stale")
ap.add_argument("--results", default=None, help="with --docs/--check-docs: the results (bench/results)")
ap.add_argument("--docs-root", default=None, help="with --docs/--check-docs: where README.md and docs/ are")
args = ap.parse_args()
if args.commit_results and args.out:
    ap.error("--commit-results writes into bench/results: give it or --out, not both")
args.out = args.out or ("bench/results" if args.commit_results else os.path.join("build", "results"))
script_start = time.monotonic()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = args.results or os.path.join(ROOT, "bench", "results")
DOCS_ROOT = args.docs_root or ROOT
ORDER = ["locked_priority_queue", "delay_queue", "hashed_wheel_timer",
         "hierarchical_timing_wheel", "asio_steady_timer"]


def clock(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


def run_benchmarks(cmd, flt, reps):
    """Runs cmd (bench_compare) and shows its progress: which benchmark runs, how many of how
    many are done, the time so far, and the total at the end. The benchmarks run in the order
    --benchmark_list_tests gives; the console reporter prints a benchmark's lines (its aggregates)
    when it is done, so the next one in the list is the one running."""
    listed = subprocess.run([cmd[0], f"--benchmark_filter={flt}", "--benchmark_list_tests"],
                            capture_output=True, text=True)
    names = [n for n in listed.stdout.split() if n] if listed.returncode == 0 else []
    total = len(names)
    tty = sys.stdout.isatty()
    start = time.monotonic()
    done = set()

    status = ""  # "{elapsed}" in it is filled in each time it is shown
    lock = threading.Lock()

    def render():
        text = status.replace("{elapsed}", clock(time.monotonic() - start))
        if tty:
            print("\r\033[K" + text[:shutil.get_terminal_size().columns - 1], end="", flush=True)
        else:
            print(text, flush=True)

    def show(text):
        nonlocal status
        with lock:
            status = text
            render()

    def say(line):  # a line of the benchmark's own (its context: machine, load, warnings)
        with lock:
            print(("\r\033[K" if tty else "") + line, flush=True)
            if tty and status:
                render()

    finished = threading.Event()

    def tick():  # on a terminal, the elapsed time moves while one long benchmark runs
        while not finished.wait(1.0):
            with lock:
                if status:
                    render()

    if tty:
        threading.Thread(target=tick, daemon=True).start()
    if total:
        print(f"{total} benchmarks, {reps} repetition{'s' if reps != 1 else ''} each", flush=True)
    # Its console output, stderr (the context) included, one line at a time; the JSON goes to
    # --benchmark_out as before.
    proc = subprocess.Popen(cmd + ["--benchmark_color=false"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    if total:
        show(f"[  0/{total} {{elapsed}}] running {names[0]}")
    aggregate = re.compile(r"_(mean|median|stddev|cv)$")
    for line in proc.stdout:
        fields = line.split()
        if not fields or fields[0] == "Benchmark" or fields[0].startswith("---"):
            continue
        name = aggregate.sub("", fields[0])
        if name in done:
            continue
        if name not in names and (names or "/" not in name):
            say(line.rstrip())
            continue
        done.add(name)
        took = ""
        ips = re.search(r"items_per_second=([0-9.]+)([kMGT]?)/s", line)
        if "ERROR" in line:
            took = " (error)"
        elif ips:
            scale = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[ips.group(2)]
            took = f" ({1e9 / (float(ips.group(1)) * scale):.1f} ns/op)"
        nxt = next((n for n in names if n not in done), None)
        count = f"{len(done):3d}/{total}" if total else f"{len(done):3d}"
        show(f"[{count} {{elapsed}}] done {name}{took}" +
             (f"; running {nxt}" if nxt else ""))
    rc = proc.wait()
    finished.set()
    if tty:
        print()
    print(f"benchmarks finished in {clock(time.monotonic() - start)}", flush=True)
    if rc != 0:
        raise subprocess.CalledProcessError(rc, cmd)



# ---- the comparison's table ------------------------------------------------------------------

def load_rows(raw):
    """(rows, repetitions, record): rows[(workload, N)][structure] = (ns/op, bytes per timer,
    allocations per op, allocations after the first pass); record: compare.json's "delayq" entry
    (command, commit, date, machine), {} for a run that has none."""
    data = json.load(open(raw))
    # name: workload/structure/N[/iterations:..][/threads:..][/real_time]_median
    rows = collections.defaultdict(dict)
    reps = 1
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        if b.get("error_occurred"):
            continue
        reps = b.get("repetitions", reps)
        parts = b["run_name"].split("/")
        workload, structure, n = parts[0], parts[1], int(parts[2])
        ips = b.get("items_per_second")
        if not ips:
            continue
        ns = 1e9 / ips
        if "threads:" in b["run_name"]:
            ns *= int(b.get("threads", 2))  # per insert, summed over both threads' wall time
        rows[(workload, n)][structure] = (ns, b.get("bytes_per_timer"), b.get("allocs_per_op"),
                                          b.get("allocs_after_first"))
    return rows, reps, data.get("delayq", {})


def fmt(x):
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def render_table(rows, reps):
    structures = [s for s in ORDER if any(s in r for r in rows.values())]
    workloads = []
    for w, _ in sorted(rows, key=lambda k: (k[0], k[1])):
        if w not in workloads:
            workloads.append(w)
    lines = ["| workload | N | " + " | ".join(structures) + " |",
             "|---|---:|" + "---:|" * len(structures)]
    for w in workloads:
        for n in sorted(n for (ww, n) in rows if ww == w):
            r = rows[(w, n)]
            base = r.get("locked_priority_queue", (None,))[0]
            cells = []
            for s in structures:
                if s not in r:
                    cells.append("–")
                    continue
                ns = r[s][0]
                cell = fmt(ns)
                if w == "reschedule" and s in rows.get(("cancel_schedule", n), {}):
                    # against the same structure's cancel + schedule, which it replaces
                    cell += f" ({ns / rows[('cancel_schedule', n)][s][0]:.2f}× c+s)"
                elif w == "postpone" and s in rows.get(("cancel", n), {}):
                    # against the same wheel's cancel: a push back should cost no more than one
                    cell += f" ({ns / rows[('cancel', n)][s][0]:.2f}× cancel)"
                elif base and s != "locked_priority_queue":
                    cell += f" ({ns / base:.2f}×)"
                cells.append(cell)
            lines.append(f"| {w} | {n:,} | " + " | ".join(cells) + " |")
    mem = [(n, {s: v[1] for s, v in rows[("insert_random", n)].items() if v[1]})
           for (w, n) in sorted(rows) if w == "insert_random"]
    table = "\n".join(lines)
    table += "\n\nns per operation (median of %d); in brackets: ratio to the locked heap (< 1 is faster);\n" % reps
    table += ("reschedule: ratio to the same structure's cancel_schedule (c+s), the cancel + schedule it "
              "replaces; postpone (reschedule to now + a fixed 60 s, the idle-connection pattern): ratio "
              "to the same wheel's cancel; periodic: per run of a periodic task.\n")
    pairs = [(n, s, rows[("two_threads_insert", n)][s][0] / 2, rows[("one_thread_insert", n)][s][0])
             for (w, n) in sorted(rows) if w == "two_threads_insert" for s in structures
             if s in rows[(w, n)] and s in rows.get(("one_thread_insert", n), {})]
    if pairs:
        table += ("\nTwo threads against one, the same workload (one_thread_insert: the pair's 400 000 "
                  "inserts on one thread): wall ns per insert of the pair together (half the "
                  "two_threads_insert row) / one thread's ns per insert = ratio (<= 1: no collapse). " +
                  "; ".join(f"{s} N={n:,}: {two:.1f} / {one:.1f} = {two / one:.2f}×"
                            for n, s, two, one in pairs) + ".\n")
    allocs = [(w, n, s, v[2]) for (w, n), r in sorted(rows.items()) for s, v in r.items()
              if w in ("reschedule", "periodic") and v[2] is not None]
    if allocs:
        table += "\nAllocations (operator new) per operation: " + "; ".join(
            f"{w} {s} N={n:,}: {a:.2g}" for w, n, s, a in allocs) + ".\n"
    after_first = [(n, s, v[3]) for (w, n), r in sorted(rows.items()) for s, v in r.items()
                   if w == "passes" and v[3] is not None]
    if after_first:
        table += ("\npasses: N timers fired over 1 000 passes, per fired timer; operator new calls in passes "
                  "2 to 1 000: " + "; ".join(f"{s} N={n:,}: {a:.0f}" for n, s, a in after_first) +
                  ".\n")
    if mem:
        table += "\n| bytes per pending timer | " + " | ".join(structures) + " |\n|---:|" + "---:|" * len(structures) + "\n"
        for n, m in mem:
            table += f"| N = {n:,} | " + " | ".join(f"{m[s]:.0f}" if s in m else "–" for s in structures) + " |\n"
    return table


def plot(rows, png, out_dir):
    structures = [s for s in ORDER if any(s in r for r in rows.values())]
    panels = [w for w in ("insert_random", "insert_monotonic", "cancel", "expire")
              if any(ww == w for ww, _ in rows)]
    dat = os.path.join(out_dir, ".plot.dat")
    with open(dat, "w") as f:
        for w in panels:
            for s in structures:
                f.write(f"# {w} {s}\n")
                for n in sorted(n for (ww, n) in rows if ww == w):
                    if s in rows[(w, n)]:
                        f.write(f"{n} {rows[(w, n)][s][0]}\n")
                f.write("\n\n")
    script = ["set terminal png size 1400,1000", "set termoption noenhanced",
              f"set output '{png}'", "set logscale xy", "set grid", "set key top left",
              "set xlabel 'N pending'", "set ylabel 'ns per operation'",
              f"set multiplot layout 2,2 title 'delayq: heap vs wheels (lower is better)'"]
    idx = 0
    for w in panels:
        plots = []
        for s in structures:
            plots.append(f"'{dat}' index {idx} using 1:2 with linespoints lw 2 title '{s}'")
            idx += 1
        script.append(f"set title '{w}'")
        script.append("plot " + ", ".join(plots))
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
    os.remove(dat)


# ---- the committed results, as the docs cite them ---------------------------------------------

class Missing(Exception):
    """A figure the docs cite that the results do not hold."""


def group(x):
    """A number as the docs write it: thousands apart by a space, as given otherwise."""
    if isinstance(x, int) or float(x).is_integer() and abs(x) >= 1000:
        return f"{int(x):,}".replace(",", " ")
    return f"{x}"


def micro(us):
    """A lateness in µs as the docs write it."""
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.0f} µs" if us >= 100 else f"{us:.1f} µs"


UNITS = [("_jobs_per_s", " jobs/s"), ("_puts_per_s", " puts/s"), ("_commands_per_s", " commands/s"),
         ("_per_s", "/s"), ("_us", " µs"), ("_ms", " ms"), ("_bytes", " B"), ("_x", "×")]


class Results:
    def __init__(self, root=RESULTS):
        self.root = root
        self._compare = self._lateness = self._backends = None

    # bench/results/compare.json
    def compare(self):
        if self._compare is None:
            self._compare = load_rows(os.path.join(self.root, "compare.json"))
        return self._compare

    def compare_source(self):
        _, reps, rec = self.compare()
        return (f"`{rec.get('command', 'bench/compare.py')}` (median of {reps}), commit "
                f"{rec.get('commit', '?')}, {rec.get('date', '?')}, {rec.get('machine', '?')}")

    def row(self, key):
        w, s, n = key.split("/")
        rows = self.compare()[0]
        try:
            return rows[(w, int(n))][s]
        except (KeyError, ValueError):
            raise Missing(f"compare {key}: no such row in bench/results/compare.json")

    def ns(self, key):
        return self.row(key)[0]

    def compare_figure(self, args):
        key, *rest = args.split()
        if not rest or rest == ["ns"]:
            return fmt(self.ns(key)) + " ns"
        if rest == ["bytes"]:
            b = self.row(key)[1]
            if b is None:
                raise Missing(f"compare {key} bytes: the row has no bytes per timer")
            return f"{b:.0f} B"
        if rest[0] == "ratio":
            other = rest[1] if len(rest) > 1 else "/".join(
                [key.split("/")[0], "locked_priority_queue", key.split("/")[2]])
            return f"{self.ns(key) / self.ns(other):.2f}×"
        raise Missing(f"compare {args}: unknown field {' '.join(rest)}")

    # bench/results/lateness.txt
    def lateness(self):
        if self._lateness is None:
            rec, table, section = {}, {}, None
            with open(os.path.join(self.root, "lateness.txt")) as f:
                for line in f:
                    if line.startswith("#"):
                        k, _, v = line[1:].partition(":")
                        rec[k.strip()] = v.strip()
                        continue
                    if line.startswith("lateness of"):
                        section = "dense"
                    elif line.startswith("sparse"):
                        section = "sparse"
                    elif line.startswith("dense burst"):
                        section = "burst"
                    m = re.match(r"(.*?)\s+timers \d+\s+p50\s+([\d.]+) us\s+p99\s+([\d.]+) us\s+"
                                 r"max\s+([\d.]+) us\s+early (\d+)(?:.*p99 ([\d.]+)-([\d.]+))?", line)
                    if m and section in ("dense", "sparse"):
                        label = re.sub(r"\s+", " ", m.group(1)).strip()
                        table[(section, label)] = {
                            "p50": float(m.group(2)), "p99": float(m.group(3)),
                            "max": float(m.group(4)), "early": int(m.group(5)),
                            "range": (float(m.group(6)), float(m.group(7))) if m.group(6) else None}
                    m = re.match(r"(.*?)\s+idle wake-ups in (\d+) s: (\d+)", line)
                    if m:
                        label = re.sub(r"\s+", " ", m.group(1)).strip()
                        table[("idle", label)] = {"wakeups": int(m.group(3)), "seconds": int(m.group(2))}
            self._lateness = (rec, table)
        return self._lateness

    def lateness_source(self):
        rec = self.lateness()[0]
        return (f"`{rec.get('command', 'build/release/bench/lateness')}`, commit "
                f"{rec.get('commit', '?')}, {rec.get('date', '?')}, {rec.get('machine', '?')}")

    def lateness_figure(self, args):
        parts = [p.strip() for p in args.split("|")]
        if len(parts) != 3:
            raise Missing(f"lateness {args}: write SECTION|LABEL|FIELD")
        section, label, field = parts
        entry = self.lateness()[1].get((section, label))
        if entry is None or field not in entry:
            raise Missing(f"lateness {args}: not in bench/results/lateness.txt")
        v = entry[field]
        return f"{v}" if field in ("early", "wakeups") else micro(v)

    # bench/results/backends.json
    def backends(self):
        if self._backends is None:
            self._backends = json.load(open(os.path.join(self.root, "backends.json")))["runs"]
        return self._backends

    def backend_run(self, run):
        r = self.backends().get(run)
        if r is None:
            raise Missing(f"backends {run}: no such run in bench/results/backends.json")
        return r

    def backend_source(self, run, notes=False):
        r = self.backend_run(run)
        return (f"`{r['command']}`, commit {r['commit']}, {r['date']}, {r['machine']}"
                + (f" ({r['notes']})" if notes and r.get("notes") else ""))

    def backend_figure(self, args):
        run, name = args.split()
        if name == "source":
            return self.backend_source(run)
        figures = self.backend_run(run)["figures"]
        if name not in figures:
            raise Missing(f"backends {run} {name}: run {run} has no figure {name}")
        unit = next((u for suffix, u in UNITS if name.endswith(suffix)), "")
        return group(figures[name]) + unit

    def figure(self, source, args):
        if source == "compare":
            return self.compare_figure(args)
        if source == "lateness":
            return self.lateness_figure(args)
        if source == "backends":
            return self.backend_figure(args)
        raise Missing(f"{source}: unknown source (compare, lateness or backends)")


# The tables the docs hold, by name: each returns the markdown between its markers.

def table_compare(res):
    rows, reps, _ = res.compare()
    return (f"Run: {res.compare_source()}; bench/results/compare.json.\n\n"
            + render_table(rows, reps).rstrip("\n"))


def table_lateness(res):
    rec, t = res.lateness()
    out = [f"Run: {res.lateness_source()}; bench/results/lateness.txt.", "",
           "| lateness (fire time − deadline) | p50 | p99: the median run's (range of runs) | max | early |",
           "|---|---:|---:|---:|---:|"]
    names = {"delay_queue (taker thread)": "`delay_queue` (a taker thread)",
             "asio steady_timer": "Boost.Asio `steady_timer` (timerfd + epoll)"}
    for section, title in (("dense", "100 000 timers over 1 s"), ("sparse", "sparse: 1 000 timers over 10 s")):
        for (sec, label), e in t.items():
            if sec != section:
                continue
            shown = names.get(label)
            if shown is None:
                m = re.match(r"(\w+) (\S+)(?: (.*))?", label)
                what = {"precise": "precise (default)", "rounded": "`precise = false`"}.get(
                    m.group(3) or "", m.group(3) or "precise (default)")
                if what.startswith("spin"):
                    what = f"`spin_before_deadline = {what.split()[1]}`"
                tick = re.sub(r"(\d)([a-zµ]+)$", r"\1 \2", m.group(2))
                shown = f"`{m.group(1)}`, {tick} tick, {what}"
            rng = f" ({micro(e['range'][0])} – {micro(e['range'][1])})" if e["range"] else ""
            out.append(f"| {title}: {shown} | {micro(e['p50'])} | {micro(e['p99'])}{rng} | "
                       f"{micro(e['max'])} | {e['early']} |")
    return "\n".join(out)


def wheel_table(res, s, heading):
    def cell(key, unit="ns"):
        try:
            return (fmt(res.ns(key)) + " ns") if unit == "ns" else f"{res.row(key)[1]:.0f}"
        except Missing:
            return ""
    heap = "locked_priority_queue"

    def pair(n):  # two threads: wall ns per insert of the pair (one thread alone)
        try:
            return (f"{fmt(res.ns(f'two_threads_insert/{s}/{n}') / 2)} ns "
                    f"({fmt(res.ns(f'one_thread_insert/{s}/{n}'))})")
        except Missing:
            return ""

    def heap_pair():
        try:
            return (f"{fmt(res.ns(f'two_threads_insert/{heap}/1000000') / 2)} ns "
                    f"({fmt(res.ns(f'one_thread_insert/{heap}/1000000'))})")
        except Missing:
            return ""

    def resched(n):
        a, b = cell(f"reschedule/{s}/{n}"), cell(f"cancel_schedule/{s}/{n}")
        return f"{a[:-3]} / {b}" if a and b else (a + " / –" if a else "")

    rows = [
        ("`schedule_at`, random deadlines, handle kept (`insert_random`)", "insert_random", cell(f"insert_random/{heap}/1000000")),
        ("`schedule_at`, monotonic deadlines (`insert_monotonic`)", "insert_monotonic", cell(f"insert_monotonic/{heap}/1000000")),
        ("`cancel()` of a random handle, the task destroyed before it returns (`cancel`)", "cancel", cell(f"cancel/{heap}/1000000") + " (tombstone)"),
        ("`reschedule()` of a random handle / cancel + schedule (`reschedule`, `cancel_schedule`)", "reschedule", ""),
        ("expiry of a backlog, per fired timer (`expire`)", "expire", cell(f"expire/{heap}/1000000") + " (pop)"),
        ("a periodic task, per run (`periodic`)", "periodic", ""),
        ("two threads inserting at once: wall ns per insert of the pair (one thread, the same 400 000 inserts)", "two", heap_pair()),
        ("`stop()` with N pending, per timer (`stop`)", "stop", ""),
        ("bytes per pending timer, 8-byte capture", "bytes", cell(f"insert_random/{heap}/1000000", "bytes")),
    ]
    out = [f"Run: {res.compare_source()}; bench/results/compare.json.", "",
           f"| {heading} | 1k | 1M | 10M | locked heap at 1M |", "|---|---:|---:|---:|---:|"]
    for label, w, heapcell in rows:
        cells = []
        for n in (1000, 1000000, 10000000):
            if w == "reschedule":
                cells.append(resched(n))
            elif w == "two":
                cells.append(pair(n))
            elif w == "bytes":
                cells.append(cell(f"insert_random/{s}/{n}", "bytes"))
            else:
                cells.append(cell(f"{w}/{s}/{n}"))
        if heapcell == " (tombstone)" or heapcell == " (pop)":
            heapcell = ""
        out.append(f"| {label} | " + " | ".join(cells) + f" | {heapcell} |")
    return "\n".join(out)


def table_hashed(res):
    return wheel_table(res, "hashed_wheel_timer", "at N pending (100 ms tick, 1024 buckets)")


def table_hierarchical(res):
    return wheel_table(res, "hierarchical_timing_wheel",
                       "at N pending (1 ms tick, 20 buckets a level; thread-free `hierarchical_wheel` but for expiry)")


def table_side_by_side(res):
    """docs/guide.md: the structures side by side."""
    M = "1000000"
    f = lambda w, s: fmt(res.ns(f"{w}/{s}/{M}")) + " ns"
    lat = lambda s, field: res.lateness_figure(f"dense|{s}|{field}")
    b = res.backend_figure
    rows = [
        ("holds", "values (`Delayed`)", "callbacks", "callbacks", "jobs (id + bytes), in one file",
         "jobs (id + bytes), in a table", "jobs (id + bytes)"),
        ("who runs what is due", "your threads (`take`)", "its worker, or your loop",
         "its worker, or your loop", "any thread of any process on the machine",
         "any consumer, anywhere", "any consumer, anywhere"),
        ("insert, 1M pending", f"{f('insert_random', 'delay_queue')} (locked `std::priority_queue`: "
         f"{f('insert_random', 'locked_priority_queue')})",
         f("insert_random", "hashed_wheel_timer"), f("insert_random", "hierarchical_timing_wheel"),
         f"one fsynced commit, shared by concurrent puts; {b('sqlite-reopen fill_puts_per_s')} "
         "filling 1M with `put_many` of 500",
         "one round trip, its commit on the server's disk; or one statement in your own transaction",
         f"one round trip: {b('redis-memory-put single_puts_per_s')} single, "
         f"{b('redis-memory-put batched_puts_per_s')} in batches of 100"),
        ("cancel", f"`remove_if`, O(N): {f('cancel', 'delay_queue')} per element at 1M",
         f"O(1): {fmt(res.ns('cancel/hashed_wheel_timer/1000'))} ns in cache, "
         f"{f('cancel', 'hashed_wheel_timer')} at 1M",
         f"O(1): {fmt(res.ns('cancel/hierarchical_timing_wheel/1000'))} ns in cache, "
         f"{f('cancel', 'hierarchical_timing_wheel')} at 1M",
         "one fsynced commit, by id", "one round trip, by id", "one round trip, by id"),
        ("push a deadline back", "remove + put",
         f"`reschedule`: {f('reschedule', 'hashed_wheel_timer')} "
         f"({res.compare_figure('reschedule/hashed_wheel_timer/1000000 ratio cancel_schedule/hashed_wheel_timer/1000000')} cancel + schedule)",
         f"`reschedule`: {f('reschedule', 'hierarchical_timing_wheel')} "
         f"({res.compare_figure('reschedule/hierarchical_timing_wheel/1000000 ratio cancel_schedule/hierarchical_timing_wheel/1000000')})",
         "`reschedule(id, delay)`, one fsynced commit", "`reschedule(id, delay)`, one round trip",
         "`reschedule(id, delay)`, one round trip"),
        ("expire, per fired timer, 1M backlog; jobs: end to end", f("expire", "delay_queue"),
         f("expire", "hashed_wheel_timer"), f("expire", "hierarchical_timing_wheel"),
         f"{b('sqlite-e2e sqlite_single_jobs_per_s')} with single calls, "
         f"{b('sqlite-e2e sqlite_batched_jobs_per_s')} batched",
         f"{b('postgres-e2e delayq_single_jobs_per_s')} with single calls (pg-boss "
         f"{b('postgres-e2e pgboss_single_jobs_per_s')} in the same run), "
         f"{b('postgres-e2e delayq_batched_jobs_per_s')} batched",
         f"{b('redis-e2e delayq_single_jobs_per_s')} with single calls (BullMQ "
         f"{b('redis-e2e bullmq_single_jobs_per_s')} in the same run), "
         f"{b('redis-e2e delayq_batched_jobs_per_s')} batched"),
        ("bytes per pending item", f"{res.compare_figure('insert_random/delay_queue/1000000 bytes')} "
         "(plus your `T`)", f"{res.compare_figure('insert_random/hashed_wheel_timer/1000000 bytes')} (8-byte capture)",
         res.compare_figure("insert_random/hierarchical_timing_wheel/1000000 bytes"),
         f"{b('sqlite-reopen file_per_job_bytes')} of file; "
         f"{b('sqlite-reopen memory_per_pending_job_bytes')} of memory (the jobs stay in the file)",
         "a row of the server's table", 
         f"{b('redis-memory-put memory_per_waiting_job_bytes')} of Redis memory per waiting job"),
        ("lateness p50 / p99", f"{lat('delay_queue (taker thread)', 'p50')} / "
         f"{lat('delay_queue (taker thread)', 'p99')} (100 000 timers over 1 s)",
         f"{lat('hashed_wheel_timer 1ms precise', 'p50')} / {lat('hashed_wheel_timer 1ms precise', 'p99')}",
         f"{lat('hierarchical_timing_wheel 1ms precise', 'p50')} / "
         f"{lat('hierarchical_timing_wheel 1ms precise', 'p99')}",
         "a job put by another process: up to `foreign_changes` (200 ms) late",
         f"a waiting take woken {b('postgres-e2e wake_p50_ms')} / {b('postgres-e2e wake_p99_ms')} "
         "after another object's put returned",
         f"{b('redis-paced lateness_p50_ms')} / {b('redis-paced lateness_p99_ms')} (paced, 2 of 4 "
         "consumers busy)"),
        ("periodic tasks", "–", f"`schedule_every`, {f('periodic', 'hashed_wheel_timer')} per run",
         f"`schedule_every`, {f('periodic', 'hierarchical_timing_wheel')} per run", "–", "–", "–"),
        ("idle wake-ups", "0",
         f"{res.lateness_figure('idle|hashed_wheel_timer 1ms|wakeups')} in 5 s",
         f"{res.lateness_figure('idle|hierarchical_timing_wheel 1ms|wakeups')} in 5 s",
         "5 `PRAGMA data_version` reads a second while a `take` waits (no I/O)",
         f"{b('postgres-e2e idle_consumer_statements')} statements in 20 s (`LISTEN`/`NOTIFY`)",
         f"{b('redis-idle idle_consumer_commands_per_s')} per idle consumer"),
        ("order", "deadline, FIFO among equals", "the same", "the same", "deadline", "deadline",
         "deadline within a shard"),
    ]
    out = ["| | `delay_queue` | `hashed_wheel_timer` | `hierarchical_timing_wheel` | "
           "`sqlite::delay_queue` | `postgres::delay_queue` | `redis::delay_queue` |",
           "|---|---|---|---|---|---|---|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    out += ["", "The runs (bench/results/):", "",
            "- in-process: " + res.compare_source(),
            "- lateness: " + res.lateness_source(),
            "- SQLite: " + res.backend_source("sqlite-e2e") + "; and " + res.backend_source("sqlite-reopen"),
            "- PostgreSQL: " + res.backend_source("postgres-e2e"),
            "- Redis: " + res.backend_source("redis-e2e") + "; " + res.backend_source("redis-paced")
            + "; " + res.backend_source("redis-idle") + "; and, for the inserts and the memory, "
            + res.backend_source("redis-memory-put", notes=True)]
    return "\n".join(out)


TABLES = {"compare": table_compare, "lateness": table_lateness, "hashed_wheel_timer": table_hashed,
          "hierarchical_timing_wheel": table_hierarchical, "side-by-side": table_side_by_side}
BEGIN = re.compile(r"^<!-- figures: ([\w-]+) .*-->$")
END = "<!-- end of figures -->"
FIG = re.compile(r"<!--fig (\w+) (.*?)-->(.*?)<!--/fig-->")


def doc_files():
    files = [os.path.join(DOCS_ROOT, "README.md")]
    for dirpath, dirnames, filenames in os.walk(os.path.join(DOCS_ROOT, "docs")):
        dirnames.sort()
        files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".md")]
    return [f for f in files if os.path.exists(f)]


def regenerate(path, res, problems):
    """The text of `path` with every figure as the results give it; problems gets ("missing", line)
    for each figure the results do not hold and ("stale", line) for each that differed."""
    rel = os.path.relpath(path, DOCS_ROOT)
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        m = BEGIN.match(line.strip())
        if m:
            name, start = m.group(1), i
            j = i + 1
            while j < len(lines) and lines[j].strip() != END:
                j += 1
            if j == len(lines):
                problems.append(("missing", f"{rel}:{i + 1}: the figures '{name}' have no '{END}' line"))
                out.append(line)
                i += 1
                continue
            old = "\n".join(lines[i + 1:j]).strip("\n")
            try:
                new = TABLES[name](res) if name in TABLES else None
                if new is None:
                    raise Missing(f"no table named '{name}' ({', '.join(TABLES)})")
            except Missing as e:
                problems.append(("missing", f"{rel}:{start + 1}: {e}"))
                new = old
            if new != old:
                o, n = old.split("\n"), new.split("\n")
                k = next((k for k in range(max(len(o), len(n)))
                          if k >= len(o) or k >= len(n) or o[k] != n[k]), 0)
                problems.append(("stale", f"{rel}:{start + 1}: the figures '{name}' differ from "
                                 f"bench/results, first at its line {k + 1}:\n  doc:     "
                                 f"{o[k] if k < len(o) else '(none)'}\n  results: "
                                 f"{n[k] if k < len(n) else '(none)'}"))
            out += [line, "", new, "", lines[j]]
            i = j + 1
            continue

        def sub(fm):
            try:
                value = res.figure(fm.group(1), fm.group(2))
            except (Missing, ValueError, KeyError) as e:
                problems.append(("missing", f"{rel}:{i + 1}: {e}"))
                return fm.group(0)
            if value != fm.group(3):
                problems.append(("stale", f"{rel}:{i + 1}: '{fm.group(3)}' ({fm.group(1)} "
                                 f"{fm.group(2)}) is {value} in bench/results"))
            return f"<!--fig {fm.group(1)} {fm.group(2)}-->{value}<!--/fig-->"

        out.append(FIG.sub(sub, line))
        i += 1
    return "\n".join(out)


def docs(check):
    res = Results()
    problems, changed, cited = [], [], 0
    for path in doc_files():
        text = open(path, encoding="utf-8").read()
        cited += len(FIG.findall(text)) + sum(1 for l in text.split("\n") if BEGIN.match(l.strip()))
        found = []
        new = regenerate(path, res, found)
        problems += found
        if new != text:
            changed.append(os.path.relpath(path, DOCS_ROOT))
            if not check:
                open(path, "w", encoding="utf-8").write(new)
    if check:
        for _, p in problems:
            print(p)
        if problems:
            print(f"{len(problems)} cited figures are stale or not in bench/results; "
                  "bench/compare.py --docs rewrites them from the results")
            return 1
        print(f"every figure the docs cite ({cited} markers) is what bench/results says")
        return 0
    for kind, p in problems:
        if kind == "missing":
            print(p)
    print(("rewrote: " + ", ".join(changed)) if changed else "the docs' figures were up to date")
    return 1 if any(kind == "missing" for kind, _ in problems) else 0


def git(*a):
    r = subprocess.run(["git", "-C", ROOT] + list(a), capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def this_machine():
    """'2-core Debian 12 VM (CPU model)', as the docs name a machine."""
    os_name = "Linux"
    try:
        info = dict(l.strip().split("=", 1) for l in open("/etc/os-release") if "=" in l)
        os_name = info.get("PRETTY_NAME", os_name).strip('"').split(" (")[0].replace(" GNU/Linux", "")
    except OSError:
        pass
    virt = subprocess.run(["systemd-detect-virt", "--vm"], capture_output=True, text=True)
    kind = "VM" if virt.returncode == 0 and virt.stdout.strip() not in ("", "none") else "machine"
    model = ""
    try:
        model = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()}-core {os_name} {kind}" + (f" ({model})" if model else "")


def record(command):
    commit = git("rev-parse", "--short", "HEAD") or "?"
    if git("status", "--porcelain", "--untracked-files=no", "--", "include", "bench",
           ":(exclude)bench/results"):
        commit += "+changes"  # the headers or the benchmark differ from the commit
    return {"command": command, "commit": commit, "date": time.strftime("%Y-%m-%d"),
            "machine": args.machine or this_machine()}


if args.docs or args.check_docs:
    sys.exit(docs(check=args.check_docs))

os.chdir(ROOT)
binary = os.path.join(args.build, "bench", "bench_compare")
if not args.from_json and not os.path.exists(binary):
    sys.exit(f"{binary} is missing: build the release preset first (scripts/demo does)")
os.makedirs(args.out, exist_ok=True)
raw = os.path.join(args.out, "compare-quick.json" if args.quick else "compare.json")

if args.quick:
    flt = args.filter or r"/(1000|10000|100000)(/|$)"
    reps, min_time = args.repetitions or 1, "0.05"
else:
    # 10M set-ups dominate the run time: by default only insert_random, cancel (but not
    # delay_queue's O(N) remove_if) and reschedule go to 10M.
    flt = args.filter or ("." if args.all else
                          "-((expire|insert_monotonic|cancel_schedule|postpone|periodic)/.*/10000000|"
                          "(delay_queue|asio_steady_timer)/10000000)")
    reps, min_time = args.repetitions or 3, "0.1"
cmd = [binary, f"--benchmark_filter={flt}", f"--benchmark_min_time={min_time}",
       f"--benchmark_repetitions={reps}", "--benchmark_report_aggregates_only=true",
       "--benchmark_out_format=json", f"--benchmark_out={raw}"]
if args.from_json:
    raw = args.from_json
else:
    print("running:", " ".join(cmd), flush=True)
    run_benchmarks(cmd, flt, reps)
    if args.commit_results:
        # what the docs name beside every figure of this run
        data = json.load(open(raw))
        data["delayq"] = record("bench/compare.py --commit-results" +
                                (f" --repetitions {args.repetitions}" if args.repetitions else "") +
                                (f" --filter '{args.filter}'" if args.filter else "") +
                                (" --all" if args.all else ""))
        with open(raw, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")

rows, reps, rec = load_rows(raw)
table = render_table(rows, reps)
if rec:  # a committed run says what it was
    table = (f"Run: `{rec.get('command')}` (median of {reps}), commit {rec.get('commit')}, "
             f"{rec.get('date')}, {rec.get('machine')}.\n\n" + table)
md = os.path.join(args.out, "compare-quick.md" if args.quick else "compare.md")
open(md, "w").write(table)
print(table)
png = os.path.join(args.out, "compare-quick.png" if args.quick else "compare.png")
if shutil.which("gnuplot"):
    plot(rows, png, args.out)
    print(f"\ntable: {md}\nplot:  {png}\nraw:   {raw}")
else:
    print(f"\ntable: {md}\n(no gnuplot: no plot)\nraw:   {raw}")
if args.commit_results:
    lateness = os.path.join(args.build, "bench", "lateness")
    if not args.skip_lateness:
        command = [lateness, "100000", "5"]
        print("running:", " ".join(command), "(about 5 minutes)", flush=True)
        rec = record("build/release/bench/lateness 100000 5")
        r = subprocess.run(command, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"lateness failed ({r.returncode}): {r.stderr}")
        with open(os.path.join(args.out, "lateness.txt"), "w") as f:
            f.write("".join(f"# {k}: {v}\n" for k, v in rec.items()) + r.stdout)
        print(r.stdout)
    docs(check=False)
    print("commit bench/results/ and the docs it rewrote together")
else:
    print("the committed run the docs cite: bench/results/ (left as it was; --commit-results "
          "replaces it)")
print(f"compare.py: done in {clock(time.monotonic() - script_start)}")
