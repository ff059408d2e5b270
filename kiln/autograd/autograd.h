#pragma once
// Kiln's autograd: grad modes, backward/grad, gradcheck. Tensors carry requires_grad_(),
// grad(), is_leaf() and backward() (kiln/core/tensor.h). See Note [Autograd recording].
#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/gradcheck.h"
