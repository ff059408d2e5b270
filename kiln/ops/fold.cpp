// unfold and fold over im2col and col2im (kiln/ops/fold.h).
#include "kiln/ops/fold.h"

#include "kiln/ops/op_list.h"

namespace kiln {
namespace {
// One value for both spatial dims; any other length goes to the op, which names it.
Shape pair(IntArrayRef v) { return v.size() == 1 ? Shape{v[0], v[0]} : Shape(v); }
}  // namespace

Tensor unfold(const Tensor& input, IntArrayRef kernel_size, IntArrayRef dilation,
              IntArrayRef padding, IntArrayRef stride) {
  return ops::op_im2col(input, pair(kernel_size), pair(dilation), pair(padding), pair(stride));
}
Tensor fold(const Tensor& input, IntArrayRef output_size, IntArrayRef kernel_size,
            IntArrayRef dilation, IntArrayRef padding, IntArrayRef stride) {
  return ops::op_col2im(input, pair(output_size), pair(kernel_size), pair(dilation), pair(padding),
                        pair(stride));
}

}  // namespace kiln
