#pragma once
// defines: ChatRequest, prepare_chat (a chat request's messages, tools, tool_choice,
//          response_format and template kwargs made into the engine's request and the output
//          parser's options; /v1/chat/completions and /v1/responses share it)

#include "server/params.h"
#include "text/output_parser.h"

namespace qwen36::server {

struct ChatRequest {
  Generation g;
  OutputParserOptions parser;  // reasoning (the prompt may open <think>) and the tools' calls
  bool want_logprobs = false;
};

// body: in /v1/chat/completions form, its field names already checked by the endpoint. Every
// bad value is a 400 naming its field.
ChatRequest prepare_chat(HttpServer::Api& api, const Json& body);

}  // namespace qwen36::server
