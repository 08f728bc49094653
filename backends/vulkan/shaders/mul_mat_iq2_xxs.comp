// mul_mat for IQ2_XXS weights: mul_mat.glsl with dequant.glsl's IQ2_XXS decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define W_IQ2_XXS 1
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat.glsl"
