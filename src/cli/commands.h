#pragma once
// defines: the register_* function of every subcommand (one cmd_*.cpp each)
//
// A subcommand adds itself to the app and sets a callback; the callback throws
// qwen36::Error on bad input, which main() reports as one line.

#include <CLI/CLI.hpp>

namespace qwen36::cli {

void register_commands(CLI::App& app);  // all of the below, in --help order

void register_run(CLI::App& app);
void register_chat(CLI::App& app);      // chat (a conversation in the terminal)
void register_logits(CLI::App& app);
void register_tokenize(CLI::App& app);  // tokenize, detokenize
void register_template(CLI::App& app);  // template
void register_info(CLI::App& app);      // info (GGUF metadata and tensors)
void register_serve(CLI::App& app);     // serve (OpenAI-compatible HTTP server)
void register_bench(CLI::App& app);     // bench (speed, llama-bench-like)
void register_bench_serve(CLI::App& app); // bench-serve (serving throughput and latency, S streams)
void register_convert(CLI::App& app);   // convert (HF checkpoint -> GGUF)
void register_quantize(CLI::App& app);  // quantize (GGUF or HF -> Q8_0/Q6_K/Q5_K_M/Q4_K_M...)
void register_gen_model(CLI::App& app); // gen-model (random full-size GGUF)
void register_perplexity(CLI::App& app); // perplexity (PPL and KL divergence, llama-perplexity-like)

}  // namespace qwen36::cli
