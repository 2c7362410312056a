// test_stats_report.cc: sp_stats_aggregate against statistics gathered by hand (MPI_Allgather of
// every rank's sp_memory_stats), and the three report formats parsed back: JSON with a tiny
// parser, Prometheus line by line (a sample per rank per metric), the table checked for
// completeness; argument errors on one rank returned on every rank; SYMPOOL_REPORT at finalize.
// GCC 12 at -O2 with -fsanitize=address reports std::regex's own std::function members as
// maybe-uninitialized (a false positive inside libstdc++, not in this file): without this the
// RelWithDebInfo ASan build of this test does not compile.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "mpi_util.hpp"

#include <dlfcn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

extern "C" {
#include "collectives/dtype.h"
#include "pool/device/device.h"
#include <sympool/collectives.h>
#include <sympool/summary.h>
}

namespace {

// ---- a tiny JSON reader: objects, arrays, strings (no escapes needed), numbers, literals ----
struct Json {
    enum Kind { NUL, BOOL, NUM, STR, ARR, OBJ } kind = NUL;
    std::string text;                              // number text or string value
    std::vector<Json> arr;                         // ARR
    std::vector<std::pair<std::string, Json>> obj; // OBJ, in order
    const Json *get(const std::string &k) const {
        for (const auto &kv : obj)
            if (kv.first == k)
                return &kv.second;
        return nullptr;
    }
    long long i64() const { return std::strtoll(text.c_str(), nullptr, 10); }
    double num() const { return std::strtod(text.c_str(), nullptr); }
};

struct Parser {
    const std::string &s;
    size_t i = 0;
    bool ok = true;
    void ws() {
        while (i < s.size() && std::isspace((unsigned char)s[i]))
            i++;
    }
    bool eat(char c) {
        ws();
        if (i < s.size() && s[i] == c) {
            i++;
            return true;
        }
        return false;
    }
    std::string str() {
        std::string out;
        if (!eat('"')) {
            ok = false;
            return out;
        }
        while (i < s.size() && s[i] != '"') {
            if (s[i] == '\\') { // keep the escaped character
                i++;
                if (i >= s.size())
                    break;
            }
            out += s[i++];
        }
        if (i >= s.size())
            ok = false;
        i++;
        return out;
    }
    Json value() {
        Json v;
        ws();
        if (i >= s.size()) {
            ok = false;
            return v;
        }
        char c = s[i];
        if (c == '{') {
            i++;
            v.kind = Json::OBJ;
            if (eat('}'))
                return v;
            do {
                std::string k = str();
                if (!eat(':')) {
                    ok = false;
                    return v;
                }
                v.obj.emplace_back(k, value());
            } while (ok && eat(','));
            if (!eat('}'))
                ok = false;
        } else if (c == '[') {
            i++;
            v.kind = Json::ARR;
            if (eat(']'))
                return v;
            do
                v.arr.push_back(value());
            while (ok && eat(','));
            if (!eat(']'))
                ok = false;
        } else if (c == '"') {
            v.kind = Json::STR;
            v.text = str();
        } else if (c == '-' || std::isdigit((unsigned char)c)) {
            v.kind = Json::NUM;
            size_t j = i;
            while (j < s.size() &&
                   (std::isdigit((unsigned char)s[j]) || std::strchr("+-.eE", s[j])))
                j++;
            v.text = s.substr(i, j - i);
            i = j;
        } else if (s.compare(i, 4, "true") == 0 || s.compare(i, 5, "false") == 0) {
            v.kind = Json::BOOL;
            v.text = s[i] == 't' ? "true" : "false";
            i += s[i] == 't' ? 4 : 5;
        } else if (s.compare(i, 4, "null") == 0) {
            i += 4;
        } else {
            ok = false;
        }
        return v;
    }
};

bool parse_json(const std::string &text, Json *out) {
    Parser p{text};
    *out = p.value();
    p.ws();
    return p.ok && p.i == text.size();
}

// How the reports name node k: its host name, with "#k" when another node has that name too
// (short names cut at the first dot, hosts or containers that share a name).
std::string node_label(const sp_world_t *w, int k) {
    std::string name = sp_world_node_name(w, k);
    for (int j = 0; j < sp_world_node_count(w); j++)
        if (j != k && name == sp_world_node_name(w, j))
            return name + "#" + std::to_string(k);
    return name;
}

// Everything written to a FILE*, read back.
std::string slurp(FILE *f) {
    std::string out;
    std::fflush(f);
    std::rewind(f);
    char buf[4096];
    size_t k;
    while ((k = std::fread(buf, 1, sizeof buf, f)) > 0)
        out.append(buf, k);
    return out;
}

// sp_world_finalize(w) with this process's stdout (where the report goes) captured into *text.
sp_status_t finalize_capturing_stdout(sp_world_t *w, std::string *text) {
    std::fflush(stdout);
    FILE *cap = std::tmpfile();
    if (cap == nullptr) {
        ADD_FAILURE() << "tmpfile: " << std::strerror(errno);
        return sp_world_finalize(w);
    }
    int saved = dup(1);
    dup2(fileno(cap), 1);
    sp_status_t s = sp_world_finalize(w);
    std::fflush(stdout);
    dup2(saved, 1);
    close(saved);
    *text = slurp(cap);
    std::fclose(cap);
    return s;
}

class StatsReport : public WorldTest {
  protected:
    void TearDown() override {
        for (void *p : blocks_)
            EXPECT_SP_OK(sp_free(p));
        WorldTest::TearDown();
    }
    // Rank-dependent usage: rank r holds r+1 blocks of (r+1) MiB and one of 1000 bytes.
    void allocate_skewed() {
        for (int k = 0; k <= rank_; k++) {
            void *p = nullptr;
            ASSERT_SP_OK(sp_malloc((size_t)(rank_ + 1) << 20, dev_, nullptr, &p));
            blocks_.push_back(p);
        }
        void *p = nullptr;
        ASSERT_SP_OK(sp_malloc(1000, dev_, nullptr, &p));
        blocks_.push_back(p);
    }
    // Every rank's values, as rank 0 would print them: [rank][key].
    std::vector<std::vector<int64_t>> gather_by_hand() {
        sp_stats_t st;
        EXPECT_SP_OK(sp_memory_stats(dev_, &st));
        std::vector<int64_t> all((size_t)n_ * SP_STATS_MAX);
        MPI_Allgather(st.value, SP_STATS_MAX, MPI_INT64_T, all.data(), SP_STATS_MAX, MPI_INT64_T,
                      MPI_COMM_WORLD);
        std::vector<std::vector<int64_t>> out((size_t)n_);
        for (int r = 0; r < n_; r++)
            out[(size_t)r].assign(all.begin() + (long)r * SP_STATS_MAX,
                                  all.begin() + (long)(r + 1) * SP_STATS_MAX);
        return out;
    }
    std::string report(sp_report_format_t fmt) {
        std::unique_ptr<FILE, int (*)(FILE *)> f(std::tmpfile(), std::fclose);
        EXPECT_NE(f.get(), nullptr);
        sp_status_t s = sp_stats_report(w_, dev_, f.get(), fmt);
        EXPECT_EQ(s, SP_SUCCESS) << sp::describe(s);
        std::string text = slurp(f.get());
        if (rank_ != 0) {
            EXPECT_EQ(text, "") << "only rank 0 writes";
        }
        return text;
    }
    std::vector<void *> blocks_;
};

TEST_F(StatsReport, AggregateMatchesStatsGatheredByHand) {
    SP_SKIP_BELOW_RANKS(2);
    allocate_skewed();
    auto by_rank = gather_by_hand();
    sp_stats_summary_t sum;
    ASSERT_SP_OK(sp_stats_aggregate(w_, dev_, &sum));
    EXPECT_EQ(sum.nranks, n_);
    size_t nkeys = sp_stats_count();
    ASSERT_GT(nkeys, 100u);
    size_t differing = 0;
    for (size_t i = 0; i < nkeys; i++) {
        int64_t mn = by_rank[0][i], mx = mn, total = 0;
        int mnr = 0, mxr = 0;
        for (int r = 0; r < n_; r++) {
            int64_t v = by_rank[(size_t)r][i];
            total += v;
            if (v < mn) {
                mn = v;
                mnr = r;
            }
            if (v > mx) {
                mx = v;
                mxr = r;
            }
        }
        differing += mn != mx;
        EXPECT_EQ(sum.min[i], mn) << sp_stats_key(i);
        EXPECT_EQ(sum.max[i], mx) << sp_stats_key(i);
        EXPECT_EQ(sum.sum[i], total) << sp_stats_key(i);
        EXPECT_EQ(sum.min_rank[i], mnr) << sp_stats_key(i) << " (ties go to the lowest rank)";
        EXPECT_EQ(sum.max_rank[i], mxr) << sp_stats_key(i) << " (ties go to the lowest rank)";
    }
    EXPECT_GT(differing, 5u) << "the test's usage should differ between ranks";
    // The skew is what we made: the last rank holds the most.
    int64_t cur = -1;
    sp_stats_t dummy;
    std::memcpy(dummy.value, sum.max, sizeof dummy.value);
    ASSERT_SP_OK(sp_stats_get(&dummy, "allocation.all.current", &cur));
    EXPECT_EQ(cur, n_ + 1);
}

TEST_F(StatsReport, JsonParsesBackAndMatchesTheAggregate) {
    allocate_skewed();
    std::string text = report(SP_REPORT_JSON);
    sp_stats_summary_t sum;
    ASSERT_SP_OK(sp_stats_aggregate(w_, dev_, &sum));
    if (rank_ != 0)
        return;
    Json j;
    ASSERT_TRUE(parse_json(text, &j)) << text.substr(0, 400);
    ASSERT_EQ(j.kind, Json::OBJ);
    ASSERT_NE(j.get("nranks"), nullptr);
    EXPECT_EQ(j.get("nranks")->i64(), n_);
    const Json *stats = j.get("stats");
    ASSERT_NE(stats, nullptr);
    ASSERT_EQ(stats->obj.size(), sp_stats_summary_count());
    for (size_t i = 0; i < sp_stats_summary_count(); i++) {
        const char *key = sp_stats_summary_key(i);
        const Json *k = stats->get(key);
        ASSERT_NE(k, nullptr) << key;
        // The device's figures move between the two collectives; the rest must be equal.
        bool moves = std::strncmp(key, "device.", 7) == 0;
        if (!moves) {
            EXPECT_EQ(k->get("min")->i64(), sum.min[i]) << key;
            EXPECT_EQ(k->get("max")->i64(), sum.max[i]) << key;
            EXPECT_EQ(k->get("sum")->i64(), sum.sum[i]) << key;
            EXPECT_EQ(k->get("min_rank")->i64(), sum.min_rank[i]) << key;
            EXPECT_EQ(k->get("max_rank")->i64(), sum.max_rank[i]) << key;
            EXPECT_NEAR(k->get("mean")->num(), (double)sum.sum[i] / n_,
                        1e-3 + 1e-9 * std::abs((double)sum.sum[i]))
                << key;
        }
        // Every record names the node of its min and max rank.
        ASSERT_NE(k->get("max_node"), nullptr) << key;
        EXPECT_EQ(k->get("max_node")->text,
                  node_label(w_, sp_world_node(w_, (int)k->get("max_rank")->i64())))
            << key;
    }
    // Per node: every node once, its ranks, and sums that add up to the job's.
    ASSERT_NE(j.get("nnodes"), nullptr);
    EXPECT_EQ(j.get("nnodes")->i64(), sp_world_node_count(w_));
    const Json *nodes = j.get("nodes");
    ASSERT_NE(nodes, nullptr);
    ASSERT_EQ(nodes->kind, Json::ARR);
    ASSERT_EQ(nodes->arr.size(), (size_t)sp_world_node_count(w_));
    size_t ranks_seen = 0;
    int64_t allocated = 0;
    for (size_t k = 0; k < nodes->arr.size(); k++) {
        const Json &node = nodes->arr[k];
        EXPECT_EQ(node.get("name")->text, node_label(w_, (int)k));
        for (const Json &r : node.get("ranks")->arr) {
            EXPECT_EQ(sp_world_node(w_, (int)r.i64()), (int)k);
            ranks_seen++;
        }
        allocated += node.get("stats")->get("allocated_bytes.all.current")->get("sum")->i64();
    }
    EXPECT_EQ(ranks_seen, (size_t)n_);
    EXPECT_EQ(allocated, stats->get("allocated_bytes.all.current")->get("sum")->i64());
    const Json *sym = j.get("symmetric");
    ASSERT_NE(sym, nullptr);
    for (const char *k : {"registrations", "deregistrations", "agreement_rounds", "mallocs"})
        EXPECT_NE(sym->get(k), nullptr) << k;
}

// The name and labels (without rank) a memory_stats key is exported under: the stat and pool as
// labels, current/peak as gauges, the monotonic totals and num_* as counters named *_total.
std::pair<std::string, std::string> prom_series(const std::string &key) {
    static const std::map<std::string, std::string> fields = {
        {"current", ""}, {"peak", "_peak"}, {"allocated", "_allocated"}, {"freed", "_freed"}};
    std::vector<std::string> parts;
    size_t a = 0;
    while (true) {
        size_t b = key.find('.', a);
        parts.push_back(key.substr(a, b - a));
        if (b == std::string::npos)
            break;
        a = b + 1;
    }
    if (parts.size() == 2) // oversize_*.field
        parts = {parts[0], "all", parts[1]};
    if (parts.size() == 3) {
        std::string stat = parts[0], suffix = fields.at(parts[2]);
        bool bytes = stat.size() > 6 && stat.compare(stat.size() - 6, 6, "_bytes") == 0;
        if (bytes)
            stat.resize(stat.size() - 6);
        bool counter = parts[2] == "allocated" || parts[2] == "freed";
        std::string name = bytes ? "sympool_memory" + suffix + "_bytes" : "sympool_blocks" + suffix;
        if (counter)
            name += "_total";
        return {name, "metric=\"" + stat + "\",pool=\"" + parts[1] + "\""};
    }
    if (key.rfind("num_", 0) == 0)
        return {"sympool_" + key.substr(4) + "_total", ""};
    if (key == "max_split_size")
        return {"sympool_max_split_size_bytes", ""};
    return {"sympool_" + key, ""};
}

// A program that set a locale with a decimal comma (setlocale(LC_ALL, "de_DE.UTF-8")) got a JSON
// report with "mean": 1,000, which no JSON reader takes, and a table of "1,50 MiB". The report
// is written in the C locale. Only rank 0 writes, so only rank 0 switches.
TEST_F(StatsReport, NumbersKeepTheirDecimalPointUnderACommaLocale) {
    allocate_skewed();
    std::unique_ptr<sp::CommaLocale> comma;
    int active = 0;
    if (rank_ == 0) {
        comma.reset(new sp::CommaLocale);
        active = comma->active();
    }
    MPI_Bcast(&active, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!active)
        GTEST_SKIP() << "no de_DE locale can be made here (localedef, the locales package)";
    std::string json = report(SP_REPORT_JSON);
    std::string table = report(SP_REPORT_TABLE);
    comma.reset(); // the test's own parser reads in the C locale
    if (rank_ != 0)
        return;
    Json j;
    EXPECT_TRUE(parse_json(json, &j)) << json.substr(0, 400);
    EXPECT_TRUE(std::regex_search(json, std::regex("\"mean\": [0-9]+\\.[0-9]{3}"))) << json;
    EXPECT_FALSE(std::regex_search(table, std::regex("[0-9],[0-9]"))) << table;
    EXPECT_TRUE(std::regex_search(table, std::regex("[0-9]\\.[0-9]{2} MiB"))) << table;
}

TEST_F(StatsReport, PrometheusHasEveryKeyForEveryRankAsLabelledFamilies) {
    allocate_skewed();
    auto by_rank = gather_by_hand();
    std::string text = report(SP_REPORT_PROMETHEUS);
    if (rank_ != 0)
        return;
    const std::regex sample(
        R"re(^([a-zA-Z_:][a-zA-Z0-9_:]*)\{((?:[a-z_]+="[a-z_]+",)*)rank="(\d+)",node="([^"]*)"\} (-?\d+|\+Inf)$)re");
    const std::regex help(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+$)");
    const std::regex type(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter)$)");
    // series (name{labels}) -> rank -> value
    std::map<std::string, std::map<int, std::string>> values;
    std::map<std::string, int> helped;
    std::map<std::string, std::string> typed;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        ASSERT_NE(nl, std::string::npos) << "last line lacks its newline";
        std::string line = text.substr(pos, nl - pos);
        pos = nl + 1;
        std::smatch m;
        if (std::regex_match(line, m, help)) {
            EXPECT_EQ(helped[m[1]]++, 0) << "one family, one HELP: " << m[1];
        } else if (std::regex_match(line, m, type)) {
            std::string name = m[1];
            typed[name] = m[2];
            bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
            EXPECT_EQ(total, m[2] == "counter") << "counters and only counters end in _total";
        } else if (std::regex_match(line, m, sample)) {
            std::string name = m[1];
            EXPECT_EQ(helped[name], 1) << "HELP before samples: " << name;
            EXPECT_EQ(typed.count(name), 1u) << "TYPE before samples: " << name;
            std::string series = name + "{" + std::string(m[2]) + "}";
            int r = std::stoi(m[3]);
            EXPECT_EQ(m[4].str(), node_label(w_, sp_world_node(w_, r))) << line;
            EXPECT_EQ(values[series].count(r), 0u) << "duplicate sample " << line;
            values[series][r] = m[5];
            if (typed[name] == "counter") {
                EXPECT_NE(m[5].str()[0], '-') << "a negative counter: " << line;
            }
        } else {
            ADD_FAILURE() << "not exposition format: '" << line << "'";
        }
    }
    EXPECT_LE(typed.size(), 25u) << "families, not one name per key";
    // memory_stats keys, device.used/untracked, and 8 symmetric counters.
    EXPECT_EQ(values.size(), sp_stats_count() + 2 + 8);
    EXPECT_EQ(values["sympool_device_untracked_bytes{}"].size(), (size_t)n_);
    for (size_t i = 0; i < sp_stats_count(); i++) {
        auto s = prom_series(sp_stats_key(i));
        std::string series = s.first + "{" + s.second + (s.second.empty() ? "" : ",") + "}";
        ASSERT_EQ(values[series].size(), (size_t)n_) << sp_stats_key(i) << " as " << series;
        for (int r = 0; r < n_; r++) {
            int64_t want = by_rank[(size_t)r][i];
            std::string got = values[series][r];
            if (std::string(sp_stats_key(i)) == "max_split_size" && want < 0)
                EXPECT_EQ(got, "+Inf");
            else
                EXPECT_EQ(got, std::to_string(want)) << series << " rank " << r;
        }
    }
    EXPECT_EQ(typed["sympool_memory_bytes"], "gauge");
    EXPECT_EQ(typed["sympool_memory_allocated_bytes_total"], "counter");
    EXPECT_EQ(typed["sympool_ooms_total"], "counter");
    EXPECT_EQ(typed["sympool_symmetric_registrations_total"], "counter");
    EXPECT_EQ(typed["sympool_symmetric_pools"], "gauge");
    EXPECT_EQ(values["sympool_memory_bytes{metric=\"allocated\",pool=\"all\",}"].size(),
              (size_t)n_);
}

