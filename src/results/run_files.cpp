#include "src/results/run_files.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace lattn {
namespace fs = std::filesystem;

namespace {

struct Target {
  std::string flag;  // how messages name it
  std::string path;
  bool folder = false;  // --dump: a folder, the rest files
};

std::vector<Target> targets(const RunFiles& f) {
  std::vector<Target> out = {{"the journal", f.journal}, {"the journal's lock", f.lock()}};
  if (!f.out.empty()) out.insert(out.begin(), {"--out", f.out});
  for (const std::string& path : f.more_outs) out.push_back({"--out", path});
  if (!f.gbench.empty()) out.push_back({"--gbench-out", f.gbench});
  if (!f.dump.empty()) out.push_back({"--dump", f.dump, true});
  return out;
}

// The path with '.', '..' and symbolic links of its existing part resolved, for comparing.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
  return ec ? fs::absolute(path).lexically_normal() : p;
}

std::string folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

void check_run_files(const RunFiles& files, bool resuming) {
  const std::vector<Target> all = targets(files);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Target& t = all[i];
    for (std::size_t j = 0; j < i; ++j)
      if (resolved(t.path) == resolved(all[j].path))
        throw UsageError(t.flag, "'" + t.path + "' is also the path of " + all[j].flag);
    std::error_code ec;
    const fs::file_status st = fs::status(t.path, ec);
    if (!fs::exists(st)) {
      if (resuming && t.path == files.journal) throw UsageError(t.path, "cannot read the journal: no such file");
      continue;
    }
    if (t.folder) {
      if (!fs::is_directory(st)) throw UsageError(t.flag, "'" + t.path + "' exists and is not a folder");
    } else if (fs::is_directory(st)) {
      throw UsageError(t.flag, "'" + t.path + "' is a folder, expected a file name");
    } else if (!fs::is_regular_file(st)) {
      throw UsageError(t.flag, "'" + t.path + "' exists and is not a regular file (a device, FIFO or socket): it is "
                               "never replaced");
    }
  }
}

void PreparedFolders::remove_made() {
  std::error_code ec;
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) fs::remove(*it, ec);  // empty folders only
  made_.clear();
}

PreparedFolders::PreparedFolders(const RunFiles& files) {
  // The journal is beside the first result file, or in the current folder when none is written.
  std::vector<std::pair<std::string, std::string>> folders = {{"--out", folder_of(files.out.empty() ? files.journal : files.out)}};
  for (const std::string& path : files.more_outs) folders.push_back({"--out", folder_of(path)});
  if (!files.gbench.empty()) folders.push_back({"--gbench-out", folder_of(files.gbench)});
  if (!files.dump.empty()) folders.push_back({"--dump", files.dump});
  const auto undo = [&] { remove_made(); };
  for (const auto& [flag, folder] : folders) {
    // The folders to make, outermost first, and what stands where the first of them would go.
    std::vector<fs::path> missing;
    fs::path p = fs::absolute(folder).lexically_normal();
    std::error_code ec;
    while (!p.empty() && !fs::exists(p, ec) && p != p.parent_path()) {
      missing.insert(missing.begin(), p);
      p = p.parent_path();
    }
    if (!fs::is_directory(p, ec)) {
      undo();
      throw UsageError(flag, "cannot make the folder '" + folder + "': '" + p.string() + "' is not a folder");
    }
    for (const fs::path& m : missing) {
      if (::mkdir(m.c_str(), 0755) != 0 && errno != EEXIST) {
        const int error = errno;
        undo();
        if (is_environment_errno(error)) throw_file_error("cannot make the folder " + m.string(), error);
        throw UsageError(flag, "cannot make the folder '" + m.string() + "': " + std::strerror(error));
      }
      made_.push_back(m.string());
    }
    // access(2) says yes to root on any folder of a writable file system: only a file made there tells.
    const std::string probe = (fs::path(folder) / (".lattnbench-probe-" + std::to_string(::getpid()))).string();
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      const int error = errno;
      undo();
      if (is_environment_errno(error)) throw_file_error("cannot write to the folder " + folder, error);
      throw UsageError(flag, "cannot write to the folder '" + folder + "': " + std::strerror(error));
    }
    ::close(fd);
    ::unlink(probe.c_str());
  }
}

void check_no_unfinished_journal(const std::string& journal, bool force) {
  std::error_code ec;
  if (force || !fs::exists(journal, ec)) return;
  throw UsageError(journal, "an unfinished run's journal is here: continue that run with --resume " + journal +
                                ", or start over with --force");
}

RunLock::RunLock(const RunFiles& files) : path_(files.lock()) {
  // A lock file the holder removed while this one was opening it is locked in vain: open again
  // until the file locked is the one at the path.
  for (int attempt = 0; attempt < 100; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_file_error("cannot create the lock file " + path_, errno);
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      char pid[32] = {};
      const ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
      ::close(fd_);
      fd_ = -1;
      if (error != EWOULDBLOCK) throw_file_error("cannot lock " + path_, error);
      std::string holder = n > 0 ? std::string(pid, std::size_t(n)) : "";
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
      throw UsageError(files.journal, "another run (pid " + (holder.empty() ? "unknown" : holder) +
                                          ") is writing this journal" + (files.out.empty() ? "" : " and " + files.out) +
                                          ": wait for it to end, or give this run another --out");
    }
    struct stat held {}, now {};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
        const int error = errno != 0 ? errno : ENOSPC;  // a short write: the disk filled up
        ::unlink(path_.c_str());
        ::close(fd_);
        fd_ = -1;
        throw_file_error("cannot write the lock file " + path_, error);
      }
      return;
    }
    ::close(fd_);
    fd_ = -1;
  }
  throw RuntimeFailure("cannot lock " + path_ + ": it keeps being replaced");
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still held: a run that opens it now finds it replaced, above
  ::close(fd_);
}

}  // namespace lattn
