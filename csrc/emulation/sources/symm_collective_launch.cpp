// SPDX-License-Identifier: Apache-2.0
// csrc/transport/symm/collective_launch.cu compiled for the emulated device (the same source, not a
// copy).
#include "transport/symm/collective_launch.cu"
