// The bridge between the plugin rows and Python impls (python_plugin.hpp). CPython is started
// once, on the first Python plugin, without its signal handlers (lattnbench's SIGINT/SIGTERM stop
// a run cleanly; src/run/interrupt.hpp), and the GIL is taken around every crossing, so that a row may
// call from any thread. The interpreter is never finalised: an impl's modules (torch, JAX) keep
// threads and exit handlers that must outlive every case, as a C plugin's library is never closed.
// Built without Python (-DLATTN_EMBED_PYTHON=OFF), loading one is a usage error saying so.
// Over 500 lines in one file: it is the one file that includes Python.h and handles PyObject references, so
// that the rest of lattnbench builds and reads without CPython's API.
#ifdef LATTN_HAVE_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif

#include "src/plugins/python_plugin.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "src/plugins/python_module.hpp"
#include "src/results/sha256.hpp"

namespace lattn {

#ifndef LATTN_HAVE_PYTHON

std::shared_ptr<LoadedPlugin> load_python_plugin(const std::string& path, int) {
  throw UsageError("plugin " + path,
                   "this lattnbench was built without Python (-DLATTN_EMBED_PYTHON=OFF); rebuild with python3-dev installed");
}

std::optional<PythonInfo> python_bridge_info() { return std::nullopt; }

#else

namespace {

// DLPack's C structures (the interchange ABI, version 0.x, that from_dlpack consumers accept).
struct DLDevice {
  int32_t device_type;  // 1: CPU, 2: CUDA
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 2: float, 4: bfloat
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// A capsule's tensor with its own shape and strides; the memory stays lattnbench's.
struct ManagedView {
  DLManagedTensor managed{};
  int64_t shape[5] = {}, strides[5] = {};  // MIMO's q: [B][H][T][R][D]
};

void delete_view(DLManagedTensor* self) { delete static_cast<ManagedView*>(self->manager_ctx); }

void capsule_destructor(PyObject* capsule) {
  // A consumer renames the capsule "used_dltensor" and calls the deleter itself.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    managed->deleter(managed);
  }
}

// _lattn.capsule(address, shape, dtype, device_type, device_id): a "dltensor" capsule.
PyObject* make_capsule(PyObject*, PyObject* args) {
  PyObject* address = nullptr;
  PyObject* shape = nullptr;
  const char* dtype = nullptr;
  int device_type = 1, device_id = 0;
  if (!PyArg_ParseTuple(args, "OOsii", &address, &shape, &dtype, &device_type, &device_id)) return nullptr;
  void* data = PyLong_AsVoidPtr(address);
  if (PyErr_Occurred()) return nullptr;
  auto view = std::make_unique<ManagedView>();
  const Py_ssize_t ndim = PySequence_Size(shape);
  if (ndim < 1 || ndim > 5) return PyErr_Format(PyExc_ValueError, "a tensor of %zd dimensions", ndim);
  for (Py_ssize_t i = 0; i < ndim; ++i) {
    PyObject* item = PySequence_GetItem(shape, i);
    view->shape[i] = item ? PyLong_AsLongLong(item) : -1;
    Py_XDECREF(item);
    if (PyErr_Occurred()) return nullptr;
  }
  int64_t stride = 1;
  for (Py_ssize_t i = ndim - 1; i >= 0; --i) {
    view->strides[i] = stride;
    stride *= view->shape[i];
  }
  const bool bf16 = std::strcmp(dtype, "bfloat16") == 0;
  DLTensor& t = view->managed.dl_tensor;
  t.data = data;
  t.device = {device_type, device_id};
  t.ndim = int32_t(ndim);
  t.dtype = {uint8_t(bf16 ? 4 : 2), uint8_t(bf16 ? 16 : 32), 1};
  t.shape = view->shape;
  t.strides = view->strides;
  view->managed.manager_ctx = view.get();
  view->managed.deleter = delete_view;
  PyObject* capsule = PyCapsule_New(&view->managed, "dltensor", capsule_destructor);
  if (capsule) static_cast<void>(view.release());  // the capsule's destructor or its consumer frees it
  return capsule;
}

// _lattn.memory(address, bytes, writable): a memoryview over lattnbench's buffer (no copy).
PyObject* make_memory(PyObject*, PyObject* args) {
  PyObject* address = nullptr;
  Py_ssize_t bytes = 0;
  int writable = 0;
  if (!PyArg_ParseTuple(args, "Onp", &address, &bytes, &writable)) return nullptr;
  void* data = PyLong_AsVoidPtr(address);
  if (PyErr_Occurred()) return nullptr;
  return PyMemoryView_FromMemory(static_cast<char*>(data), bytes, writable ? PyBUF_WRITE : PyBUF_READ);
}

PyMethodDef kNativeMethods[] = {
    {"capsule", make_capsule, METH_VARARGS, "a DLPack capsule over one of lattnbench's buffers"},
    {"memory", make_memory, METH_VARARGS, "a memoryview over one of lattnbench's buffers"},
    {nullptr, nullptr, 0, nullptr}};
PyModuleDef kNativeModule = {PyModuleDef_HEAD_INIT, "_lattn", nullptr, -1, kNativeMethods,
                             nullptr, nullptr, nullptr, nullptr};
PyObject* init_native() { return PyModule_Create(&kNativeModule); }

// Holds the GIL for a scope, from any thread.
class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

PyObject* g_module = nullptr;  // lattn
std::optional<PythonInfo> g_info;

// The pending exception as one line, cleared: "ValueError: boom (kernels.py:12)".
std::string take_exception() {
  PyObject *kind = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&kind, &value, &tb);
  PyErr_NormalizeException(&kind, &value, &tb);
  std::string text = "an exception without a type";
  if (kind) {
    PyObject* line = PyObject_CallMethod(g_module, "_last_line", "OOO", kind, value ? value : Py_None, tb ? tb : Py_None);
    if (line && PyUnicode_Check(line)) text = PyUnicode_AsUTF8(line);
    Py_XDECREF(line);
    PyErr_Clear();
  }
  Py_XDECREF(kind);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return text;
}

// Starts CPython (once) and runs the lattn module's source. Throws UsageError on failure.
void start_python(const std::string& where) {
  if (g_module) return;
  if (PyImport_AppendInittab("_lattn", init_native) != 0) throw UsageError(where, "cannot register the _lattn module");
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.install_signal_handlers = 0;
  config.parse_argv = 0;
  // The interpreter whose prefix and site-packages the plugins see: an active virtual
  // environment's, else the one this lattnbench was built against.
  std::string program = LATTN_PYTHON_EXECUTABLE;
  if (const char* venv = std::getenv("VIRTUAL_ENV"); venv && *venv) program = std::string(venv) + "/bin/python3";
  PyStatus status = PyConfig_SetBytesString(&config, &config.program_name, program.c_str());
  if (!PyStatus_Exception(status)) {
    const wchar_t* argv[] = {L"lattnbench"};
    status = PyConfig_SetArgv(&config, 1, const_cast<wchar_t* const*>(argv));
  }
  if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(status))
    throw UsageError(where, std::string("cannot start Python: ") + (status.err_msg ? status.err_msg : "unknown error"));
  PyObject* module = PyImport_AddModule("lattn");  // borrowed; sys.modules holds it
  PyObject* globals = module ? PyModule_GetDict(module) : nullptr;
  PyObject* ran = globals ? PyRun_String(kPythonModuleSource, Py_file_input, globals, globals) : nullptr;
  if (!ran) {
    PyErr_Print();
    throw UsageError(where, "the embedded lattn module does not run");
  }
  Py_DECREF(ran);
  Py_INCREF(module);
  g_module = module;
  PyEval_SaveThread();  // the GIL is taken by whoever crosses next (Gil)
}

