// Recursive-descent parser with jinja2's operator precedence (filters bind tighter than
// arithmetic: `messages|length - 1` is `(messages|length) - 1`).
#include "text/jinja_parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>

#include "text/jinja_lexer.h"

namespace qwen36::jinja {

namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse_template() {
    return parse_body({});
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  int line() const { return cur().line; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(const char* op) const { return cur().kind == TokenKind::Operator && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == TokenKind::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  std::string describe(const Token& t) const {
    switch (t.kind) {
      case TokenKind::End: return "end of template";
      case TokenKind::BlockEnd: return "end of statement block";
      case TokenKind::VarEnd: return "end of print statement";
      case TokenKind::Text: return "template text";
      default: return "'" + t.text + "'";
    }
  }
  [[noreturn]] void unexpected(const char* wanted) const {
    template_error(line(), fmt::format("expected {}, got {}", wanted, describe(cur())));
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) unexpected(op);
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::BlockEnd) unexpected("end of statement block");
    next();
  }
  std::string expect_name() {
    if (cur().kind != TokenKind::Name) unexpected("a name");
    std::string n = cur().text;
    next();
    return n;
  }

  // Parses statements until a block tag named in `stops`; leaves its name in stop_ and the
  // stream just after that name.
  Body parse_body(std::initializer_list<const char*> stops) {
    Body body;
    stop_.clear();
    while (true) {
      const Token& tok = cur();
      if (tok.kind == TokenKind::End) {
        if (stops.size() > 0) {
          template_error(tok.line, fmt::format("unexpected end of template, expected '{}'", *stops.begin()));
        }
        return body;
      }
      if (tok.kind == TokenKind::Text) {
        auto s = make_stmt(StmtKind::Text, tok.line);
        s->text = tok.text;
        body.push_back(std::move(s));
        next();
        continue;
      }
      if (tok.kind == TokenKind::VarBegin) {
        int l = tok.line;
        next();
        auto s = make_stmt(StmtKind::Output, l);
        s->expr = parse_tuple(true);
        if (cur().kind != TokenKind::VarEnd) unexpected("end of print statement");
        next();
        body.push_back(std::move(s));
        continue;
      }
      if (tok.kind != TokenKind::BlockBegin) unexpected("a statement");
      next();
      if (cur().kind != TokenKind::Name) unexpected("a statement name");
      std::string name = cur().text;
      for (const char* s : stops) {
        if (name == s) {
          stop_ = name;
          next();
          return body;
        }
      }
      body.push_back(parse_statement());
    }
  }

  StmtPtr make_stmt(StmtKind k, int l) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = l;
    return s;
  }

  StmtPtr parse_statement() {
    int l = line();
    std::string name = expect_name();
    if (name == "if") {
      auto s = make_stmt(StmtKind::If, l);
      while (true) {
        ExprPtr c = parse_expr();
        expect_block_end();
        Body b = parse_body({"elif", "else", "endif"});
        s->branches.emplace_back(std::move(c), std::move(b));
        if (stop_ == "elif") continue;
        if (stop_ == "else") {
          expect_block_end();
          s->else_body = parse_body({"endif"});
        }
        expect_block_end();
        return s;
      }
    }
    if (name == "for") {
      auto s = make_stmt(StmtKind::For, l);
      s->targets = parse_targets();
      if (!skip_name("in")) unexpected("'in'");
      s->expr = parse_tuple(false);
      if (skip_name("if")) s->cond = parse_expr();
      if (is_name("recursive")) template_error(line(), "recursive loops are not supported");
      expect_block_end();
      s->body = parse_body({"else", "endfor"});
      if (stop_ == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"});
      }
      expect_block_end();
      return s;
    }
    if (name == "set") {
      std::string first = expect_name();
      if (skip_op(".")) {
        auto s = make_stmt(StmtKind::Set, l);
        s->targets = {first};
        s->text = expect_name();
        expect_op("=");
        s->expr = parse_tuple(true);
        expect_block_end();
        return s;
      }
      std::vector<std::string> targets{first};
      while (skip_op(",")) targets.push_back(expect_name());
      if (skip_op("=")) {
        auto s = make_stmt(StmtKind::Set, l);
        s->targets = std::move(targets);
        s->expr = parse_tuple(true);
        expect_block_end();
        return s;
      }
      if (targets.size() != 1) unexpected("'='");
      auto s = make_stmt(StmtKind::SetBlock, l);
      s->targets = std::move(targets);
      if (is_op("|")) template_error(line(), "filtered block set is not supported");
      expect_block_end();
      s->body = parse_body({"endset"});
      expect_block_end();
      return s;
    }
    if (name == "macro") {
      auto s = make_stmt(StmtKind::Macro, l);
      s->text = expect_name();
      expect_op("(");
      while (!skip_op(")")) {
        if (!s->params.empty()) expect_op(",");
        if (skip_op(")")) break;  // trailing comma
        MacroParam p{expect_name(), nullptr};
        if (skip_op("=")) p.default_value = parse_expr();
        s->params.push_back(std::move(p));
      }
      expect_block_end();
      s->body = parse_body({"endmacro"});
      if (cur().kind == TokenKind::Name) next();  // {% endmacro name %}
      expect_block_end();
      return s;
    }
    if (name == "break" || name == "continue") {
      expect_block_end();
      return make_stmt(name == "break" ? StmtKind::Break : StmtKind::Continue, l);
    }
    if (name == "generation") {
      auto s = make_stmt(StmtKind::Scope, l);
      expect_block_end();
      s->body = parse_body({"endgeneration"});
      expect_block_end();
      return s;
    }
    template_error(l, fmt::format("unknown tag '{}'", name));
  }

