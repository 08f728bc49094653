// mul_mat for F32 weights: mul_mat.glsl with dequant.glsl's F32 decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define W_F32 1
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat.glsl"
