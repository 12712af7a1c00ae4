// bench/ab: is a change faster? Two revisions of delayq in one process, their rounds alternated.
//
// On a shared VM the speed of the machine moves by 10-50 % within minutes, so two binaries run
// one after the other can differ by more than a change does. Here both revisions are built into
// one program (side_base.cpp renames the other revision's namespace), and each round runs one
// batch on the base side, then the same batch on the working tree's: a slow minute slows both.
// It reports each side's quartiles of ns per operation and in how many rounds the working tree
// was faster, with the sign test's z (|z| > 3: not chance); then each side's mean with the paired
// t of the rounds' differences. The median and the sign test miss work done once every k rounds
// (a staging lane that settles every fourth round, say): the mean counts it.
//
// usage (scripts/ab builds it): ab STRUCTURE WORKLOAD [N=1000000] [ROUNDS=200]
//   STRUCTURE: hashed | hierarchical | both (the thread-free cores) | hashed_timer (the threaded
//              hashed timer, whose worker sleeps: not for expire, expire_monotonic or stop)
//   WORKLOAD:  insert | insert_monotonic | insert_cold | cancel | postpone | expire |
//   expire_monotonic | stop
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ab.hpp"

namespace {

double mean(const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return sum / static_cast<double>(v.size());
}

double at(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

int compare(const std::string& structure, const std::string& workload, std::size_t n, int rounds) {
    const auto base = make_base(structure, workload, n);
    const auto work = make_work(structure, workload, n);
    if (!base || !work) {
        std::fprintf(stderr, "ab: no structure '%s'\n", structure.c_str());
        return 2;
    }
    std::vector<double> b, w;
    int faster = 0;
    for (int r = 0; r < rounds; ++r) {
        const double x = base->round(), y = work->round();
        if (x < 0 || y < 0) {
            std::fprintf(stderr, "ab: no workload '%s'\n", workload.c_str());
            return 2;
        }
        b.push_back(x);
        w.push_back(y);
        faster += y < x;
    }
    const double z = (faster - rounds / 2.0) / std::sqrt(rounds / 4.0);
    std::printf(
        "%-12s %-16s N=%-9zu base p25 %7.1f median %7.1f | work p25 %7.1f median %7.1f ns "
        "(%.2fx) | work faster in %d/%d rounds, z = %+.1f\n",
        structure.c_str(), workload.c_str(), n, at(b, 0.25), at(b, 0.5), at(w, 0.25), at(w, 0.5),
        at(w, 0.5) / at(b, 0.5), faster, rounds, z);
    // paired t of base - work: > 3, the working tree is faster on average, not by chance
    std::vector<double> d(b.size());
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = b[i] - w[i];
    const double dm = mean(d);
    double ss = 0;
    for (double x : d) ss += (x - dm) * (x - dm);
    const double se =
        std::sqrt(ss / static_cast<double>(d.size() - 1) / static_cast<double>(d.size()));
    std::printf(
        "%-12s %-16s N=%-9zu base mean %7.1f | work mean %7.1f ns (%.2fx) | paired t = %+.1f\n",
        structure.c_str(), workload.c_str(), n, mean(b), mean(w), mean(w) / mean(b),
        d.size() > 1 && se > 0 ? dm / se : 0.0);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr,
                     "usage: %s hashed|hierarchical|both "
                     "insert|insert_monotonic|insert_cold|cancel|cancel_schedule|postpone|expire|"
                     "expire_monotonic|stop [N] "
                     "[ROUNDS]\n",
                     argv[0]);
        return 2;
    }
    const std::string structure = argv[1], workload = argv[2];
    const std::size_t n = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1'000'000;
    const int rounds = argc > 4 ? std::atoi(argv[4]) : 200;
    if (n == 0 || rounds <= 0) return 2;
    if (structure != "both") return compare(structure, workload, n, rounds);
    const int rc = compare("hashed", workload, n, rounds);
    return rc != 0 ? rc : compare("hierarchical", workload, n, rounds);
}
