# Writes OUTPUT with the checkout's revision and dirty flag; leaves it untouched when unchanged,
# so that an unchanged tree does not relink.
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse HEAD OUTPUT_VARIABLE rev
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rev_status)
if(NOT rev_status EQUAL 0 OR rev STREQUAL "")
  set(rev "unknown")
endif()
execute_process(COMMAND git -C "${SOURCE_DIR}" status --porcelain --untracked-files=no
                OUTPUT_VARIABLE changes ERROR_QUIET RESULT_VARIABLE status_status)
if(status_status EQUAL 0 AND NOT changes STREQUAL "")
  set(dirty true)
else()
  set(dirty false)
endif()
set(content "// Generated at build time by cmake/git_revision.cmake.
namespace lattn {
extern const char* const kGitRevision;
extern const bool kGitDirty;
const char* const kGitRevision = \"${rev}\";
const bool kGitDirty = ${dirty};
}  // namespace lattn
")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUTPUT}" "${content}")
endif()
