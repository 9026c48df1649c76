// JSON-schema matcher for structured outputs: acceptance and refusal byte by byte, schema
// keywords, caps, state equality/hashing, random-mutation checks against nlohmann's parser, and a
// copy+feed micro-benchmark.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "core/error.h"
#include "json_matcher_util.h"
#include "text/json_schema.h"

namespace qwen36::text {
namespace {

using namespace json_test;

TEST(JsonSchema, AnyValueAcceptsValidDocuments) {
  const Schema any = JsonSchema::any_value(Whitespace::Any);
  const char* docs[] = {
      "{}", "[]", R"("")", "0", "-0", "12", "-3.25", "1e10", "1E+2", "-0.5e-3", "2.50E-07", "true", "false", "null",
      R"({"a":[1,{"b":null}],"c":"x\"y\\z\/\b\f\n\r\t\u00e9\uD83D\uDE00"})",
      " \n\t{ \"a\" : [ 1 , 2.5 , -7e3 ] ,\r\n \"b\" : { } }",
      "[[[]],[{}],[true,false,null],\"h\xc3\xa9llo\"]",
      R"({"k":{"k":{"k":[0,-1,1.0e+0]}}})",
  };
  for (const char* doc : docs) {
    JsonMatcher m(any);
    EXPECT_EQ(first_refused(m, doc), strlen(doc)) << doc;
    EXPECT_TRUE(m.complete()) << doc;
  }
}

TEST(JsonSchema, AnyValueRefusesAtTheFirstBadByte) {
  const Schema any = JsonSchema::any_value(Whitespace::Any);
  const std::pair<std::string, size_t> cases[] = {
      {R"({"a":01})", 6},  {"[1,]", 3},       {R"({"a" 1})", 5}, {R"("\x")", 2},       {"tru e", 3},
      {"[1 2]", 3},        {"{,}", 1},        {R"("a\u12g4")", 6}, {"1.e5", 2},        {"-a", 1},
      {"[] ", 2},          {R"({"a":1}})", 7}, {"\"a\nb\"", 2},   {R"({"a":1,})", 7},  {"[1.5.2]", 4},
      {"{1:2}", 1},        {"01", 1},         {"--1", 1},        {"1e+]", 3},         {"]", 0},
      {"[1,2]x", 5},       {R"({"a":tru})", 8}, {"nulll", 4},     {R"(["a"]])", 5},    {"[-]", 2},
      {"{\"a\":1 \"b\"}", 7}, {"[1e]", 3},     {"+1", 0},         {"[.5]", 1},         {"\"\\u\"", 3},
  };
  for (const auto& [doc, bad] : cases) EXPECT_EQ(refused_at(any, doc), bad) << doc;
  // Prefixes of valid documents are accepted but not complete.
  for (const char* doc : {"nul", R"("abc)", "[1,", R"({"a")", "-", "1.", "1e", "1e+", R"("\u12)"}) {
    JsonMatcher m(any);
    EXPECT_TRUE(m.feed(std::string_view(doc))) << doc;
    EXPECT_FALSE(m.complete()) << doc;
  }
}

TEST(JsonSchema, FeedStringIsAllOrNothing) {
  JsonMatcher m(JsonSchema::any_value(Whitespace::Any));
  ASSERT_TRUE(m.feed(std::string_view("[1,")));
  const JsonMatcher before = m;
  EXPECT_FALSE(m.feed(std::string_view("2,3]]")));  // fails at the second ']'
  EXPECT_TRUE(m == before);
  EXPECT_TRUE(m.feed(std::string_view("2,3]")));
  EXPECT_TRUE(m.finished());
}

TEST(JsonSchema, AnyObject) {
  const Schema obj = JsonSchema::any_object(Whitespace::Any);
  EXPECT_EQ(refused_at(obj, "[1]"), 0u);
  EXPECT_EQ(refused_at(obj, R"("x")"), 0u);
  EXPECT_EQ(refused_at(obj, "1"), 0u);
  EXPECT_EQ(refused_at(obj, "null"), 0u);
  EXPECT_TRUE(accepts(obj, "{}"));
  EXPECT_TRUE(accepts(obj, R"({"k":[1,{"x":"y"}],"k":2, "e\"sc": null})"));  // duplicates are not checked
  JsonMatcher m(obj);
  ASSERT_TRUE(m.feed(std::string_view(R"({"a":1})")));
  EXPECT_TRUE(m.finished());
  EXPECT_FALSE(m.feed(uint8_t(' ')));
}

const char* kPerson = R"({
  "type": "object", "title": "Person",
  "properties": {
    "name": {"type": "string", "description": "full name"},
    "nickname": {"type": "string", "format": "not-checked"},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y", "xy"]}, "minItems": 1}
  },
  "required": ["name", "age", "tags"]
})";

