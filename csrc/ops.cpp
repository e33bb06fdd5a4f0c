// Registration of the specdec operators: the schemas (csrc/op_schemas.h, the one
// place where they are defined, with a comment per op), the device rule every op
// checks first, and the _C module. Kernels are registered per backend next to their
// launchers (csrc/cpu, csrc/cuda); fake (meta) kernels for torch.compile live in
// specdec_ext/ops.
#include <Python.h>

#include <iterator>
#include <string>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include "args/common.h"
#include "op_schemas.h"

TORCH_LIBRARY(specdec, m) {
  for (const auto& op : specdec::schemas::kOps) m.def(op.schema);
}

// ---- The device rule of every op, checked before any kernel is chosen ----
// Every tensor argument must be on the op's device: the device of its FIRST
// tensor argument (target_logits, logits, key_cache, lengths). The sampling ops'
// temperature, seed, offset, filters and num_drafts may also be CPU tensors when the data is on an
// accelerator (a 0-dim one is read on the host, a [B] one copied without a host
// sync). Anything else (e.g. a meta tensor among CPU tensors, which the
// dispatcher would otherwise route to the fake kernel and return garbage) is a
// ValueError naming the argument. This runs at the BackendSelect key, i.e.
// after autograd and FakeTensor / torch.compile tracing (whose fake kernels
// never get here) and before the CPU / CUDA / Meta kernel is picked.
namespace {

// Whether `name` is in the comma-separated list `host_args` (the op table's host arguments).
bool may_be_host(const std::string& name, const char* host_args) {
  const std::string list = std::string(",") + host_args + ",";
  return list.find("," + name + ",") != std::string::npos;
}

// The op table's host arguments of `op` (a specdec::<name> operator).
const char* host_args_of(const c10::OperatorHandle& op) {
  const std::string& qualified = op.schema().name();
  const int i = specdec::schemas::find_op(qualified.substr(qualified.find("::") + 2).c_str());
  return i < 0 ? "" : specdec::schemas::kOps[i].host_args;
}

void device_guard(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const char* host_args = host_args_of(op);
  const auto& schema_args = op.schema().arguments();
  const auto args = torch::jit::last(*stack, schema_args.size());
  const at::Tensor* ref = nullptr;
  const char* ref_name = nullptr;
  for (size_t i = 0; i < schema_args.size(); ++i) {
    if (!args[i].isTensor()) continue;  // ints, and None for an absent optional tensor
    const at::Tensor& t = args[i].toTensor();
    const std::string& name = schema_args[i].name();
    if (ref == nullptr) {
      ref = &t;
      ref_name = name.c_str();
    } else if (may_be_host(name, host_args)) {
      specdec::args::check_device_or_host(t, *ref, name.c_str(), ref_name);
    } else {
      specdec::args::check_device(t, *ref, name.c_str(), ref_name);
    }
  }
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect),
                     stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, BackendSelect, m) {
  for (const auto& op : specdec::schemas::kOps)
    m.impl(op.name, torch::CppFunction::makeFromBoxedFunction<&device_guard>());
}

#ifndef SPECDEC_WITH_CUDA
#define SPECDEC_WITH_CUDA 0
#endif

namespace {

// The op table as Python data: ((name, backends, host_args, cuda_file), ...), backends a tuple
// of "cpu" / "cuda", host_args a comma-separated string of names, cuda_file a path under csrc/
// or None.
PyObject* op_table() {
  using specdec::schemas::kOps;
  PyObject* table = PyTuple_New(static_cast<Py_ssize_t>(std::size(kOps)));
  if (table == nullptr) return nullptr;
  for (size_t i = 0; i < std::size(kOps); ++i) {
    const auto& op = kOps[i];
    PyObject* row = Py_BuildValue("(sNNz)", op.name,
                                  Py_BuildValue((op.backends & specdec::schemas::kCuda) ? "(ss)" : "(s)", "cpu", "cuda"),
                                  PyUnicode_FromString(op.host_args), op.cuda_file);
    if (row == nullptr) {
      Py_DECREF(table);
      return nullptr;
    }
    PyTuple_SET_ITEM(table, static_cast<Py_ssize_t>(i), row);
  }
  return table;
}

}  // namespace

// `import specdec_ext._C` loads this library, which runs the registrations above; the module
// says how it was built (CUDA_KERNELS) and holds the op table (OPS).
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", "specdec_ext native ops", -1, nullptr};
  PyObject* mod = PyModule_Create(&def);
  if (mod == nullptr) return nullptr;
  PyObject* table = op_table();
  if (PyModule_AddIntConstant(mod, "CUDA_KERNELS", SPECDEC_WITH_CUDA) < 0 || table == nullptr ||
      PyModule_AddObject(mod, "OPS", table) < 0) {
    Py_XDECREF(table);
    Py_DECREF(mod);
    return nullptr;
  }
  return mod;
}