// How a tensor's shape follows from the case (include/lattn/plugin_v2.h), in lattnbench's order
// [B, H, rows, ...] or, for an impl of layout BTHD, [B, rows, H, ...].
enum class ShapeKind {
  token,       // q o dO dq: T rows of [R][D] (R = mimo_rank; [D] when R = 1)
  step,        // k v dk dv: T n rows of [R][D] (n = householder)
  state,       // h0 hT dhT dh0: [B, H, D, D], the same in both layouts
  step_scalar, // beta dbeta: T n rows
  scalar,      // dt trap ddt dtrap: T rows
  gate,        // g dg: T rows, of [D] for vector gates
  channels,    // a b da db: T rows of [D]
  heads,       // gamma: [H]
  head_rows,   // u du: [H, D]
};

// A tensor as the Python side builds it (lattn._tensors).
struct TensorSpec {
  const char* name;
  const void* data;
  bool writable;
  bool model_dtype;  // q k v o dO dq dk dv: the case's dtype; the rest float32
  ShapeKind shape;
};

std::vector<TensorSpec> tensor_specs(const lattn_tensors2& t) {
  using K = ShapeKind;
  return {{"q", t.q, false, true, K::token},          {"k", t.k, false, true, K::step},
          {"v", t.v, false, true, K::step},           {"h0", t.h0, false, false, K::state},
          {"g", t.g, false, false, K::gate},          {"beta", t.beta, false, false, K::step_scalar},
          {"gamma", t.gamma, false, false, K::heads}, {"o", t.o, true, true, K::token},
          {"hT", t.hT, true, false, K::state},        {"dO", t.dO, false, true, K::token},
          {"dhT", t.dhT, false, false, K::state},     {"dq", t.dq, true, true, K::token},
          {"dk", t.dk, true, true, K::step},          {"dv", t.dv, true, true, K::step},
          {"dh0", t.dh0, true, false, K::state},      {"dg", t.dg, true, false, K::gate},
          {"dbeta", t.dbeta, true, false, K::step_scalar},
          {"a", t.a, false, false, K::channels},      {"b", t.b, false, false, K::channels},
          {"u", t.u, false, false, K::head_rows},     {"dt", t.dt, false, false, K::scalar},
          {"trap", t.trap, false, false, K::scalar},  {"da", t.da, true, false, K::channels},
          {"db", t.db, true, false, K::channels},     {"du", t.du, true, false, K::head_rows},
          {"ddt", t.ddt, true, false, K::scalar},     {"dtrap", t.dtrap, true, false, K::scalar}};
}

