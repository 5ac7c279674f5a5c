// The one place records, the summary, the device block and the whole document become JSON
// (docs/results.md), and the one place a journal's JSON lines become records again.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "src/results/record.hpp"

namespace lattn {

inline constexpr const char* kSchemaVersion = "1.0.0";

// The keys that name a case in its record: suite, impl, mode, backend, dtype, plan_index, and the
// shape parameters its op has (with the layer's head_dim and model_dim).
nlohmann::json identity_json(const Case& kase);
nlohmann::json to_json(const CaseRecord& record);
nlohmann::json to_json(const DeviceInfo& device);
nlohmann::json to_json(const Summary& summary);
nlohmann::json to_json(const RunDocument& document);

// What must match for a journal to be resumed: the device, not its measurements.
nlohmann::json device_fingerprint(const DeviceInfo& device);

// A journal line back into the record of `planned` (the case of its plan_index). Throws
// UsageError naming `where` when the line is not a record of that case.
CaseRecord record_from_json(const nlohmann::json& line, const Case& planned, const std::string& where);

}  // namespace lattn
