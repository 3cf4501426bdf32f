// SPDX-License-Identifier: Apache-2.0
// csrc/transport/symm/launch.cu compiled for the emulated device (the same source, not a copy).
#include "transport/symm/launch.cu"
