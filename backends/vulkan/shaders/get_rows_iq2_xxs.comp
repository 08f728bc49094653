// get_rows for IQ2_XXS weights: get_rows.glsl with dequant.glsl's IQ2_XXS decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#define W_IQ2_XXS 1
#include "common.glsl"
#include "dequant.glsl"
#include "get_rows.glsl"
