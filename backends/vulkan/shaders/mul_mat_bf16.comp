// mul_mat for BF16 weights: mul_mat.glsl with dequant.glsl's BF16 decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define W_BF16 1
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat.glsl"
