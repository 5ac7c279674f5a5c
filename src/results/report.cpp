#include "src/results/report.hpp"

#include <fcntl.h>
#include <fmt/format.h>

#include <algorithm>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"
#include "core/op.hpp"
#include "src/results/formats.hpp"

namespace lattn {
namespace fs = std::filesystem;

int write_all(int fd, std::string_view data) {
  std::size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = ::write(fd, data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : ENOSPC;
    written += std::size_t(n);
  }
  return 0;
}

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces) {
  const fs::path parent = fs::path(path).parent_path();
  const std::string folder = parent.empty() ? "." : parent.string();
  std::error_code ec;
  fs::create_directories(folder, ec);
  const std::string tmp = (fs::path(folder) / ("." + fs::path(path).filename().string() + ".tmp." +
                                               std::to_string(::getpid()))).string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_file_error("cannot create " + tmp, errno);
  const auto fail = [&](const std::string& what, int error) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw_file_error(what, error);
  };
  for (const std::string_view piece : pieces)
    if (const int error = write_all(fd, piece); error != 0) fail("cannot write " + path, error);
  if (::fsync(fd) != 0) fail("cannot flush " + path, errno);
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    throw_file_error("cannot flush " + path, error);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    throw_file_error("cannot rename " + tmp + " to " + path, error);
  }
}

void write_output_files(const std::vector<Output>& outputs, const RunDocument& document) {
  for (const Output& o : outputs)
    if (!o.to_stdout()) write_file_atomically(o.path, render(document, o.format));
}

namespace {

// Whether the record's op has a byte model (core/op.hpp: the decode step): its figures are
// bandwidth and tokens, shown in a table of their own.
bool has_byte_model(const CaseRecord& r) { return r.kase.op && r.kase.op->bytes; }

// A figure the record may not have, as the tables show it: "-" where it is unknown,
// `precision` significant digits (g) or decimals (f), as the column has them.
std::string known(std::optional<double> value, int precision, char style) {
  if (!value) return "-";
  return style == 'g' ? fmt::format("{:.{}g}", *value, precision) : fmt::format("{:.{}f}", *value, precision);
}

// The record's percentage of its device's peak (fraction_of_peak), "-" where unknown.
std::string percent_of_peak(const CaseRecord& r) {
  const std::optional<double> f = fraction_of_peak(r);
  return f ? fmt::format("{:.1f}", *f * 100) : std::string("-");
}

// rel_err, or "-" for a case whose outputs were not checked (status unchecked).
std::string rel_err_cell(const Measurement& m) {
  return m.unchecked.empty() ? fmt::format("{:.2e}", m.rel_err) : std::string("-");
}

std::string temp_cell(const Measurement& m) {
  return m.temp_unknown.empty() ? fmt::format("{:.3f}", m.temp_mb) : std::string("-");
}

// The cases of an op with a byte model (core/op.hpp: the decode step), whose figures are bandwidth
// and tokens rather than GFLOP/s: B, H, tokens per sequence, D, rule, decay and snapshots, and a
// column for each other option that varies in the run (heads_k, dim_v), so that no two rows look
// alike; the median, GB/s, its percentage of the run's measured bandwidth (%peak) and the roof
// (dram or llc), tokens per second and microseconds per token.
std::string format_bandwidth_table(const std::vector<const CaseRecord*>& records) {
  std::vector<CaseRecord> copies;
  copies.reserve(records.size());
  for (const CaseRecord* r : records) copies.push_back(*r);
  std::vector<std::pair<std::string, std::size_t>> varying;  // key, width
  for (const std::string& key : varying_keys(copies)) {
    if (key == "rule" || key == "snapshots") continue;
    std::size_t width = key.size();
    for (const CaseRecord* r : records) width = std::max(width, r->kase.option(key).size());
    varying.emplace_back(key, width);
  }
  std::string out = fmt::format("{:<7} {:<6} {:>4} {:>3} {:>3} {:>4} {:<8} {:<6} {:>2} ", "suite", "impl", "B", "H", "T",
                                "D", "rule", "decay", "K");
  for (const auto& [key, width] : varying) out += fmt::format("{:<{}} ", key, width);
  out += fmt::format("{:>10} {:>8} {:>6} {:<4} {:>11} {:>9} {:>9} {:>9}  {}\n", "median_ms", "GB/s", "%peak", "roof",
                     "tokens/s", "us/token", "temp_MiB", "rel_err", "status");
  for (const CaseRecord* r : records) {
    const Case& c = r->kase;
    const std::string kept = c.option("snapshots");
    out += fmt::format("{:<7} {:<6} {:>4} {:>3} {:>3} {:>4} {:<8} {:<6} {:>2} ", c.op->suite, c.impl, c.batch, c.heads,
                       c.seq, c.dim, c.option("rule"), c.decay, kept.empty() ? "-" : kept);
    for (const auto& [key, width] : varying) {
      const std::string v = c.option(key);
      out += fmt::format("{:<{}} ", v.empty() ? "-" : v, width);
    }
    if (r->status == Status::skipped || !r->measured) {
      out += fmt::format("{:>10} {:>8} {:>6} {:<4} {:>11} {:>9} {:>9} {:>9}  {}: {}\n", "-", "-", "-", "-", "-", "-", "-",
                         "-", to_string(r->status), r->skip_reason.empty() ? r->error : r->skip_reason);
      continue;
    }
    const Measurement& m = *r->measured;
    out += fmt::format("{:>10.4f} {:>8.2f} {:>6} {:<4} {:>11} {:>9} {:>9} {:>9}  {}\n", m.median_ms, m.gbytes_per_s,
                       percent_of_peak(*r), m.bandwidth_roof.empty() ? "-" : m.bandwidth_roof,
                       known(m.tokens_per_s, 4, 'g'), known(m.us_per_token, 3, 'f'), temp_cell(m), rel_err_cell(m),
                       to_string(r->status));
  }
  return out;
}

// The table of the other cases, then the byte-model cases' own table (only that one when there are
// no others).
std::string with_bandwidth_table(std::string compute_table, const std::vector<CaseRecord>& records) {
  std::vector<const CaseRecord*> bandwidth;
  for (const CaseRecord& r : records)
    if (has_byte_model(r)) bandwidth.push_back(&r);
  if (bandwidth.empty()) return compute_table;
  if (bandwidth.size() == records.size()) return format_bandwidth_table(bandwidth);
  return compute_table + "\n" + format_bandwidth_table(bandwidth);
}

}  // namespace

