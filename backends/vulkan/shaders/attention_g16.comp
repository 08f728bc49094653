// kite/backends/vulkan/shaders/attention_g16.comp — attention for GQA groups of up to 16 query
// heads per KV head (attention_main.glsl).
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "attention.glsl"

#define MAX_GROUP 16u
#include "attention_main.glsl"
