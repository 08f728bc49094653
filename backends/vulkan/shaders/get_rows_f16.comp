// get_rows for F16 weights: get_rows.glsl with dequant.glsl's F16 decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#define W_F16 1
#include "common.glsl"
#include "dequant.glsl"
#include "get_rows.glsl"