TEST(JsonSchema, ObjectWithProperties) {
  const Schema s = compile(kPerson);
  EXPECT_TRUE(accepts(s, R"({"name":"a","age":3,"tags":["x"]})"));
  EXPECT_TRUE(accepts(s, R"({"name":"a","nickname":"b","age":-30,"tags":["x","xy","y"]})"));
  EXPECT_TRUE(accepts(s, "{ \"name\" : \"a\" ,\n  \"age\" : 3 , \"tags\" : [ \"x\" , \"y\" ] }"));
  // Wrong order: name comes first; tags cannot come before the required age.
  EXPECT_EQ(refused_at(s, R"({"age":3})"), 2u);
  EXPECT_EQ(refused_at(s, R"({"name":"a","tags":["x"]})"), 13u);
  EXPECT_EQ(refused_at(s, R"({"name":"a","age":3,"nickname":"b"})"), 21u);
  // Missing required before '}'.
  EXPECT_EQ(refused_at(s, R"({"name":"a","age":3})"), 19u);
  EXPECT_EQ(refused_at(s, "{}"), 1u);
  // Extra keys: after the last property no key may follow, so the comma is refused.
  EXPECT_EQ(refused_at(s, R"({"name":"a","age":3,"tags":["x"],"extra":1})"), 32u);
  EXPECT_EQ(refused_at(s, R"({"name":"a","zzz":1})"), 13u);
  // Types and arrays.
  EXPECT_EQ(refused_at(s, R"({"name":"a","age":3.5,"tags":["x"]})"), 19u);
  EXPECT_EQ(refused_at(s, R"({"name":"a","age":3e1,"tags":["x"]})"), 19u);
  EXPECT_EQ(refused_at(s, R"({"name":"a","age":"3"})"), 18u);
  EXPECT_EQ(refused_at(s, R"({"name":"a","age":3,"tags":[]})"), 28u);
  EXPECT_EQ(refused_at(s, R"({"name":"a","age":3,"tags":["z"]})"), 29u);
  EXPECT_EQ(refused_at(s, R"({"name":"a","age":3,"tags":["xyz"]})"), 31u);
  EXPECT_EQ(refused_at(s, R"({"name":1})"), 8u);
}

TEST(JsonSchema, ExtraKeysAndPrefixNames) {
  // An optional "a", a required "ab" (a prefix pair), then extra string-valued keys.
  const Schema s = compile(R"({"properties": {"a": {"type": "integer"}, "ab": {"type": "integer"}},
                              "required": ["ab"], "additionalProperties": {"type": "string"}})");
  EXPECT_TRUE(accepts(s, R"({"ab":1})"));
  EXPECT_TRUE(accepts(s, R"({"a":1,"ab":2})"));
  EXPECT_TRUE(accepts(s, R"({"ab":1,"c":"x","d":"y"})"));
  EXPECT_EQ(refused_at(s, R"({"c":"x"})"), 2u);             // "ab" is still required
  EXPECT_EQ(refused_at(s, R"({"a":1})"), 6u);               // '}' before "ab"
  EXPECT_EQ(refused_at(s, R"({"ab":1,"c":2})"), 12u);       // extra values are strings
  EXPECT_EQ(refused_at(s, R"({"ab":1,"c":"x","ab":2})"), 21u);  // extra keys are not checked against names...
  EXPECT_TRUE(accepts(s, R"({"ab":1,"c":"x","ab":"2"})"));  // ...and take the extra value schema

  // Extra keys may share a prefix with an optional declared name.
  const Schema t = compile(R"({"properties": {"a": {"type": "integer"}}, "additionalProperties": true})");
  EXPECT_TRUE(accepts(t, R"({"a":1})"));
  EXPECT_TRUE(accepts(t, R"({"ab":"s","a":[]})"));
  EXPECT_EQ(refused_at(t, R"({"a":"s"})"), 5u);  // a declared name takes its declared schema
  EXPECT_TRUE(accepts(t, "{}"));

  // Names needing escapes match their JSON serialisation.
  const Schema e = compile(R"({"properties": {"q\"uote": {"type": "null"}, "new\nline": {"type": "null"}},
                              "required": ["new\nline"]})");
  EXPECT_TRUE(accepts(e, R"({"q\"uote":null,"new\nline":null})"));
  EXPECT_EQ(refused_at(e, R"({"q\u0022uote":null})"), 4u);

  // Without properties: free keys, values from additionalProperties.
  const Schema f = compile(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(accepts(f, R"({"x":1,"y":-2})"));
  EXPECT_EQ(refused_at(f, R"({"x":"s"})"), 5u);
  const Schema empty = compile(R"({"type": "object", "additionalProperties": false})");
  EXPECT_TRUE(accepts(empty, "{}"));
  EXPECT_EQ(refused_at(empty, R"({"x":1})"), 1u);
  // Type inferred from object keywords.
  EXPECT_EQ(refused_at(compile(R"({"properties": {"a": {}}})"), "[]"), 0u);
}

TEST(JsonSchema, Arrays) {
  const Schema s = compile(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})");
  EXPECT_TRUE(accepts(s, "[1,2]"));
  EXPECT_TRUE(accepts(s, "[1, 2, 3]"));
  EXPECT_EQ(refused_at(s, "[1]"), 2u);
  EXPECT_EQ(refused_at(s, "[]"), 1u);
  EXPECT_EQ(refused_at(s, "[1,2,3,4]"), 6u);
  EXPECT_EQ(refused_at(s, "[1,true]"), 3u);
  const Schema none = compile(R"({"type": "array", "maxItems": 0})");
  EXPECT_TRUE(accepts(none, "[]"));
  EXPECT_EQ(refused_at(none, "[1]"), 1u);
}

