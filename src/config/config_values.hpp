// One value of a config key, from the text a file or a flag gave, with where it came from
// (file:line: key, or the flag) for the one-line error when it is wrong.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
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
double parse_number_or_zero(const Raw& raw, double hi);   // in [0, hi] (0 often turns a setting off)
double parse_real(const Raw& raw, double lo, double hi);  // in (lo, hi]: NaN and infinities refused
std::uint64_t parse_seed(const Raw& raw);
bool parse_bool(const Raw& raw);
const std::string& parse_choice(const Raw& raw, const std::vector<std::string>& choices, const char* what);

// Each value parsed; a value given twice is refused, also when written two ways ("16" and "16.0"
// are one gate_norm, "512" and "0512" one seq): the plan would hold the same case twice.
template <class T, class Parse>
std::vector<T> parse_list(const std::vector<Raw>& raws, Parse parse) {
  std::vector<T> out;
  for (const auto& raw : raws) {
    T value = parse(raw);
    if (std::find(out.begin(), out.end(), value) != out.end())
      throw UsageError(raw.where, "duplicate value '" + raw.text + "'");
    out.push_back(std::move(value));
  }
  return out;
}

}  // namespace lattn
