// Tree-walking evaluator. Scopes follow jinja2: a for-loop body gets a fresh scope per
// iteration (so `set` inside a loop does not leak, hence `namespace`), `if` gets none,
// a macro call sees only its arguments and the template's top level.
#include "text/jinja_eval.h"

#include <fmt/format.h>

#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "text/jinja_builtins.h"
#include "text/jinja_lexer.h"

namespace qwen36::jinja {

namespace {

constexpr int kMaxDepth = 200;  // macro recursion bound; a template must not crash us

class Evaluator {
 public:
  explicit Evaluator(const Object& vars) {
    frames_.emplace_back();
    Object globals;
    add_globals(globals);
    for (auto& [k, v] : globals.items) frames_[0][k] = v;
    for (const auto& [k, v] : vars.items) frames_[0][k] = v;
  }

  std::string run(const Body& body) {
    std::string out;
    try {
      exec(body, out);
    } catch (const Error& e) {
      std::string_view msg = e.what();
      if (msg.rfind("template line ", 0) == 0) throw;
      template_error(line_, std::string(msg));
    }
    return out;
  }

 private:
  enum class Flow { Normal, Break, Continue };
  using Frame = std::unordered_map<std::string, Value>;

  Flow exec(const Body& body, std::string& out) {
    for (const auto& s : body) {
      Flow f = exec(*s, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Stmt& s, std::string& out) {
    line_ = s.line;
    switch (s.kind) {
      case StmtKind::Text: out += s.text; return Flow::Normal;
      case StmtKind::Output: out += eval(*s.expr).str(); return Flow::Normal;
      case StmtKind::If:
        for (const auto& [cond, body] : s.branches) {
          if (eval(*cond).truthy()) return exec(body, out);
        }
        return exec(s.else_body, out);
      case StmtKind::For: return exec_for(s, out);
      case StmtKind::Set: {
        Value v = eval(*s.expr);
        line_ = s.line;
        if (!s.text.empty()) {
          Value target = lookup(s.targets[0]);
          if (!target.is_object() || !target.object().is_namespace) {
            fail("cannot assign attribute on non-namespace object '{}'", s.targets[0]);
          }
          target.mutable_object().set(s.text, std::move(v));
        } else {
          assign(s.targets, v);
        }
        return Flow::Normal;
      }
      case StmtKind::SetBlock: {
        std::string captured;
        exec(s.body, captured);
        frames_.back()[s.targets[0]] = Value(std::move(captured));
        return Flow::Normal;
      }
      case StmtKind::Macro: frames_.back()[s.text] = make_macro(s); return Flow::Normal;
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
      case StmtKind::Scope: return exec(s.body, out);
    }
    return Flow::Normal;
  }

  void assign(const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      frames_.back()[targets[0]] = v;
      return;
    }
    Array items = iterate(v);
    if (items.size() != targets.size()) {
      fail("cannot unpack {} values into {} names", items.size(), targets.size());
    }
    for (size_t i = 0; i < targets.size(); ++i) frames_.back()[targets[i]] = items[i];
  }

  struct FrameGuard {
    Evaluator& ev;
    explicit FrameGuard(Evaluator& e) : ev(e) { ev.frames_.emplace_back(); }
    ~FrameGuard() { ev.frames_.pop_back(); }
    FrameGuard(const FrameGuard&) = delete;
    FrameGuard& operator=(const FrameGuard&) = delete;
  };

  Flow exec_for(const Stmt& s, std::string& out) {
    Array items = iterate(eval(*s.expr));
    if (s.cond) {
      Array kept;
      for (const auto& item : items) {
        FrameGuard g(*this);
        assign(s.targets, item);
        if (eval(*s.cond).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(s.else_body, out);
    size_t n = items.size();
    for (size_t i = 0; i < n; ++i) {
      FrameGuard g(*this);
      Object loop;
      auto sz = static_cast<int64_t>(n);
      auto idx = static_cast<int64_t>(i);
      loop.items = {{"index", Value(idx + 1)},
                    {"index0", Value(idx)},
                    {"revindex", Value(sz - idx)},
                    {"revindex0", Value(sz - idx - 1)},
                    {"first", Value(i == 0)},
                    {"last", Value(i + 1 == n)},
                    {"length", Value(sz)},
                    {"depth", Value(int64_t{1})},
                    {"depth0", Value(int64_t{0})},
                    {"previtem", i > 0 ? items[i - 1] : Value(Undefined{"loop.previtem"})},
                    {"nextitem", i + 1 < n ? items[i + 1] : Value(Undefined{"loop.nextitem"})}};
      loop.set("cycle", Value::function("cycle", [i](const CallArgs& a) {
                 if (a.positional.empty()) fail("no items for cycling given");
                 return a.positional[i % a.positional.size()];
               }));
      frames_.back()["loop"] = Value(std::move(loop));
      assign(s.targets, items[i]);
      Flow f = exec(s.body, out);
      if (f == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const Stmt& s) {
    const Stmt* def = &s;
    return Value::function(s.text, [this, def](const CallArgs& a) {
      if (++depth_ > kMaxDepth) fail("macro recursion too deep");
      if (a.positional.size() > def->params.size()) fail("macro '{}' takes {} arguments", def->text, def->params.size());
      // Evaluate defaults and arguments before switching scopes (defaults see the caller).
      Frame frame;
      for (size_t i = 0; i < def->params.size(); ++i) {
        const MacroParam& p = def->params[i];
        const Value* given = a.get(i, p.name);
        frame[p.name] = given ? *given : p.default_value ? eval(*p.default_value) : Value(Undefined{p.name});
      }
      for (const auto& [k, v] : a.named) {
        bool known = false;
        for (const auto& p : def->params) known = known || p.name == k;
        if (!known) fail("macro '{}' has no argument '{}'", def->text, k);
      }
      size_t saved_barrier = barrier_;
      int saved_line = line_;
      frames_.push_back(std::move(frame));
      barrier_ = frames_.size() - 1;
      std::string out;
      try {
        exec(def->body, out);
      } catch (...) {
        frames_.pop_back();
        barrier_ = saved_barrier;
        --depth_;
        throw;
      }
      frames_.pop_back();
      barrier_ = saved_barrier;
      line_ = saved_line;
      --depth_;
      return Value(std::move(out));
    });
  }

  Value lookup(const std::string& name) const {
    for (size_t i = frames_.size(); i-- > 0;) {
      if (i < barrier_ && i != 0) continue;
      auto it = frames_[i].find(name);
      if (it != frames_[i].end()) return it->second;
    }
    return Value(Undefined{"'" + name + "'"});
  }

  Value eval(const Expr& e) {
    line_ = e.line;
    switch (e.kind) {
      case ExprKind::Literal: return e.value;
      case ExprKind::Name: return lookup(e.name);
      case ExprKind::GetAttr: {
        Value obj = eval(*e.args[0]);
        line_ = e.line;
        return get_attribute(obj, e.name);
      }
      case ExprKind::GetItem: {
        Value obj = eval(*e.args[0]);
        Value key = eval(*e.args[1]);
        line_ = e.line;
        return get_item(obj, key);
      }
      case ExprKind::Slice: {
        Value obj = eval(*e.args[0]);
        Value parts[3];
        for (int i = 0; i < 3; ++i) {
          if (e.args[static_cast<size_t>(i) + 1]) parts[i] = eval(*e.args[static_cast<size_t>(i) + 1]);
        }
        line_ = e.line;
        return get_slice(obj, parts[0], parts[1], parts[2]);
      }
      case ExprKind::Call: {
        Value fn = eval(*e.args[0]);
        CallArgs args = eval_args(e, 1);
        line_ = e.line;
        if (fn.is_undefined()) fail_undefined(fn);
        if (!fn.is_callable()) fail("'{}' object is not callable", fn.type_name());
        return fn.callable().fn(args);
      }
      case ExprKind::Filter: {
        Value in = eval(*e.args[0]);
        CallArgs args = eval_args(e, 1);
        line_ = e.line;
        return call_filter(e.name, in, args);
      }
      case ExprKind::Test: {
        Value in = eval(*e.args[0]);
        CallArgs args = eval_args(e, 1);
        line_ = e.line;
        return Value(call_test(e.name, in, args) != e.negated);
      }
      case ExprKind::Unary: {
        Value v = eval(*e.args[0]);
        line_ = e.line;
        if (e.name == "not") return Value(!v.truthy());
        if (v.is_undefined()) fail_undefined(v);
        if (v.is_int()) return Value(e.name == "-" ? -v.as_int() : v.as_int());
        if (v.is_bool()) return Value(int64_t{e.name == "-" ? -int64_t{v.as_bool()} : int64_t{v.as_bool()}});
        if (v.is_float()) return Value(e.name == "-" ? -v.as_double() : v.as_double());
        fail("bad operand type for unary {}: '{}'", e.name, v.type_name());
      }
      case ExprKind::Binary: {
        Value a = eval(*e.args[0]);
        // and/or return an operand, as in Python, and short-circuit.
        if (e.name == "and") return a.truthy() ? eval(*e.args[1]) : a;
        if (e.name == "or") return a.truthy() ? a : eval(*e.args[1]);
        Value b = eval(*e.args[1]);
        line_ = e.line;
        return binary_op(e.name, a, b);
      }
      case ExprKind::Cond:
        if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value(Undefined{});
      case ExprKind::List:
      case ExprKind::Tuple: {
        Array out;
        out.reserve(e.args.size());
        for (const auto& x : e.args) out.push_back(eval(*x));
        return e.kind == ExprKind::Tuple ? Value::tuple(std::move(out)) : Value(std::move(out));
      }
      case ExprKind::Dict: {
        Object o;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i]);
          if (!k.is_string()) fail("dict literal keys must be strings");
          o.set(k.as_string(), eval(*e.args[i + 1]));
        }
        return Value(std::move(o));
      }
    }
    fail("unknown expression");
  }

  CallArgs eval_args(const Expr& e, size_t first) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.named.emplace_back(k, eval(*v));
    return a;
  }

  std::vector<Frame> frames_;
  size_t barrier_ = 0;  // frames below this (except the top level) are hidden: macro scope
  int line_ = 1;
  int depth_ = 0;
};

}  // namespace

Template::Template(std::string_view source) : body_(std::make_shared<Body>(parse(source))) {}

std::string Template::render(const Object& vars) const { return Evaluator(vars).run(*body_); }

}  // namespace qwen36::jinja
