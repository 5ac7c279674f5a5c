// Packed batches' keys (packing.hpp): parsing, the canonical text records keep, and the seeded
// draw of varlen's document lengths.
#include "kernels/linear_attention/packing.hpp"

#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>

#include "core/random.hpp"

namespace lattn {
namespace {

constexpr long kMaxTokens = 1L << 24;  // the kernel suite's largest seq

std::vector<std::string> fields(const std::string& text, const char* separators) {
  std::vector<std::string> out;
  std::string field;
  for (char ch : text + separators[0]) {
    if (std::string(separators).find(ch) != std::string::npos) {
      if (!field.empty()) out.push_back(field);
      field.clear();
    } else {
      field += ch;
    }
  }
  return out;
}

long whole(const std::string& field, const std::string& what, long lo, long hi) {
  std::size_t used = 0;
  long value = 0;
  try {
    value = std::stol(field, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != field.size() || field.empty())
    throw std::invalid_argument(what + " '" + field + "' is not a whole number");
  if (value < lo || value > hi)
    throw std::invalid_argument(what + " " + field + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return value;
}

struct VarlenSpec {
  long tokens, lo, hi;
  std::string dist;
  std::uint64_t seed;
};

VarlenSpec varlen_spec(const std::string& text) {
  const std::vector<std::string> f = fields(text, " :\t");
  if (f.size() < 3 || f.size() > 5)
    throw std::invalid_argument("'" + text + "' is not TOKENS MIN MAX [uniform|log] [SEED]");
  VarlenSpec s;
  s.tokens = whole(f[0], "TOKENS", 1, kMaxTokens);
  s.lo = whole(f[1], "MIN", 1, kMaxTokens);
  s.hi = whole(f[2], "MAX", s.lo, kMaxTokens);
  s.dist = f.size() > 3 ? f[3] : "uniform";
  if (s.dist != "uniform" && s.dist != "log")
    throw std::invalid_argument("distribution '" + s.dist + "' is not uniform or log");
  s.seed = f.size() > 4 ? std::uint64_t(whole(f[4], "SEED", 0, 1L << 53)) : 0;
  if (s.tokens / s.lo > kMaxDocuments)
    throw std::invalid_argument("TOKENS / MIN allows over " + std::to_string(kMaxDocuments) + " documents");
  return s;
}

}  // namespace

std::string canonical_lengths(const std::string& text) {
  const std::vector<std::string> f = fields(text, " +\t");
  if (f.empty()) throw std::invalid_argument("no document lengths in '" + text + "'");
  if (long(f.size()) > kMaxDocuments)
    throw std::invalid_argument(std::to_string(f.size()) + " documents, over " + std::to_string(kMaxDocuments));
  std::string out;
  long total = 0;
  for (const std::string& field : f) {
    total += whole(field, "document length", 1, kMaxTokens);
    if (total > kMaxTokens) throw std::invalid_argument("the documents add up to over " + std::to_string(kMaxTokens) + " tokens");
    out += (out.empty() ? "" : "+") + std::to_string(std::stol(field));
  }
  return out;
}

std::string canonical_varlen(const std::string& text) {
  const VarlenSpec s = varlen_spec(text);
  return std::to_string(s.tokens) + ":" + std::to_string(s.lo) + ":" + std::to_string(s.hi) + ":" + s.dist + ":" +
         std::to_string(s.seed);
}

std::vector<int> lengths_of(const std::string& canonical) {
  std::vector<int> out;
  if (canonical.empty()) return out;
  for (const std::string& field : fields(canonical, "+")) out.push_back(int(std::stol(field)));
  return out;
}

std::vector<int> draw_varlen(const std::string& canonical) {
  std::vector<int> out;
  if (canonical.empty()) return out;
  const VarlenSpec s = varlen_spec(canonical);
  // Uniform draws from the project's counter-based generator (core/random.hpp), stream 9.
  std::vector<float> u(std::size_t(s.tokens / s.lo + 1));
  fill_uniform(u, s.seed, 9);
  long total = 0;
  for (std::size_t i = 0; total < s.tokens; ++i) {
    const double x = double(u[i]);
    double length = s.dist == "log" ? std::exp(std::log(double(s.lo)) + x * (std::log(double(s.hi)) - std::log(double(s.lo))))
                                    : double(s.lo) + x * double(s.hi - s.lo + 1);
    long n = std::min(s.hi, std::max(s.lo, long(length)));
    n = std::min(n, s.tokens - total);
    if (n < s.lo && !out.empty() && out.back() + n <= s.hi) {
      out.back() += int(n);
    } else {
      out.push_back(int(n));
    }
    total += n;
  }
  return out;
}

}  // namespace lattn