TEST(JsonSchema, Scalars) {
  const Schema i = compile(R"({"type": "integer"})");
  EXPECT_TRUE(accepts(i, "-0"));
  EXPECT_TRUE(accepts(i, "120"));
  EXPECT_EQ(refused_at(i, "1.0"), 1u);
  EXPECT_EQ(refused_at(i, "1e5"), 1u);
  const Schema b = compile(R"({"type": ["boolean", "null"]})");
  EXPECT_TRUE(accepts(b, "true"));
  EXPECT_TRUE(accepts(b, "false"));
  EXPECT_TRUE(accepts(b, "null"));
  EXPECT_EQ(refused_at(b, "0"), 0u);
  EXPECT_EQ(refused_at(b, "\"true\""), 0u);
  const Schema s = compile(R"({"type": "string"})");
  EXPECT_TRUE(accepts(s, R"("a\u00FFb")"));
  EXPECT_EQ(refused_at(s, "[]"), 0u);
  EXPECT_TRUE(accepts(compile("{}"), "[1]"));
  EXPECT_TRUE(accepts(compile("true"), "[1]"));
}

TEST(JsonSchema, EnumWithPrefixValues) {
  const Schema s = compile(R"({"enum": [1, 10, "a", "ab", 1.5]})");
  for (const char* doc : {"1", "10", "1.5", R"("a")", R"("ab")"}) EXPECT_TRUE(accepts(s, doc)) << doc;
  JsonMatcher one(s);
  ASSERT_TRUE(one.feed(uint8_t('1')));
  EXPECT_TRUE(one.complete());
  EXPECT_FALSE(one.finished());  // 10 or 1.5 may follow
  JsonMatcher ten(s);
  ASSERT_TRUE(ten.feed(std::string_view("10")));
  EXPECT_TRUE(ten.finished());
  EXPECT_EQ(refused_at(s, "100"), 2u);
  EXPECT_EQ(refused_at(s, "2"), 0u);
  EXPECT_EQ(refused_at(s, "1.2"), 2u);
  EXPECT_EQ(refused_at(s, R"("b")"), 1u);
  EXPECT_EQ(refused_at(s, R"("abc")"), 3u);
  EXPECT_EQ(refused_at(s, "[]"), 0u);

  // Inside an array the shorter value ends at the delimiter.
  const Schema a = compile(R"({"type": "array", "items": {"enum": [1, 10]}})");
  EXPECT_TRUE(accepts(a, "[1,10,1 ,10 ]"));
  EXPECT_EQ(refused_at(a, "[11]"), 2u);
  EXPECT_EQ(refused_at(a, "[1.]"), 2u);

  // Values of any type match their compact serialisation.
  const Schema c = compile(R"({"const": {"a": [1, "x"]}})");
  EXPECT_TRUE(accepts(c, R"({"a":[1,"x"]})"));
  EXPECT_EQ(refused_at(c, R"({ "a":[1,"x"]})"), 1u);
  const Schema l = compile(R"({"enum": [true, null, 2.5]})");
  EXPECT_TRUE(accepts(l, "true"));
  EXPECT_TRUE(accepts(l, "null"));
  EXPECT_TRUE(accepts(l, "2.5"));
  EXPECT_EQ(refused_at(l, "false"), 0u);
  // `type` filters the values.
  const Schema t = compile(R"({"type": "string", "enum": ["a", 1]})");
  EXPECT_TRUE(accepts(t, R"("a")"));
  EXPECT_EQ(refused_at(t, "1"), 0u);
  // Enum strings are not free strings.
  JsonMatcher m(t);
  ASSERT_TRUE(m.feed(uint8_t('"')));
  EXPECT_FALSE(m.in_free_string());
}