  std::vector<std::string> parse_targets() {
    bool paren = skip_op("(");
    std::vector<std::string> out{expect_name()};
    while (skip_op(",")) {
      if (cur().kind != TokenKind::Name || is_name("in")) break;
      out.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return out;
  }

  ExprPtr node(ExprKind k, int l) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = l;
    return e;
  }

  // expr (, expr)* -- a bare comma list is a tuple, as in jinja2.
  ExprPtr parse_tuple(bool with_cond) {
    int l = line();
    ExprPtr first = with_cond ? parse_expr() : parse_or();
    if (!is_op(",")) return first;
    auto t = node(ExprKind::Tuple, l);
    t->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().kind == TokenKind::BlockEnd || cur().kind == TokenKind::VarEnd) break;
      t->args.push_back(with_cond ? parse_expr() : parse_or());
    }
    return t;
  }

  ExprPtr parse_expr() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      int l = line();
      next();
      auto c = node(ExprKind::Cond, l);
      ExprPtr cond = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_expr() : nullptr;
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int l) {
    auto e = node(ExprKind::Binary, l);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      int l = line();
      next();
      e = binary("or", std::move(e), parse_and(), l);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      int l = line();
      next();
      e = binary("and", std::move(e), parse_not(), l);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      int l = line();
      next();
      auto e = node(ExprKind::Unary, l);
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      int l = line();
      std::string op;
      if (cur().kind == TokenKind::Operator &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().kind == TokenKind::Name && peek().text == "in") {
        op = "not in";
        next();
        next();
      } else {
        return e;
      }
      e = binary(op, std::move(e), parse_math1(), l);
    }
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      int l = line();
      next();
      e = binary(op, std::move(e), parse_concat(), l);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      int l = line();
      next();
      e = binary("~", std::move(e), parse_math2(), l);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      int l = line();
      next();
      e = binary(op, std::move(e), parse_pow(), l);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      int l = line();
      next();
      e = binary("**", std::move(e), parse_unary(true), l);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      auto u = node(ExprKind::Unary, line());
      u->name = cur().text;
      next();
      u->args.push_back(parse_unary(false));
      e = std::move(u);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tok = cur();
    int l = tok.line;
    auto lit = [&](Value v) {
      auto e = node(ExprKind::Literal, l);
      e->value = std::move(v);
      return e;
    };
    switch (tok.kind) {
      case TokenKind::Name: {
        std::string n = tok.text;
        next();
        if (n == "true" || n == "True") return lit(Value(true));
        if (n == "false" || n == "False") return lit(Value(false));
        if (n == "none" || n == "None") return lit(Value(None{}));
        auto e = node(ExprKind::Name, l);
        e->name = n;
        return e;
      }
      case TokenKind::String: {
        std::string s;
        while (cur().kind == TokenKind::String) {  // adjacent literals concatenate
          s += cur().text;
          next();
        }
        return lit(Value(std::move(s)));
      }
      case TokenKind::Integer: {
        std::string s = tok.text;
        next();
        try {
          return lit(Value(static_cast<int64_t>(std::stoll(s))));
        } catch (const std::exception&) {
          return lit(Value(std::stod(s)));
        }
      }
      case TokenKind::Float: {
        std::string s = tok.text;
        next();
        return lit(Value(std::stod(s)));
      }
      case TokenKind::Operator:
        if (tok.text == "(") {
          next();
          if (skip_op(")")) return node(ExprKind::Tuple, l);
          ExprPtr first = parse_expr();
          if (skip_op(")")) return first;
          auto t = node(ExprKind::Tuple, l);
          t->args.push_back(std::move(first));
          while (skip_op(",")) {
            if (is_op(")")) break;
            t->args.push_back(parse_expr());
          }
          expect_op(")");
          return t;
        }
        if (tok.text == "[") {
          next();
          auto e = node(ExprKind::List, l);
          while (!skip_op("]")) {
            if (!e->args.empty()) {
              expect_op(",");
              if (skip_op("]")) break;
            }
            e->args.push_back(parse_expr());
          }
          return e;
        }
        if (tok.text == "{") {
          next();
          auto e = node(ExprKind::Dict, l);
          while (!skip_op("}")) {
            if (!e->args.empty()) {
              expect_op(",");
              if (skip_op("}")) break;
            }
            e->args.push_back(parse_expr());
            expect_op(":");
            e->args.push_back(parse_expr());
          }
          return e;
        }
        break;
      default:
        break;
    }
    unexpected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      int l = line();
      if (skip_op(".")) {
        if (cur().kind == TokenKind::Integer) {  // foo.0 is foo[0]
          auto g = node(ExprKind::GetItem, l);
          g->args.push_back(std::move(e));
          auto idx = node(ExprKind::Literal, l);
          idx->value = Value(static_cast<int64_t>(std::stoll(cur().text)));
          next();
          g->args.push_back(std::move(idx));
          e = std::move(g);
          continue;
        }
        auto g = node(ExprKind::GetAttr, l);
        g->name = expect_name();
        g->args.push_back(std::move(e));
        e = std::move(g);
      } else if (skip_op("[")) {
        e = parse_subscript(std::move(e), l);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, int l) {
    ExprPtr parts[3];
    int n = 0;
    bool is_slice = false;
    while (true) {
      if (is_op(":")) {
        is_slice = true;
        next();
        if (++n > 2) template_error(l, "bad slice");
        continue;
      }
      if (skip_op("]")) break;
      if (parts[n]) unexpected("']'");
      parts[n] = parse_expr();
    }
    if (!is_slice) {
      if (!parts[0]) template_error(l, "empty subscript");
      auto g = node(ExprKind::GetItem, l);
      g->args.push_back(std::move(target));
      g->args.push_back(std::move(parts[0]));
      return g;
    }
    auto s = node(ExprKind::Slice, l);
    s->args.push_back(std::move(target));
    for (auto& p : parts) s->args.push_back(std::move(p));
    return s;
  }

  // Call arguments into e->args (after any existing) and e->kwargs.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) {
        expect_op(",");
        if (skip_op(")")) break;
      }
      first = false;
      if (cur().kind == TokenKind::Name && peek().kind == TokenKind::Operator && peek().text == "=") {
        std::string k = cur().text;
        next();
        next();
        e.kwargs.emplace_back(k, parse_expr());
      } else {
        if (!e.kwargs.empty()) template_error(line(), "positional argument after keyword argument");
        e.args.push_back(parse_expr());
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = node(ExprKind::Call, line());
    c->args.push_back(std::move(callee));
    parse_call_args(*c);
    return c;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        int l = line();
        next();
        auto f = node(ExprKind::Filter, l);
        f->name = expect_name();
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        int l = line();
        next();
        auto t = node(ExprKind::Test, l);
        t->negated = skip_name("not");
        t->name = expect_name();
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().kind == TokenKind::Name && !is_name("else") && !is_name("or") && !is_name("and")) ||
                   cur().kind == TokenKind::String || cur().kind == TokenKind::Integer ||
                   cur().kind == TokenKind::Float || is_op("[") || is_op("{")) {
          ExprPtr arg = parse_primary();
          t->args.push_back(parse_postfix(std::move(arg)));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  std::string stop_;
};

}  // namespace

Body parse(std::string_view source) { return Parser(tokenize(source)).parse_template(); }

}  // namespace qwen36::jinja