// Nodes whose hosts share a short name (gpu01.rack1 and gpu01.rack2, or containers with one host
// name) are still told apart: every report names each node with a label no other node has, so
// that Prometheus' sum by (node) sums one node, and the table's per-node rows and rank@node are
// not two nodes under one name. multinode.stats_report_same_host_name gives every node the same
// short name (tests/multinode/mn-same-name.sh).
TEST_F(StatsReport, NodesSharingAHostNameAreToldApart) {
    allocate_skewed();
    std::string prom = report(SP_REPORT_PROMETHEUS);
    std::string json = report(SP_REPORT_JSON);
    std::string table = report(SP_REPORT_TABLE);
    if (rank_ != 0)
        return;
    const int nodes = sp_world_node_count(w_);
    // Prometheus: the node label of each rank's samples; one node per label and one label per node.
    std::map<std::string, std::set<int>> nodes_of_label;
    std::map<int, std::set<std::string>> labels_of_node;
    const std::regex sample(R"re(rank="(\d+)",node="([^"]*)"\})re");
    for (auto it = std::sregex_iterator(prom.begin(), prom.end(), sample);
         it != std::sregex_iterator(); ++it) {
        int node = sp_world_node(w_, std::stoi((*it)[1]));
        nodes_of_label[(*it)[2]].insert(node);
        labels_of_node[node].insert((*it)[2]);
    }
    EXPECT_EQ((int)nodes_of_label.size(), nodes) << prom.substr(0, 2000);
    for (auto &e : nodes_of_label)
        EXPECT_EQ(e.second.size(), 1u) << "label node=\"" << e.first << "\" covers several nodes";
    for (auto &e : labels_of_node)
        EXPECT_EQ(e.second.size(), 1u) << "node " << e.first << " has several labels";
    // JSON: the nodes' names are distinct.
    std::set<std::string> json_names;
    const std::regex json_node(R"re(\{"node": (\d+), "name": "([^"]*)")re");
    for (auto it = std::sregex_iterator(json.begin(), json.end(), json_node);
         it != std::sregex_iterator(); ++it)
        json_names.insert((*it)[2]);
    EXPECT_EQ((int)json_names.size(), nodes) << "the nodes' names in JSON";
    // Table: the per-node section's rows (the 16 with most reserved) name distinct nodes.
    if (nodes > 1) {
        size_t at = table.find("-- per node");
        ASSERT_NE(at, std::string::npos) << table;
        std::set<std::string> rows;
        size_t pos = table.find('\n', table.find('\n', at) + 1) + 1; // past the column heads
        const int shown = std::min(nodes, 16);
        for (int k = 0; k < shown && pos < table.size(); k++) {
            size_t nl = table.find('\n', pos);
            rows.insert(table.substr(pos, table.find(' ', pos) - pos));
            pos = nl + 1;
        }
        EXPECT_EQ((int)rows.size(), shown) << table.substr(at);
    }
}

TEST_F(StatsReport, TableAllNamesEveryKeyAndTheWorstRank) {
    SP_SKIP_BELOW_RANKS(2);
    allocate_skewed();
    std::string text = report(SP_REPORT_TABLE_ALL);
    sp_stats_summary_t sum;
    ASSERT_SP_OK(sp_stats_aggregate(w_, dev_, &sum));
    if (rank_ != 0)
        return;
    for (size_t i = 0; i < sp_stats_count(); i++) {
        std::regex word(
            "(^|[ \n])" +
            std::regex_replace(std::string(sp_stats_key(i)), std::regex(R"(\.)"), R"(\.)") +
            "([ \n]|$)");
        EXPECT_TRUE(std::regex_search(text, word)) << "missing key " << sp_stats_key(i);
    }
    EXPECT_NE(text.find("symmetric.registrations"), std::string::npos);
    EXPECT_NE(text.find("zero on every rank"), std::string::npos);
    EXPECT_NE(text.find("-- key figures"), std::string::npos);
    // The row of allocation.all.current: max n+1 held by the last rank, which is the worst.
    size_t row = text.find("\nallocation.all.current ");
    ASSERT_NE(row, std::string::npos) << text;
    std::string line = text.substr(row + 1, text.find('\n', row + 1) - row - 1);
    char key[64], mn[32], mean[32], mx[32];
    int worst = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "%63s %31s %31s %31s %d", key, mn, mean, mx, &worst), 5)
        << line;
    EXPECT_EQ(std::atoll(mx), n_ + 1) << line;
    EXPECT_EQ(worst, n_ - 1) << line;
    // The worst rank is named with its node.
    std::string at = std::to_string(n_ - 1) + "@" + node_label(w_, sp_world_node(w_, n_ - 1));
    EXPECT_NE(line.find(" " + at + " "), std::string::npos) << line;
}

// The default table is short: the key figures first, then only the keys where a rank stands out
// (most imbalanced first), and a pointer to the full table.
TEST_F(StatsReport, TableLeadsWithKeyFiguresAndImbalancedKeys) {
    allocate_skewed();
    std::string text = report(SP_REPORT_TABLE);
    if (rank_ != 0)
        return;
    size_t lines = 0;
    for (char c : text)
        lines += c == '\n';
    // Two more key figures (device.*), and a per-node section only when the job spans nodes.
    int nodes = sp_world_node_count(w_);
    EXPECT_LE(lines, 32u + (nodes > 1 ? 2u + (unsigned)nodes : 0u)) << text;
    EXPECT_EQ(text.find("-- per node"), nodes > 1 ? text.find("-- per node") : std::string::npos)
        << text;
    if (nodes > 1) {
        EXPECT_NE(text.find("-- per node"), std::string::npos) << text;
    }
    size_t key_figures = text.find("-- key figures\nallocated_bytes.all.current ");
    size_t imbalanced = text.find("-- imbalanced keys");
    ASSERT_NE(key_figures, std::string::npos) << text;
    ASSERT_NE(imbalanced, std::string::npos) << text;
    EXPECT_LT(key_figures, imbalanced);
    EXPECT_NE(text.find("SYMPOOL_REPORT=table_all"), std::string::npos) << text;
    // Every imbalanced row is marked, and sorted by its max/mean.
    double prev = 1e300;
    size_t rows = 0;
    for (size_t p = text.find('\n', imbalanced) + 1; p < text.size() && text[p] != '-';
         p = text.find('\n', p) + 1) {
        std::string line = text.substr(p, text.find('\n', p) - p);
        ASSERT_NE(line.find(" *"), std::string::npos) << line;
        double ratio = std::atof(line.substr(line.rfind("  ") + 2).c_str());
        EXPECT_LE(ratio, prev) << line;
        prev = ratio;
        rows++;
    }
    if (n_ > 1) {
        EXPECT_GT(rows, 0u) << text;
    }
    // Without a symmetric pool the symmetric counters stay out of the short table.
    EXPECT_EQ(text.find("symmetric.registrations"), std::string::npos) << text;
}

TEST_F(StatsReport, SymmetricCountersAreReported) {
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sym_pool_create(w_, "counted", /*use_on_oom=*/false, &pool));
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool, 4096, nullptr, &p));
    std::string text = report(SP_REPORT_JSON);
    EXPECT_SP_OK(sp_free(p));
    EXPECT_SP_OK(sp_symmetric_mempool_destroy(pool));
    if (rank_ != 0)
        return;
    Json j;
    ASSERT_TRUE(parse_json(text, &j));
    const Json *sym = j.get("symmetric");
    ASSERT_NE(sym, nullptr);
    EXPECT_GE(sym->get("registrations")->get("min")->i64(), 1);
    EXPECT_GE(sym->get("mallocs")->get("min")->i64(), 1);
    EXPECT_GE(sym->get("agreement_rounds")->get("min")->i64(), 1);
    EXPECT_GE(sym->get("pools")->get("min")->i64(), 1);
}