std::vector<long long> tensor_shape(const lattn_case2& c, ShapeKind kind, bool bthd) {
  const long long writes = c.householder > 1 ? c.householder : 1;
  std::vector<long long> inner;
  long long rows = c.seq;
  switch (kind) {
    case ShapeKind::state: return {c.batch, c.heads, c.dim, c.dim};
    case ShapeKind::heads: return {c.heads};
    case ShapeKind::head_rows: return {c.heads, c.dim};
    case ShapeKind::token: inner = c.mimo_rank > 1 ? std::vector<long long>{c.mimo_rank, c.dim} : std::vector<long long>{c.dim}; break;
    case ShapeKind::step:
      rows = c.seq * writes;
      inner = c.mimo_rank > 1 ? std::vector<long long>{c.mimo_rank, c.dim} : std::vector<long long>{c.dim};
      break;
    case ShapeKind::step_scalar: rows = c.seq * writes; break;
    case ShapeKind::scalar: break;
    case ShapeKind::gate: if (std::strcmp(c.decay, "vector") == 0) inner = {c.dim}; break;
    case ShapeKind::channels: inner = {c.dim}; break;
  }
  std::vector<long long> shape = bthd ? std::vector<long long>{c.batch, rows, c.heads}
                                      : std::vector<long long>{c.batch, c.heads, rows};
  shape.insert(shape.end(), inner.begin(), inner.end());
  return shape;
}

// Python objects kept between calls of one prepared case: its Case and Tensors, keyed by every
// field of the case and every pointer of the tensors (the rows bind both once per case).
struct BoundCall {
  std::string key;
  PyObject* kase = nullptr;
  PyObject* tensors = nullptr;
};

std::string call_key(const lattn_case2& c, const lattn_tensors2& t) {
  std::string key(reinterpret_cast<const char*>(&t), sizeof t);
  const int64_t numbers[] = {c.batch, c.heads, c.seq, c.dim, c.chunk, c.threads, c.householder, c.bonus, c.mimo_rank};
  key.append(reinterpret_cast<const char*>(numbers), sizeof numbers);
  key.append(reinterpret_cast<const char*>(&c.scale), sizeof c.scale);
  for (const char* text : {c.op, c.mode, c.decay, c.rule, c.dtype, c.device}) (key += text ? text : "") += '\n';
  return key;
}

class PythonImplFunctions final : public ImplFunctions {
 public:
  // `impl`: a lattn.Impl (a new reference, kept for the process).
  PythonImplFunctions(PyObject* impl, std::string device) : impl_(impl), device_(std::move(device)) {
    PyObject* fn = PyObject_GetAttrString(impl, "forward");
    PyObject* bwd = PyObject_GetAttrString(impl, "backward_fn");
    PyObject* arrays = PyObject_GetAttrString(impl, "arrays");
    PyObject* layout = PyObject_GetAttrString(impl, "layout");
    layout_ = layout && PyUnicode_Check(layout) && std::strcmp(PyUnicode_AsUTF8(layout), "BTHD") == 0
                  ? PluginLayout::bthd
                  : PluginLayout::bhtd;
    Py_XDECREF(layout);
    forward_ = fn;
    backward_ = bwd && bwd != Py_None ? bwd : nullptr;
    if (bwd == Py_None) Py_DECREF(bwd);
    numpy_ = arrays && PyUnicode_Check(arrays) && std::strcmp(PyUnicode_AsUTF8(arrays), "numpy") == 0;
    Py_XDECREF(arrays);
    PyErr_Clear();
  }

