// The files a run writes, settled before its first case: the result file (--out), the Google
// Benchmark export (--gbench-out), the dump folder (--dump), the journal and its lock. They must be
// distinct, an existing one must be of its kind (a regular file; a folder for --dump), and their
// folders must take a new file; a run refused here (exit 2) leaves no folder behind. The lock
// keeps a second run off a journal one is writing.
#pragma once

#include <string>
#include <vector>

namespace lattn {

struct RunFiles {
  std::string out, gbench, dump, journal;  // out empty when no result file is written (--out -);
                                           // gbench and dump empty when not asked for
  std::vector<std::string> more_outs;      // the further --out files
  std::string lock() const { return journal + ".lock"; }
};

// Distinct paths, each existing one of its kind; with `resuming` the journal must exist. No side
// effects. Throws UsageError naming the flag.
void check_run_files(const RunFiles& files, bool resuming);

// Creates the folders of the result file, the export and the dump, and checks that each takes a new
// file; when one cannot, removes the folders it made and throws UsageError (EnvironmentError when
// the disk is full). The folders it made are removed again when it goes out of scope before
// keep(): a run refused after this point (another run holds the lock, an unfinished journal, a
// journal of another run) leaves none behind.
class PreparedFolders {
 public:
  explicit PreparedFolders(const RunFiles& files);
  PreparedFolders(const PreparedFolders&) = delete;
  PreparedFolders& operator=(const PreparedFolders&) = delete;
  ~PreparedFolders() { remove_made(); }
  void keep() { made_.clear(); }

 private:
  void remove_made();
  std::vector<std::string> made_;  // outermost first
};

// A fresh run's journal must not hold an unfinished run's cases unless `force` (start over).
void check_no_unfinished_journal(const std::string& journal, bool force);

// An exclusive lock (flock) on `journal`'s lock file, which holds this process's pid: a second run
// on the same journal exits 2 naming the first one's pid. Released, and the file removed, when
// this goes out of scope; a killed run's lock is released by the kernel.
class RunLock {
 public:
  explicit RunLock(const RunFiles& files);
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  ~RunLock();

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace lattn
