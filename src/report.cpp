#include "report.hpp"

#include <fcntl.h>
#include <fmt/format.h>

#include <algorithm>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"
#include "core/op.hpp"

namespace lattn {
namespace fs = std::filesystem;

namespace {
std::string parent_or_dot(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}
}  // namespace

void write_file_atomically(const std::string& path, const std::string& content) {
  const std::string folder = parent_or_dot(path);
  std::error_code ec;
  fs::create_directories(folder, ec);
  const std::string tmp = (fs::path(folder) / ("." + fs::path(path).filename().string() + ".tmp." +
                                               std::to_string(::getpid()))).string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw RuntimeFailure("cannot create " + tmp + ": " + std::strerror(errno));
  std::size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw RuntimeFailure("cannot write " + tmp + ": " + why);
    }
    written += std::size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw RuntimeFailure("cannot flush " + tmp + ": " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw RuntimeFailure("cannot rename " + tmp + " to " + path + ": " + why);
  }
}

void check_writable(const std::string& path, const std::string& flag) {
  const std::string folder = parent_or_dot(path);
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (fs::is_directory(path)) throw UsageError(flag, "'" + path + "' is a folder, expected a file name");
  if (!fs::is_directory(folder) || ::access(folder.c_str(), W_OK) != 0)
    throw UsageError(flag, "cannot write to the folder '" + folder + "'");
}

std::string format_table(const std::vector<CaseRecord>& records) {
  // The impl column as wide as its longest name (a plugin's NAME:IMPL is longer than "chunked").
  std::size_t impl_width = 8;
  for (const CaseRecord& r : records) impl_width = std::max(impl_width, r.kase.impl.size());
  std::string out = fmt::format("{:<7} {:<{}} {:<8} {:>3} {:>3} {:>6} {:>4} {:>5} {:>5} {:<6} {:>10} {:>10} {:>10} {:>8} {:>9} {:>9}  {}\n",
                                "suite", "impl", impl_width, "mode", "B", "H", "seq", "D", "chunk", "W", "decay", "median_ms", "q1_ms",
                                "q3_ms", "GFLOP/s", "temp_MiB", "rel_err", "status");
  for (const CaseRecord& r : records) {
    const Case& c = r.kase;
    const Op& op = *c.op;
    // "-" for what the op does not have (the kernel suite has no window).
    auto param = [&](Param p, long value) { return op.has(p) ? std::to_string(value) : std::string("-"); };
    out += fmt::format("{:<7} {:<{}} {:<8} {:>3} {:>3} {:>6} {:>4} {:>5} {:>5} {:<6} ", op.suite, c.impl, impl_width,
                       to_string(c.mode), c.batch, c.heads, c.seq, c.dim, param(Param::chunk, c.chunk),
                       param(Param::window, c.window), op.has(Param::decay) ? c.decay : "-");
    if (r.status == Status::skipped || !r.measured) {
      out += fmt::format("{:>10} {:>10} {:>10} {:>8} {:>9} {:>9}  {}: {}\n", "-", "-", "-", "-", "-", "-",
                         to_string(r.status), r.skip_reason.empty() ? r.error : r.skip_reason);
      continue;
    }
    const Measurement& m = *r.measured;
    out += fmt::format("{:>10.4f} {:>10.4f} {:>10.4f} {:>8.2f} {:>9.3f} {:>9.2e}  {}\n", m.median_ms, m.q1_ms, m.q3_ms,
                       m.gflops, m.temp_mb, m.rel_err, to_string(r.status));
  }
  return out;
}

}  // namespace lattn
