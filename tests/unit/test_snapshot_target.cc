// test_snapshot_target.cc: what sp_dump_snapshot may write over, and how it fails.
//  - A target that exists and is not a regular file (a FIFO, a directory, a socket, a device
//    such as /dev/null) is refused with SP_ERR_INVALID_ARGUMENT and left exactly as it was; no
//    temporary file is left behind.
//  - A symbolic link to a regular file is written through: the file it names gets the snapshot
//    (atomically, by a rename in that file's directory) and the link stays a link. A link to
//    anything else, or a dangling link, is refused like the thing it names.
//  - A regular file the caller may not write (mode 0444) is refused (SP_ERR_SYSTEM) and kept.
//  - Running out of host memory while the snapshot is being built is SP_ERR_SYSTEM naming the
//    cause, not SP_ERR_INTERNAL; tested with the snapshot writer's allocation fault hook.
#include "sp_test.hpp"
#include "sympool/experimental.h"

#include <dirent.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include "core/core_emit.h"
}

using sp::MiB;

namespace {

std::string tempdir() {
    char tmpl[] = "/tmp/sp_snaptarget_XXXXXX";
    char *d = mkdtemp(tmpl);
    EXPECT_NE(d, nullptr);
    return d ? d : "/tmp";
}

std::vector<std::string> list_dir(const std::string &dir) {
    std::vector<std::string> out;
    DIR *d = opendir(dir.c_str());
    if (!d)
        return out;
    while (dirent *e = readdir(d))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            out.push_back(e->d_name);
    closedir(d);
    return out;
}

void remove_tree(const std::string &dir) {
    for (auto &n : list_dir(dir)) {
        std::string p = dir + "/" + n;
        struct stat st;
        if (lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
            remove_tree(p);
        else
            unlink(p.c_str());
    }
    rmdir(dir.c_str());
}

mode_t kind_of(const std::string &path) {
    struct stat st;
    return lstat(path.c_str(), &st) == 0 ? (st.st_mode & S_IFMT) : 0;
}

std::string read_all(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Puts log lines into the fixture's capture again after a test sent them to a file.
void capture(sp_log_level_t level, const char *line, void *arg) {
    auto *cap = static_cast<sp::LogCapture *>(arg);
    std::lock_guard<std::mutex> g(cap->mu);
    cap->lines.emplace_back(level, line);
}

} // namespace

class SnapshotTarget : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        expect_warnings();
        dir_ = tempdir();
    }
    void TearDown() override {
        sp__emit_fault_after(0);
        remove_tree(dir_);
        sp::Test::TearDown();
    }
    std::string dir_;
};