TEST_F(StatsReport, BadArgumentsOnOneRankFailEverywhere) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    sp_stats_summary_t sum;
    EXPECT_SP_STATUS(sp_stats_aggregate(nullptr, dev_, &sum), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_stats_aggregate(w_, dev_, rank_ == 1 ? nullptr : &sum),
                     SP_ERR_INVALID_ARGUMENT);
    if (rank_ != 1) {
        EXPECT_NE(std::string(sp_last_error()).find("rank 1"), std::string::npos)
            << sp_last_error();
    }
    EXPECT_SP_STATUS(sp_stats_aggregate(w_, rank_ == n_ - 1 ? 9999 : dev_, &sum),
                     SP_ERR_INVALID_ARGUMENT);
    // Rank 0 writes: a NULL file there fails on every rank; elsewhere NULL is fine.
    EXPECT_SP_STATUS(sp_stats_report(w_, dev_, nullptr, SP_REPORT_TABLE), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_stats_report(w_, dev_, stdout, (sp_report_format_t)7),
                     SP_ERR_INVALID_ARGUMENT);
    // Ranks that pass different formats: the message names this rank's by its name.
    std::unique_ptr<FILE, int (*)(FILE *)> f(std::tmpfile(), std::fclose);
    EXPECT_SP_STATUS(
        sp_stats_report(w_, dev_, f.get(), rank_ == 0 ? SP_REPORT_JSON : SP_REPORT_PROMETHEUS),
        SP_ERR_MISMATCH);
    EXPECT_NE(
        std::string(sp_last_error())
            .find(rank_ == 0 ? "(this rank: SP_REPORT_JSON)" : "(this rank: SP_REPORT_PROMETHEUS)"),
        std::string::npos)
        << sp_last_error();
    // Still in step.
    ASSERT_SP_OK(sp_stats_aggregate(w_, dev_, &sum));
    EXPECT_EQ(sum.nranks, n_);
}

