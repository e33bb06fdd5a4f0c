// SIMT emulation build: __half with bit-exact conversion to float (IEEE binary16).
#pragma once
#include <cstdint>

#include "../simt.h"

struct __half {
  unsigned short x;
};

inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }

// Every binary16 value (normal, subnormal, +-0, +-inf, NaN with its payload) is exact in binary32.
inline float __half2float(__half h) {
  const uint32_t sign = static_cast<uint32_t>(h.x & 0x8000u) << 16;
  const uint32_t exp = (h.x >> 10) & 0x1fu;
  uint32_t man = h.x & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while (!(man & 0x400u));
    bits = sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((man & 0x3ffu) << 13);
  }
  return __uint_as_float(bits);
}
