// The typed launch layer: every kernel of csrc/cuda is launched through these four
// calls (there is no <<<>>>), so the same launch code runs on a GPU (launch_cuda.h)
// and in the SIMT emulation (csrc/simt/launch_simt.h):
//
//   launch(kernel, grid, block, stream, args...)            an ordinary launch
//   launch_cooperative(kernel, grid, block, stream, args...) -> CoopLaunch
//                                                            kLaunched, or kRefused when the
//                                                            device refuses it (too large,
//                                                            not supported): nothing ran
//   device_info(kernel, threads, device) -> DeviceInfo       SMs, resident blocks, cooperative
//   stream_is_capturing(stream)                              a CUDA graph is being captured
//
// Arguments are brace-converted to the kernel's parameter types at the call, so a
// mismatch or a narrowing conversion is a compile error, not a garbled launch.
#pragma once
#include "launch_plan.h"

// (CoopLaunch and DeviceInfo: launch_plan.h, which both backends include.)
#if defined(SPECDEC_SIMT)
#include "../simt/launch_simt.h"
#else
#include "launch_cuda.h"
#endif
