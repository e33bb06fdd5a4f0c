// The ONE place where the specdec operator schemas are defined. Kernels are
// registered per backend next to their launchers (csrc/cpu, csrc/cuda); fake
// (meta) kernels for torch.compile live in specdec_ext/_fake.py.
//
// Shapes: B batch, K drafts per row, V vocabulary.
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(specdec, m) {
  // Fused chain verification of K drafted tokens per row, straight from logits.
  //   target_logits   [B, K+1, V] float32|float16|bfloat16  (vocab dim stride 1, else copied)
  //   draft_token_ids [B, K] int64|int32
  //   draft_probs     [B, K, V] float32|float16|bfloat16, or None = one-hot (deterministic drafts)
  //   temperature     float32 [] (CPU: host value; device: read by kernel) or [B]; 0 = greedy
  //   seed, offset    int64 [] (batch-wide, row index mixed in) or [B] (per row), any device
  // returns tokens [B, K+1] int64 (accepted drafts, correction/bonus, then -1),
  //         num_accepted [B] int64, valid [B] bool
  m.def("verify(Tensor target_logits, Tensor draft_token_ids, Tensor? draft_probs, "
        "Tensor temperature, Tensor seed, Tensor offset) -> (Tensor, Tensor, Tensor)");

  // Fused draft-step sampler: temperature softmax + one draw per row.
  //   logits      [B, V] float32|float16|bfloat16 (any row stride)
  //   temperature, seed, offset as in verify
  //   probs_out   [B, V] float32 written in place with the normalised probabilities
  //               (may be a strided slice such as draft_probs[:, i]), or None
  // returns tokens [B] int64 (-1 for a row with NaN / +inf / all -inf logits)
  m.def("sample(Tensor logits, Tensor temperature, Tensor seed, Tensor offset, "
        "Tensor(a!)? probs_out) -> Tensor");
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
