#pragma once
// Checks a function's backward against finite differences, as torch.autograd.gradcheck.
#include <functional>
#include <string>

#include "kiln/core/tensor.h"

namespace kiln::autograd {

struct GradcheckOptions {
  double eps = 1e-6;   // central-difference step
  double atol = 1e-5;  // |analytical - numerical| <= atol + rtol * |numerical|
  double rtol = 1e-3;
};

// Compares the Jacobian that backward gives for `fn` at `inputs` with central differences.
// Inputs that require grad are perturbed (use float64 for meaningful tolerances); the others
// are held fixed. Returns true when every entry matches; otherwise false, and `why` (if given)
// names the output, input, element and both values of the first mismatch.
bool gradcheck(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs,
               const GradcheckOptions& options = {}, std::string* why = nullptr);

}  // namespace kiln::autograd
