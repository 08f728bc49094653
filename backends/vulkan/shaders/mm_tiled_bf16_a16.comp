// mm_tiled.glsl for BF16 weights, rows 16-byte aligned, k % 8 == 0.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define W_BF16 1
#define W_ALIGNED16 1
#include "common.glsl"
#include "dequant.glsl"
#include "mm_tiled.glsl"
