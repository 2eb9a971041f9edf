// The HTML reports of `shardsim plan --report` and `shardsim compare --report`, loaded in a
// real browser (Debian's chromium, headless): the DOM it builds holds every chart with the
// data drawn (a circle per evaluated plan, a bar segment per step part, a bar per link), the
// page asks for nothing over the network, and the browser logs no console error. Skipped
// when chromium is not installed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "tests/cli/subprocess.h"

namespace shardsim::cli_test {
namespace {

constexpr const char* kChromium = "/usr/bin/chromium";

class HtmlReportTest : public CliFixture {
 protected:
  // The DOM chromium builds from `page` (headless, no network, a fresh profile), and its log.
  Result Dom(const std::string& page) const {
    const fs::path profile = root_ / "profile";
    fs::create_directories(profile);
    return RunBinary(
        kChromium,
        {"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--user-data-dir=" + profile.string(), "--dump-dom",
         "file://" + page},
        root_);
  }

  static size_t Count(const std::string& text, const std::string& needle) {
    size_t n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
      ++n;
    }
    return n;
  }

  static void ExpectNoConsoleErrors(const std::string& log) {
    std::istringstream in(log);
    for (std::string line; std::getline(in, line);) {
      EXPECT_EQ(line.find("CONSOLE"), std::string::npos) << line;
      EXPECT_EQ(line.find("Uncaught"), std::string::npos) << line;
    }
  }

  std::string TinyModel(const std::string& rest) const {
    return "hardware: {preset: tpu-v5e, shape: [4, 2]}\n"
           "model: {kind: transformer, layers: 4, d_model: 64, d_ff: 128, heads: 8,\n"
           "        kv_heads: 2, vocab: 128}\n"
           "train: {global_batch: 16, seq_len: 16, optimizer: adam, dtype: f32,\n"
           "        param_dtype: f32}\n" +
           rest;
  }
};

TEST_F(HtmlReportTest, PlanReportRendersInChromium) {
  if (!fs::exists(kChromium)) GTEST_SKIP() << "chromium is not installed";
  const std::string file = WriteInput(
      "tiny.yaml", TinyModel("search: {axes: [data, fsdp, tensor], microbatches: [1, 2],\n"
                             "         memory_limit: 0.0001}\n"));
  const std::string page = (out() / "plan.html").string();
  const std::string results = (out() / "r.jsonl").string();
  RunOk({"plan", file, "--report", page, "--out", results, "--top", "4"});
  const std::string html = ReadFile(page);
  EXPECT_EQ(html.find("http://"), std::string::npos);  // Self-contained: no fetches.
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  size_t evaluated = 0;
  std::istringstream in(ReadFile(results));
  for (std::string line; std::getline(in, line);) {
    evaluated += !nlohmann::json::parse(line).contains("refused");
  }
  ASSERT_GT(evaluated, 0u);
  const Result dom = Dom(page);
  ASSERT_EQ(dom.exit_code, 0) << dom;
  ExpectNoConsoleErrors(dom.err);
  for (const char* id : {"id=\"ranked\"", "id=\"scatter\"", "id=\"step-bars\"",
                         "id=\"memory-bars\"", "id=\"links-1\""}) {
    EXPECT_NE(dom.out.find(id), std::string::npos) << id;
  }
  // One circle per evaluated plan; four ranked rows of bars; a bar per link the best used.
  EXPECT_EQ(Count(dom.out, "<circle"), evaluated);
  EXPECT_EQ(Count(dom.out, "class=\"capacity\""), 4u + 1u);  // Memory bars and the scatter.
  EXPECT_GE(Count(dom.out, "class=\"step-part\""), 4u);
  EXPECT_GT(Count(dom.out, "class=\"link\""), 0u);
  // The ranked table (header and four rows) and the links table (header and a row per group).
  EXPECT_EQ(Count(dom.out, "<tr>"), 1u + 4u + 1u + Count(dom.out, "<tr><td>ICI"));
}

// A serving search's page: the ranked table with TTFT and TPOT, a circle per evaluated plan
// (generation time against peak), each top plan's generation split into prefill and decode
// parts, and memory bars of weights, KV cache and activations.
TEST_F(HtmlReportTest, ServingPlanReportRendersInChromium) {
  if (!fs::exists(kChromium)) GTEST_SKIP() << "chromium is not installed";
  const std::string file = WriteInput(
      "serve.yaml",
      "hardware: {preset: tpu-v5e, shape: [4, 2]}\n"
      "model: {kind: transformer, layers: 4, d_model: 64, d_ff: 128, heads: 8, kv_heads: 2,\n"
      "        vocab: 128}\n"
      "serve: {batch: 8, prompt_len: 16, decode_len: 8}\n"
      "search: {axes: [data, tensor], objective: tpot}\n");
  const std::string page = (out() / "serve.html").string();
  const std::string results = (out() / "r.jsonl").string();
  RunOk({"plan", file, "--report", page, "--out", results, "--top", "2"});
  size_t evaluated = 0;
  std::istringstream in(ReadFile(results));
  for (std::string line; std::getline(in, line);) {
    evaluated += !nlohmann::json::parse(line).contains("refused");
  }
  ASSERT_EQ(evaluated, 2u);  // data 8, and data 4 x tensor 2 (2 kv heads: tensor 2 at most).
  const std::string html = ReadFile(page);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("<th>TPOT</th>"), std::string::npos);
  const Result dom = Dom(page);
  ASSERT_EQ(dom.exit_code, 0) << dom;
  ExpectNoConsoleErrors(dom.err);
  for (const char* id :
       {"id=\"ranked\"", "id=\"scatter\"", "id=\"step-bars\"", "id=\"memory-bars\""}) {
    EXPECT_NE(dom.out.find(id), std::string::npos) << id;
  }
  EXPECT_EQ(Count(dom.out, "<circle"), evaluated);
  EXPECT_EQ(Count(dom.out, "class=\"capacity\""), 2u + 1u);  // Memory bars and the scatter.
  // Each plan's prefill and decode compute at least; weights and KV cache at least.
  EXPECT_GE(Count(dom.out, "class=\"step-part\""), 2u * 2u);
  EXPECT_GE(Count(dom.out, "class=\"memory-part\""), 2u * 2u);
  EXPECT_EQ(Count(dom.out, "<tr>"), 1u + 2u);
}

