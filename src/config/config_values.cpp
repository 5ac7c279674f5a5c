#include "src/config/config_values.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <sstream>

namespace lattn {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

long parse_int(const Raw& raw, long lo, long hi) {
  long value = 0;
  const char* first = raw.text.data();
  const char* last = first + raw.text.size();
  auto [ptr, ec] = std::from_chars(first, last, value);
  if (raw.quoted || raw.text.empty() || ec != std::errc() || ptr != last)
    throw UsageError(raw.where, "expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                                    ", got " + (raw.quoted ? "the string " : "") + "'" + raw.text + "'");
  if (value < lo || value > hi)
    throw UsageError(raw.where, "expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                                    ", got " + raw.text);
  return value;
}

namespace {

// The text as a number (a quoted string, trailing characters or no digits are refused).
double read_number(const Raw& raw) {
  double value = 0;
  std::istringstream in(raw.text);
  in >> value;
  if (raw.quoted || raw.text.empty() || in.fail() || !in.eof())
    throw UsageError(raw.where, "expected a number, got '" + raw.text + "'");
  return value;
}

}  // namespace

double parse_positive_number(const Raw& raw, double hi) {
  const double value = read_number(raw);
  if (!(value > 0 && value <= hi))
    throw UsageError(raw.where, "expected a number in (0, " + std::to_string(long(hi)) + "], got " + raw.text);
  return value;
}

double parse_number_or_zero(const Raw& raw, double hi) {
  const double value = read_number(raw);
  if (!(value >= 0 && value <= hi)) throw UsageError(raw.where, fmt::format("expected a number in [0, {}], got {}", hi, raw.text));
  return value;
}

std::uint64_t parse_seed(const Raw& raw) {
  std::uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(raw.text.data(), raw.text.data() + raw.text.size(), value);
  if (raw.quoted || raw.text.empty() || ec != std::errc() || ptr != raw.text.data() + raw.text.size())
    throw UsageError(raw.where, "expected a non-negative integer seed, got '" + raw.text + "'");
  return value;
}

bool parse_bool(const Raw& raw) {
  if (!raw.quoted && (raw.text == "true" || raw.text == "yes" || raw.text == "on" || raw.text == "1")) return true;
  if (!raw.quoted && (raw.text == "false" || raw.text == "no" || raw.text == "off" || raw.text == "0")) return false;
  throw UsageError(raw.where, "expected true or false, got '" + raw.text + "'");
}

const std::string& parse_choice(const Raw& raw, const std::vector<std::string>& choices, const char* what) {
  auto it = std::find(choices.begin(), choices.end(), raw.text);
  if (it == choices.end())
    throw UsageError(raw.where, std::string("unknown ") + what + " '" + raw.text + "' (expected one of: " +
                                    join(choices) + ")");
  return *it;
}

// A real in (lo, hi]: NaN and infinities are refused by the range.
double parse_real(const Raw& raw, double lo, double hi) {
  const double value = read_number(raw);
  if (!(value > lo && value <= hi))
    throw UsageError(raw.where, fmt::format("expected a number in ({}, {}], got {}", lo, hi, raw.text));
  return value;
}

}  // namespace lattn