  bool has_backward() const override { return backward_ != nullptr; }
  PluginLayout layout() const override { return layout_; }

  std::optional<std::string> unsupported(const lattn_case2& c) const override {
    Gil gil;
    PyObject* kase = make_case(c, nullptr);
    PyObject* why = kase ? PyObject_CallMethod(impl_, "_why_not", "O", kase) : nullptr;
    Py_XDECREF(kase);
    if (!why) return "unsupported() raised " + take_exception();
    std::optional<std::string> text;
    if (why != Py_None) {
      PyObject* str = PyObject_Str(why);
      text = str ? PyUnicode_AsUTF8(str) : "?";
      Py_XDECREF(str);
    }
    Py_DECREF(why);
    return text;
  }

  int forward(const lattn_case2& c, const lattn_tensors2& t, const lattn_allocator*, void* stream, void** saved,
              char* err, size_t errlen) const override {
    Gil gil;
    const BoundCall* bound = bind(c, t, stream);
    if (!bound) return fail(err, errlen);
    PyObject* result = PyObject_CallFunctionObjArgs(forward_, bound->kase, bound->tensors, nullptr);
    if (!result) return fail(err, errlen);
    // What the forward returned is the backward's `saved`; a fwd case has no backward to take it.
    if (std::strcmp(c.mode, "fwd_bwd") == 0) *saved = result;
    else Py_DECREF(result);
    return 0;
  }

  int backward(const lattn_case2& c, const lattn_tensors2& t, const lattn_allocator*, void* stream, void* saved,
               char* err, size_t errlen) const override {
    Gil gil;
    PyObject* kept = saved ? static_cast<PyObject*>(saved) : (Py_INCREF(Py_None), Py_None);
    const BoundCall* bound = bind(c, t, stream);
    PyObject* result = bound ? PyObject_CallFunctionObjArgs(backward_, bound->kase, bound->tensors, kept, nullptr) : nullptr;
    Py_DECREF(kept);
    if (!result) return fail(err, errlen);
    Py_DECREF(result);
    return 0;
  }

  std::optional<std::string> uncounted_scratch() const override {
    return std::string("a Python impl's memory comes from its own allocator (NumPy, PyTorch, JAX), which lattnbench does not count");
  }

  // The lattn module's _watch_start and _watch_stop around the call (tracemalloc for NumPy arrays,
  // torch's or JAX's statistics on CUDA); the watch is stopped even when the call throws.
  std::optional<ScratchSeen> watch_scratch(const lattn_case2& c, const std::function<void()>& call) const override {
    PyObject* watches = nullptr;
    {
      Gil gil;
      watches = PyObject_CallMethod(g_module, "_watch_start", "ss", numpy_ ? "numpy" : "dlpack", c.device);
      if (!watches) {
        const std::string why = "watching it raised " + take_exception();
        call();
        return ScratchSeen{std::nullopt, why};
      }
    }
    const auto stop = [watches] {
      Gil gil;
      PyObject* result = PyObject_CallMethod(g_module, "_watch_stop", "O", watches);
      Py_DECREF(watches);
      ScratchSeen seen;
      PyObject* bytes =
          result && PyTuple_Check(result) && PyTuple_Size(result) == 2 ? PyTuple_GetItem(result, 0) : nullptr;
      PyObject* text = bytes ? PyTuple_GetItem(result, 1) : nullptr;
      if (!bytes) {
        seen.source = "watching it raised " + take_exception();
      } else {
        if (bytes != Py_None) seen.bytes = std::size_t(PyLong_AsUnsignedLongLong(bytes));
        if (text && PyUnicode_Check(text)) seen.source = PyUnicode_AsUTF8(text);
        PyErr_Clear();
      }
      Py_XDECREF(result);
      return seen;
    };
    try {
      call();
    } catch (...) {
      static_cast<void>(stop());
      throw;
    }
    return stop();
  }

 private:
  static int fail(char* err, size_t errlen) {
    const std::string text = take_exception();
    std::snprintf(err, errlen, "%s", text.c_str());
    return 1;
  }

