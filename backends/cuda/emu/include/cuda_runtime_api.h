// The CUDA emulator's stand-in for the toolkit header of this name (backends/cuda/emu).
#pragma once
#include "backends/cuda/emu/kernel.h"
