#pragma once
// Umbrella header for Kiln users.
#include "kiln/autograd/autograd.h"
#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/generator.h"
#include "kiln/core/scalar.h"
#include "kiln/core/tensor.h"
#include "kiln/io/safetensors.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
