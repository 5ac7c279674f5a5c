// Where lattnbench finds the files `cmake --install` puts beside it: PREFIX/share/lattnbench/
// (configs/, scripts/), found from the running executable (PREFIX/bin/lattnbench) by the relative
// path CMake gives between the two install folders, so that an install can move. A binary run from its build folder finds the source tree's configs/ instead.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace lattn {

// The folders --config NAME is looked up in, in order: PREFIX/share/lattnbench/configs when it
// exists seen from the executable, then the source tree's configs/ when it exists.
std::vector<std::filesystem::path> config_dirs();

// --config's argument as the path to read: itself when it names a file or holds a '/'; else the
// first of NAME, NAME.yaml, NAME.yml, NAME.json in config_dirs(); else itself (and reading it then
// fails with the usual message).
std::string resolve_config_path(const std::string& name);

// The NAMEs --config finds: the .yaml, .yml and .json files of config_dirs(), without their
// extension, each once, sorted.
std::vector<std::string> installed_config_names();

}  // namespace lattn
