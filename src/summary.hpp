// The answer users came for: per shape and mode, which impl is fastest, by what factor and at what
// memory cost against the other, and where along seq the winner changes.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace lattn {

// From result records (skipped and broken ones are ignored): {"comparisons": [...], "crossovers": [...]}.
nlohmann::json build_summary(const nlohmann::json& results);
std::string format_summary(const nlohmann::json& summary);

}  // namespace lattn
