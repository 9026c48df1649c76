#pragma once
// defines: the request fields the OpenAI endpoints share, each bad value a 400 naming it:
//          reject_unknown, has, number, integer, boolean, Generation / parse_generation
//          (sampling, limits, stop, logit_bias, n, streaming), output_constraint
//          (response_format and its vLLM / SGLang / llama-server cousins); random_id, unix_time

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/api.h"

namespace qwen36::server {

// An unknown field (in neither list) is a 400 naming it (as OpenAI answers).
void reject_unknown(const Json& body, std::initializer_list<const char*> known,
                    std::initializer_list<std::span<const char* const>> also = {});
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
// (a 400 "context_length_exceeded" when they leave no room for the answer). end_of_turn false
// (raw completions): <|im_end|> is not among the stop ids, only the end-of-text ones.
Generation parse_generation(const Json& body, const HttpServer::Api& api, std::vector<int32_t> prompt,
                            bool end_of_turn = true);
// vLLM's extensions that parse_generation reads (and llama-server's typical_p / top_n_sigma),
// accepted by the chat and completions routes.
inline constexpr const char* kVllmSamplingFields[] = {"min_tokens", "stop_token_ids", "include_stop_str_in_output",
                                                      "prompt_logprobs", "priority", "typical_p", "top_n_sigma"};
// The request's output constraint, from the one field that gives it: response_format (OpenAI:
// text, json_object — llama-server's form may carry a "schema" — or json_schema), vLLM's
// structured_outputs {json | regex | choice | grammar | json_object} and older guided_json /
// guided_regex / guided_choice / guided_grammar, SGLang's regex, ebnf and json_schema (a JSON
// string), llama-server's json_schema and grammar. Grammars are GBNF (text/grammar.h). JSON
// output holds json_ws between tokens unless the request sets its own (vLLM's
// structured_outputs disable_any_whitespace / whitespace_pattern, guided_whitespace_pattern).
OutputConstraint output_constraint(const Json& body, text::Whitespace json_ws = text::Whitespace::Limited);
// The fields output_constraint reads besides response_format, and vLLM's guided_decoding_backend
// (accepted, ignored: there is one backend).
inline constexpr const char* kStructuredOutputFields[] = {
    "structured_outputs", "guided_json", "guided_regex", "guided_choice", "regex", "json_schema", "guided_grammar",
    "grammar", "ebnf", "guided_decoding_backend", "guided_whitespace_pattern"};

std::string random_id(const char* prefix);  // prefix + random hex, unique in this process
int64_t unix_time();

}  // namespace qwen36::server