// A rank that cannot prepare the statistics' collectives fails the call on every rank, naming
// it, before any rank moves data, and the ranks stay in step. MPI refusing one rank the
// reduction's op used to return that rank alone while its peers waited in the MPI_Allreduce for
// good; rank 0 short of host memory for its node tables used to fail alone (or, with ranks on
// other nodes, leave their leaders in the MPI_Gatherv).
// A report that cannot be written (a full disk) is rank 0's SP_ERR_SYSTEM, and the message says
// why: written straight to the stream, the write failed inside one of the printf calls' buffer
// flushes (every format is larger than the stream's buffer), whose errno was gone by the final
// fflush, so the message was "writing the report failed" and nothing more.
TEST_F(StatsReport, AFailedWriteSaysWhy) {
    expect_warnings();
    for (sp_report_format_t fmt :
         {SP_REPORT_TABLE, SP_REPORT_JSON, SP_REPORT_PROMETHEUS, SP_REPORT_TABLE_ALL}) {
        SCOPED_TRACE("format " + std::to_string(fmt));
        std::unique_ptr<FILE, int (*)(FILE *)> f(std::fopen("/dev/full", "w"), std::fclose);
        ASSERT_NE(f.get(), nullptr);
        sp_status_t s = sp_stats_report(w_, dev_, f.get(), fmt);
        if (rank_ == 0) {
            EXPECT_SP_STATUS(s, SP_ERR_SYSTEM);
            std::string msg = sp_last_error();
            EXPECT_NE(msg.find("writing the report failed: " + std::string(strerror(ENOSPC))),
                      std::string::npos)
                << msg;
        } else {
            EXPECT_SP_OK(s);
        }
    }
}

