// SIMT emulation build: __nv_bfloat16 with its exact conversion to float (the top 16 bits).
#pragma once
#include "../simt.h"

struct __nv_bfloat16 {
  unsigned short x;
};

inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float(static_cast<unsigned>(h.x) << 16); }