TEST_F(SnapshotTarget, FifoIsRefusedAndKept) {
    std::string fifo = dir_ + "/pipe.pickle";
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    EXPECT_SP_STATUS(sp_dump_snapshot(fifo.c_str()), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("not a regular file"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(kind_of(fifo), (mode_t)S_IFIFO) << "the FIFO was replaced";
    EXPECT_EQ(list_dir(dir_).size(), 1u) << "a temporary file was left behind";
}

TEST_F(SnapshotTarget, DirectoryAndSocketAreRefused) {
    std::string sub = dir_ + "/sub.json";
    ASSERT_EQ(mkdir(sub.c_str(), 0700), 0);
    EXPECT_SP_STATUS(sp_dump_snapshot(sub.c_str()), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(kind_of(sub), (mode_t)S_IFDIR);

    std::string sock = dir_ + "/sock.pickle";
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un addr;
    std::memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    ASSERT_LT(sock.size(), sizeof(addr.sun_path));
    std::strcpy(addr.sun_path, sock.c_str());
    ASSERT_EQ(bind(fd, (sockaddr *)&addr, sizeof addr), 0);
    EXPECT_SP_STATUS(sp_dump_snapshot(sock.c_str()), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(kind_of(sock), (mode_t)S_IFSOCK);
    close(fd);
    EXPECT_EQ(list_dir(dir_).size(), 2u);
}

// As root the old behaviour replaced the system's /dev/null with a regular file.
TEST_F(SnapshotTarget, DeviceNodeIsRefused) {
    ASSERT_EQ(kind_of("/dev/null"), (mode_t)S_IFCHR);
    EXPECT_SP_STATUS(sp_dump_snapshot("/dev/null"), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(kind_of("/dev/null"), (mode_t)S_IFCHR);
    void *p = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(sp_default_mempool(0), 4096, nullptr, &p));
    EXPECT_SP_STATUS(sp_mempool_dump_snapshot(sp_default_mempool(0), "/dev/null"),
                     SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(kind_of("/dev/null"), (mode_t)S_IFCHR);
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(SnapshotTarget, SymlinkToRegularFileIsWrittenThrough) {
    std::string real_dir = dir_ + "/real";
    ASSERT_EQ(mkdir(real_dir.c_str(), 0700), 0);
    std::string target = real_dir + "/target.json";
    {
        std::ofstream f(target);
        f << "old";
    }
    std::string link = dir_ + "/link.json";
    ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
    ASSERT_SP_OK(sp_dump_snapshot(link.c_str()));
    EXPECT_EQ(kind_of(link), (mode_t)S_IFLNK) << "the link stays a link";
    std::string body = read_all(target);
    EXPECT_NE(body.find("\"segments\""), std::string::npos) << body.substr(0, 200);
    EXPECT_EQ(list_dir(real_dir).size(), 1u);
    EXPECT_EQ(list_dir(dir_).size(), 2u);
    // A relative link works the same (resolved against the link's directory).
    std::string rel = dir_ + "/rel.pickle";
    ASSERT_EQ(symlink("real/target.json", rel.c_str()), 0);
    ASSERT_SP_OK(sp_dump_snapshot(rel.c_str()));
    EXPECT_EQ(kind_of(rel), (mode_t)S_IFLNK);
    EXPECT_EQ(read_all(target).compare(0, 2, "\x80\x04"), 0) << "now a pickle";
}

TEST_F(SnapshotTarget, SymlinkToSomethingElseOrNothingIsRefused) {
    std::string fifo = dir_ + "/pipe";
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    std::string to_fifo = dir_ + "/to_fifo.pickle";
    ASSERT_EQ(symlink(fifo.c_str(), to_fifo.c_str()), 0);
    EXPECT_SP_STATUS(sp_dump_snapshot(to_fifo.c_str()), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(kind_of(fifo), (mode_t)S_IFIFO);
    EXPECT_EQ(kind_of(to_fifo), (mode_t)S_IFLNK);
    std::string to_null = dir_ + "/to_null.pickle";
    ASSERT_EQ(symlink("/dev/null", to_null.c_str()), 0);
    EXPECT_SP_STATUS(sp_dump_snapshot(to_null.c_str()), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(kind_of("/dev/null"), (mode_t)S_IFCHR);
    std::string dangling = dir_ + "/dangling.pickle";
    ASSERT_EQ(symlink((dir_ + "/nowhere/x").c_str(), dangling.c_str()), 0);
    EXPECT_SP_STATUS(sp_dump_snapshot(dangling.c_str()), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(kind_of(dangling), (mode_t)S_IFLNK);
    EXPECT_EQ(list_dir(dir_).size(), 4u);
}

TEST_F(SnapshotTarget, NewAndRegularTargetsStillWork) {
    std::string p = dir_ + "/new.pickle";
    ASSERT_SP_OK(sp_dump_snapshot(p.c_str()));
    EXPECT_EQ(kind_of(p), (mode_t)S_IFREG);
    ASSERT_SP_OK(sp_dump_snapshot(p.c_str())); // replaced whole
    EXPECT_EQ(list_dir(dir_).size(), 1u);
}

// The library's own log file (SYMPOOL_DEBUG_FILE) is refused as a target, by any name of it, and
// left as the log wrote it: replaced by the rename, the log went on writing to the old, unlinked
// file, so every later line was lost; not yet open, the log's next line was appended to the
// snapshot.
TEST_F(SnapshotTarget, TheLogFileIsRefusedAndKept) {
    std::string log = dir_ + "/sympool.log", other = dir_ + "/./sympool.log";
    std::string link = dir_ + "/link.pickle";
    {
        sp::ScopedEnv env({{"SYMPOOL_DEBUG_FILE", log.c_str()}});
        sp__log_set_fn(nullptr, nullptr); // to the file, not the capture
        // Not open yet, not there yet: the name alone is the log's.
        EXPECT_SP_STATUS(sp_dump_snapshot(other.c_str()), SP_ERR_INVALID_ARGUMENT);
        std::string why = sp_last_error();
        SP_WARN(SP_SUB_POOL, "first line");
        ASSERT_EQ(symlink(log.c_str(), link.c_str()), 0);
        // Open, by its name, another name and a link to it; the pool's dump too.
        EXPECT_SP_STATUS(sp_dump_snapshot(log.c_str()), SP_ERR_INVALID_ARGUMENT);
        EXPECT_SP_STATUS(sp_dump_snapshot(other.c_str()), SP_ERR_INVALID_ARGUMENT);
        EXPECT_SP_STATUS(sp_dump_snapshot(link.c_str()), SP_ERR_INVALID_ARGUMENT);
        EXPECT_SP_STATUS(sp_mempool_dump_snapshot(sp_default_mempool(0), log.c_str()),
                         SP_ERR_INVALID_ARGUMENT);
        SP_WARN(SP_SUB_POOL, "last line");
        sp__log_set_fn(capture, &log_);
        EXPECT_NE(why.find("SYMPOOL_DEBUG_FILE"), std::string::npos) << why;
        EXPECT_NE(why.find("nothing was written"), std::string::npos) << why;
        // Another file is still written, while the log is open.
        ASSERT_SP_OK(sp_dump_snapshot((dir_ + "/snap.pickle").c_str()));
    }
    std::string text = read_all(log);
    EXPECT_NE(text.find("first line"), std::string::npos) << text;
    EXPECT_NE(text.find("last line"), std::string::npos) << "the log lost its later lines:\n"
                                                         << text;
    std::istringstream in(text);
    size_t lines = 0;
    for (std::string l; std::getline(in, l); lines++)
        EXPECT_NE(l.find(" SYMPOOL "), std::string::npos) << "not a log line: " << l;
    EXPECT_GE(lines, 2u);
    EXPECT_EQ(kind_of(link), (mode_t)S_IFLNK);
    EXPECT_EQ(list_dir(dir_).size(), 3u) << "a temporary file was left behind";
}

// A SYMPOOL_DEBUG_FILE pattern with %r before the rank is known: the log writes to stderr until
// then, and the name it will open is not known yet. A snapshot written to what the pattern names
// for some rank (log.3) was let through, and once the rank became 3 the log appended its lines
// to the snapshot. Any rank's file of the pattern is refused while the rank is unknown.
TEST_F(SnapshotTarget, TheLogFileOfARankNotKnownYetIsRefused) {
    if (sp__process_rank() >= 0)
        GTEST_SKIP() << "a launcher gave this process its rank";
    std::string pattern = dir_ + "/log.%r.txt", ranked = dir_ + "/log.3.txt";
    {
        sp::ScopedEnv env({{"SYMPOOL_DEBUG_FILE", pattern.c_str()}});
        sp__log_set_fn(nullptr, nullptr); // to the file, not the capture
        EXPECT_SP_STATUS(sp_dump_snapshot(ranked.c_str()), SP_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(sp_last_error()).find("SYMPOOL_DEBUG_FILE"), std::string::npos)
            << sp_last_error();
        EXPECT_SP_STATUS(sp_dump_snapshot((dir_ + "/./log.0.txt").c_str()),
                         SP_ERR_INVALID_ARGUMENT);
        // sp_x_path_names tells a program (sympool's CLI) so before it writes anything.
        EXPECT_TRUE(sp_x_path_names(pattern.c_str(), ranked.c_str()));
        EXPECT_TRUE(sp_x_path_names(pattern.c_str(), (dir_ + "/./log.0.txt").c_str()));
        EXPECT_FALSE(sp_x_path_names(pattern.c_str(), (dir_ + "/log.x.txt").c_str()));
        EXPECT_FALSE(sp_x_path_names("", ranked.c_str()));
        // Names the pattern cannot make for any rank are written.
        ASSERT_SP_OK(sp_dump_snapshot((dir_ + "/log.3.txt.pickle").c_str()));
        ASSERT_SP_OK(sp_dump_snapshot((dir_ + "/log.x.txt").c_str()));
        ASSERT_SP_OK(sp_dump_snapshot((dir_ + "/log.-3.txt").c_str()));
        sp__log_set_rank(3);
        SP_WARN(SP_SUB_POOL, "a line of rank 3");
        sp__log_set_rank(-1);
        sp__log_set_fn(capture, &log_);
    }
    std::string text = read_all(ranked);
    EXPECT_NE(text.find("a line of rank 3"), std::string::npos) << text;
    std::string host = std::string(sp__process_host()) + ":";
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);)
        EXPECT_EQ(l.rfind(host, 0), 0u) << "not a log line: " << l;
}

// The file gets the permissions any other way of writing it would give: a new one 0666 less the
// umask (the temporary used to be made 0600 and then opened to 0644, whatever the umask said),
// and a file that is replaced keeps its own mode (also through a link), rather than becoming
// readable by everyone.
TEST_F(SnapshotTarget, NewFileFollowsTheUmaskAndAReplacedFileKeepsItsMode) {
    auto mode_of = [](const std::string &path) {
        struct stat st;
        return stat(path.c_str(), &st) == 0 ? (unsigned)(st.st_mode & 07777) : 0u;
    };
    std::string priv = dir_ + "/private.pickle";
    mode_t old = umask(077);
    sp_status_t s = sp_dump_snapshot(priv.c_str());
    umask(old);
    ASSERT_SP_OK(s);
    EXPECT_EQ(mode_of(priv), 0600u) << "the umask was ignored";

    std::string open_ = dir_ + "/open.json";
    old = umask(022);
    s = sp_dump_snapshot(open_.c_str());
    umask(old);
    ASSERT_SP_OK(s);
    EXPECT_EQ(mode_of(open_), 0644u);

    std::string kept = dir_ + "/kept.json";
    { std::ofstream(kept) << "{}"; }
    ASSERT_EQ(chmod(kept.c_str(), 0640), 0);
    ASSERT_SP_OK(sp_dump_snapshot(kept.c_str()));
    EXPECT_EQ(mode_of(kept), 0640u) << "the replaced file's mode was not kept";
    EXPECT_NE(read_all(kept), "{}");

    std::string link = dir_ + "/link.json";
    ASSERT_EQ(symlink(kept.c_str(), link.c_str()), 0);
    ASSERT_EQ(chmod(kept.c_str(), 0600), 0);
    ASSERT_SP_OK(sp_dump_snapshot(link.c_str()));
    EXPECT_EQ(mode_of(kept), 0600u) << "through a link";
    EXPECT_EQ(list_dir(dir_).size(), 4u) << "a temporary file was left behind";

    // The set-user-ID, set-group-ID and sticky bits are the old contents', not carried over.
    ASSERT_EQ(chmod(kept.c_str(), 07755), 0);
    ASSERT_SP_OK(sp_dump_snapshot(kept.c_str()));
    EXPECT_EQ(mode_of(kept), 0755u) << "special bits carried onto new contents";
}

// A target whose name is as long as a directory entry may be (NAME_MAX) is a legal target: the
// temporary next to it used to take the whole name plus ".tmp.XXXXXX", which the file system
// refused (ENAMETOOLONG), so such a snapshot could never be written.
TEST_F(SnapshotTarget, LongestLegalNameIsWritten) {
    for (size_t len : {(size_t)NAME_MAX - 10, (size_t)NAME_MAX}) {
        std::string name(len - 7, 'n');
        name += ".pickle";
        std::string p = dir_ + "/" + name;
        ASSERT_SP_OK(sp_dump_snapshot(p.c_str()));
        EXPECT_EQ(kind_of(p), (mode_t)S_IFREG) << len;
        ASSERT_SP_OK(sp_dump_snapshot(p.c_str())); // and replaced
        EXPECT_EQ(list_dir(dir_).size(), 1u) << "a temporary file was left behind";
        unlink(p.c_str());
    }
    // One byte more is the argument's fault, as history.h says of a path too long (it was
    // SP_ERR_SYSTEM, where a pattern expanding past PATH_MAX was SP_ERR_INVALID_ARGUMENT).
    std::string too_long = dir_ + "/" + std::string(NAME_MAX + 1, 'x');
    EXPECT_SP_STATUS(sp_dump_snapshot(too_long.c_str()), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("too long"), std::string::npos) << sp_last_error();
    EXPECT_TRUE(list_dir(dir_).empty());
}

// A regular file the caller may not write (mode 0444) is refused and kept, directly and through
// a link, as open(2) and PyTorch's dump refuse it: the rename over it used to replace it. Root may
// write any file, so as root the child that checks drops to an unprivileged user first.
TEST_F(SnapshotTarget, ReadOnlyFileIsRefusedAndKept) {
    std::string ro = dir_ + "/ro.pickle", link = dir_ + "/link.pickle";
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        if (geteuid() == 0 &&
            (chown(dir_.c_str(), 65534, 65534) != 0 || setgid(65534) != 0 || setuid(65534) != 0))
            _exit(77);
        { std::ofstream(ro) << "keep"; }
        if (chmod(ro.c_str(), 0444) != 0 || symlink(ro.c_str(), link.c_str()) != 0)
            _exit(3);
        int bits = 0;
        if (sp_dump_snapshot(ro.c_str()) != SP_ERR_SYSTEM)
            bits |= 4;
        if (strstr(sp_last_error(), "not writable") == nullptr)
            bits |= 8;
        if (sp_dump_snapshot(link.c_str()) != SP_ERR_SYSTEM)
            bits |= 16;
        if (read_all(ro) != "keep" || kind_of(link) != S_IFLNK)
            bits |= 32;
        if (list_dir(dir_).size() != 2)
            bits |= 64;
        _exit(bits);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77)
        GTEST_SKIP() << "root cannot drop to an unprivileged user here";
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << "bits: 3 setup failed, 4 not refused, 8 message, 16 not refused through a link, "
           "32 the file or link replaced, 64 a temporary left";
}

// Host OOM at every allocation the writer makes, one after another: each is SP_ERR_SYSTEM with
// the cause, leaves no file, and the allocator carries on.
TEST_F(SnapshotTarget, HostOomWhileBuildingIsSystemError) {
    sp_history_params_t hp;
    sp_history_params_init(&hp);
    ASSERT_SP_OK(sp_record_memory_history(&hp));
    std::vector<void *> live;
    for (int i = 0; i < 200; i++) {
        void *p = nullptr;
        ASSERT_SP_OK(sp_malloc((size_t)(i % 7 + 1) * 4096, 0, nullptr, &p));
        live.push_back(p);
    }
    std::string p = dir_ + "/oom.pickle";
    int failures = 0;
    for (long n = 1; n < 64; n++) {
        sp__emit_fault_after(n);
        sp_status_t s = sp_dump_snapshot(p.c_str());
        sp__emit_fault_after(0);
        if (s == SP_SUCCESS)
            break; // past the last allocation the writer makes
        failures++;
        EXPECT_EQ(s, SP_ERR_SYSTEM) << "fault at allocation " << n << ": " << sp::describe(s);
        EXPECT_NE(std::string(sp_last_error()).find("out of host memory"), std::string::npos)
            << sp_last_error();
        EXPECT_EQ(list_dir(dir_).size(), 0u) << "a partial file was left";
    }
    EXPECT_GT(failures, 0);
    EXPECT_EQ(kind_of(p), (mode_t)S_IFREG);
    for (void *q : live)
        ASSERT_SP_OK(sp_free(q));
    hp.enabled = SP_HISTORY_OFF;
    ASSERT_SP_OK(sp_record_memory_history(&hp));
}