TEST_F(HtmlReportTest, CompareReportRendersInChromium) {
  if (!fs::exists(kChromium)) GTEST_SKIP() << "chromium is not installed";
  const std::string a = WriteInput(
      "a.yaml", TinyModel("plan: {mesh: {fsdp: 8}, rules: {batch: fsdp, embed: fsdp}}\n"));
  const std::string b = WriteInput(
      "b.yaml", TinyModel("plan: {mesh: {data: 4, tensor: 2}, rules: {batch: data, heads: "
                          "tensor, kv_heads: tensor, mlp: tensor, vocab: tensor}}\n"));
  const std::string page = (out() / "compare.html").string();
  const Result r = RunOk({"compare", a, b, "--report", page});
  const Result dom = Dom(page);
  ASSERT_EQ(dom.exit_code, 0) << dom;
  ExpectNoConsoleErrors(dom.err);
  for (const char* id : {"id=\"side-by-side\"", "id=\"reasons\"", "id=\"step-bars\"",
                         "id=\"memory-bars\"", "id=\"links-A\"", "id=\"links-B\""}) {
    EXPECT_NE(dom.out.find(id), std::string::npos) << id;
  }
  // The reasons printed on stdout are the page's list items.
  std::istringstream in(r.out);
  size_t sentences = 0;
  for (std::string line; std::getline(in, line);) sentences += line.starts_with("- ");
  EXPECT_EQ(Count(dom.out, "<li>"), sentences);
  EXPECT_EQ(Count(dom.out, "class=\"capacity\""), 2u);
}

}  // namespace
}  // namespace shardsim::cli_test
