// test_world_nodes.cc: which rank is on which node, and what follows from it: the node table
// (sp_world_node, sp_world_node_name), local rank and size, and the device by local rank (peer
// pointers within a node only: test_symmetric.cc). Under a plain mpirun every rank is on one node;
// under tests/multinode/mn-run.sh (ctest label multinode) the ranks are spread over hosts that
// differ in name and network, and SP_TEST_EXPECT_NODES says how many there must be.
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "mpi_util.hpp"

extern "C" {
#include "world/world.h"
}

namespace {

class WorldNodes : public WorldTest {
  protected:
    // Every rank's short host name, in rank order (the test's own gather, not sympool's).
    std::vector<std::string> hosts() {
        char mine[SP_WORLD_NODE_NAME] = {0};
        gethostname(mine, sizeof mine - 1);
        if (char *dot = std::strchr(mine, '.'))
            *dot = '\0';
        std::vector<char> all((size_t)mpi_size() * SP_WORLD_NODE_NAME);
        MPI_Allgather(mine, SP_WORLD_NODE_NAME, MPI_CHAR, all.data(), SP_WORLD_NODE_NAME, MPI_CHAR,
                      MPI_COMM_WORLD);
        std::vector<std::string> out;
        for (int r = 0; r < mpi_size(); r++)
            out.emplace_back(&all[(size_t)r * SP_WORLD_NODE_NAME]);
        return out;
    }
};

// The node table agrees with the host names and with MPI's own shared-memory split: ranks share
// a node exactly when they share a host name, and the node's name is that host name.
TEST_F(WorldNodes, NodesAreHostsAndMpiSharedMemorySplits) {
    std::vector<std::string> host = hosts();
    std::set<std::string> distinct(host.begin(), host.end());
    EXPECT_EQ(sp_world_node_count(w_), (int)distinct.size());
    if (const char *want = std::getenv("SP_TEST_EXPECT_NODES")) {
        EXPECT_EQ(sp_world_node_count(w_), std::atoi(want))
            << "the job was started over " << want << " nodes";
    }
    int lowest_of_prev = -1;
    for (int node = 0; node < sp_world_node_count(w_); node++) {
        const char *name = sp_world_node_name(w_, node);
        ASSERT_NE(name, nullptr);
        int lowest = -1;
        for (int r = 0; r < n_ && lowest < 0; r++)
            if (sp_world_node(w_, r) == node)
                lowest = r;
        ASSERT_GE(lowest, 0) << "node " << node << " has no rank";
        EXPECT_GT(lowest, lowest_of_prev) << "nodes are numbered by their lowest rank";
        lowest_of_prev = lowest;
        EXPECT_EQ(host[(size_t)lowest], name);
    }
    for (int r = 0; r < n_; r++) {
        EXPECT_EQ(host[(size_t)r] == host[(size_t)rank_],
                  sp_world_node(w_, r) == sp_world_node(w_, rank_))
            << "rank " << r << " on " << host[(size_t)r] << ", this rank on "
            << host[(size_t)rank_];
        EXPECT_EQ(sp__world_node_rank_of(w_, r) >= 0,
                  sp_world_node(w_, r) == sp_world_node(w_, rank_));
    }
    // MPI's split, made here independently, holds exactly the ranks of this node.
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    int ls = 0;
    MPI_Comm_size(node, &ls);
    MPI_Comm_free(&node);
    int on_my_node = 0;
    for (int r = 0; r < n_; r++)
        on_my_node += sp_world_node(w_, r) == sp_world_node(w_, rank_);
    EXPECT_EQ(on_my_node, ls);
    EXPECT_EQ(sp_world_local_size(w_), ls);
    // Out of range and NULL.
    EXPECT_EQ(sp_world_node(w_, -1), -1);
    EXPECT_EQ(sp_world_node(w_, n_), -1);
    EXPECT_EQ(sp_world_node_name(w_, sp_world_node_count(w_)), nullptr);
    EXPECT_EQ(sp_world_node_name(w_, -1), nullptr);
    EXPECT_EQ(sp_world_node_count(nullptr), 0);
    EXPECT_EQ(sp_world_node(nullptr, 0), -1);
    EXPECT_EQ(sp_world_node_name(nullptr, 0), nullptr);
    EXPECT_EQ(sp_world_local_size(nullptr), 0);
}

// Local rank = position among this node's ranks in world order; the device is local rank modulo
// the node's device count, so every node starts again at device 0.
TEST_F(WorldNodes, LocalRankCountsPerNodeAndPicksTheDevice) {
    int local = 0;
    for (int r = 0; r < rank_; r++)
        local += sp_world_node(w_, r) == sp_world_node(w_, rank_);
    EXPECT_EQ(sp_world_local_rank(w_), local);
    ASSERT_GT(sp_device_count(), 0);
    EXPECT_EQ(sp_world_device(w_), local % sp_device_count());
    if (sp_world_node_count(w_) > 1) {
        // The lowest rank of every node has local rank 0, wherever it is in the world.
        std::vector<int> locals((size_t)n_);
        int mine = sp_world_local_rank(w_);
        MPI_Allgather(&mine, 1, MPI_INT, locals.data(), 1, MPI_INT, MPI_COMM_WORLD);
        std::set<int> firsts;
        for (int r = 0; r < n_; r++)
            if (locals[(size_t)r] == 0)
                firsts.insert(sp_world_node(w_, r));
        EXPECT_EQ((int)firsts.size(), sp_world_node_count(w_));
    }
}

} // namespace
