#pragma once
// Helpers of the JSON-schema matcher tests: feed a document byte by byte and report where it is
// refused (checking a refusal leaves the state unchanged), compile errors as text.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "core/error.h"
#include "text/json_schema.h"

namespace qwen36::text::json_test {

using Json = nlohmann::ordered_json;
using Schema = std::shared_ptr<const JsonSchema>;

inline Schema compile(const char* schema) { return JsonSchema::compile(Json::parse(schema), Whitespace::Any); }

// Feeds byte by byte; returns the index of the first refused byte (doc.size() if none), after
// checking that a refusal left the state unchanged.
inline size_t first_refused(JsonMatcher& m, std::string_view doc) {
  for (size_t i = 0; i < doc.size(); ++i) {
    const JsonMatcher before = m;
    if (m.feed(uint8_t(doc[i]))) continue;
    EXPECT_TRUE(m == before) << "state changed by a refused byte at " << i << " of " << doc;
    EXPECT_EQ(m.hash(), before.hash());
    return i;
  }
  return doc.size();
}

// The whole document is accepted and complete.
inline bool accepts(const Schema& s, std::string_view doc) {
  JsonMatcher m(s);
  return first_refused(m, doc) == doc.size() && m.complete();
}

// Index of the first refused byte (doc.size() if none).
inline size_t refused_at(const Schema& s, std::string_view doc) {
  JsonMatcher m(s);
  return first_refused(m, doc);
}

inline std::string error_of(const char* schema) {
  try {
    compile(schema);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace qwen36::text::json_test
