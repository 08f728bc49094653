// mul_mat for Q4_K weights: mul_mat.glsl with dequant.glsl's Q4_K decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define W_Q4_K 1
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat.glsl"
