// mul_mat for Q5_1 weights: mul_mat.glsl with dequant.glsl's Q5_1 decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define W_Q5_1 1
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat.glsl"
