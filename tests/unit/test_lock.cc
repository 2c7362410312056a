// test_lock.cc: the device lock's single-threaded path (core/core_lock.h). While the process has
// one thread the lock is taken and given back with plain stores; these tests check that a thread
// born while the lock is held that way still waits for it and is woken by its unlock, and that
// the lock keeps excluding once threads exist, and that a waiter whose wake was missed (the plain
// store's store-buffer window) still takes the lock when it is free. Each ctest case runs in a
// fresh process, so the first test starts single-threaded; run as one binary it may not, and then
// says so and skips.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "lock_probe.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRebiased = 4; // SP_LOCK_REBIASED

// Waits up to 10 s for pred(); true if it became true.
template <class Pred> bool wait_for(Pred pred) {
    auto end = Clock::now() + std::chrono::seconds(10);
    while (!pred()) {
        if (Clock::now() > end)
            return false;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return true;
}

TEST(LockAlone, AThreadBornWhileTheLockIsHeldWaitsAndIsWoken) {
    if (!sp_probe_alone())
        GTEST_SKIP() << "this process already has threads (the binary ran whole): the "
                        "single-threaded path cannot be reached here";
    void *l = sp_probe_lock_new();
    ASSERT_NE(l, nullptr);
    sp_probe_lock(l);
    EXPECT_EQ(sp_probe_lock_word(l), 3); // SP_LOCK_ALONE: taken with a plain store
    std::atomic<int> stage{0};
    std::thread contender([&] {
        stage.store(1);
        sp_probe_lock(l);
        stage.store(2);
        sp_probe_unlock(l);
    });
    EXPECT_FALSE(sp_probe_alone());
    // The contender spins, then counts itself a sleeper and sleeps in the kernel.
    ASSERT_TRUE(wait_for([&] { return sp_probe_lock_sleepers(l) == 1; }))
        << "the contender never slept on the lock (word " << sp_probe_lock_word(l) << ")";
    EXPECT_EQ(stage.load(), 1) << "the contender took a held lock";
    sp_probe_unlock(l); // not alone any more: must wake the sleeper
    bool woke = wait_for([&] { return stage.load() == 2; });
    EXPECT_TRUE(woke) << "the unlock did not wake the thread asleep on the lock";
    if (!woke) // wake it by hand so that the join below cannot hang
        sp_probe_wake(l);
    contender.join();
    EXPECT_EQ(sp_probe_lock_word(l), 0);
    std::free(l);
}

TEST(LockAlone, ExcludesOnceThreadsExist) {
    void *l = sp_probe_lock_new();
    ASSERT_NE(l, nullptr);
    long counter = 0; // plain: only the lock orders the increments
    const long per_thread = 200000;
    auto work = [&] {
        for (long i = 0; i < per_thread; i++) {
            sp_probe_lock(l);
            counter = counter + 1;
            sp_probe_unlock(l);
        }
    };
    std::thread a(work), b(work);
    a.join();
    b.join();
    EXPECT_EQ(counter, 2 * per_thread);
    EXPECT_EQ(sp_probe_lock_word(l), 0);
    std::free(l);
}

// Four threads, some holds long enough that the others spin out and sleep: every increment is
// made under the lock, and when they are done nobody is counted asleep and no wake is flagged
// on its way (the sleepers' word is back to 0).
TEST(LockShared, ExcludesWithSleepersAndEndsWithNobodyCounted) {
    void *l = sp_probe_lock_new();
    ASSERT_NE(l, nullptr);
    long counter = 0;
    const long per_thread = 3000;
    auto work = [&] {
        for (long i = 0; i < per_thread; i++) {
            sp_probe_lock(l);
            long seen = counter;
            if (i % 100 == 0) // long enough for the others to give up spinning
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            counter = seen + 1;
            sp_probe_unlock(l);
        }
    };
    std::thread t[4];
    for (auto &x : t)
        x = std::thread(work);
    for (auto &x : t)
        x.join();
    EXPECT_EQ(counter, 4 * per_thread);
    EXPECT_EQ(sp_probe_lock_word(l), 0);
    EXPECT_EQ(sp_probe_lock_sleepers_word(l), 0);
    std::free(l);
}

// The unlock's plain store may let the unlocker read the sleepers before its store is visible,
// and miss a sleeper's wake; the sleep's bound makes that waiter look again. Here the lock is
// given back with no wake at all: the waiter must still get it (without the bound it would sleep
// until woken by hand below, and the test fails).
TEST(LockShared, AWaiterWhoseWakeIsMissedStillTakesTheFreedLock) {
    void *l = sp_probe_lock_new();
    ASSERT_NE(l, nullptr);
    std::atomic<int> stage{0};
    std::thread holder_started([] {}); // the process is multi-threaded from here
    holder_started.join();
    sp_probe_lock(l);
    std::thread contender([&] {
        stage.store(1);
        sp_probe_lock(l);
        stage.store(2);
        sp_probe_unlock(l);
    });
    ASSERT_TRUE(wait_for([&] { return sp_probe_lock_sleepers(l) == 1; }))
        << "the contender never slept on the lock (word " << sp_probe_lock_word(l) << ")";
    EXPECT_EQ(stage.load(), 1) << "the contender took a held lock";
    sp_probe_release_silently(l);
    bool took = wait_for([&] { return stage.load() == 2; });
    EXPECT_TRUE(took) << "a waiter whose wake was missed slept on with the lock free";
    if (!took)
        sp_probe_wake(l);
    contender.join();
    EXPECT_EQ(sp_probe_lock_word(l), 0);
    EXPECT_EQ(sp_probe_lock_sleepers(l), 0);
    std::free(l);
}

// A child forked while a thread sleeps on a lock its parent holds inherits the count of that
// sleeper, who does not exist in the child; sp__lock_fork_child (what the fork handler calls)
// forgets it, so the child's unlocks leave the sleepers' word at 0 and stop looking for sleepers.
TEST(LockShared, AForkChildForgetsTheParentsSleepers) {
    void *l = sp_probe_lock_new();
    ASSERT_NE(l, nullptr);
    std::thread started([] {});
    started.join();
    sp_probe_lock(l);
    std::atomic<int> stage{0};
    std::thread contender([&] {
        sp_probe_lock(l);
        stage.store(1);
        sp_probe_unlock(l);
    });
    // The contender's sleep is bounded (SP_LOCK_SLEEP_NS): between the look below and the fork
    // it may be out of the sleep, spinning, and the child then inherits no sleeper (exit 10,
    // nothing to test). Fork again until a child inherits one; every such child must forget it.
    int status = 0, tries = 0;
    do {
        ASSERT_TRUE(wait_for([&] { return sp_probe_lock_sleepers(l) == 1; }));
        pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            int code = sp_probe_lock_sleepers(l) == 1 && sp_probe_lock_waiting(l) == 1 ? 0 : 10;
            sp_probe_fork_child(l);
            sp_probe_unlock(l);
            sp_probe_lock(l);
            sp_probe_unlock(l);
            if (code == 0 && (sp_probe_lock_word(l) != 0 || sp_probe_lock_sleepers_word(l) != 0 ||
                              sp_probe_lock_waiting(l) != 0))
                code = 11;
            _exit(code);
        }
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        ASSERT_TRUE(WIFEXITED(status));
    } while (WEXITSTATUS(status) == 10 && ++tries < 200);
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << "10: no child of " << tries << " inherited a sleeper; 11: one left counted";
    sp_probe_unlock(l);
    ASSERT_TRUE(wait_for([&] { return stage.load() == 1; }));
    contender.join();
    std::free(l);
}

