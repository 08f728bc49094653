// get_rows for IQ1_M weights: get_rows.glsl with dequant.glsl's IQ1_M decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#define W_IQ1_M 1
#include "common.glsl"
#include "dequant.glsl"
#include "get_rows.glsl"
