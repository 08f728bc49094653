// mm_tiled.glsl (GPU-shaped mul_mat for many columns) for IQ2_XXS weights.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define W_IQ2_XXS 1
#include "common.glsl"
#include "dequant.glsl"
#include "mm_tiled.glsl"
