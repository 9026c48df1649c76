#pragma once
// defines: jinja::Template (a parsed template that renders with given variables)
//
// Usage: Template t(source); std::string s = t.render(vars);  // vars: messages, tools, ...
// Rendering is reentrant: each render has its own scopes, the syntax tree is shared.

#include <memory>
#include <string>
#include <string_view>

#include "text/jinja_parser.h"
#include "text/jinja_value.h"

namespace qwen36::jinja {

class Template {
 public:
  explicit Template(std::string_view source);  // throws Error on syntax errors

  // Renders with `vars` as top-level variables (plus the globals transformers defines);
  // throws Error "template line N: ..." on runtime errors, including raise_exception.
  std::string render(const Object& vars) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace qwen36::jinja
