// kite/src/runtime/jinja/parser.cpp — recursive descent over the token list (see parser.h).
// Syntax errors are thrown as TemplateError inside and returned as kite::Error by
// parse_template.
#include "src/runtime/jinja/parser.h"

#include <algorithm>
#include <initializer_list>

namespace kite::jinja {
namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, int max_depth) : t_(std::move(tokens)), max_depth_(max_depth) {}

  Body parse() {
    std::string end;
    Body body = parse_body({}, &end, "");
    return body;
  }

 private:
  // RAII nesting counter.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > p_.max_depth_) p_.fail("template nested too deeply (more than " + std::to_string(p_.max_depth_) + " levels)");
    }
    ~DepthGuard() { --p_.depth_; }

   private:
    Parser& p_;
  };

  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  void next() {
    if (p_ + 1 < t_.size()) ++p_;
  }

  [[noreturn]] void fail(const std::string& what) const { fail_at(cur(), what); }
  [[noreturn]] static void fail_at(const Token& t, const std::string& what) {
    throw_error("template syntax error at line " + std::to_string(t.line) + ", column " + std::to_string(t.column) +
                ": " + what);
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEnd: return "end of template";
      case Tok::kBlockEnd: return "end of statement block";
      case Tok::kVarEnd: return "end of print statement";
      case Tok::kText: return "template data";
      case Tok::kString: return "string";
      default: return "'" + t.text + "'";
    }
  }

  bool is_op(std::string_view op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(std::string_view name) const { return cur().type == Tok::kName && cur().text == name; }
  void expect_op(std::string_view op) {
    if (!is_op(op)) fail("expected '" + std::string(op) + "', got " + describe(cur()));
    next();
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) fail(std::string("expected ") + what + ", got " + describe(cur()));
    next();
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) fail("expected a name, got " + describe(cur()));
    std::string n = cur().text;
    next();
    return n;
  }
  void expect_block_end() { expect(Tok::kBlockEnd, "end of statement block"); }

  template <class N>
  static std::unique_ptr<N> node_at(const Token& t, decltype(N::kind) k) {
    return std::make_unique<N>(k, t.line, t.column);
  }

  // ---------------------------------------------------------------------------------------------
  // Statements

  // Parses until a block tag whose name is in `end_names`; the name is consumed and returned in
  // *found. `opener` names the enclosing block for the error message.
  Body parse_body(std::initializer_list<std::string_view> end_names, std::string* found, const std::string& opener) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kText) {
        auto s = node_at<Stmt>(t, StmtKind::kText);
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::kVarBegin) {
        next();
        auto s = node_at<Stmt>(t, StmtKind::kOutput);
        s->expr = parse_tuple(true, {}, false);
        expect(Tok::kVarEnd, "end of print statement");
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        next();
        if (cur().type != Tok::kName) fail("expected a tag name, got " + describe(cur()));
        const std::string name = cur().text;
        if (std::find(end_names.begin(), end_names.end(), name) != end_names.end()) {
          next();
          *found = name;
          return body;
        }
        body.push_back(parse_statement());
      } else if (t.type == Tok::kEnd) {
        if (end_names.size() == 0) return body;
        std::string want;
        for (auto n : end_names) want += (want.empty() ? "'" : " or '") + std::string(n) + "'";
        fail("unexpected end of template; looking for " + want + " to close '" + opener + "'");
      } else {
        fail("unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& t = cur();
    const std::string name = t.text;
    next();
    if (name == "if") return parse_if(t);
    if (name == "for") return parse_for(t);
    if (name == "set") return parse_set(t);
    if (name == "macro") return parse_macro(t);
    if (name == "call") return parse_call_block(t);
    if (name == "filter") return parse_filter_block(t);
    if (name == "with") return parse_with(t);
    if (name == "break" || name == "continue") {
      expect_block_end();
      if (loop_depth_ == 0) fail_at(t, "'" + name + "' outside of a loop");
      return node_at<Stmt>(t, name == "break" ? StmtKind::kBreak : StmtKind::kContinue);
    }
    if (name == "generation") {  // transformers' assistant-mask tag: renders its body unchanged
      expect_block_end();
      std::string found;
      auto s = node_at<Stmt>(t, StmtKind::kWith);
      s->body = parse_body({"endgeneration"}, &found, "generation");
      expect_block_end();
      return s;
    }
    if (name == "include" || name == "import" || name == "from" || name == "extends")
      fail_at(t, "'" + name + "' is not supported: templates cannot load other files");
    fail_at(t, "unknown tag '" + name + "'");
  }

  StmtPtr parse_if(const Token& t) {
    auto s = node_at<Stmt>(t, StmtKind::kIf);
    s->conditions.push_back(parse_tuple(false, {}, false));
    expect_block_end();
    while (true) {
      std::string found;
      s->bodies.push_back(parse_body({"elif", "else", "endif"}, &found, "if"));
      if (found == "elif") {
        s->conditions.push_back(parse_tuple(false, {}, false));
        expect_block_end();
        continue;
      }
      if (found == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"}, &found, "if");
      }
      expect_block_end();
      return s;
    }
  }

  std::vector<std::string> parse_targets(const char* stop_name) {
    std::vector<std::string> names;
    const bool paren = is_op("(");
    if (paren) next();
    while (true) {
      names.push_back(expect_name());
      if (!is_op(",")) break;
      next();
      if ((stop_name && is_name(stop_name)) || is_op(")")) break;
    }
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for(const Token& t) {
    auto s = node_at<Stmt>(t, StmtKind::kFor);
    s->targets = parse_targets("in");
    if (!is_name("in")) fail("expected 'in', got " + describe(cur()));
    next();
    s->expr = parse_tuple(false, {"recursive"}, false);
    if (is_name("if")) {
      next();
      s->filter = parse_expression(true);
    }
    if (is_name("recursive")) {
      next();
      s->recursive = true;
    }
    expect_block_end();
    std::string found;
    ++loop_depth_;
    s->body = parse_body({"endfor", "else"}, &found, "for");
    --loop_depth_;
    if (found == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"}, &found, "for");
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(const Token& t) {
    auto s = node_at<Stmt>(t, StmtKind::kSet);
    if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "." && peek(2).type == Tok::kName) {
      s->targets.push_back(cur().text);
      s->text = peek(2).text;
      p_ += 3;
    } else {
      s->targets = parse_targets(nullptr);
    }
    if (is_op("=")) {
      next();
      s->expr = parse_tuple(true, {}, false);
      expect_block_end();
      return s;
    }
    if (s->targets.size() != 1 || !s->text.empty()) fail("expected '='");
    s->block_set = true;
    if (is_op("|")) s->filter = parse_filter_chain(nullptr);
    expect_block_end();
    std::string found;
    s->body = parse_body({"endset"}, &found, "set");
    expect_block_end();
    return s;
  }

  void parse_params(std::vector<MacroParam>& params) {
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam p;
      p.name = expect_name();
      if (is_op("=")) {
        next();
        p.default_value = parse_expression(true);
      } else if (!params.empty() && params.back().default_value) {
        fail("non-default argument follows default argument");
      }
      params.push_back(std::move(p));
    }
    next();
  }

  StmtPtr parse_macro(const Token& t) {
    auto s = node_at<Stmt>(t, StmtKind::kMacro);
    s->name = expect_name();
    parse_params(s->params);
    expect_block_end();
    std::string found;
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"}, &found, "macro");
    loop_depth_ = saved;
    if (cur().type == Tok::kName) next();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block(const Token& t) {
    auto s = node_at<Stmt>(t, StmtKind::kCallBlock);
    if (is_op("(")) parse_params(s->params);
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::kCall) fail_at(t, "expected a call in {% call %}");
    expect_block_end();
    std::string found;
    s->body = parse_body({"endcall"}, &found, "call");
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(const Token& t) {
    auto s = node_at<Stmt>(t, StmtKind::kFilterBlock);
    s->filter = parse_filter_chain(nullptr, true);
    expect_block_end();
    std::string found;
    s->body = parse_body({"endfilter"}, &found, "filter");
    expect_block_end();
    return s;
  }

  StmtPtr parse_with(const Token& t) {
    auto s = node_at<Stmt>(t, StmtKind::kWith);
    while (cur().type != Tok::kBlockEnd) {
      if (!s->assignments.empty()) expect_op(",");
      std::string name = expect_name();
      expect_op("=");
      s->assignments.emplace_back(std::move(name), parse_expression(true));
    }
    expect_block_end();
    std::string found;
    s->body = parse_body({"endwith"}, &found, "with");
    expect_block_end();
    return s;
  }

  // ---------------------------------------------------------------------------------------------
  // Expressions

  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    const Token& c = cur();
    if (c.type == Tok::kVarEnd || c.type == Tok::kBlockEnd || c.type == Tok::kEnd) return true;
    if (c.type == Tok::kOp && c.text == ")") return true;
    if (c.type == Tok::kName)
      for (auto n : extra_end)
        if (c.text == n) return true;
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<std::string_view> extra_end, bool explicit_parens) {
    const Token& start = cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail("expected an expression, got " + describe(cur()));
    }
    auto e = node_at<Expr>(start, ExprKind::kTuple);
    e->items = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    if (!with_condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const Token& t = cur();
      next();
      auto c = node_at<Expr>(t, ExprKind::kCondition);
      c->b = parse_or();
      if (is_name("else")) {
        next();
        c->c = parse_expression(true);
      }
      c->a = std::move(e);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const Token& t, std::string op, ExprPtr l, ExprPtr r) {
    auto e = node_at<Expr>(t, ExprKind::kBinary);
    e->name = std::move(op);
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Token& t = cur();
      next();
      e = binary(t, "or", std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Token& t = cur();
      next();
      e = binary(t, "and", std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      const Token& t = cur();
      next();
      auto e = node_at<Expr>(t, ExprKind::kUnary);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& t = cur();
    ExprPtr first = parse_math1();
    std::unique_ptr<Expr> cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" || cur().text == ">" ||
           cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = node_at<Expr>(t, ExprKind::kCompare);
        cmp->a = std::move(first);
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = cur();
      std::string op = t.text;
      next();
      e = binary(t, op, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token& t = cur();
      next();
      e = binary(t, "~", std::move(e), parse_math2());
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = cur();
      std::string op = t.text;
      next();
      e = binary(t, op, std::move(e), parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& t = cur();
      next();
      e = binary(t, "**", std::move(e), parse_unary(true));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    const Token& t = cur();
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      next();
      e = node_at<Expr>(t, ExprKind::kUnary);
      e->name = t.text;
      e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr literal(const Token& t, Value v) {
    auto e = node_at<Expr>(t, ExprKind::kLiteral);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::kName: {
        next();
        if (t.text == "true" || t.text == "True") return literal(t, Value::boolean(true));
        if (t.text == "false" || t.text == "False") return literal(t, Value::boolean(false));
        if (t.text == "none" || t.text == "None") return literal(t, Value::none());
        auto e = node_at<Expr>(t, ExprKind::kName);
        e->name = t.text;
        return e;
      }
      case Tok::kString: {
        std::string s = t.text;
        next();
        while (cur().type == Tok::kString) {
          s += cur().text;
          next();
        }
        return literal(t, Value::string(std::move(s)));
      }
      case Tok::kInt:
        next();
        return literal(t, Value::integer(t.int_value));
      case Tok::kFloat:
        next();
        return literal(t, Value::number(t.float_value));
      case Tok::kOp:
        if (t.text == "(") {
          next();
          ExprPtr e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") return parse_list(t);
        if (t.text == "{") return parse_dict(t);
        break;
      default:
        break;
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr parse_list(const Token& t) {
    next();
    auto e = node_at<Expr>(t, ExprKind::kList);
    while (!is_op("]")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("]")) break;
      e->items.push_back(parse_expression(true));
    }
    next();
    return e;
  }

  ExprPtr parse_dict(const Token& t) {
    next();
    auto e = node_at<Expr>(t, ExprKind::kDict);
    while (!is_op("}")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("}")) break;
      e->items.push_back(parse_expression(true));
      expect_op(":");
      e->items.push_back(parse_expression(true));
    }
    next();
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const Token& t = cur();
      if (is_op(".")) {
        next();
        if (cur().type == Tok::kName) {
          auto g = node_at<Expr>(t, ExprKind::kGetAttr);
          g->name = cur().text;
          g->a = std::move(e);
          e = std::move(g);
          next();
        } else if (cur().type == Tok::kInt) {
          auto g = node_at<Expr>(t, ExprKind::kGetItem);
          g->a = std::move(e);
          g->b = literal(cur(), Value::integer(cur().int_value));
          e = std::move(g);
          next();
        } else {
          fail("expected a name after '.', got " + describe(cur()));
        }
      } else if (is_op("[")) {
        next();
        e = parse_subscript(t, std::move(e));
      } else if (is_op("(")) {
        e = parse_call(t, std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(const Token& t, ExprPtr obj) {
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (is_op("]")) {
        next();
        auto g = node_at<Expr>(t, ExprKind::kGetItem);
        g->a = std::move(obj);
        g->b = std::move(start);
        return g;
      }
    }
    auto s = node_at<Expr>(t, ExprKind::kSlice);
    s->a = std::move(obj);
    s->b = std::move(start);
    expect_op(":");
    if (!is_op("]") && !is_op(":")) s->c = parse_expression(true);
    if (is_op(":")) {
      next();
      if (!is_op("]")) s->d = parse_expression(true);
    }
    expect_op("]");
    return s;
  }

  void parse_call_args(CallArgsExpr& args) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string key = cur().text;
        next();
        next();
        args.keyword.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!args.keyword.empty()) fail("positional argument follows keyword argument");
        args.positional.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(const Token& t, ExprPtr callee) {
    auto c = node_at<Expr>(t, ExprKind::kCall);
    c->a = std::move(callee);
    parse_call_args(c->args);
    return c;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().type == Tok::kName) {
      next();
      name += "." + cur().text;
      next();
    }
    return name;
  }

  // `| f(args) | g ...` applied to `operand` (null in {% filter %} blocks).
  ExprPtr parse_filter_chain(ExprPtr operand, bool start_inline = false) {
    ExprPtr e = std::move(operand);
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const Token& t = cur();
      auto f = node_at<Expr>(t, ExprKind::kFilter);
      f->name = dotted_name();
      if (is_op("(")) parse_call_args(f->args);
      f->a = std::move(e);
      e = std::move(f);
    }
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter_chain(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(cur(), std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_test(ExprPtr operand) {
    const Token& t = cur();
    next();
    auto e = node_at<Expr>(t, ExprKind::kTest);
    if (is_name("not")) {
      next();
      e->negated = true;
    }
    e->name = dotted_name();
    if (is_op("(")) {
      parse_call_args(e->args);
    } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                cur().type == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("you cannot chain multiple tests with is");
      DepthGuard guard(*this);
      e->args.positional.push_back(parse_postfix(parse_primary()));
    }
    e->a = std::move(operand);
    return e;
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int max_depth_;
  int loop_depth_ = 0;
};

}  // namespace

Result<Body> parse_template(std::string_view source, const ParseOptions& options) {
  KITE_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source, options.lex));
  try {
    Parser parser(std::move(tokens), options.max_depth);
    return parser.parse();
  } catch (const TemplateError& e) {
    return Error{e.message()};
  } catch (const std::exception& e) {
    return make_error("template parse failed: ", e.what());
  }
}

}  // namespace kite::jinja
