// get_rows for F32 weights: get_rows.glsl with dequant.glsl's F32 decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#define W_F32 1
#include "common.glsl"
#include "dequant.glsl"
#include "get_rows.glsl"
