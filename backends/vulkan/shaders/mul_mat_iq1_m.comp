// mul_mat for IQ1_M weights: mul_mat.glsl with dequant.glsl's IQ1_M decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define W_IQ1_M 1
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat.glsl"