TEST_F(StatsReport, PreparationFailureOnOneRankFailsEverywhere) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    struct Case {
        int which, bad;
        sp_status_t status;
        const char *mine;
    } cases[] = {{SP_STATS_TEST_FAIL_OP, n_ - 1, SP_ERR_MPI, "MPI_Op_create"},
                 {SP_STATS_TEST_FAIL_TABLES, 0, SP_ERR_SYSTEM, "out of host memory for rank 0"}};
    for (const Case &c : cases) {
        for (sp_report_format_t fmt : {SP_REPORT_JSON, SP_REPORT_PROMETHEUS}) {
            SCOPED_TRACE("case " + std::to_string(c.which) + " format " + std::to_string(fmt));
            if (rank_ == c.bad)
                sp__stats_test_fail_prep(c.which);
            std::unique_ptr<FILE, int (*)(FILE *)> f(std::tmpfile(), std::fclose);
            sp_status_t s = sp_stats_report(w_, dev_, f.get(), fmt);
            sp__stats_test_fail_prep(0);
            std::string msg = sp_last_error();
            EXPECT_SP_STATUS(s, c.status);
            if (rank_ == c.bad) {
                EXPECT_NE(msg.find(c.mine), std::string::npos) << msg;
            } else {
                EXPECT_NE(msg.find("rank " + std::to_string(c.bad) + " could not prepare"),
                          std::string::npos)
                    << msg;
            }
        }
    }
    // The aggregate prepares its op too; no rank-0 tables.
    sp_stats_summary_t sum;
    if (rank_ == n_ - 1)
        sp__stats_test_fail_prep(SP_STATS_TEST_FAIL_OP);
    sp_status_t s = sp_stats_aggregate(w_, dev_, &sum);
    sp__stats_test_fail_prep(0);
    EXPECT_SP_STATUS(s, SP_ERR_MPI);
    // Still in step.
    ASSERT_SP_OK(sp_stats_aggregate(w_, dev_, &sum));
    EXPECT_EQ(sum.nranks, n_);
    std::unique_ptr<FILE, int (*)(FILE *)> f(std::tmpfile(), std::fclose);
    ASSERT_SP_OK(sp_stats_report(w_, dev_, f.get(), SP_REPORT_PROMETHEUS));
}

