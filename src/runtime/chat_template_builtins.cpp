// kite/src/runtime/chat_template_builtins.cpp — built-in chat templates for models that carry
// none, written in the published prompt formats of each chat style.
#include <algorithm>

#include "src/runtime/chat_template.h"

namespace kite {
namespace {

struct Builtin {
  const char* name;
  const char* source;
};

// <|im_start|>role\ncontent<|im_end|>\n
constexpr const char* kChatml = R"JINJA({%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}
)JINJA";

// <s>[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer </s>
constexpr const char* kLlama2 = R"JINJA({%- if messages[0]['role'] == 'system' -%}
{%- set system_message = messages[0]['content'] -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
{%- endif -%}
{%- if loop.index0 == 0 and system_message is defined -%}
{%- set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] -%}
{%- else -%}
{%- set content = message['content'] -%}
{%- endif -%}
{%- if message['role'] == 'user' -%}
{{- bos_token + '[INST] ' + content | trim + ' [/INST]' -}}
{%- elif message['role'] == 'assistant' -%}
{{- ' ' + content | trim + ' ' + eos_token -}}
{%- endif -%}
{%- endfor -%}
)JINJA";

// <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
constexpr const char* kLlama3 = R"JINJA({{- bos_token -}}
{%- for message in messages -%}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
)JINJA";

// <s>[INST] user [/INST] answer</s>[INST] ...
constexpr const char* kMistral = R"JINJA({{- bos_token -}}
{%- if messages[0]['role'] == 'system' -%}
{%- set system_message = messages[0]['content'] -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
{%- endif -%}
{%- if message['role'] == 'user' -%}
{%- if loop.first and system_message is defined -%}
{{- '[INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' -}}
{%- else -%}
{{- '[INST] ' + message['content'] + ' [/INST]' -}}
{%- endif -%}
{%- elif message['role'] == 'assistant' -%}
{{- ' ' + message['content'] + eos_token -}}
{%- endif -%}
{%- endfor -%}
)JINJA";

// <|role|>\ncontent<|end|>\n ... <|assistant|>\n
constexpr const char* kPhi3 = R"JINJA({%- for message in messages -%}
{{- '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|assistant|>\n' -}}
{%- else -%}
{{- eos_token -}}
{%- endif -%}
)JINJA";

// <bos><start_of_turn>user\n(system\n\n)content<end_of_turn>\n<start_of_turn>model\n
constexpr const char* kGemma = R"JINJA({{- bos_token -}}
{%- if messages[0]['role'] == 'system' -%}
{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set first_user_prefix = '' -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
{%- endif -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<start_of_turn>model\n' -}}
{%- endif -%}
)JINJA";

// ChatML with Qwen's default system prompt, tools in <tools></tools> and <tool_call> blocks.
constexpr const char* kQwen = R"JINJA({%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0]['role'] == 'system' -%}
{{- messages[0]['content'] -}}
{%- else -%}
{{- 'You are a helpful assistant.' -}}
{%- endif -%}
{{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}
{{- '\n' + tool | tojson -}}
{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0]['role'] == 'system' -%}
{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'system' and loop.first -%}
{%- elif message.role == 'user' or message.role == 'system' or (message.role == 'assistant' and not message.tool_calls) -%}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant' -}}
{%- if message.content -%}
{{- '\n' + message.content -}}
{%- endif -%}
{%- for tool_call in message.tool_calls -%}
{%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
{{- '\n<tool_call>\n{"name": "' + call.name + '", "arguments": ' + (call.arguments if call.arguments is string else call.arguments | tojson) + '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
{{- '<|im_start|>user' -}}
{%- endif -%}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}
)JINJA";

constexpr Builtin kBuiltins[] = {
    {"chatml", kChatml}, {"llama2", kLlama2}, {"llama3", kLlama3}, {"mistral", kMistral},
    {"phi3", kPhi3},     {"gemma", kGemma},   {"qwen", kQwen},
};

}  // namespace

std::vector<std::string> ChatTemplate::builtin_names() {
  std::vector<std::string> names;
  for (const auto& b : kBuiltins) names.emplace_back(b.name);
  return names;
}

Result<ChatTemplate> ChatTemplate::builtin(std::string_view name, Options options) {
  for (const auto& b : kBuiltins)
    if (name == b.name) return parse(b.source, std::move(options));
  std::string known;
  for (const auto& b : kBuiltins) known += (known.empty() ? "" : ", ") + std::string(b.name);
  return make_error("unknown built-in chat template '", name, "' (known: ", known, ")");
}

}  // namespace kite