std::string format_table(const std::vector<CaseRecord>& records) {
  // The impl column as wide as its longest name (a plugin's NAME:IMPL is longer than "chunked"),
  // and a column for each option that varies in the run (gate_norm, dtype, ...) and the rule, as
  // wide as its name or its widest value, so that no two rows look alike and the rule and decay
  // columns name the family; the options that did not vary are one line above the rows.
  std::size_t impl_width = 8;
  for (const CaseRecord& r : records) impl_width = std::max(impl_width, r.kase.impl.size());
  struct Varying {
    std::string key;
    std::size_t width;
  };
  const auto value_of = [](const CaseRecord& r, const std::string& key) {
    const std::string v = key == "dtype" ? r.kase.dtype : key == "backend" ? r.kase.backend : r.kase.option(key);
    return v.empty() ? std::string("-") : v;
  };
  std::vector<Varying> varying;
  const std::vector<std::string> shown = table_option_keys(records);
  for (const std::string& key : shown) {
    std::size_t width = key.size();
    for (const CaseRecord& r : records) width = std::max(width, value_of(r, key).size());
    varying.push_back({key, width});
  }
  std::string out = fmt::format("{:<7} {:<{}} {:<8} {:>3} {:>3} {:>6} {:>4} {:>5} {:>5} {:<6} ", "suite", "impl", impl_width,
                                "mode", "B", "H", "seq", "D", "chunk", "W", "decay");
  for (const Varying& v : varying) out += fmt::format("{:<{}} ", v.key, v.width);
  out += fmt::format("{:>10} {:>10} {:>10} {:>6} {:>7} {:>8} {:>6} {:>9} {:>9}  {}\n", "median_ms", "q1_ms", "q3_ms",
                     "noise%", "samples", "GFLOP/s", "%peak", "temp_MiB", "rel_err", "status");
  for (const CaseRecord& r : records) {
    if (has_byte_model(r)) continue;
    const Case& c = r.kase;
    const Op& op = *c.op;
    // "-" for what the op does not have (the kernel suite has no window).
    auto param = [&](Param p, long value) { return op.has(p) ? std::to_string(value) : std::string("-"); };
    out += fmt::format("{:<7} {:<{}} {:<8} {:>3} {:>3} {:>6} {:>4} {:>5} {:>5} {:<6} ", op.suite, c.impl, impl_width,
                       to_string(c.mode), c.batch, c.heads, c.seq, c.dim, param(Param::chunk, c.chunk),
                       param(Param::window, c.window), op.has(Param::decay) ? c.decay : "-");
    for (const Varying& v : varying) out += fmt::format("{:<{}} ", value_of(r, v.key), v.width);
    if (r.status == Status::skipped || !r.measured) {
      out += fmt::format("{:>10} {:>10} {:>10} {:>6} {:>7} {:>8} {:>6} {:>9} {:>9}  {}: {}\n", "-", "-", "-", "-", "-",
                         "-", "-", "-", "-", to_string(r.status), r.skip_reason.empty() ? r.error : r.skip_reason);
      continue;
    }
    const Measurement& m = *r.measured;
    out += fmt::format("{:>10.4f} {:>10.4f} {:>10.4f} {:>6.1f} {:>7} {:>8.2f} {:>6} {:>9} {:>9}  {}\n", m.median_ms,
                       m.q1_ms, m.q3_ms, m.noise_pct, m.samples_ms.size(), m.gflops, percent_of_peak(r), temp_cell(m),
                       rel_err_cell(m), to_string(r.status));
  }
  // What every row shares (the backend, the dtype, options that did not vary), once above the rows.
  const std::string constant = constant_line(records, shown);
  return (constant.empty() ? "" : constant + "\n") + with_bandwidth_table(std::move(out), records);
}

}  // namespace lattn