TEST_F(StatsReport, SympoolReportPrintsAtFinalize) {
    sp::ScopedEnv env({{"SYMPOOL_REPORT", "json"}});
    sp_world_t *w2 = nullptr;
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w2));
    std::string text;
    sp_status_t s = finalize_capturing_stdout(w2, &text);
    ASSERT_EQ(s, SP_SUCCESS) << sp::describe(s);
    if (rank_ == 0) {
        Json j;
        ASSERT_TRUE(parse_json(text, &j)) << text.substr(0, 300);
        ASSERT_NE(j.get("stats"), nullptr);
        EXPECT_EQ(j.get("nranks")->i64(), n_);
    } else {
        EXPECT_EQ(text, "");
    }
}

// SYMPOOL_REPORT set on rank 0 only: rank 0 used to wait alone in the report's gather while the
// others went on (a timeout at its deadline, or a hang with none); now every rank joins one round
// at finalize, sees the settings differ, and says so, with no report and no wait. (The short
// deadline only bounds the run of a broken build: rank 0 then times out instead.)
TEST_F(StatsReport, SympoolReportOnOneRankOnlyIsAWarningOnEveryRank) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    std::unique_ptr<sp::ScopedEnv> env;
    if (rank_ == 0)
        env.reset(new sp::ScopedEnv({{"SYMPOOL_REPORT", "json"}, {"SYMPOOL_SYM_TIMEOUT", "20"}}));
    else
        env.reset(new sp::ScopedEnv({{"SYMPOOL_SYM_TIMEOUT", "20"}}));
    sp_world_t *w2 = nullptr;
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w2));
    std::string text;
    EXPECT_SP_OK(finalize_capturing_stdout(w2, &text));
    EXPECT_EQ(text, "");
    EXPECT_EQ(warnings("SYMPOOL_REPORT: no report: the ranks do not all set it alike"), 1u);
    MPI_Barrier(MPI_COMM_WORLD);
}

