#pragma once
// The mixed-precision policy table (Note [Autocast policies] in autocast_policies.cpp).
#include <span>
#include <string_view>

#include "kiln/dispatch/op.h"

namespace kiln::amp {

struct PolicyEntry {
  std::string_view op;
  AutocastPolicy policy;
};

// The functional ops' entries, for tests (every name must be an op).
std::span<const PolicyEntry> autocast_policy_table();

}  // namespace kiln::amp
