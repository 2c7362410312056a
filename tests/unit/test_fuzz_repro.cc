// test_fuzz_repro.cc: every input in tests/fuzz/repro (defects found by fuzzing or by hand:
// extreme sizes, times and addresses; files the loaders with and without stacks read differently)
// goes through what the fuzzer runs (fuzz_one.c: the pickle reader and the trace loader, and the
// loader without stacks against the one with them). Each must load or be refused alike, never
// crash; the ASan/UBSan and TSan builds run this too. tests/fuzz/run.sh also seeds the fuzzer with
// them.
#include <dirent.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/fuzz/fuzz_one.h"

#ifndef SP_FUZZ_REPRO_DIR
#error "SP_FUZZ_REPRO_DIR names tests/fuzz/repro"
#endif

namespace {

std::vector<std::string> repro_files() {
    std::vector<std::string> out;
    DIR *d = opendir(SP_FUZZ_REPRO_DIR);
    if (!d)
        return out;
    while (dirent *e = readdir(d)) {
        std::string n = e->d_name;
        if (n.size() > 7 &&
            (n.rfind(".pickle") == n.size() - 7 || n.rfind(".json") == n.size() - 5))
            out.push_back(std::string(SP_FUZZ_REPRO_DIR) + "/" + n);
    }
    closedir(d);
    return out;
}

TEST(FuzzRepro, EveryReproducerLoadsOrIsRefused) {
    auto files = repro_files();
    ASSERT_FALSE(files.empty()) << "no reproducers in " << SP_FUZZ_REPRO_DIR;
    int loaded = 0;
    for (const auto &path : files) {
        std::ifstream in(path, std::ios::binary);
        std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
        bool json = path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0;
        loaded += sp_fuzz_one(data.data(), data.size(), json ? 1 : 0);
    }
    // The six handled ones (time going backwards, the largest legal size, an entry whose
    // pool_id is an int, a key that is no string after a skipped stack, an entry that is also
    // the settings, an action written as a SHORT_BINSTRING, which pickle.load reads as a str)
    // load; the rest are refused (tests/fuzz/cli_extreme.py checks the messages through the
    // CLI), among them what pickle.load refuses in a stack: a name that is not UTF-8, a frame
    // keyed by a dict. Each also goes through both loaders, which must agree (fuzz_one.c).
    EXPECT_EQ(loaded, 6);
}

} // namespace
