#pragma once
// defines: tool_call_grammar (the grammar of a forced tool call — tool_choice "required" or a
//          named function — with the arguments held to each function's parameters schema)
//
// Written in the template's own form (ChatTemplate::tool_call_form), after up to two newlines:
//  - JSON form (Qwen3): the arguments object is an embedded JSON value of the parameters schema
//    (json_schema.h: the same subset and strictness as response_format);
//  - XML form (Qwen3.6): the declared parameters in schema order, each required one present; a
//    value is written as the template writes it: integers, numbers, objects and arrays as JSON
//    of the parameter's schema, booleans True / False (true / false too), null None / null,
//    enums as their values, strings raw — any text without the closing tag "</parameter>", held
//    to the string's pattern, enforced format and length (lengths up to 256 characters; longer
//    limits are not checked).
//    A parameters schema without properties takes any parameters.
// Throws Error when a parameter's schema is outside the JSON-schema subset; the caller then
// forces the call's beginning only.

#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "text/chat_template.h"
#include "text/grammar.h"

namespace qwen36::text {

// functions: the function objects ({"name", "parameters"}) any of which may be called; several:
// further calls may follow the first (parallel tool calls); opened: the text starts right after
// the first call's "<tool_call>" (a constraint that begins once the model opens a call).
std::shared_ptr<const Grammar> tool_call_grammar(const ChatTemplate::ToolCallForm& form,
                                                 const std::vector<nlohmann::ordered_json>& functions, bool several,
                                                 bool opened = false);

}  // namespace qwen36::text
