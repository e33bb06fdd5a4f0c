// Registration of the specdec operators: the schemas (csrc/op_schemas.h, the one
// place where they are defined, with a comment per op), the device rule every op
// checks first, and the _C module. Kernels are registered per backend next to their
// launchers (csrc/cpu, csrc/cuda); fake (meta) kernels for torch.compile live in
// specdec_ext/ops.
#include <Python.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include "args/common.h"
#include "op_schemas.h"

TORCH_LIBRARY(specdec, m) {
  for (const char* schema : specdec::schemas::kAll) m.def(schema);
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

bool may_be_host(const std::string& name) {
  for (const char* n : {"temperature", "seed", "offset", "top_k", "top_p", "min_p", "num_drafts"})
    if (name == n) return true;
  return false;
}

void device_guard(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
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
    } else if (may_be_host(name)) {
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
  for (const char* name : {"verify", "sample", "filtered_probs", "mask_logits", "logprobs", "verify_shard",
                           "verify_shard_finish", "verify_reference", "sample_reference", "kv_append_",
                           "kv_rollback_", "paged_kv_append_", "paged_kv_gather", "paged_kv_gather_into_",
                           "kv_compact_", "paged_kv_compact_"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&device_guard>());
}

#ifndef SPECDEC_WITH_CUDA
#define SPECDEC_WITH_CUDA 0
#endif

// `import specdec_ext._C` loads this library, which runs the registrations
// above; the module itself only says how it was built.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", "specdec_ext native ops", -1, nullptr};
  PyObject* mod = PyModule_Create(&def);
  if (mod && PyModule_AddIntConstant(mod, "CUDA_KERNELS", SPECDEC_WITH_CUDA) < 0) {
    Py_DECREF(mod);
    return nullptr;
  }
  return mod;
}
