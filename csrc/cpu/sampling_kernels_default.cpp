// The CPU sampling kernels for any x86-64 / other CPU (at::vec's DEFAULT width).
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT
#include "sampling_kernels.h"
#include "block_kernels.h"
#include "tree_kernels.h"
#include "logprob_kernels.h"
#include "shard_kernels.h"
#include "skinny_linear_kernels.h"
#include "sampling_kernels_entry.h"

#define SPECDEC_CPU_TAG Default
#include "sampling_kernels_entries.inc"
