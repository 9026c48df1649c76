#pragma once
// defines: jinja::Expr, jinja::Stmt (the template syntax tree), jinja::parse
//
// One generic node type per family keeps the tree small; `kind` says which fields are used.

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja_value.h"

namespace qwen36::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Literal,  // value
  Name,     // name
  GetAttr,  // args[0].name
  GetItem,  // args[0][args[1]]
  Slice,    // args[0][args[1]:args[2]:args[3]] (null parts omitted)
  Call,     // args[0](args[1..], kwargs)
  Filter,   // args[0] | name(args[1..], kwargs)
  Test,     // args[0] is [not] name(args[1..]); negated
  Unary,    // op args[0]: "not", "-", "+"
  Binary,   // args[0] op args[1]: arithmetic, comparisons, "and", "or", "in", "not in", "~"
  Cond,     // args[0] if args[1] else args[2] (args[2] may be null)
  List,     // [args...]
  Tuple,    // (args...)
  Dict,     // {args[0]: args[1], ...}
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;
  std::string name;  // variable, attribute, filter, test or operator
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  Text,      // text
  Output,    // {{ expr }}
  If,        // branches (condition, body); else_body
  For,       // targets in expr [if cond] body, else_body
  Set,       // targets = expr, or ns.attr = expr (attr set)
  SetBlock,  // {% set targets[0] %}body{% endset %}
  Macro,     // name(params) body
  Break,
  Continue,
  Scope,     // a body run as is ({% generation %} from transformers' AssistantTracker)
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;  // Text; Macro name; Set attribute name when attr set
  ExprPtr expr;      // Output/For iterable/Set value
  ExprPtr cond;      // For filter
  std::vector<std::string> targets;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<MacroParam> params;
};

// Parses a whole template; throws Error naming the line on syntax errors.
Body parse(std::string_view source);

}  // namespace qwen36::jinja
