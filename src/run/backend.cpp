// The backend table's own lookups (backend.hpp), apart from the registration of the backends
// (backends.cpp), so that a backend built elsewhere (the CUDA one in the CPU emulation's tests)
// links them without the others.
#include "src/run/backend.hpp"

#include "core/op.hpp"

namespace lattn {

const ImplRow* Backend::find(const std::string& op, const std::string& impl) const {
  for (const ImplRow& row : impls)
    if (row.op == op && row.impl == impl) return &row;
  return nullptr;
}

std::optional<std::string> Backend::unsupported(const Case& kase) const {
  const ImplRow* row = find(kase.op->name, kase.impl);
  if (!row) return "the " + name + " backend has no " + kase.impl + " impl of the " + kase.op->name + " op";
  return row->unsupported ? row->unsupported(kase) : std::nullopt;
}

std::string Backend::variant(const Case& kase) const {
  const ImplRow* row = find(kase.op->name, kase.impl);
  return row && row->variant && !unsupported(kase) ? row->variant(kase) : std::string();
}

}  // namespace lattn