TEST(JsonSchema, RefRecursion) {
  const Schema tree = compile(R"({
    "$defs": {"node": {"type": "object", "properties": {
      "value": {"type": "integer"},
      "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["value"]}},
    "$ref": "#/$defs/node"})");
  EXPECT_TRUE(accepts(tree, R"({"value":1,"children":[{"value":2},{"value":3,"children":[{"value":4,"children":[]}]}]})"));
  const std::string bad = R"({"value":1,"children":[{"children":[]}]})";
  EXPECT_EQ(refused_at(tree, bad), bad.find("children", 14) + 0);

  // definitions, and a reference to the root.
  const Schema defs = compile(R"({"definitions": {"s": {"type": "string"}},
                                 "type": "array", "items": {"anyOf": [{"$ref": "#/definitions/s"}, {"$ref": "#"}]}})");
  EXPECT_TRUE(accepts(defs, R"(["a",[],["b",[[]]]])"));
  EXPECT_EQ(refused_at(defs, "[1]"), 1u);

  // A cycle that consumes no input is an error, like a dangling reference.
  EXPECT_NE(error_of(R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})")
                .find("loops back"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
                         "type": "array", "items": {"$ref": "#/$defs/a"}})")
                .find("loops back"),
            std::string::npos);
  EXPECT_EQ(error_of(R"({"type": "array", "items": {"$ref": "#/$defs/missing"}})"),
            "schema.items: '$ref' target '#/$defs/missing' does not exist");
  EXPECT_EQ(error_of(R"({"$ref": "http://x/y.json"})"),
            "schema: '$ref' must be a local reference starting with '#', got \"http://x/y.json\"");
}

TEST(JsonSchema, AnyOf) {
  const Schema s = compile(R"({"anyOf": [{"type": "string"}, {"type": "null"}], "default": null})");
  EXPECT_TRUE(accepts(s, R"("x")"));
  EXPECT_TRUE(accepts(s, "null"));
  EXPECT_EQ(refused_at(s, "1"), 0u);
  EXPECT_EQ(refused_at(s, "true"), 0u);
  const Schema n = compile(R"({"oneOf": [{"type": "integer"}, {"type": "number"}, {"enum": ["a", "b"]}]})");
  EXPECT_TRUE(accepts(n, "1.5"));
  EXPECT_TRUE(accepts(n, R"("b")"));
  EXPECT_EQ(refused_at(n, R"("c")"), 1u);
  EXPECT_EQ(error_of(R"({"anyOf": [{"type": "string"}, {"enum": ["a"]}]})"),
            "schema: 'anyOf' alternatives 0 and 1 both accept string values (only alternatives told apart by "
            "the first byte are supported)");
}

// allOf: the entries' keywords (a $ref's target's) merged into one schema, as Pydantic writes a
// described model field; conflicts are refused by name.
TEST(JsonSchema, AllOfMerges) {
  const Schema pydantic = compile(R"({
    "$defs": {"Color": {"enum": ["red", "green"], "type": "string"},
              "Point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
    "type": "object",
    "properties": {"color": {"allOf": [{"$ref": "#/$defs/Color"}], "description": "the color", "default": "red"},
                   "at": {"$ref": "#/$defs/Point", "allOf": [{"properties": {"y": {"type": "integer"}}, "required": ["y"]}]}},
    "required": ["color", "at"]})");
  EXPECT_TRUE(accepts(pydantic, R"({"color": "green", "at": {"x": 1, "y": 2}})"));
  EXPECT_EQ(refused_at(pydantic, R"({"color": "blue")"), 11u);
  EXPECT_EQ(refused_at(pydantic, R"({"color": "red", "at": {"x": 1}})"), 30u) << "y is required too";
  const Schema nested = compile(R"({"allOf": [{"allOf": [{"type": "integer"}]}, {"minimum": 3}]})");
  EXPECT_TRUE(accepts(nested, "4"));
  EXPECT_EQ(refused_at(nested, "-1"), 0u);
  EXPECT_FALSE(accepts(nested, "2"));
  EXPECT_EQ(error_of(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})"),
            "schema.allOf[1]: 'allOf' gives 'type' twice with different values (not supported)");
  EXPECT_EQ(error_of(R"({"allOf": [{"properties": {"a": {"type": "string"}}}, {"properties": {"a": {}}}]})"),
            "schema.allOf[1]: 'allOf' defines property 'a' twice, differently (not supported)");
  EXPECT_EQ(error_of(R"({"allOf": [{"$ref": "#"}]})"), "schema.allOf[0]: 'allOf' / '$ref' nest more than 16 deep");
  EXPECT_EQ(error_of(R"({"allOf": [{"uniqueItems": true}]})"), "schema.allOf[0]: keyword 'uniqueItems' is not supported");
}

// Tuples: prefixItems (Pydantic's tuple[int, str]) or draft 4's items array; items false closes.
TEST(JsonSchema, Tuples) {
  const Schema pair = compile(R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                                  "minItems": 2, "maxItems": 2})");
  EXPECT_TRUE(accepts(pair, R"([1, "a"])"));
  EXPECT_EQ(refused_at(pair, R"(["a", 1])"), 1u);
  EXPECT_EQ(refused_at(pair, R"([1])"), 2u) << "two items at least";
  EXPECT_EQ(refused_at(pair, R"([1, "a", 2])"), 7u);
  const Schema open = compile(R"({"prefixItems": [{"type": "string"}], "items": {"type": "integer"}})");
  EXPECT_TRUE(accepts(open, R"(["a", 1, 2])"));
  EXPECT_TRUE(accepts(open, R"([])"));
  EXPECT_EQ(refused_at(open, R"(["a", "b"])"), 6u);
  const Schema closed = compile(R"({"items": [{"type": "boolean"}]})");  // draft 4: more items are any
  EXPECT_TRUE(accepts(closed, R"([true, "x"])"));
  const Schema shut = compile(R"({"prefixItems": [{"type": "null"}], "items": false})");
  EXPECT_TRUE(accepts(shut, "[null]"));
  EXPECT_EQ(refused_at(shut, "[null,"), 5u);
  EXPECT_EQ(error_of(R"({"prefixItems": [{}], "items": false, "minItems": 2})"),
            "schema: 'minItems' is above the items allowed");
}

TEST(JsonSchema, SchemaErrors) {
  EXPECT_EQ(error_of(R"({"type": "object", "properties": {"age": {"type": "integer", "multipleOf": 2}}})"),
            "schema.properties.age: keyword 'multipleOf' is not supported");
  EXPECT_EQ(error_of(R"({"type": "string", "pattern": "(a"})"),
            "schema: 'pattern': regex '(a': missing ')' at offset 2");
  EXPECT_EQ(error_of(R"({"type": "array", "items": {"allOf": []}})"), "schema.items: 'allOf' must be a non-empty array");
  EXPECT_EQ(error_of(R"({"$defs": {"x": {"uniqueItems": true}}, "$ref": "#/$defs/x"})"),
            "schema.$defs.x: keyword 'uniqueItems' is not supported");
  EXPECT_EQ(error_of(R"({"type": []})"), "schema: 'type' is an empty array");
  EXPECT_EQ(error_of(R"({"type": "float"})"), "schema: unknown type \"float\"");
  EXPECT_EQ(error_of(R"({"properties": {"a": {}}, "required": ["b"]})"),
            "schema: required property \"b\" is not in 'properties'");
  EXPECT_EQ(error_of(R"({"$ref": "#/$defs/a", "type": "string", "$defs": {"a": {}}})"),
            "schema: keyword 'type' next to '$ref' is not supported");
  EXPECT_EQ(error_of(R"({"minItems": 3, "maxItems": 2})"), "schema: 'minItems' is above the items allowed");
  EXPECT_EQ(error_of(R"({"minItems": -1})"), "schema: 'minItems' must be a non-negative integer, got -1");
  EXPECT_EQ(error_of(R"({"type": "integer", "enum": ["a"]})"), "schema: no 'enum'/'const' value matches 'type'");
  EXPECT_EQ(error_of("false"), "schema: schema 'false' matches nothing");
  EXPECT_EQ(error_of("3"), "schema: a schema must be an object or a boolean, got 3");
  // Annotations are accepted.
  EXPECT_EQ(error_of(R"({"$schema": "x", "$id": "y", "$comment": "z", "title": "t", "description": "d",
                        "default": 1, "examples": [1], "strict": true, "type": "string", "format": "date"})"),
            "no error");
}

TEST(JsonSchema, WhitespaceCap) {
  const Schema any = JsonSchema::any_value(Whitespace::Any);
  const std::string run(JsonMatcher::kMaxWhitespace, ' ');
  JsonMatcher m(any);
  ASSERT_TRUE(m.feed(std::string_view(run)));
  EXPECT_FALSE(m.feed(uint8_t('\n')));
  ASSERT_TRUE(m.feed(uint8_t('[')));
  ASSERT_TRUE(m.feed(std::string_view(run)));  // a token resets the run
  EXPECT_FALSE(m.feed(uint8_t('\t')));
  ASSERT_TRUE(m.feed(uint8_t('1')));
  ASSERT_TRUE(m.feed(std::string_view(run)));  // the number ends at the first space
  EXPECT_FALSE(m.feed(uint8_t(' ')));
  ASSERT_TRUE(m.feed(std::string_view(",\"" + run + run + "\"]")));  // spaces inside strings are content
  EXPECT_TRUE(m.finished());
}

// minLength / maxLength count characters (a UTF-8 sequence or an escape is one); such a string
// is not "free" (every character changes the state), an unbounded one is.
TEST(JsonSchema, StringLength) {
  const Schema s = compile(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_TRUE(accepts(s, "\"ab\""));
  EXPECT_TRUE(accepts(s, "\"abc\""));
  EXPECT_TRUE(accepts(s, "\"\xc3\xa9\\u00e9\"")) << "two characters in five bytes";
  EXPECT_TRUE(accepts(s, "\"\\n\\t\\\"\""));
  EXPECT_EQ(refused_at(s, "\"a\""), 2u) << "one character: too short to close";
  EXPECT_EQ(refused_at(s, "\"abcd\""), 4u) << "a fourth character";
  JsonMatcher m(s);
  ASSERT_TRUE(m.feed(std::string_view("\"a")));
  EXPECT_FALSE(m.in_free_string());
  JsonMatcher free(compile(R"({"type": "string"})"));
  ASSERT_TRUE(free.feed(std::string_view("\"a")));
  EXPECT_TRUE(free.in_free_string());
  const Schema obj = compile(R"({"properties": {"id": {"type": "string", "maxLength": 1}}, "required": ["id"]})");
  EXPECT_TRUE(accepts(obj, R"({"id": "x"})"));
  EXPECT_EQ(refused_at(obj, R"({"id": "xy"})"), 9u);
  EXPECT_NE(error_of(R"({"type": "string", "minLength": 3, "maxLength": 2})").find("minLength"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "string", "minLength": -1})").find("minLength"), std::string::npos);
}

// The default whitespace: one space, or a newline and up to kMaxIndent spaces / tabs.
TEST(JsonSchema, LimitedWhitespace) {
  const Schema limited = JsonSchema::any_value();
  EXPECT_TRUE(accepts(limited, "{\"a\": [1, 2], \"b\": null}"));
  EXPECT_TRUE(accepts(limited, "{\n  \"a\": [\n\t\t1\n  ]\n}"));
  EXPECT_TRUE(accepts(limited, " [1]"));
  const std::string indent(JsonMatcher::kMaxIndent, ' ');
  EXPECT_TRUE(accepts(limited, "[\n" + indent + "1]"));
  EXPECT_EQ(refused_at(limited, "[\n" + indent + " 1]"), 2 + indent.size());
  EXPECT_EQ(refused_at(limited, "[1,  2]"), 4u) << "a second space";
  EXPECT_EQ(refused_at(limited, "[1, \n2]"), 4u) << "a newline after a space";
  EXPECT_EQ(refused_at(limited, "[1,\n\n2]"), 4u) << "an empty line";
  EXPECT_EQ(refused_at(limited, "[\t1]"), 1u) << "a tab starts no run";
  EXPECT_EQ(refused_at(limited, "[\r\n1]"), 1u);
  EXPECT_TRUE(accepts(limited, "[\"a  \\n b\"]")) << "strings keep their content";
}

// Compact: at most one space; a pattern of the caller's (Outlines' / vLLM's whitespace_pattern)
// is checked to match the empty text and nothing but JSON whitespace.
TEST(JsonSchema, CompactAndCustomWhitespace) {
  const Schema compact = JsonSchema::any_value(Whitespace::Compact);
  EXPECT_TRUE(accepts(compact, "{\"a\":[1,2]}"));
  EXPECT_TRUE(accepts(compact, "{\"a\": [1, 2], \"b\": null}"));
  EXPECT_EQ(refused_at(compact, "{\n\"a\":1}"), 1u) << "no newline";
  EXPECT_EQ(refused_at(compact, "[1,  2]"), 4u) << "a second space";
  EXPECT_TRUE(JsonSchema::any_value(Whitespace::Compact) == compact) << "built-in patterns compile once";

  const Schema pretty = JsonSchema::compile(Json(true), Whitespace{"(?:\\n(?:  )*)?"});  // newline, indent pairs
  EXPECT_TRUE(accepts(pretty, "{\n  \"a\":\n    1\n}"));
  EXPECT_EQ(refused_at(pretty, "[ 1]"), 1u) << "no lone space";
  EXPECT_EQ(refused_at(pretty, "[\n 1]"), 3u) << "an odd indent cannot end the run";
  const Schema pairs = JsonSchema::compile(Json(true), Whitespace{"(?:\\r\\n)?"});
  EXPECT_TRUE(accepts(pairs, "[\r\n1]"));
  EXPECT_EQ(refused_at(pairs, "[\r1]"), 2u) << "the run must end where the pattern matches";

  auto error_with = [](std::string_view pattern) {
    try {
      JsonSchema::compile(Json(true), Whitespace{pattern});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_with("\\s+").find("must match the empty text"), std::string::npos) << error_with("\\s+");
  EXPECT_NE(error_with("[ x]?").find("byte 0x78"), std::string::npos) << error_with("[ x]?");
  EXPECT_NE(error_with("(").find("whitespace pattern '('"), std::string::npos) << error_with("(");
  EXPECT_EQ(error_with("[ \\t]*"), "no error");
}

TEST(JsonSchema, DepthCap) {
  JsonMatcher m(JsonSchema::any_value(Whitespace::Any));
  const int open = JsonMatcher::kMaxDepth - 1;  // the top-level frame takes one
  ASSERT_TRUE(m.feed(std::string_view(std::string(open, '['))));
  EXPECT_FALSE(m.feed(uint8_t('[')));
  EXPECT_FALSE(m.feed(uint8_t('1')));  // a scalar needs a frame too
  ASSERT_TRUE(m.feed(std::string_view(std::string(open, ']'))));
  EXPECT_TRUE(m.finished());
}

TEST(JsonSchema, NumberCap) {
  const Schema any = JsonSchema::any_value(Whitespace::Any);
  const std::string digits(JsonMatcher::kMaxNumber, '7');
  JsonMatcher m(any);
  ASSERT_TRUE(m.feed(std::string_view(digits)));
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(m.finished());
  EXPECT_FALSE(m.feed(uint8_t('7')));
  EXPECT_TRUE(accepts(any, "[" + digits + "]"));
  EXPECT_EQ(refused_at(any, "[" + digits + "7]"), digits.size() + 1);
  EXPECT_EQ(refused_at(any, "-" + digits), digits.size());
  // No dead end at the cap: '.', 'e' and signs need room for a digit after them.
  const std::string shorter(JsonMatcher::kMaxNumber - 1, '7');
  EXPECT_EQ(refused_at(any, shorter + ".5"), shorter.size());
  EXPECT_TRUE(accepts(any, shorter.substr(1) + ".5"));
  EXPECT_EQ(refused_at(any, shorter.substr(1) + "e+5"), shorter.size());  // the sign would fill the cap
  EXPECT_TRUE(accepts(any, shorter.substr(2) + "e+5"));                   // exactly kMaxNumber bytes
}

TEST(JsonSchema, Finished) {
  const Schema any = JsonSchema::any_value(Whitespace::Any);
  for (const char* doc : {"{}", "[1]", R"("a")", "true", "null"}) {
    JsonMatcher m(any);
    ASSERT_TRUE(m.feed(std::string_view(doc))) << doc;
    EXPECT_TRUE(m.complete() && m.finished()) << doc;
    for (int c = 0; c < 256; ++c) EXPECT_FALSE(m.feed(uint8_t(c))) << doc << " then " << c;
  }
  JsonMatcher n(any);
  ASSERT_TRUE(n.feed(std::string_view("-1.5")));
  EXPECT_TRUE(n.complete());
  EXPECT_FALSE(n.finished());
  JsonMatcher t(any);
  ASSERT_TRUE(t.feed(std::string_view("tru")));
  EXPECT_FALSE(t.complete() || t.finished());
}

TEST(JsonSchema, FreeStringsAndEquality) {
  const Schema any = JsonSchema::any_value(Whitespace::Any);
  JsonMatcher m(any);
  EXPECT_FALSE(m.in_free_string());
  ASSERT_TRUE(m.feed(std::string_view(R"([{"ke)")));
  EXPECT_TRUE(m.in_free_string());  // a free key
  ASSERT_TRUE(m.feed(std::string_view(R"(y":"ab)")));
  EXPECT_TRUE(m.in_free_string());
  for (uint8_t c : {uint8_t('x'), uint8_t(' '), uint8_t('{'), uint8_t(0x7f), uint8_t(0xc3), uint8_t(0xff)}) {
    JsonMatcher next = m;
    ASSERT_TRUE(next.feed(c));
    EXPECT_TRUE(next == m) << int(c);
    EXPECT_EQ(next.hash(), m.hash());
  }
  ASSERT_TRUE(m.feed(uint8_t('\\')));
  EXPECT_FALSE(m.in_free_string());
  ASSERT_TRUE(m.feed(std::string_view("u00")));
  EXPECT_FALSE(m.in_free_string());
  ASSERT_TRUE(m.feed(std::string_view("e9")));
  EXPECT_TRUE(m.in_free_string());
  ASSERT_TRUE(m.feed(uint8_t('"')));
  EXPECT_FALSE(m.in_free_string());

  // Declared keys are matched, not free; string values are free.
  JsonMatcher p(compile(kPerson));
  ASSERT_TRUE(p.feed(std::string_view(R"({"na)")));
  EXPECT_FALSE(p.in_free_string());
  ASSERT_TRUE(p.feed(std::string_view(R"(me":"a)")));
  EXPECT_TRUE(p.in_free_string());

  // Equal states from different paths; different states differ.
  JsonMatcher a(any), b(any);
  ASSERT_TRUE(a.feed(std::string_view("[1, ")));
  ASSERT_TRUE(b.feed(std::string_view("[2, ")));
  EXPECT_TRUE(a == b);
  EXPECT_EQ(a.hash(), b.hash());
  ASSERT_TRUE(b.feed(uint8_t(' ')));  // a longer whitespace run is a different state
  EXPECT_FALSE(a == b);
  EXPECT_FALSE(JsonMatcher(any) == JsonMatcher(JsonSchema::any_object(Whitespace::Any)));
}

TEST(JsonSchema, CopiesAreIndependent) {
  JsonMatcher a(JsonSchema::any_value(Whitespace::Any));
  ASSERT_TRUE(a.feed(std::string_view(R"({"a":[1,)")));
  JsonMatcher b = a;
  ASSERT_TRUE(b.feed(std::string_view("2]}")));
  EXPECT_TRUE(b.finished());
  EXPECT_FALSE(a.complete());
  ASSERT_TRUE(a.feed(std::string_view(R"("x"],"b":{}})")));
  EXPECT_TRUE(a.finished());
  JsonMatcher c(JsonSchema::any_object(Whitespace::Any));
  c = b;  // assignment takes the schema too
  EXPECT_TRUE(c == b);
  JsonMatcher d(JsonSchema::any_value(Whitespace::Any));
  d = JsonMatcher(JsonSchema::any_value(Whitespace::Any));
  ASSERT_TRUE(d.feed(std::string_view("[[")));
  c = d;
  ASSERT_TRUE(c.feed(std::string_view("]]")));
  EXPECT_TRUE(c.finished());
  EXPECT_FALSE(d.complete());
}

// Random JSON (ASCII strings, so nlohmann's UTF-8 check agrees with the matcher's bytes).
Json random_json(std::mt19937& rng, int depth) {
  const int pick = int(rng() % (depth > 0 ? 8 : 5));
  switch (pick) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return int(rng() % 2000000) - 1000000;
    case 3: return double(int(rng() % 200000) - 100000) / 64.0;
    case 4: {
      std::string s;
      for (int n = int(rng() % 6); n > 0; --n) s += "ab \"\\/\n\t\x01zQ"[rng() % 12];
      return s;
    }
    case 5:
    case 6: {
      Json a = Json::array();
      for (int n = int(rng() % 4); n > 0; --n) a.push_back(random_json(rng, depth - 1));
      return a;
    }
    default: {
      Json o = Json::object();
      for (int n = int(rng() % 4); n > 0; --n) o[std::string(1, char('a' + rng() % 4))] = random_json(rng, depth - 1);
      return o;
    }
  }
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Valid JSON grammar per nlohmann, which stops at a NUL byte and refuses numbers out of a
// double's range (the matcher checks only the grammar).
bool parses(const std::string& doc) {
  if (doc.find('\0') != std::string::npos) return false;
  try {
    return !Json::parse(doc).is_discarded();
  } catch (const Json::out_of_range&) {
    return true;
  } catch (const Json::exception&) {
    return false;
  }
}

// doc with one random byte replaced at `at`, fed to a matcher of s: `stop` is the first byte it
// refused (the size if none), `whole` whether it accepted all of it as a complete value.
struct Mutation {
  std::string bad;
  size_t at = 0, stop = 0;
  bool whole = false;
};
Mutation mutate(const Schema& s, const std::string& doc, std::mt19937& rng) {
  Mutation m{doc};
  m.at = rng() % m.bad.size();
  m.bad[m.at] = char(rng() % 128);
  JsonMatcher matcher(s);
  m.stop = first_refused(matcher, m.bad);
  m.whole = m.stop == m.bad.size() && matcher.complete();
  return m;
}

TEST(JsonSchema, RandomMutationsAgreeWithParser) {
  const Schema any = JsonSchema::any_value(Whitespace::Any);
  std::mt19937 rng(1234);
  int refused = 0, accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const Json value = random_json(rng, 4);
    const std::string doc = value.dump(rng() % 3 == 0 ? -1 : int(rng() % 3));
    ASSERT_TRUE(accepts(any, doc)) << doc;
    const Mutation m = mutate(any, doc, rng);
    EXPECT_GE(m.stop, m.at) << m.bad;  // the unchanged prefix stays acceptable
    const bool parser_ok = parses(m.bad) && !is_ws(m.bad.back());  // no whitespace after the value
    EXPECT_EQ(m.whole, parser_ok) << m.bad;
    (m.whole ? accepted : refused)++;
  }
  EXPECT_GT(refused, 100);
  EXPECT_GT(accepted, 100);
}

// A handwritten check of kPerson, for documents the matcher accepted.
bool valid_person(const Json& j) {
  static const std::vector<std::string> order = {"name", "nickname", "age", "tags"};
  if (!j.is_object() || !j.contains("name") || !j.contains("age") || !j.contains("tags")) return false;
  size_t pos = 0;
  for (const auto& [k, v] : j.items()) {
    while (pos < order.size() && order[pos] != k) ++pos;
    if (pos == order.size()) return false;  // unknown or out of order
  }
  if (!j["name"].is_string() || !j["age"].is_number_integer() || !j["tags"].is_array() || j["tags"].empty())
    return false;
  if (j.contains("nickname") && !j["nickname"].is_string()) return false;
  for (const Json& t : j["tags"])
    if (t != "x" && t != "y" && t != "xy") return false;
  return true;
}

TEST(JsonSchema, RandomPersonMutations) {
  const Schema s = compile(kPerson);
  std::mt19937 rng(99);
  for (int iter = 0; iter < 3000; ++iter) {
    Json p = Json::object();
    p["name"] = std::string(rng() % 4, 'n');
    if (rng() % 2) p["nickname"] = "k\"\\";
    p["age"] = int(rng() % 200) - 100;
    p["tags"] = Json::array();
    for (int n = 1 + int(rng() % 3); n > 0; --n) p["tags"].push_back(std::vector<std::string>{"x", "y", "xy"}[rng() % 3]);
    const std::string doc = p.dump(rng() % 2 ? -1 : 1);
    ASSERT_TRUE(accepts(s, doc)) << doc;
    const Mutation m = mutate(s, doc, rng);
    EXPECT_GE(m.stop, m.at) << m.bad;
    if (m.whole) {
      EXPECT_TRUE(Json::accept(m.bad) && valid_person(Json::parse(m.bad))) << m.bad;
    }
  }
}

// Not a pass/fail check: prints the cost of the mask loop's inner step.
TEST(JsonSchema, CopyFeedBenchmark) {
  JsonMatcher base(compile(kPerson));
  ASSERT_TRUE(base.feed(std::string_view(R"({"name":"abc","age":12,"tags":["x",)")));
  const std::string_view bytes = R"("xy],} a1"\{:)";
  constexpr int kIters = 1000000;
  size_t sink = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kIters; ++i) {
    JsonMatcher m = base;
    sink += m.feed(uint8_t(bytes[i % bytes.size()]));
  }
  auto t1 = std::chrono::steady_clock::now();
  JsonMatcher scratch = base;
  for (int i = 0; i < kIters; ++i) {
    scratch = base;
    sink += scratch.feed(uint8_t(bytes[i % bytes.size()]));
  }
  auto t2 = std::chrono::steady_clock::now();
  auto ns = [](auto d) { return std::chrono::duration<double, std::nano>(d).count() / kIters; };
  std::printf("copy-construct+feed: %.1f ns, assign+feed: %.1f ns (depth 3, %zu accepted)\n", ns(t1 - t0),
              ns(t2 - t1), sink);
  EXPECT_GT(sink, 0u);
}

}  // namespace
}  // namespace qwen36::text