// A folder of this rank's own under /tmp, removed with the files named through it however the
// test ends (an ASSERT returns early). Every rank makes one: it was rank 0 alone that removed its
// own, and each run left the others' behind.
struct RankTempDir {
    char path[32] = "/tmp/sp_report_XXXXXX";
    bool made = mkdtemp(path) != nullptr;
    std::vector<std::string> files;
    std::string file(const char *name) {
        files.push_back(std::string(path) + "/" + name);
        return files.back();
    }
    bool remove() { // true if nothing is left
        for (const std::string &f : files)
            unlink(f.c_str());
        files.clear();
        if (made && rmdir(path) == 0)
            made = false;
        struct stat st;
        return stat(path, &st) != 0 && errno == ENOENT;
    }
    ~RankTempDir() { remove(); }
};

// SYMPOOL_REPORT_FILE is written like a snapshot: a FIFO is refused with a message (opening it
// for writing blocked rank 0 forever); a write that fails (a full disk; here a file size limit)
// leaves the previous report whole, and the message names the path and the cause.
TEST_F(StatsReport, ReportFileIsRegularAndWrittenAtomically) {
    expect_warnings();
    RankTempDir dir;
    ASSERT_TRUE(dir.made) << std::strerror(errno);
    std::string fifo = dir.file("report.fifo"), file = dir.file("report.json");
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    {
        sp::ScopedEnv env({{"SYMPOOL_REPORT", "json"}, {"SYMPOOL_REPORT_FILE", fifo.c_str()}});
        sp_world_t *w2 = nullptr;
        ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w2));
        ASSERT_SP_OK(sp_world_finalize(w2));
        if (rank_ == 0) {
            EXPECT_GE(warnings("is a FIFO, not a regular file"), 1u);
        }
    }
    {
        FILE *f = std::fopen(file.c_str(), "w");
        ASSERT_NE(f, nullptr);
        std::fputs("the previous report\n", f);
        std::fclose(f);
        sp::ScopedEnv env({{"SYMPOOL_REPORT", "json"}, {"SYMPOOL_REPORT_FILE", file.c_str()}});
        sp_world_t *w2 = nullptr;
        ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w2));
        struct rlimit old;
        ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
        if (rank_ == 0) { // the disk is "full" after 64 bytes
            std::signal(SIGXFSZ, SIG_IGN);
            struct rlimit small = {64, old.rlim_max};
            ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
        }
        sp_status_t s = sp_world_finalize(w2);
        if (rank_ == 0)
            setrlimit(RLIMIT_FSIZE, &old);
        ASSERT_SP_OK(s);
        if (rank_ == 0) {
            FILE *r = std::fopen(file.c_str(), "r");
            ASSERT_NE(r, nullptr);
            EXPECT_EQ(slurp(r), "the previous report\n");
            std::fclose(r);
            EXPECT_GE(warnings("SYMPOOL_REPORT_FILE: cannot write " + file), 1u);
            EXPECT_GE(warnings(std::strerror(EFBIG)), 1u);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_TRUE(dir.remove()) << dir.path << " is left on rank " << rank_;
}

