// SIMT emulation build: stands in for the CUDA runtime header (csrc/simt/simt.h).
#pragma once
#include "../simt.h"
