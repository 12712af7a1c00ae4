#!/usr/bin/env python3
"""Runs bench_compare, then writes a markdown table of
ns/op per structure x workload x N with ratios to the locked heap, and a log-log PNG plot.

usage: bench/compare.py [--quick | --all] [--build DIR] [--out DIR | --commit-results] [--repetitions K]

A run's table, plot and raw JSON go to build/results/ (--out DIR: there instead), so that a run
leaves the checkout as it was; --commit-results writes them into bench/results/ instead, replacing
the committed run that README.md and docs/ quote (then update the figures there, and commit both).

The default run covers N = 1k .. 1M, and 10M for random inserts, cancel and reschedule; --all runs
every workload at 10M too. (The committed bench/results run, default settings, took 5 min 21 s on
2 vCPUs; --quick, about half a minute.) While it runs it shows which benchmark runs, how many of how many
are done and the time so far (on a terminal, one line that updates; else a line per benchmark),
and the total time at the end.
"""
import argparse, json, os, re, subprocess, sys, collections, shutil, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--quick", action="store_true", help="about half a minute: N <= 100k, short runs")
ap.add_argument("--all", action="store_true", help="every benchmark, 10M expiry included (long)")
ap.add_argument("--build", default="build/release")
ap.add_argument("--out", default=None, help="where the results go (default: build/results)")
ap.add_argument("--commit-results", action="store_true",
                help="write into bench/results/, replacing the committed run the docs quote")
ap.add_argument("--repetitions", type=int, default=None)
ap.add_argument("--filter", default=None, help="a Google Benchmark filter regex")
ap.add_argument("--from-json", default=None, help="only render the table and plot of an earlier run")
args = ap.parse_args()
if args.commit_results and args.out:
    ap.error("--commit-results writes into bench/results: give it or --out, not both")
args.out = args.out or ("bench/results" if args.commit_results else os.path.join("build", "results"))
script_start = time.monotonic()


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


root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(root)
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
    reps = json.load(open(raw))["benchmarks"][0].get("repetitions", reps)
else:
    print("running:", " ".join(cmd), flush=True)
    run_benchmarks(cmd, flt, reps)

data = json.load(open(raw))
# name: workload/structure/N[/iterations:..][/threads:..][/real_time]_median
rows = collections.defaultdict(dict)   # (workload, N) -> structure -> ns/op
for b in data["benchmarks"]:
    if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
        continue
    if b.get("error_occurred"):
        continue
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

order = ["locked_priority_queue", "delay_queue", "hashed_wheel_timer",
         "hierarchical_timing_wheel", "asio_steady_timer"]
structures = [s for s in order if any(s in r for r in rows.values())]
workloads = []
for w, _ in sorted(rows, key=lambda k: (k[0], k[1])):
    if w not in workloads:
        workloads.append(w)

def fmt(x):
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"

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
              "2 to 1 000 (goal: 0): " + "; ".join(f"{s} N={n:,}: {a:.0f}" for n, s, a in after_first) +
              ".\n")
if mem:
    table += "\n| bytes per pending timer | " + " | ".join(structures) + " |\n|---:|" + "---:|" * len(structures) + "\n"
    for n, m in mem:
        table += f"| N = {n:,} | " + " | ".join(f"{m[s]:.0f}" if s in m else "–" for s in structures) + " |\n"
md = os.path.join(args.out, "compare-quick.md" if args.quick else "compare.md")
open(md, "w").write(table)
print(table)

png = os.path.join(args.out, "compare-quick.png" if args.quick else "compare.png")
if shutil.which("gnuplot"):
    panels = [w for w in ("insert_random", "insert_monotonic", "cancel", "expire") if w in workloads]
    dat = os.path.join(args.out, ".plot.dat")
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
    print(f"\ntable: {md}\nplot:  {png}\nraw:   {raw}")
else:
    print(f"\ntable: {md}\n(no gnuplot: no plot)\nraw:   {raw}")
if not args.commit_results:
    print("the committed run the README quotes: bench/results/compare.md (left as it was; "
          "--commit-results replaces it)")
print(f"compare.py: done in {clock(time.monotonic() - script_start)}")
