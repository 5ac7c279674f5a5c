// A config's text, from a file to a YAML tree: the file's checks (a regular file of at most
// kMaxConfigBytes), JSON's strict syntax check, and what YAML allows but a config must not have
// (a second document, tags, nesting past kMaxConfigDepth), each a UsageError naming file:line.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <string>

namespace lattn {

inline constexpr std::size_t kMaxConfigBytes = std::size_t(1) << 20;
inline constexpr int kMaxConfigDepth = 64;

// The text of the config file at `path`; refuses a directory, a device or FIFO, and a file over
// kMaxConfigBytes (before reading it whole).
std::string read_config_file(const std::string& path);

// `text` as a YAML tree (JSON when `source` ends in .json, after a strict JSON syntax check);
// throws UsageError naming `source` and the line for anything a config may not be.
YAML::Node load_config_tree(const std::string& text, const std::string& source);

}  // namespace lattn
