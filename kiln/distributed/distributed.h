#pragma once
// kiln/distributed: process groups over MPI (CPU, sim) and NCCL (CUDA), and collectives as ops.
// See DESIGN.md "Distributed" and docs/distributed.md.
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/distributed/process_group.h"
