// The house's rules, held against the sources: includes run one way (core <- kernels <- src, and
// backends on top of all three, with src/run/backends.cpp the one file of src/ that names a backend),
// and no source file grows past 500 lines without saying why in its opening comment.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace fs = std::filesystem;

namespace {

struct Source {
  std::string path;  // relative to the project root
  std::vector<std::string> includes;  // the quoted ones, as written
  std::size_t lines = 0;
  std::string opening_comment;
};

std::vector<Source> sources(const std::string& folder) {
  std::vector<Source> out;
  const fs::path root = lattn::test::source_dir();
  static const std::regex include(R"re(^\s*#\s*include\s*"([^"]+)")re");
  // The plugin interface is the one angle-bracket include of the project's own (include/lattn/).
  static const std::regex public_header(R"re(^\s*#\s*include\s*<(lattn/[^>]+)>)re");
  for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".cuh")) continue;
    Source s;
    s.path = fs::relative(entry.path(), root).string();
    std::ifstream in(entry.path());
    std::string line;
    bool opening = true;
    while (std::getline(in, line)) {
      ++s.lines;
      std::smatch m;
      if (std::regex_search(line, m, include) || std::regex_search(line, m, public_header)) s.includes.push_back(m[1]);
      if (opening && line.rfind("//", 0) == 0) s.opening_comment += line + "\n";
      else opening = false;
    }
    out.push_back(std::move(s));
  }
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// An include written from the project root names its folder; a bare name is the including file's
// own folder.
std::string top_folder(const Source& from, const std::string& include) {
  if (include.find('/') == std::string::npos) return from.path.substr(0, from.path.find('/'));
  return include.substr(0, include.find('/'));
}

}  // namespace

TEST_CASE("includes run one way: core < kernels < src < backends", "[layout]") {
  std::size_t checked = 0, plugin_header = 0;
  for (const char* folder : {"core", "kernels", "src", "backends"})
    for (const Source& s : sources(folder))
      for (const std::string& include : s.includes) {
        INFO(s.path << " includes \"" << include << "\"");
        const std::string to = top_folder(s, include);
        ++checked;
        if (include == "lattn/plugin.h" || include == "lattn/plugin_v2.h") ++plugin_header;
        // The public C headers (include/lattn/plugin.h, plugin_v2.h) are the harness's and the backends' to
        // include, never core's or a kernel's: the vocabulary and the kernels do not depend on
        // the plugin interface, which may only ever grow new versions beside this one.
        if (starts_with(s.path, "core/")) CHECK(to == "core");
        if (starts_with(s.path, "kernels/")) CHECK((to == "core" || to == "kernels"));
        if (starts_with(s.path, "src/")) {
          CHECK(to != "tests");
          if (s.path != "src/run/backends.cpp") CHECK(to != "backends");
        }
        if (starts_with(s.path, "backends/cpu/")) CHECK_FALSE(starts_with(include, "backends/cuda/"));
        if (starts_with(s.path, "backends/cuda/")) CHECK_FALSE(starts_with(include, "backends/cpu/"));
      }
  CHECK(checked > 100);
  CHECK(plugin_header > 0);  // the angle-bracket form is seen
}

// src/ in rooms, each including only the rooms below it: config (the config, the plan, the ops'
// list) < results (records, their formats, the journal, the device block) < plugins (loading and
// calling C and Python plugins) < run (the runner, a case's run, timing, check, backends' table,
// cost and shards) < cli (the command line and main).
TEST_CASE("src/'s rooms include one way: config < results < plugins < run < cli", "[layout]") {
  const std::vector<std::string> rooms = {"config", "results", "plugins", "run", "cli"};
  auto rank = [&](const std::string& room) {
    return std::size_t(std::find(rooms.begin(), rooms.end(), room) - rooms.begin());
  };
  std::size_t crossings = 0, files = 0;
  for (const Source& s : sources("src")) {
    ++files;
    const std::string room = s.path.substr(4, s.path.find('/', 4) - 4);
    INFO(s.path);
    REQUIRE(s.path.find('/', 4) != std::string::npos);  // every file of src/ is in a room
    REQUIRE(rank(room) < rooms.size());
    for (const std::string& include : s.includes) {
      if (!starts_with(include, "src/")) continue;
      const std::string to = include.substr(4, include.find('/', 4) - 4);
      INFO("includes \"" << include << "\"");
      REQUIRE(rank(to) < rooms.size());
      CHECK(rank(to) <= rank(room));
      crossings += to != room;
    }
  }
  CHECK(files > 50);
  CHECK(crossings > 10);
}

// Under kernels/ a backend is named by a folder (cpu/, cuda/) or by a whole file name (cpu.cpp,
// cuda.cu, cuda/check.hpp), never as a prefix or suffix of a longer name: the folder does the work
// the prefix would, so that a kernel's room is found by walking the tree.
TEST_CASE("no file under kernels/ names its backend in a prefix or suffix", "[layout]") {
  const fs::path root = lattn::test::source_dir();
  static const std::regex backend_affix(R"re(^(cpu|cuda)_|_(cpu|cuda)$)re");
  std::size_t files = 0, in_backend_rooms = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root / "kernels")) {
    if (!entry.is_regular_file()) continue;
    ++files;
    const std::string relative = fs::relative(entry.path(), root).string();
    INFO(relative);
    CHECK_FALSE(std::regex_search(entry.path().stem().string(), backend_affix));
    const std::string folder = entry.path().parent_path().filename().string();
    in_backend_rooms += folder == "cpu" || folder == "cuda" || relative.find("/cpu/") != std::string::npos;
  }
  CHECK(files > 80);
  CHECK(in_backend_rooms > 30);
}

TEST_CASE("a source file over 500 lines says why in its opening comment", "[layout]") {
  for (const char* folder : {"core", "kernels", "src", "backends"})
    for (const Source& s : sources(folder)) {
      if (s.lines <= 500) continue;
      INFO(s.path << ": " << s.lines << " lines");
      CHECK(s.opening_comment.find("500 lines") != std::string::npos);
    }
}

// catch_discover_tests hands each name to Catch as a test spec: a leading '-' reads as a flag, and
// CTest splits the name at a semicolon, so that the spec matches no test and CTest reports a pass
// for a test that never ran.
TEST_CASE("no test name starts with '-' or holds a semicolon, which CTest would pass to Catch as a flag or cut", "[layout]") {
  const fs::path root = lattn::test::source_dir();
  static const std::regex dash_name(R"re(TEST_CASE\(\s*"-)re");
  static const std::regex semicolon_name(R"re(TEST_CASE\(\s*"[^"]*;)re");
  std::size_t files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root / "tests")) {
    if (!entry.is_regular_file() || entry.path().extension() != ".cpp") continue;
    ++files;
    std::ifstream in(entry.path());
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
      ++number;
      INFO(fs::relative(entry.path(), root).string() << ":" << number);
      CHECK_FALSE(std::regex_search(line, dash_name));
      CHECK_FALSE(std::regex_search(line, semicolon_name));
    }
  }
  CHECK(files > 10);
}