  PyObject* make_case(const lattn_case2& c, void* stream) const {
    return PyObject_CallMethod(g_module, "_case", "ssssssLLLLLdiKiii", c.op, c.mode, c.decay, c.rule, c.dtype, c.device,
                               (long long)c.batch, (long long)c.heads, (long long)c.seq, (long long)c.dim,
                               (long long)c.chunk, c.scale, c.threads,
                               static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(stream)), c.householder,
                               c.bonus, c.mimo_rank);
  }

  // The Case and Tensors of this call, made on the first call of a prepared case (under the GIL).
  const BoundCall* bind(const lattn_case2& c, const lattn_tensors2& t, void* stream) const {
    std::string key = call_key(c, t);
    key.append(reinterpret_cast<const char*>(&stream), sizeof stream);
    for (const BoundCall& b : bound_)
      if (b.key == key) return &b;
    PyObject* kase = make_case(c, stream);
    PyObject* tensors = kase ? make_tensors(c, t) : nullptr;
    if (!tensors) {
      Py_XDECREF(kase);
      return nullptr;
    }
    // A forward's and a backward's per case; older entries belong to finished cases.
    if (bound_.size() >= 4) {
      Py_DECREF(bound_.front().kase);
      Py_DECREF(bound_.front().tensors);
      bound_.erase(bound_.begin());
    }
    bound_.push_back({std::move(key), kase, tensors});
    return &bound_.back();
  }

  PyObject* make_tensors(const lattn_case2& c, const lattn_tensors2& t) const {
    const bool bf16 = std::strcmp(c.dtype, "bfloat16") == 0;
    const bool cuda = std::strcmp(c.device, "cuda") == 0;
    const bool bthd = layout_ == PluginLayout::bthd;  // the row has permuted the per-token buffers
    PyObject* specs = PyList_New(0);
    for (const TensorSpec& s : tensor_specs(t)) {
      if (!s.data) continue;
      const std::vector<long long> shape = tensor_shape(c, s.shape, bthd);
      long long elements = 1;
      for (long long n : shape) elements *= n;
      const bool half = s.model_dtype && bf16;
      PyObject* dims = PyTuple_New(Py_ssize_t(shape.size()));
      for (std::size_t i = 0; i < shape.size(); ++i) PyTuple_SET_ITEM(dims, Py_ssize_t(i), PyLong_FromLongLong(shape[i]));
      PyObject* spec = Py_BuildValue("(sKnNsOii)", s.name, static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(s.data)),
                                     Py_ssize_t(elements * (half ? 2 : 4)), dims, half ? "bfloat16" : "float32",
                                     s.writable ? Py_True : Py_False, cuda ? 2 : 1, 0);
      PyList_Append(specs, spec);
      Py_DECREF(spec);
    }
    PyObject* tensors = PyObject_CallMethod(g_module, "_tensors", "sO", numpy_ ? "numpy" : "dlpack", specs);
    Py_DECREF(specs);
    return tensors;
  }

  PyObject* impl_;
  PyObject* forward_ = nullptr;
  PyObject* backward_ = nullptr;
  std::string device_;
  bool numpy_ = true;
  PluginLayout layout_ = PluginLayout::bhtd;
  mutable std::vector<BoundCall> bound_;  // under the GIL
};

std::string text_attr(PyObject* object, const char* name) {
  PyObject* value = PyObject_GetAttrString(object, name);
  std::string text;
  if (value && PyUnicode_Check(value)) text = PyUnicode_AsUTF8(value);
  else text = "";
  Py_XDECREF(value);
  PyErr_Clear();
  return text;
}

