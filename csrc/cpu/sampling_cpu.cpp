// CPU launchers of specdec::verify and specdec::sample: argument handling is
// shared (sampling_args.cpp); here we pick the instruction set and run.
#include <torch/library.h>

#include <cstdlib>
#include <cstring>

#include "../sampling_args.h"
#include "sampling_kernels_entry.h"

namespace specdec {
namespace {

// AVX2 copy when the CPU has AVX2 + FMA + F16C, unless SPECDEC_CPU_CAPABILITY=default
// (read per call so tests can compare the two copies in one process).
bool use_avx2() {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  const char* env = std::getenv("SPECDEC_CPU_CAPABILITY");
  return has && cpu::avx2_compiled() && !(env && std::strcmp(env, "default") == 0);
#else
  return false;
#endif
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature,
    const at::Tensor& seed, const at::Tensor& offset) {
  VerifyLaunch L = prepare_verify(target_logits, draft_token_ids, draft_probs, temperature, seed, offset);
  if (L.params.B > 0) {
    if (use_avx2()) cpu::verify_avx2(L.params, L.logits_dtype, L.probs_dtype);
    else cpu::verify_default(L.params, L.logits_dtype, L.probs_dtype);
  }
  return {L.tokens, L.num_accepted, L.valid};
}

at::Tensor sample_cpu(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& seed,
                      const at::Tensor& offset, const std::optional<at::Tensor>& probs_out) {
  SampleLaunch L = prepare_sample(logits, temperature, seed, offset, probs_out);
  if (L.params.B > 0) {
    if (use_avx2()) cpu::sample_avx2(L.params, L.logits_dtype);
    else cpu::sample_default(L.params, L.logits_dtype);
  }
  return L.tokens;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("verify", &verify_cpu);
  m.impl("sample", &sample_cpu);
}

}  // namespace specdec
