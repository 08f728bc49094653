// mul_mat for IQ2_S weights: mul_mat.glsl with dequant.glsl's IQ2_S decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define W_IQ2_S 1
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat.glsl"