// The bridge's cost per call: an empty impl's forward on a small case, through the functions a
// row calls, the median of batches of calls.
PythonInfo measure_bridge() {
  PythonInfo info;
  {
    Gil gil;
    PyObject* sys = PyImport_ImportModule("sys");
    PyObject* version = sys ? PyObject_GetAttrString(sys, "version") : nullptr;
    PyObject* executable = sys ? PyObject_GetAttrString(sys, "executable") : nullptr;
    if (version && PyUnicode_Check(version)) {
      info.version = PyUnicode_AsUTF8(version);
      info.version = info.version.substr(0, info.version.find(' '));
    }
    if (executable && PyUnicode_Check(executable)) info.executable = PyUnicode_AsUTF8(executable);
    Py_XDECREF(version);
    Py_XDECREF(executable);
    Py_XDECREF(sys);
    PyErr_Clear();
  }
  std::unique_ptr<PythonImplFunctions> functions;
  {
    Gil gil;
    PyObject* plugin = PyObject_CallMethod(g_module, "Plugin", "s", "bridge");
    PyObject* decorate = plugin ? PyObject_CallMethod(plugin, "impl", "s", "empty") : nullptr;
    PyObject* fn = PyObject_GetAttrString(g_module, "_empty");
    PyObject* empty = decorate && fn ? PyObject_CallFunctionObjArgs(decorate, fn, nullptr) : nullptr;
    PyErr_Clear();
    if (empty) functions = std::make_unique<PythonImplFunctions>(empty, "cpu");
    Py_XDECREF(fn);
    Py_XDECREF(decorate);
    Py_XDECREF(plugin);
    if (!functions) return info;
  }
  const int64_t batch = 1, heads = 1, seq = 64, dim = 16;
  std::vector<float> q(std::size_t(seq * dim)), k(q.size()), v(q.size()), o(q.size()), hT(std::size_t(dim * dim));
  lattn_case2 c{};
  c.op = "linear_attention";
  c.mode = "fwd";
  c.decay = "none";
  c.rule = "additive";
  c.dtype = "float32";
  c.device = "cpu";
  c.batch = batch;
  c.heads = heads;
  c.seq = seq;
  c.dim = dim;
  c.chunk = 64;
  c.threads = 1;
  c.householder = 1;
  c.mimo_rank = 1;
  lattn_tensors2 t{};
  t.q = q.data();
  t.k = k.data();
  t.v = v.data();
  t.o = o.data();
  t.hT = hT.data();
  char err[256] = "";
  void* saved = nullptr;
  const int calls = 2000;
  std::vector<double> per_call_us;
  for (int round = 0; round < 8; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) functions->forward(c, t, nullptr, nullptr, &saved, err, sizeof err);
    const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
    if (round > 0) per_call_us.push_back(elapsed.count() / calls);  // the first warms the caches
  }
  std::sort(per_call_us.begin(), per_call_us.end());
  info.bridge_call_us = per_call_us[per_call_us.size() / 2];
  info.bridge_calls = calls;
  return info;
}

}  // namespace

std::shared_ptr<LoadedPlugin> load_python_plugin(const std::string& path, int threads) {
  const std::string where = "plugin " + path;
  const bool module_path = path.rfind("python:", 0) == 0;
  if (module_path && path.size() == std::strlen("python:")) throw UsageError(where, "names no module (python:MODULE)");
  if (!module_path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw UsageError(where, "no such file");
    if (!std::filesystem::is_regular_file(path, ec)) throw UsageError(where, "not a file");
  }
  start_python(where);
  auto loaded = std::make_shared<LoadedPlugin>();
  loaded->path = path;
  std::string source;
  {
    Gil gil;
    const long run_threads = threads > 0 ? threads : long(std::max(1u, std::thread::hardware_concurrency()));
    PyObject* count = PyLong_FromLong(run_threads);
    PyObject_SetAttrString(g_module, "threads", count);
    Py_XDECREF(count);
    PyObject* result = PyObject_CallMethod(g_module, "_load", "s", path.c_str());
    if (!result) throw UsageError(where, "does not load: " + take_exception());
    PyObject* plugin = PyTuple_GetItem(result, 0);
    PyObject* file = PyTuple_GetItem(result, 1);
    if (file && PyUnicode_Check(file)) source = PyUnicode_AsUTF8(file);
    loaded->name = text_attr(plugin, "name");
    PyObject* impls = PyObject_GetAttrString(plugin, "impls");
    const Py_ssize_t n = impls ? PyList_Size(impls) : 0;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* impl = PyList_GetItem(impls, i);
      Py_INCREF(impl);
      const std::string device = text_attr(impl, "device");
      loaded->impls.push_back({loaded->name + ":" + text_attr(impl, "name"), device,
                               std::make_shared<PythonImplFunctions>(impl, device)});
    }
    Py_XDECREF(impls);
    Py_DECREF(result);
    PyErr_Clear();
  }
  try {
    loaded->sha256 = source.empty() ? "" : sha256_file_hex(source);
  } catch (const RuntimeFailure&) {
    throw UsageError(where, "cannot read the file");
  }
  if (!g_info) g_info = measure_bridge();
  return loaded;
}

std::optional<PythonInfo> python_bridge_info() { return g_info; }

#endif  // LATTN_HAVE_PYTHON

}  // namespace lattn
