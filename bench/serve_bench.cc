// serve_bench: aggregate generation throughput of a running txl-server at
// several concurrency levels, measured in one run and reported as ratios
// to one session (absolute figures for reference only).
//   serve_bench --server 127.0.0.1:50051 --levels 1,8,32 --new_tokens 64 --rounds 3
#include <algorithm>
#include <chrono>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "base/flags_help.h"
#include "client/txl_client.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "txl-server address");
ABSL_FLAG(std::vector<std::string>, levels, std::vector<std::string>({"1", "8", "32"}), "concurrent sessions");
ABSL_FLAG(int, new_tokens, 64, "tokens generated per request");
ABSL_FLAG(int, rounds, 3, "interleaved repetitions; the median is reported");
ABSL_FLAG(std::string, prompt, "ROMEO:\n", "input of every request");

namespace {

// One level: N sessions generate at once; tokens per second over the wall time.
double Measure(const std::string& server, int sessions, int new_tokens, const std::string& prompt) {
  std::vector<std::thread> threads;
  std::vector<int64_t> generated(sessions, 0);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < sessions; ++i) {
    threads.emplace_back([&, i] {
      txl::ClientOptions o;
      o.server = server;
      auto client = *txl::TxlClient::Create(o);
      txl::v1::GenerateRequest req;
      req.mutable_input()->set_text(prompt);
      req.set_max_new_tokens(new_tokens);
      req.mutable_sampling()->set_temperature(1.0f);
      req.mutable_sampling()->set_seed(1000 + i);
      absl::Status s =
          client->Generate(req, [&](const txl::v1::GenerateResponse& r) { generated[i] += r.tokens_size(); });
      if (!s.ok()) std::cerr << "serve_bench: " << s << "\n";
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t total = 0;
  for (int64_t g : generated) total += g;
  return static_cast<double>(total) / secs;
}

}  // namespace

int main(int argc, char** argv) {
  txl::ListOwnFlagsInHelp();
  absl::ParseCommandLine(argc, argv);
  std::vector<int> levels;
  for (const auto& l : absl::GetFlag(FLAGS_levels)) levels.push_back(std::stoi(l));
  std::vector<std::vector<double>> results(levels.size());
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    for (size_t i = 0; i < levels.size(); ++i) {
      results[i].push_back(Measure(absl::GetFlag(FLAGS_server), levels[i], absl::GetFlag(FLAGS_new_tokens),
                                   absl::GetFlag(FLAGS_prompt)));
    }
  }
  std::vector<double> median;
  for (auto& v : results) {
    std::sort(v.begin(), v.end());
    median.push_back(v[v.size() / 2]);
  }
  std::cout << "| sessions | tokens/s (median of " << absl::GetFlag(FLAGS_rounds)
            << ") | vs 1 session |\n|---|---|---|\n";
  for (size_t i = 0; i < levels.size(); ++i) {
    std::cout << absl::StrFormat("| %d | %.0f | %.2fx |\n", levels[i], median[i], median[i] / median[0]);
  }
  return 0;
}
