// get_rows for BF16 weights: get_rows.glsl with dequant.glsl's BF16 decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#define W_BF16 1
#include "common.glsl"
#include "dequant.glsl"
#include "get_rows.glsl"
