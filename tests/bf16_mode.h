// The CPU's two ways of multiplying BF16 weights (backends/cpu/matmul.h): activations rounded to
// bf16 for vdpbf16ps (the default where the CPU has AVX512-BF16) or kept f32 (exact products).
// Tests against transformers' fp32 outputs run the exact way at their tight bounds, and the
// default way at bounds that allow its rounding.
#pragma once

#include "backends/cpu/matmul.h"

namespace kite::test {

// Sets the way for a scope (contexts created inside it plan and run that way).
class Bf16Activations {
 public:
  explicit Bf16Activations(bool rounded) : prev_(cpu::bf16_activations()) { cpu::set_bf16_activations(rounded); }
  ~Bf16Activations() { cpu::set_bf16_activations(prev_); }
  Bf16Activations(const Bf16Activations&) = delete;
  Bf16Activations& operator=(const Bf16Activations&) = delete;

 private:
  bool prev_;
};

// Whether BF16 weights multiply bf16-rounded activations now: the active level has the kernels
// (bgemm) and the way is on.
inline bool bf16_activations_rounded() {
  const cpu::MatmulKernels* mk = cpu::active_kernels();
  return mk != nullptr && mk->bgemm != nullptr && cpu::bf16_activations();
}

}  // namespace kite::test