// Device memory taken outside the pool (as NCCL or another library would take it) shows as
// device.untracked_bytes: in sp_device_usage, in the aggregate, in memory_summary and in the
// report. On the host backend the emulated device counts every allocation from it; under the
// CUDA doubles (label cuda_double) each process has devices of its own, and the memory comes from
// cudaMalloc.
TEST_F(StatsReport, MemoryOutsideThePoolIsUntracked) {
    // On a real GPU other processes change the device's free memory meanwhile.
    if (sp::on_gpu() && !dlsym(RTLD_DEFAULT, "cuda_double_memory_used"))
        GTEST_SKIP() << "needs the host backend or the CUDA doubles (a device nobody else uses)";
    void *held = nullptr;
    ASSERT_SP_OK(sp_malloc(4 << 20, dev_, nullptr, &held)); // sympool's own: tracked
    blocks_.push_back(held);
    sp_device_usage_t before;
    ASSERT_SP_OK(sp_device_usage(dev_, &before));
    EXPECT_GE(before.reserved, (size_t)4 << 20);
    EXPECT_EQ(before.used, before.reserved + before.untracked);
    // Rank r takes (r+1) x 3 MiB straight from the device, outside every pool.
    const size_t outside = ((size_t)rank_ + 1) * (3u << 20);
    const sp_device_ops_t *ops = nullptr;
    sp_device_caps_t caps;
    ASSERT_SP_OK(sp__device_select(&ops, &caps)); // the backend sympool already uses
    void *raw = nullptr;
    ASSERT_SP_OK(ops->mem_alloc(dev_, outside, &raw));
    sp_device_usage_t u;
    ASSERT_SP_OK(sp_device_usage(dev_, &u));
    EXPECT_EQ(u.untracked, before.untracked + outside);
    EXPECT_EQ(u.used, before.used + outside);
    EXPECT_EQ(u.reserved, before.reserved);
    expect_warnings();
    EXPECT_SP_STATUS(sp_device_usage(dev_, nullptr), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_device_usage(9999, &u), SP_ERR_INVALID_ARGUMENT);

    sp_stats_summary_t sum;
    ASSERT_SP_OK(sp_stats_aggregate(w_, dev_, &sum));
    size_t iu = sp_stats_summary_count();
    for (size_t i = 0; i < sp_stats_summary_count(); i++)
        if (std::strcmp(sp_stats_summary_key(i), "device.untracked_bytes") == 0)
            iu = i;
    ASSERT_LT(iu, sp_stats_summary_count());
    EXPECT_EQ(sp_stats_summary_key(sp_stats_summary_count()), nullptr);
    EXPECT_EQ(sum.max_rank[iu], n_ - 1) << "the rank that took the most";
    EXPECT_GE(sum.max[iu], (int64_t)(n_ * (3 << 20)));

    char buf[8192];
    ASSERT_SP_OK(sp_memory_summary(dev_, buf, sizeof buf));
    std::string summary = buf;
    EXPECT_NE(summary.find("not sympool's"), std::string::npos) << summary;
    EXPECT_NE(summary.find("Device used"), std::string::npos) << summary;

    std::string text = report(SP_REPORT_TABLE);
    ASSERT_SP_OK(ops->mem_free(dev_, raw, outside));
    sp_device_usage_t after;
    ASSERT_SP_OK(sp_device_usage(dev_, &after));
    EXPECT_EQ(after.untracked, before.untracked);
    if (rank_ == 0) {
        size_t row = text.find("\ndevice.untracked_bytes ");
        ASSERT_NE(row, std::string::npos) << text;
        std::string line = text.substr(row + 1, text.find('\n', row + 1) - row - 1);
        if (n_ > 1) {
            std::string at = std::to_string(n_ - 1) + "@";
            EXPECT_NE(line.find(" " + at), std::string::npos) << line;
        }
    }
}

// Collectives are counted per world as able to use symmetric kernels or not, and the reason for
// a fallback is logged at INFO.
TEST_F(StatsReport, CollectivesAreCountedEligibleOrFallback) {
    SP_SKIP_BELOW_RANKS(2);
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sym_pool_create(w_, "eligible", false, &pool));
    float *sym = nullptr, *plain = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool, 64 * sizeof(float), nullptr, (void **)&sym));
    ASSERT_SP_OK(sp_malloc(64 * sizeof(float), dev_, nullptr, (void **)&plain));
    auto counts = [&](int64_t *eligible, int64_t *fallback) {
        std::string text = report(SP_REPORT_JSON);
        int64_t v[2] = {0, 0};
        if (rank_ == 0) {
            Json j;
            ASSERT_TRUE(parse_json(text, &j));
            v[0] = j.get("symmetric")->get("collectives_eligible")->get("min")->i64();
            v[1] = j.get("symmetric")->get("collectives_fallback")->get("min")->i64();
        }
        MPI_Bcast(v, 2, MPI_INT64_T, 0, MPI_COMM_WORLD);
        *eligible = v[0];
        *fallback = v[1];
    };
    // NCCL 2.28 runs symmetric kernels within one node only: on cuda, a world over several nodes
    // counts even the call on symmetric buffers as a fallback, with that reason.
    const bool across_nodes = sp::on_gpu() && sp_world_node_count(w_) > 1;
    int64_t e0, f0, e1, f1, e2, f2;
    counts(&e0, &f0);
    ASSERT_SP_OK(sp_allreduce(w_, sym, sym, 64, SP_FLOAT32, SP_SUM, nullptr));
    counts(&e1, &f1);
    EXPECT_EQ(e1, across_nodes ? e0 : e0 + 1);
    EXPECT_EQ(f1, across_nodes ? f0 + 1 : f0);
    {
        sp::ScopedEnv env({{"SYMPOOL_DEBUG", "INFO"}, {"SYMPOOL_DEBUG_SUBSYS", "COLL"}});
        ASSERT_SP_OK(sp_allreduce(w_, plain, plain, 64, SP_FLOAT32, SP_SUM, nullptr));
        EXPECT_EQ(
            log_.count(SP_LOG_INFO,
                       std::string("sp_allreduce(64 x float32, sum): not symmetric kernels: ") +
                           (across_nodes ? "ranks span several nodes"
                                         : "send buffer is not in a registered symmetric "
                                           "segment")),
            1u);
    }
    counts(&e2, &f2);
    EXPECT_EQ(e2, e1);
    EXPECT_EQ(f2, f1 + 1);
    ASSERT_SP_OK(sp_free(sym));
    ASSERT_SP_OK(sp_free(plain));
    ASSERT_SP_OK(sp_symmetric_mempool_destroy(pool));
}

} // namespace
