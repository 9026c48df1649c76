#pragma once
// defines: the request fields the OpenAI endpoints share, each bad value a 400 naming it:
//          reject_unknown, has, number, integer, boolean, Generation / parse_generation
//          (sampling, limits, stop, logit_bias, n, streaming), output_constraint
//          (response_format); random_id, unix_time

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/api.h"

namespace qwen36::server {

// An unknown field is a 400 naming it (as OpenAI answers).
void reject_unknown(const Json& body, std::initializer_list<const char*> known);
bool has(const Json& body, const char* key);  // present and not null
// The field, checked against [lo, hi] (a 400 otherwise), or def when absent.
double number(const Json& body, const char* key, double lo, double hi, double def);
int64_t integer(const Json& body, const char* key, int64_t lo, int64_t hi, int64_t def);
bool boolean(const Json& body, const char* key, bool def);

struct Generation {
  RequestParams params;
  int n = 1;  // choices: requests of the same prompt
  bool stream = false, include_usage = false;
  bool logprobs = false;
};

// Sampling, limits, stop, logit_bias, n and streaming fields; prompt: the request's tokens
// (a 400 "context_length_exceeded" when they leave no room for the answer).
Generation parse_generation(const Json& body, const HttpServer::Api& api, std::vector<int32_t> prompt);
// response_format → the request's output constraint: text (none), json_object (any object;
// llama-server's form may carry a "schema" there) or json_schema ({"name", "schema", "strict"}).
OutputConstraint output_constraint(const Json& body);

std::string random_id(const char* prefix);  // prefix + random hex, unique in this process
int64_t unix_time();

}  // namespace qwen36::server
