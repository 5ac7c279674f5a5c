// The Python source of the `lattn` module that Python plugins import (docs/plugins.md, "Python
// kernels"): lattn.Plugin, its impl decorator, Case, Tensors and the DLPack view. The bridge
// (src/plugins/python_plugin.cpp) runs it once in the embedded interpreter.
#pragma once

namespace lattn {

extern const char* const kPythonModuleSource;

}  // namespace lattn