// With the calling thread inside l biased: another thread that takes l takes the word (1) and
// waits; it enters only after this thread's unlock (which this gives).
static void expect_revoker_waits_for_owner(void *l) {
    std::atomic<int> entered{0};
    std::thread revoker([&] {
        sp_probe_lock(l);
        entered.store(1);
        sp_probe_unlock(l);
    });
    ASSERT_TRUE(wait_for([&] { return sp_probe_lock_word(l) == 1; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(entered.load(), 0) << "entered while the owner was inside";
    sp_probe_unlock(l);
    ASSERT_TRUE(wait_for([&] { return entered.load() == 1; }));
    revoker.join();
}

// The fork handler takes every device lock in its prepare step; the forking thread enters the ones
// it owns biased. Another thread that wants one meanwhile takes its word (1) and waits for the
// forking thread to leave: forked then, the child inherits a word held by a revoker it does not
// have. sp__lock_fork_child (what the child's handler calls before its unlock) gives that word to
// the forking thread, so that its unlock frees the lock (it gave back only its biased entry, and
// the child's next take of the lock waited forever). rebias: the forking thread owns a re-bias
// (its entry in its record), else the first bias.
static void expect_fork_child_frees_a_lock_a_revoker_waits_for(void *l, bool rebias) {
    sp_probe_lock(l); // inside, biased
    ASSERT_EQ(sp_probe_lock_word(l), rebias ? kRebiased : 2);
    ASSERT_EQ(rebias ? sp_probe_lock_rebiased_in(l) : sp_probe_lock_in(l), 1);
    std::atomic<int> entered{0};
    std::thread revoker([&] {
        sp_probe_lock(l);
        entered.store(1);
        sp_probe_unlock(l);
    });
    ASSERT_TRUE(wait_for([&] { return sp_probe_lock_word(l) == 1; })) << "no revocation began";
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) { // the handler's steps, then a take and a look (no wait: no thread here)
        sp_probe_fork_child(l);
        sp_probe_unlock(l);
        _exit(sp_probe_lock_word(l) == 0 && sp_probe_lock_in(l) == 0 &&
                      sp_probe_lock_rebiased_in(l) == 0
                  ? 0
                  : 10 + sp_probe_lock_word(l));
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's lock is held (11: by the parent's revoker)";
    sp_probe_unlock(l);
    ASSERT_TRUE(wait_for([&] { return entered.load() == 1; }));
    revoker.join();
}

TEST(LockBias, AForkChildFreesALockWhoseRevokerItDoesNotHave) {
    if (!sp_probe_bias_begin())
        GTEST_SKIP() << "no bias here (no membarrier, or another thread owned it)";
    void *l = sp_probe_lock_new();
    ASSERT_NE(l, nullptr);
    sp_probe_bias(l);
    ASSERT_NO_FATAL_FAILURE(expect_fork_child_frees_a_lock_a_revoker_waits_for(l, false));
    std::free(l);
}

// The bias (core_lock.h): the owner enters with plain stores, another thread revokes the bias
// (the word from BIASED to 1, a process-wide barrier, a wait for the owner's `in` to be 0). In
// each of many trials a fresh biased lock is hammered by the owner and by a second thread that
// starts while the owner is at it, both incrementing under the lock with a pause between the
// read and the write: every increment counts, and the lock ends an ordinary free lock with
// nobody inside.
TEST(LockBias, OwnerAndAnotherThreadExcludeAcrossTheRevocation) {
    const int trials = 200;
    for (int t = 0; t < trials; t++) {
        if (!sp_probe_bias_begin())
            GTEST_SKIP() << "no bias here (no membarrier, or another thread owned it)";
        void *l = sp_probe_lock_new();
        ASSERT_NE(l, nullptr);
        sp_probe_bias(l);
        long counter = 0;
        const long per_thread = 2000;
        std::atomic<int> ready{0};
        auto work = [&] {
            for (long i = 0; i < per_thread; i++) {
                sp_probe_lock(l);
                long seen = counter;
                for (volatile int k = 0; k < 10; k = k + 1) {
                }
                counter = seen + 1;
                sp_probe_unlock(l);
            }
        };
        std::thread other([&] {
            ready.store(1);
            while (ready.load() != 2) {
            }
            work();
        });
        while (ready.load() != 1) {
        }
        sp_probe_lock(l); // the owner, biased, before the other thread can start
        EXPECT_EQ(sp_probe_lock_in(l), 1);
        counter = counter + 1;
        sp_probe_unlock(l);
        ready.store(2);
        work();
        other.join();
        ASSERT_EQ(counter, 2 * per_thread + 1) << "trial " << t;
        // An ordinary lock after the revocation, or re-biased to the thread whose last
        // SP_LOCK_STREAK takes came in a row (the other one had finished); nobody inside.
        const int word = sp_probe_lock_word(l);
        EXPECT_TRUE((word == 0 && sp_probe_bias_gone() == 1) ||
                    (word == kRebiased && sp_probe_bias_gone() == 0))
            << "word " << word << ", gone " << sp_probe_bias_gone();
        EXPECT_EQ(sp_probe_lock_in(l), 0);
        EXPECT_EQ(sp_probe_lock_rebiased_in(l), 0);
        std::free(l);
    }
}

// A revoker that comes while the owner is inside takes the word (1) and waits: it enters only
// after the owner's unlock; the owner's next lock is then an ordinary one.
TEST(LockBias, TheRevokerWaitsForTheOwnerInside) {
    if (!sp_probe_bias_begin())
        GTEST_SKIP() << "no bias here (no membarrier, or another thread owned it)";
    void *l = sp_probe_lock_new();
    ASSERT_NE(l, nullptr);
    sp_probe_bias(l);
    sp_probe_lock(l);
    EXPECT_EQ(sp_probe_lock_word(l), 2) << "held by the owner, biased";
    EXPECT_EQ(sp_probe_lock_in(l), 1);
    ASSERT_NO_FATAL_FAILURE(expect_revoker_waits_for_owner(l));
    sp_probe_lock(l);
    EXPECT_EQ(sp_probe_lock_word(l), 1) << "the owner takes it as anyone now";
    EXPECT_EQ(sp_probe_lock_in(l), 0);
    sp_probe_unlock(l);
    EXPECT_EQ(sp_probe_lock_word(l), 0);
    std::free(l);
}

// Once a bias is gone in the process, the owner turns its other biased locks into ordinary ones
// at their next lock (so that its hits take the CAS with everybody's), with no revocation.
TEST(LockBias, TheOwnerUnbiasesItsOtherLocksOnceTheBiasIsGone) {
    if (!sp_probe_bias_begin())
        GTEST_SKIP() << "no bias here (no membarrier, or another thread owned it)";
    void *a = sp_probe_lock_new(), *b = sp_probe_lock_new();
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    sp_probe_bias(a);
    sp_probe_bias(b);
    EXPECT_EQ(sp_probe_bias_gone(), 0);
    std::thread other([&] {
        sp_probe_lock(a);
        sp_probe_unlock(a);
    });
    other.join();
    EXPECT_EQ(sp_probe_bias_gone(), 1);
    EXPECT_EQ(sp_probe_lock_word(b), 2) << "nobody touched b";
    sp_probe_lock(b);
    EXPECT_EQ(sp_probe_lock_word(b), 1);
    EXPECT_EQ(sp_probe_lock_in(b), 0);
    sp_probe_unlock(b);
    EXPECT_EQ(sp_probe_lock_word(b), 0);
    std::free(a);
    std::free(b);
}

// A lock biased to nobody yet goes to its first taker: that thread then holds it biased (the
// word says BIASED while it is inside, `in` is 1) and takes it so again; a second thread revokes.
TEST(LockBias, TheFirstTakerOfANobodysLockOwnsIt) {
    if (!sp_probe_bias_begin())
        GTEST_SKIP() << "no bias here (no membarrier)";
    void *l = sp_probe_lock_new();
    ASSERT_NE(l, nullptr);
    sp_probe_bias_nobody(l);
    std::atomic<int> stage{0};
    std::thread first([&] {
        for (int i = 0; i < 2; i++) {
            sp_probe_lock(l);
            if (sp_probe_lock_word(l) == 2 && sp_probe_lock_in(l) == 1)
                stage.fetch_add(1);
            sp_probe_unlock(l);
        }
        while (stage.load() != 3) {
        }
    });
    ASSERT_TRUE(wait_for([&] { return stage.load() == 2; })) << "the first taker did not own it";
    EXPECT_EQ(sp_probe_lock_in(l), 0);
    EXPECT_EQ(sp_probe_lock_word(l), 2);
    sp_probe_lock(l); // while the owner still lives: a revocation
    EXPECT_EQ(sp_probe_lock_word(l), 1);
    EXPECT_EQ(sp_probe_lock_in(l), 0);
    sp_probe_unlock(l);
    EXPECT_EQ(sp_probe_bias_gone(), 1);
    stage.store(3);
    first.join();
    std::free(l);
}

// The re-bias tests: each starts from a fresh bias (sp_probe_bias_begin: pinned streak) and a
// lock whose first bias the test's thread owns; without membarrier there is no bias to test.
class LockRebias : public ::testing::Test {
  protected:
    void SetUp() override {
        if (!sp_probe_bias_begin())
            GTEST_SKIP() << "no bias here (no membarrier)";
        l = sp_probe_lock_new();
        ASSERT_NE(l, nullptr);
        sp_probe_bias(l);
    }
    void TearDown() override { std::free(l); }
    void *l = nullptr;
};

// Re-biasing (core_lock.h): a thread that takes a biasable lock with the CAS SP_LOCK_STREAK
// times in a row gets it biased to itself (the word REBIASED, its entries plain stores into its
// own record); the next other thread revokes that bias as it revoked the first.
TEST_F(LockRebias, AStreakOfCasTakesRebiasesTheLockToItsThread) {
    const int streak = sp_probe_lock_streak();
    std::atomic<int> step{0};
    std::thread b([&] {
        sp_probe_lock(l); // revokes the first bias: the first take of its streak
        EXPECT_EQ(sp_probe_lock_word(l), 1);
        sp_probe_unlock(l);
        EXPECT_EQ(sp_probe_bias_gone(), 1);
        for (int i = 2; i < streak; i++) {
            sp_probe_lock(l);
            sp_probe_unlock(l);
        }
        EXPECT_EQ(sp_probe_lock_word(l), 0) << "one take short of the streak: ordinary";
        EXPECT_EQ(sp_probe_rebias_era(), 0);
        sp_probe_lock(l);
        sp_probe_unlock(l);
        EXPECT_EQ(sp_probe_lock_word(l), kRebiased) << "the streak's last take re-biases";
        EXPECT_EQ(sp_probe_bias_gone(), 0);
        EXPECT_EQ(sp_probe_rebias_era(), 1);
        sp_probe_lock(l);
        EXPECT_EQ(sp_probe_lock_word(l), kRebiased) << "entered with plain stores";
        EXPECT_EQ(sp_probe_lock_rebiased_in(l), 1);
        sp_probe_unlock(l);
        EXPECT_EQ(sp_probe_lock_rebiased_in(l), 0);
        step.store(1);
        while (step.load() != 2) {
        }
    });
    ASSERT_TRUE(wait_for([&] { return step.load() == 1; }));
    sp_probe_lock(l); // the first owner, now another thread: revokes the re-bias
    EXPECT_EQ(sp_probe_lock_word(l), 1);
    EXPECT_EQ(sp_probe_bias_gone(), 1);
    EXPECT_EQ(sp_probe_lock_rebiased_in(l), 0);
    sp_probe_unlock(l);
    EXPECT_EQ(sp_probe_lock_word(l), 0);
    step.store(2);
    b.join();
}

// Makes l re-biased to the calling thread (it must not own it yet): a streak of CAS takes.
static void rebias_to_me(void *l) {
    for (int i = 0; i < sp_probe_lock_streak(); i++) {
        sp_probe_lock(l);
        sp_probe_unlock(l);
    }
}

// A revoker that comes while the re-bias owner is inside takes the word (1) and waits for the
// owner's record to let go of the lock.
TEST_F(LockRebias, TheRevokerWaitsForTheRebiasedOwnerInside) {
    std::thread([&] { rebias_to_me(l); }).join(); // revokes, then the streak (its thread ended)
    ASSERT_EQ(sp_probe_lock_word(l), kRebiased);
    std::thread([&] {
        sp_probe_lock(l);
        sp_probe_unlock(l);
    }).join(); // an ended owner: no wait
    EXPECT_EQ(sp_probe_lock_word(l), 0);
    rebias_to_me(l);
    ASSERT_EQ(sp_probe_lock_word(l), kRebiased);
    sp_probe_lock(l);
    EXPECT_EQ(sp_probe_lock_rebiased_in(l), 1);
    ASSERT_NO_FATAL_FAILURE(expect_revoker_waits_for_owner(l));
}

// A former owner stopped between its look at the owner and its store enters with its own record:
// its store lands there, the checks after it send it back, and the new owner inside is still
// seen inside (what an entry word kept in the lock would lose).
TEST_F(LockRebias, AFormerOwnerStoppedInItsEntryStepsBack) {
    std::atomic<void *> a_rec{nullptr};
    std::atomic<int> step{0};
    std::thread a([&] {
        rebias_to_me(l);
        a_rec.store(sp_probe_lock_rec_owner(l));
        step.store(1);
        while (step.load() != 2) {
        }
        // What this thread read before it was stopped: its own record as the owner's.
        EXPECT_EQ(sp_probe_enter_rebiased_as(l, a_rec.load()), 0) << "entered a lock it lost";
        step.store(3);
        while (step.load() != 4) {
        }
    });
    ASSERT_TRUE(wait_for([&] { return step.load() == 1; }));
    rebias_to_me(l); // revokes a's re-bias, then takes it for this thread
    ASSERT_EQ(sp_probe_lock_word(l), kRebiased);
    ASSERT_NE(sp_probe_lock_rec_owner(l), a_rec.load());
    sp_probe_lock(l); // inside
    step.store(2);
    ASSERT_TRUE(wait_for([&] { return step.load() == 3; }));
    EXPECT_EQ(sp_probe_lock_rebiased_in(l), 1) << "the owner inside is still seen inside";
    EXPECT_EQ(sp_probe_lock_word(l), kRebiased);
    sp_probe_unlock(l);
    step.store(4);
    a.join();
}

// A thread holding a re-biased lock takes another it owns (the shutdown and the fork handler take
// every device lock): as an ordinary lock, given back re-biased to it, nothing counted as lost.
TEST_F(LockRebias, ANestedTakeGivesTheBiasBack) {
    void *a = l, *b = sp_probe_lock_new();
    ASSERT_NE(b, nullptr);
    sp_probe_bias(b);
    std::thread([&] { // another thread's streaks: both locks re-biased to it
        rebias_to_me(a);
        rebias_to_me(b);
        ASSERT_EQ(sp_probe_lock_word(a), kRebiased);
        ASSERT_EQ(sp_probe_lock_word(b), kRebiased);
        EXPECT_EQ(sp_probe_bias_gone(), 0);
        sp_probe_lock(a);
        sp_probe_lock(b);
        EXPECT_EQ(sp_probe_lock_word(b), 1) << "the second as an ordinary lock";
        EXPECT_EQ(sp_probe_lock_rebiased_in(a), 1);
        sp_probe_unlock(b);
        EXPECT_EQ(sp_probe_lock_word(b), kRebiased) << "given back re-biased";
        sp_probe_unlock(a);
        EXPECT_EQ(sp_probe_bias_gone(), 0);
        sp_probe_lock(b);
        EXPECT_EQ(sp_probe_lock_rebiased_in(b), 1) << "its owner enters it biased again";
        sp_probe_unlock(b);
    })
        .join();
    std::free(b);
}

// As LockBias.AForkChildFreesALockWhoseRevokerItDoesNotHave, the forking thread inside a re-bias.
TEST_F(LockRebias, AForkChildFreesALockWhoseRevokerItDoesNotHave) {
    std::thread([&] {
        sp_probe_lock(l);
        sp_probe_unlock(l);
    }).join(); // revokes the first bias
    rebias_to_me(l);
    ASSERT_EQ(sp_probe_lock_word(l), kRebiased);
    ASSERT_NO_FATAL_FAILURE(expect_fork_child_frees_a_lock_a_revoker_waits_for(l, true));
}

// Records are never freed, and a thread's goes back when it ends: more threads than there are
// records become owners one after another, and each is re-biased to in its turn.
TEST_F(LockRebias, TheRecordsOfEndedThreadsAreTakenAgain) {
    const int threads = 1100; // more than core_lock.c's RECS
    for (int t = 0; t < threads; t++) {
        int word = -1;
        std::thread([&] {
            rebias_to_me(l);
            word = sp_probe_lock_word(l);
        }).join();
        ASSERT_EQ(word, kRebiased) << "thread " << t;
    }
}

// The lock changing hands: three threads take turns (bursts longer than a streak, so the lock is
// re-biased at every turn and revoked at the next), then hammer it all at once in bursts of
// random lengths; every increment made under the lock counts.
TEST_F(LockRebias, ExcludesWhileTheBiasMovesBetweenThreads) {
    const int nthreads = 3, turns = 12, burst = sp_probe_lock_streak() + 200;
    const long free_for_all = 20000;
    long counter = 0;
    std::atomic<int> turn{0};
    auto add = [&] {
        sp_probe_lock(l);
        long seen = counter;
        for (volatile int k = 0; k < 4; k = k + 1) {
        }
        counter = seen + 1;
        sp_probe_unlock(l);
    };
    std::vector<std::thread> th;
    for (int id = 0; id < nthreads; id++)
        th.emplace_back([&, id] {
            for (int t = id; t < turns; t += nthreads) {
                while (turn.load() != t) {
                }
                for (int i = 0; i < burst; i++)
                    add();
                turn.store(t + 1);
            }
            unsigned seed = 12345u + (unsigned)id;
            for (long done = 0; done < free_for_all;) {
                seed = seed * 1103515245u + 12345u;
                long n = (seed >> 16) % 3 == 0 ? 1500 : 1 + (seed >> 16) % 40;
                for (long i = 0; i < n && done < free_for_all; i++, done++)
                    add();
                std::this_thread::yield();
            }
        });
    for (auto &t : th)
        t.join();
    EXPECT_EQ(counter, (long)turns * burst + nthreads * free_for_all);
    EXPECT_EQ(sp_probe_rebias_era(), 1) << "the turns re-biased the lock";
    EXPECT_EQ(sp_probe_lock_rebiased_in(l), 0);
    EXPECT_EQ(sp_probe_lock_in(l), 0);
}

// The streak follows what revocations cost (the barrier's time, a running average, over 2.5 ns),
// between SP_LOCK_STREAK and INT16_MAX takes: a lock re-biased and revoked at once has cost at
// most about half again the streak's CAS takes.
TEST_F(LockRebias, TheStreakFollowsTheBarriersCost) {
    sp_probe_streak_pin(0); // follow, from SP_LOCK_STREAK (SetUp's fresh start saw no barrier)
    EXPECT_EQ(sp_probe_lock_streak(), 1024);
    EXPECT_EQ(sp_probe_streak_after_barrier(100), 1024) << "a cheap barrier: the floor";
    EXPECT_EQ(sp_probe_streak_after_barrier(20000), 2030) << "average (3 * 100 + 20000) / 4";
    for (int i = 0; i < 40; i++)
        sp_probe_streak_after_barrier(20000);
    EXPECT_EQ(sp_probe_lock_streak(), 7998) << "20 us barriers: about 8000 takes";
    for (int i = 0; i < 40; i++)
        sp_probe_streak_after_barrier(1000000000);
    EXPECT_EQ(sp_probe_lock_streak(), 32767) << "at most INT16_MAX";
    for (int i = 0; i < 80; i++)
        sp_probe_streak_after_barrier(50);
    EXPECT_EQ(sp_probe_lock_streak(), 1024) << "back to the floor";
    sp_probe_streak_pin(1024);
    EXPECT_EQ(sp_probe_streak_after_barrier(20000000), 1024) << "pinned";
    sp_probe_bias_begin();
}

// sp__lock_unless (the fork handler's take of a device lock): it waits for the holder as
// sp__lock does, but gives up, holding nothing, once the stop flag (the holder's "inside a user
// callback") is set; a revocation of a bias under way is undone, the owner still inside.
TEST(LockUnless, TakesAHeldLockOnceItIsFree) {
    void *l = sp_probe_lock_new();
    ASSERT_NE(l, nullptr);
    sp_probe_unless_stop(0);
    sp_probe_lock(l);
    std::atomic<int> got{-1};
    std::thread w([&] { got.store(sp_probe_lock_unless(l)); });
    ASSERT_TRUE(wait_for([&] { return sp_probe_lock_waiting(l) == 1; }));
    EXPECT_EQ(got.load(), -1) << "took a held lock";
    sp_probe_unlock(l);
    w.join();
    EXPECT_EQ(got.load(), 1);
    EXPECT_EQ(sp_probe_lock_word(l), 1) << "held by the waiter";
    sp_probe_unlock(l);
    EXPECT_EQ(sp_probe_lock_word(l), 0);
    std::free(l);
}

TEST(LockUnless, GivesUpAHeldLockOnceStopped) {
    void *l = sp_probe_lock_new();
    ASSERT_NE(l, nullptr);
    sp_probe_unless_stop(0);
    sp_probe_lock(l);
    std::atomic<int> got{-1};
    std::thread w([&] { got.store(sp_probe_lock_unless(l)); });
    ASSERT_TRUE(wait_for([&] { return sp_probe_lock_waiting(l) == 1; }));
    sp_probe_unless_stop(1);
    w.join();
    sp_probe_unless_stop(0);
    EXPECT_EQ(got.load(), 0);
    EXPECT_NE(sp_probe_lock_word(l), 0) << "still the holder's";
    EXPECT_EQ(sp_probe_lock_waiting(l), 0);
    sp_probe_unlock(l);
    EXPECT_EQ(sp_probe_lock_word(l), 0);
    std::free(l);
}

// The owner of the bias is inside: the waiter revokes (the word 1) and waits for it; stopped,
// it puts the bias back, and the owner leaves and enters again with its plain stores.
TEST(LockUnless, UndoesARevocationOnceStopped) {
    if (!sp_probe_bias_begin())
        GTEST_SKIP() << "no bias here (no membarrier, or another thread owned it)";
    void *l = sp_probe_lock_new();
    ASSERT_NE(l, nullptr);
    sp_probe_bias(l);
    sp_probe_unless_stop(0);
    sp_probe_lock(l);
    ASSERT_EQ(sp_probe_lock_in(l), 1);
    std::atomic<int> got{-1};
    std::thread w([&] { got.store(sp_probe_lock_unless(l)); });
    ASSERT_TRUE(wait_for([&] { return sp_probe_lock_word(l) == 1; })) << "no revocation";
    EXPECT_EQ(sp_probe_bias_gone(), 1);
    sp_probe_unless_stop(1);
    w.join();
    sp_probe_unless_stop(0);
    EXPECT_EQ(got.load(), 0);
    EXPECT_EQ(sp_probe_lock_word(l), 2) << "BIASED again";
    EXPECT_EQ(sp_probe_bias_gone(), 0);
    EXPECT_EQ(sp_probe_lock_in(l), 1) << "the owner is still inside";
    sp_probe_unlock(l);
    EXPECT_EQ(sp_probe_lock_in(l), 0);
    sp_probe_lock(l);
    EXPECT_EQ(sp_probe_lock_in(l), 1) << "entered biased";
    sp_probe_unlock(l);
    // Not stopped, another thread takes it from the owner that left (revoking for good).
    std::thread([&] {
        EXPECT_EQ(sp_probe_lock_unless(l), 1);
        EXPECT_EQ(sp_probe_lock_word(l), 1);
        sp_probe_unlock(l);
    }).join();
    EXPECT_EQ(sp_probe_bias_gone(), 1);
    std::free(l);
}

TEST_F(LockRebias, LockUnlessUndoesARevocationOnceStopped) {
    std::thread([&] {
        sp_probe_lock(l);
        sp_probe_unlock(l);
    }).join(); // the first bias revoked
    rebias_to_me(l);
    ASSERT_EQ(sp_probe_lock_word(l), kRebiased);
    sp_probe_unless_stop(0);
    sp_probe_lock(l);
    ASSERT_EQ(sp_probe_lock_rebiased_in(l), 1);
    std::atomic<int> got{-1};
    std::thread w([&] { got.store(sp_probe_lock_unless(l)); });
    ASSERT_TRUE(wait_for([&] { return sp_probe_lock_word(l) == 1; })) << "no revocation";
    sp_probe_unless_stop(1);
    w.join();
    sp_probe_unless_stop(0);
    EXPECT_EQ(got.load(), 0);
    EXPECT_EQ(sp_probe_lock_word(l), kRebiased);
    EXPECT_EQ(sp_probe_lock_rebiased_in(l), 1) << "the owner is still inside";
    sp_probe_unlock(l);
    sp_probe_lock(l);
    EXPECT_EQ(sp_probe_lock_rebiased_in(l), 1) << "entered re-biased";
    sp_probe_unlock(l);
}

} // namespace
