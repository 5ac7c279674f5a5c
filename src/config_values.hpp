// One value of a config key, from the text a file or a flag gave, with where it came from
// (file:line: key, or the flag) for the one-line error when it is wrong.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace lattn {

struct Raw {
  std::string text;
  std::string where;
  bool quoted = false;  // a quoted YAML/JSON string: never a number
};

std::string join(const std::vector<std::string>& items);  // "a, b, c"

long parse_int(const Raw& raw, long lo, long hi);
double parse_positive_number(const Raw& raw, double hi);  // in (0, hi]
double parse_real(const Raw& raw, double lo, double hi);  // in (lo, hi]: NaN and infinities refused
std::uint64_t parse_seed(const Raw& raw);
bool parse_bool(const Raw& raw);
const std::string& parse_choice(const Raw& raw, const std::vector<std::string>& choices, const char* what);

// Each value parsed; a value given twice is refused.
template <class T, class Parse>
std::vector<T> parse_list(const std::vector<Raw>& raws, Parse parse) {
  std::vector<T> out;
  std::set<std::string> seen;
  for (const auto& raw : raws) {
    if (!seen.insert(raw.text).second) throw UsageError(raw.where, "duplicate value '" + raw.text + "'");
    out.push_back(parse(raw));
  }
  return out;
}

}  // namespace lattn
