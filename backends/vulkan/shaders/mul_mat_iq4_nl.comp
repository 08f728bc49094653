// mul_mat for IQ4_NL weights: mul_mat.glsl with dequant.glsl's IQ4_NL decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define W_IQ4_NL 1
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat.glsl"
