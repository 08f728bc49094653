// mul_mat for F16 weights: mul_mat.glsl with dequant.glsl's F16 decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define W_F16 1
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat.glsl"
