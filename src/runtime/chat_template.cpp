// kite/src/runtime/chat_template.cpp — ChatTemplate: parse once, render many times.
#include "src/runtime/chat_template.h"

#include "src/runtime/jinja/parser.h"

namespace kite {

Result<ChatTemplate> ChatTemplate::parse(std::string_view source, Options options) {
  jinja::ParseOptions po;
  po.max_depth = options.limits.max_parse_depth;
  auto body = jinja::parse_template(source, po);
  if (!body) return body.error().with_context("chat template");
  ChatTemplate t;
  t.source_ = std::make_shared<const std::string>(source);
  t.body_ = std::make_shared<const jinja::Body>(std::move(body).value());
  t.options_ = std::move(options);
  return t;
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) return make_error("chat template: the render context must be a JSON object, got ", context.type_name());
  jinja::Value value;
  try {
    value = jinja::Value::from_json(context);
  } catch (const jinja::TemplateError& e) {
    return make_error("chat template: ", e.message());
  }
  return render(value);
}

Result<std::string> ChatTemplate::render(const jinja::Value& context) const {
  jinja::RenderOptions ro;
  ro.limits = options_.limits;
  ro.clock = options_.clock;
  jinja::Interpreter interpreter(ro);
  try {
    return interpreter.render(*body_, context);
  } catch (const jinja::TemplateError& e) {
    return make_error("chat template: ", e.message());
  } catch (const std::bad_alloc&) {
    return make_error("chat template: out of memory while rendering");
  } catch (const std::exception& e) {
    return make_error("chat template: internal error while rendering: ", e.what());
  }
}

}  // namespace kite
