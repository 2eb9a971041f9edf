// `shardsim plan` (SPEC "Searching plans"): the ranked table, --out lines and --json, a
// search killed mid-way resumes from its --out file without re-evaluating and ends with the
// same file and ranking as an uninterrupted one, results equal for any --jobs, and located
// errors for what the file gets wrong or asks for that is not built.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/cli/subprocess.h"

namespace shardsim::cli_test {
namespace {

class PlanCommandTest : public CliFixture {
 protected:
  // The tiny transformer on 8 v5e chips: data x fsdp x tensor, every remat, 1 or 2
  // microbatches, a memory limit some plans exceed; `extra` appended.
  std::string Tiny(const std::string& extra = "") const {
    return WriteInput("tiny.yaml",
                      "hardware: {preset: tpu-v5e, shape: [4, 2]}\n"
                      "model: {kind: transformer, layers: 4, d_model: 64, d_ff: 128, heads: 8,\n"
                      "        kv_heads: 2, vocab: 128}\n"
                      "train: {global_batch: 16, seq_len: 16, optimizer: adam, dtype: f32,\n"
                      "        param_dtype: f32}\n"
                      "search:\n"
                      "  axes: [data, fsdp, tensor]\n"
                      "  microbatches: [1, 2]\n"
                      "  memory_limit: 0.0001\n" +
                          extra);
  }

  // The count on a search's "candidates:" line.
  static int64_t Candidates(const std::string& out) {
    const size_t at = out.find("candidates:");
    return std::stoll(out.substr(at + 11));
  }

  static std::vector<std::string> Lines(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
};

TEST_F(PlanCommandTest, PrintsTheRankedTableAndWritesResults) {
  const std::string file = Tiny();
  const std::string results_path = (out() / "r.jsonl").string();
  const std::string json = (out() / "ranked.json").string();
  const Result r = RunOk({"plan", file, "--out", results_path, "--json", json, "--top", "3"});
  for (const char* text : {"candidates:     60 (", "dominated", "simulated", "rank  mesh",
                           "step time", "MFU", "peak / HBM", "dominated by"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << text << "\n" << r.out;
  }
  // --top 3: three ranked rows after the header.
  const std::vector<std::string> lines = Lines(r.out);
  size_t header = 0;
  while (header < lines.size() && !lines[header].starts_with("rank")) ++header;
  ASSERT_LT(header, lines.size()) << r.out;
  EXPECT_EQ(lines.size() - header - 1, 3u) << r.out;
  EXPECT_TRUE(lines[header + 1].starts_with("1 ")) << r.out;
  // --out: one line per evaluated plan, each with SPEC's fields.
  const std::vector<std::string> results = Lines(ReadFile(results_path));
  ASSERT_FALSE(results.empty());
  int fitting = 0;
  for (const std::string& line : results) {
    const nlohmann::json j = nlohmann::json::parse(line);
    for (const char* key : {"plan", "key", "step_time_s", "mfu", "peak_bytes", "fits"}) {
      EXPECT_TRUE(j.contains(key)) << key << " in " << line;
    }
    for (const char* key : {"mesh", "rules", "remat", "microbatches"}) {
      EXPECT_TRUE(j["plan"].contains(key)) << key << " in " << line;
    }
    fitting += j["fits"].get<bool>();
  }
  // --json: the fitting plans, best first.
  const nlohmann::json ranked = nlohmann::json::parse(ReadFile(json));
  ASSERT_EQ(ranked.size(), static_cast<size_t>(fitting));
  for (size_t k = 1; k < ranked.size(); ++k) {
    EXPECT_LE(ranked[k - 1]["step_time_s"].get<double>(), ranked[k]["step_time_s"].get<double>());
  }
}

TEST_F(PlanCommandTest, ResultsDoNotDependOnJobs) {
  const std::string file = Tiny();
  const std::string a = (out() / "a.json").string(), b = (out() / "b.json").string();
  const std::string oa = (out() / "a.jsonl").string(), ob = (out() / "b.jsonl").string();
  RunOk({"plan", file, "--jobs", "1", "--json", a, "--out", oa});
  RunOk({"plan", file, "--jobs", "2", "--json", b, "--out", ob});
  EXPECT_EQ(ReadFile(a), ReadFile(b));
  EXPECT_EQ(ReadFile(oa), ReadFile(ob));
}

TEST_F(PlanCommandTest, CacheKeepsSimulationsForLaterRuns) {
  const std::string file = Tiny();
  const std::string cache = (out() / "cache").string();
  const std::string a = (out() / "a.json").string(), b = (out() / "b.json").string();
  const std::string c = (out() / "c.json").string();
  RunOk({"plan", file, "--json", a});
  RunOk({"plan", file, "--json", b, "--cache", cache});
  // The first run with the cache wrote its collectives' timings, in one folder for this build;
  // the second reads them.
  size_t folders = 0, entries = 0;
  for (const auto& e : fs::recursive_directory_iterator(cache)) {
    if (e.is_directory()) {
      ++folders;
      continue;
    }
    EXPECT_EQ(e.path().extension(), ".timing") << e.path();
    ++entries;
  }
  EXPECT_EQ(folders, 1u);
  EXPECT_GT(entries, 0u);
  RunOk({"plan", file, "--json", c, "--cache", cache, "--jobs", "2"});
  EXPECT_EQ(ReadFile(a), ReadFile(b));
  EXPECT_EQ(ReadFile(a), ReadFile(c));
  // A cache that is a file, not a directory.
  const std::string not_dir = WriteInput("not_a_dir", "x");
  const Result r = Run({"plan", file, "--cache", not_dir});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_NE(r.err.find("--cache: cannot use " + not_dir), std::string::npos) << r;
  EXPECT_EQ(r.out, "") << r;
}

TEST_F(PlanCommandTest, ResumesACutFileWithoutReevaluating) {
  const std::string file = Tiny();
  const std::string whole = (out() / "whole.jsonl").string();
  const std::string cut = (out() / "cut.jsonl").string();
  RunOk({"plan", file, "--out", whole});
  const std::vector<std::string> lines = Lines(ReadFile(whole));
  ASSERT_GT(lines.size(), 4u);
  // Three whole lines and half of the fourth: what a kill during a write leaves.
  WriteFile(cut, lines[0] + "\n" + lines[1] + "\n" + lines[2] + "\n" +
                     lines[3].substr(0, lines[3].size() / 2));
  const Result r = RunOk({"plan", file, "--out", cut});
  EXPECT_NE(r.out.find(std::to_string(lines.size() - 3) + " simulated, 3 resumed"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(ReadFile(cut), ReadFile(whole));
}

// Each --out line records the schedule its step ran (TrainStepOptions::within_memory); a
// line naming no schedule this version knows is refused with the file's line, not guessed.
TEST_F(PlanCommandTest, ResumeLinesNameTheirSchedule) {
  const std::string file = Tiny();
  const std::string results = (out() / "r.jsonl").string();
  RunOk({"plan", file, "--out", results});
  std::vector<std::string> lines = Lines(ReadFile(results));
  ASSERT_FALSE(lines.empty());
  for (const std::string& line : lines) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("refused")) continue;
    const std::string schedule = j.at("schedule").get<std::string>();
    EXPECT_TRUE(schedule == "prefetch" || schedule == "no_prefetch" || schedule == "program_order")
        << line;
  }
  nlohmann::json first = nlohmann::json::parse(lines[0]);
  ASSERT_FALSE(first.contains("refused"));
  first["schedule"] = "sideways";
  lines[0] = first.dump();
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  WriteFile(results, text);
  const Result r = Run({"plan", file, "--out", results});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("unknown schedule \"sideways\""), std::string::npos) << r;
}

TEST_F(PlanCommandTest, ResumesAKilledSearch) {
  // A larger space (more layers, a 4 x 4 slice), killed once two results are written.
  const std::string file = WriteInput(
      "big.yaml",
      "hardware: {preset: tpu-v5e, shape: [4, 4]}\n"
      "model: {kind: transformer, layers: 8, d_model: 256, d_ff: 512, heads: 16, kv_heads: 4,\n"
      "        vocab: 512}\n"
      "train: {global_batch: 64, seq_len: 64, optimizer: adam, dtype: bf16, param_dtype: f32}\n"
      "search: {axes: [data, fsdp, tensor], microbatches: [1, 2, 4], memory_limit: 0.002}\n");
  const std::string whole = (out() / "whole.jsonl").string();
  const std::string killed = (out() / "killed.jsonl").string();
  const Result full = RunOk({"plan", file, "--out", whole});
  const size_t total = Lines(ReadFile(whole)).size();
  ASSERT_GT(total, 4u);

  const pid_t pid = SpawnBinary(Binary(), {"plan", file, "--out", killed}, root_);
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (Lines(ReadFile(killed)).size() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  const size_t written = Lines(ReadFile(killed)).size();
  ASSERT_GE(written, 2u);
  ASSERT_LT(written, total);  // Killed before the end.

  const Result resumed = RunOk({"plan", file, "--out", killed});
  // What the killed run wrote in whole is not evaluated again; the file ends as the
  // uninterrupted run's, and so does the ranking.
  EXPECT_NE(resumed.out.find("resumed"), std::string::npos) << resumed.out;
  EXPECT_EQ(ReadFile(killed), ReadFile(whole));
  auto table = [](const std::string& out) { return out.substr(out.find("rank  mesh")); };
  EXPECT_EQ(table(resumed.out), table(full.out));
}

TEST_F(PlanCommandTest, MpiProcessesGiveTheSingleProcessResults) {
  const std::string mpirun = "/usr/bin/mpirun";
  if (!fs::exists(mpirun)) GTEST_SKIP() << "Open MPI's mpirun is not installed";
  const std::string file = Tiny();
  const Result probe = Run({"plan", file, "--mpi", "--budget", "1"});
  if (probe.err.find("built without MPI") != std::string::npos) {
    GTEST_SKIP() << "this shardsim was built without MPI";
  }
  // mpirun refuses to start as root unless told (CI containers run as root).
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  const std::string one = (out() / "one.jsonl").string(), two = (out() / "two.jsonl").string();
  const std::string one_json = (out() / "one.json").string();
  const std::string two_json = (out() / "two.json").string();
  RunOk({"plan", file, "--out", one, "--json", one_json});
  const Result r = RunBinary(mpirun,
                             {"-n", "2", "--oversubscribe", Binary(), "plan", file, "--mpi",
                              "--out", two, "--json", two_json},
                             root_);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("in each of 2 processes"), std::string::npos) << r;
  EXPECT_EQ(ReadFile(two), ReadFile(one));
  EXPECT_EQ(ReadFile(two_json), ReadFile(one_json));
  auto table = [](const std::string& out) { return out.substr(out.find("rank  mesh")); };
  EXPECT_EQ(table(r.out), table(RunOk({"plan", file}).out));
}

// An MPI search streams each process's outcomes to --out's part files (R.jsonl.part<rank>) as
// it goes, and rank 0 merges them into --out in one process's order at the end. What a killed
// MPI search left there (here: three outcomes and a torn fourth line in the part of a process
// 3 of a larger run) is resumed by the next search, with or without MPI: not simulated again,
// the final file the uninterrupted run's, and the parts removed.
TEST_F(PlanCommandTest, ResumesWhatMpiProcessesStreamed) {
  const std::string file = Tiny();
  const std::string whole = (out() / "whole.jsonl").string();
  RunOk({"plan", file, "--out", whole});
  const std::vector<std::string> lines = Lines(ReadFile(whole));
  ASSERT_GT(lines.size(), 4u);
  const std::string left =
      lines[0] + "\n" + lines[1] + "\n" + lines[2] + "\n" + lines[3].substr(0, lines[3].size() / 2);
  const std::string plain = (out() / "plain.jsonl").string();
  WriteFile(plain + ".part3", left);
  const Result r = RunOk({"plan", file, "--out", plain});
  EXPECT_NE(r.out.find(std::to_string(lines.size() - 3) + " simulated, 3 resumed"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(ReadFile(plain), ReadFile(whole));
  EXPECT_FALSE(fs::exists(plain + ".part3"));

  const std::string mpirun = "/usr/bin/mpirun";
  if (!fs::exists(mpirun)) GTEST_SKIP() << "Open MPI's mpirun is not installed";
  if (Run({"plan", file, "--mpi", "--budget", "1"}).err.find("built without MPI") !=
      std::string::npos) {
    GTEST_SKIP() << "this shardsim was built without MPI";
  }
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  const std::string spread = (out() / "spread.jsonl").string();
  WriteFile(spread + ".part3", left);
  const Result m = RunBinary(
      mpirun, {"-n", "2", "--oversubscribe", Binary(), "plan", file, "--mpi", "--out", spread},
      root_);
  ASSERT_EQ(m.exit_code, 0) << m;
  EXPECT_NE(m.out.find("3 resumed"), std::string::npos) << m.out;
  EXPECT_EQ(ReadFile(spread), ReadFile(whole));
  for (const char* part : {".part0", ".part1", ".part3"}) {
    EXPECT_FALSE(fs::exists(spread + part)) << part;
  }
}

// Every plan search example runs (its first few candidates: the whole searches take seconds
// to a minute; README lists their outcomes).
TEST_F(PlanCommandTest, EveryPlanExampleRuns) {
  const fs::path plans = SourceDir() + "/configs/plans";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(plans)) {
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 3u);
  for (const fs::path& file : files) {
    SCOPED_TRACE(file.string());
    const Result r = RunOk({"plan", file.string(), "--budget", "4", "--jobs", "2"});
    EXPECT_NE(r.out.find("candidates:"), std::string::npos) << r;
    EXPECT_TRUE(r.out.find("rank  mesh") != std::string::npos ||
                r.out.find("no plan fits") != std::string::npos ||
                r.out.find("no plan evaluated") != std::string::npos)
        << r;
  }
}

TEST_F(PlanCommandTest, SearchesServingPlans) {
  const std::string file = WriteInput(
      "serve.yaml",
      "hardware: {preset: tpu-v5e, shape: [4, 2]}\n"
      "model: {kind: transformer, layers: 4, d_model: 64, d_ff: 128, heads: 8, kv_heads: 2,\n"
      "        vocab: 128}\n"
      "serve: {batch: 8, prompt_len: 16, decode_len: 8}\n"
      "search: {axes: [data, tensor], objective: tpot}\n");
  const std::string json = (out() / "ranked.json").string();
  const Result r = RunOk({"plan", file, "--json", json});
  for (const char* text : {"TTFT", "TPOT", "generation", "objective:      tpot"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << text << "\n" << r.out;
  }
  const nlohmann::json ranked = nlohmann::json::parse(ReadFile(json));
  ASSERT_EQ(ranked.size(), 2u);
  EXPECT_LE(ranked[0]["tpot_s"].get<double>(), ranked[1]["tpot_s"].get<double>());
  const Result remat = Run({"plan", file, "--set", "search.remat=[none]"});
  EXPECT_EQ(remat.exit_code, 2) << remat;
  EXPECT_NE(remat.err.find("remat: applies to training steps, not to serve:"), std::string::npos)
      << remat;
}

TEST_F(PlanCommandTest, TimeLimitStopsStartingPlans) {
  // 1 ms: the workers stop taking candidates almost at once; what they did not take is
  // counted, and the run still ends with its summary.
  const Result r = RunOk({"plan", Tiny(), "--time-limit", "1ms", "--jobs", "2"});
  EXPECT_NE(r.out.find("beyond the budget"), std::string::npos) << r.out;
  const Result bad = Run({"plan", Tiny(), "--time-limit", "soon"});
  EXPECT_EQ(bad.exit_code, 2) << bad;
  EXPECT_TRUE(IsOneErrorLine(bad.err)) << bad;
}

// search.collective_matmul lists modes: each is a family of its own, so the candidates double,
// and the evaluated plans carry their mode (in --out and the ranked table).
TEST_F(PlanCommandTest, CollectiveMatmulModesAreSearched) {
  const Result plain = RunOk({"plan", Tiny()});
  const std::string results = (out() / "cm.jsonl").string();
  const Result both = RunOk({"plan", Tiny("  collective_matmul: [off, bidirectional]\n"), "--out",
                             results, "--top", "100"});
  EXPECT_EQ(Candidates(both.out), 2 * Candidates(plain.out)) << both.out;
  const std::string lines = ReadFile(results);
  EXPECT_NE(lines.find("\"collective_matmul\":\"bidirectional\""), std::string::npos);
  EXPECT_NE(both.out.find("(cm bidirectional)"), std::string::npos) << both.out;
}

// plan.algorithms may list candidates per collective kind: every combination is a family of
// its own (the "collective algorithms" in the space), named in the table.
TEST_F(PlanCommandTest, CollectiveAlgorithmsAreSearched) {
  const Result plain = RunOk({"plan", Tiny()});
  const std::string results = (out() / "alg.jsonl").string();
  const Result both = RunOk(
      {"plan",
       Tiny("plan: {algorithms: {all_reduce: [ring, bidirectional_ring], all_gather: ring}}\n"),
       "--out", results, "--top", "100"});
  EXPECT_EQ(Candidates(both.out), 2 * Candidates(plain.out)) << both.out;
  const std::string lines = ReadFile(results);
  EXPECT_NE(lines.find("\"all_reduce\":\"bidirectional_ring\""), std::string::npos);
  EXPECT_NE(lines.find("\"all_reduce\":\"ring\""), std::string::npos);
  EXPECT_NE(both.out.find("(all_gather ring) (all_reduce bidirectional_ring)"), std::string::npos)
      << both.out;
  // The report's plans are named with their algorithms too.
  const std::string report = (out() / "alg.html").string();
  RunOk({"plan",
         Tiny("plan: {algorithms: {all_reduce: [ring, bidirectional_ring], all_gather: ring}}\n"),
         "--report", report, "--top", "4"});
  const std::string html = ReadFile(report);
  EXPECT_NE(html.find("; all_gather ring; all_reduce bidirectional_ring"), std::string::npos);
  EXPECT_NE(html.find("; all_gather ring; all_reduce ring"), std::string::npos);
  // A set some collective cannot run is refused plan by plan, the reason in the summary.
  const Result nvls =
      RunOk({"plan", Tiny("plan: {algorithms: {all_reduce: [ring, nvls]}}\n"), "--top", "1"});
  EXPECT_NE(nvls.out.find("refused:        "), std::string::npos) << nvls.out;
  EXPECT_NE(nvls.out.find(" x psum: nvls needs an NVSwitch"), std::string::npos) << nvls.out;
}

// search.sequence_parallel: [off, on] tries every rule set that splits the heads once more
// with the sequence split over the same axes; meshes without a tensor axis are tried once.
TEST_F(PlanCommandTest, SequenceParallelismIsSearched) {
  const Result plain = RunOk({"plan", Tiny()});
  const Result both = RunOk({"plan", Tiny("  sequence_parallel: [off, on]\n"), "--top", "100"});
  EXPECT_GT(Candidates(both.out), Candidates(plain.out));
  EXPECT_LT(Candidates(both.out), 2 * Candidates(plain.out)) << "meshes without tensor twice";
  EXPECT_NE(both.out.find("length: tensor"), std::string::npos) << both.out;
  EXPECT_EQ(plain.out.find("length: tensor"), std::string::npos) << plain.out;
}

// search.activation_embed: [off, on] tries every rule set that splits the heads once more with
// the residual stream's d_model split over the same axes (MaxText's activation_embed); meshes
// without a tensor axis are tried once.
TEST_F(PlanCommandTest, ActivationEmbedIsSearched) {
  const Result plain = RunOk({"plan", Tiny()});
  const Result both = RunOk({"plan", Tiny("  activation_embed: [off, on]\n"), "--top", "100"});
  EXPECT_GT(Candidates(both.out), Candidates(plain.out));
  EXPECT_LT(Candidates(both.out), 2 * Candidates(plain.out)) << "meshes without tensor twice";
  EXPECT_NE(both.out.find("activation_embed: tensor"), std::string::npos) << both.out;
  EXPECT_EQ(plain.out.find("activation_embed"), std::string::npos) << plain.out;
}

// With sequence parallelism too, length takes the heads' axes before activation_embed (the
// residual stream is [batch, length, activation_embed]), so both on is the plan with sequence
// parallelism alone and is not tried again: the candidates are plain + SP's extra + ae's extra
// (60 + 36 + 36 = 132 here; 168 tried the 36 SP plans twice, identical step times and peaks).
TEST_F(PlanCommandTest, ActivationEmbedBesideSequenceParallelismIsNotTriedTwice) {
  const int64_t plain = Candidates(RunOk({"plan", Tiny()}).out);
  const int64_t sp = Candidates(RunOk({"plan", Tiny("  sequence_parallel: [off, on]\n")}).out);
  const int64_t ae = Candidates(RunOk({"plan", Tiny("  activation_embed: [off, on]\n")}).out);
  const int64_t both = Candidates(
      RunOk({"plan", Tiny("  sequence_parallel: [off, on]\n  activation_embed: [off, on]\n")}).out);
  EXPECT_GT(sp, plain);
  EXPECT_GT(ae, plain);
  EXPECT_EQ(both, plain + (sp - plain) + (ae - plain));
}

// search.offload lists sets of values to keep in host memory: each is a candidate beside every
// remat policy (three sets: three times the candidates), written in --out and the table;
// plan.offload pins one set.
TEST_F(PlanCommandTest, OffloadSetsAreSearched) {
  const Result plain = RunOk({"plan", Tiny()});
  const std::string results = (out() / "offload.jsonl").string();
  const Result sets = RunOk(
      {"plan", Tiny("  offload: [[], [decoder_layer_input], [decoder_layer_input, query_proj]]\n"),
       "--out", results, "--top", "100"});
  EXPECT_EQ(Candidates(sets.out), 3 * Candidates(plain.out)) << sets.out;
  EXPECT_NE(ReadFile(results).find("\"offload\":[\"decoder_layer_input\",\"query_proj\"]"),
            std::string::npos);
  EXPECT_NE(sets.out.find(", offload decoder_layer_input"), std::string::npos) << sets.out;
  const Result pinned = RunOk({"plan", Tiny("plan: {offload: [key_proj]}\n"), "--top", "100"});
  EXPECT_EQ(Candidates(pinned.out), Candidates(plain.out)) << pinned.out;
  EXPECT_NE(pinned.out.find(", offload key_proj"), std::string::npos) << pinned.out;
}

// plan.remat may pin a custom policy: every candidate takes it (a third of the default three
// policies' candidates), its results say what it saves as a run file would, and a search
// resumed from them evaluates nothing again.
TEST_F(PlanCommandTest, PinsACustomRemat) {
  const Result plain = RunOk({"plan", Tiny(), "--top", "100"});
  const std::string results = (out() / "custom.jsonl").string();
  const std::string file = Tiny("plan: {remat: {save: [query_proj, context]}}\n");
  const Result r = RunOk({"plan", file, "--out", results, "--top", "100"});
  EXPECT_EQ(3 * Candidates(r.out), Candidates(plain.out)) << r.out;
  const std::vector<std::string> lines = Lines(ReadFile(results));
  ASSERT_FALSE(lines.empty());
  for (const std::string& line : lines) {
    EXPECT_NE(line.find("\"remat\":{\"save\":[\"query_proj\",\"context\"]}"), std::string::npos)
        << line;
  }
  const Result again = RunOk({"plan", file, "--out", results});
  EXPECT_NE(again.out.find("0 simulated, " + std::to_string(lines.size()) + " resumed"),
            std::string::npos)
      << again.out;
}

TEST_F(PlanCommandTest, LocatedErrors) {
  struct Case {
    std::string extra;
    std::string message;
  };
  for (const Case& c : {
           Case{"  objective: ttft\n", "ranks serving plans"},
           Case{"  remat: [none, sometimes]\n", "(key search.remat.1)"},
           Case{"plan: {remat: [none, {save: [context]}]}\n",
                "a custom remat ({save: [...]}) is given alone"},
           Case{"plan: {remat: {save: [contexts]}}\n", "(key plan.remat.save.0)"},
           Case{"  offload: [[], [context]]\nplan: {remat: {save: [context]}}\n",
                "in host memory (key search.offload.1)"},
           Case{"  axis_orders: some\n", "(key search.axis_orders)"},
           Case{"  torus_orders: given\n", "(key search.torus_orders)"},
           Case{"  torus_orders: all\nplan: {torus_order: [0, 1]}\n",
                "give search.torus_orders or plan.torus_order, not both"},
           Case{"plan: {mesh: {fsdp: 8}}\n",
                "give search.axes (the search sizes them) or plan.mesh"},
           Case{"  collective_matmul: [off, windowed]\n", "(key search.collective_matmul.1)"},
           Case{"  collective_matmul: auto\nplan: {collective_matmul: off}\n",
                "give search.collective_matmul or plan.collective_matmul, not both"},
           Case{"plan: {pipeline: {schedule: [gpipe, 1f1b], virtual_stages: 2}}\n",
                "virtual_stages > 1 needs schedule: interleaved"},
           Case{"  offload: [[], [q_proj]]\n", "(key search.offload.1.0)"},
           Case{"  offload: []\n", "give at least one set of names to offload"},
           Case{"plan: {algorithms: {all_reduce: [ring, rings]}}\n",
                "(key plan.algorithms.all_reduce.1)"},
           Case{"plan: {algorithms: {all_reduce: [ring, ring]}}\n", "'ring' is named twice"},
           Case{"plan: {algorithms: {psum: [ring, direct, tree, double_tree, torus_2d, nvls, "
                "collnet], all_reduce: [ring, direct, tree, double_tree, torus_2d, nvls, collnet], "
                "all_gather: [ring, direct, tree, double_tree, torus_2d, nvls, collnet]}}\n",
                "make more than 256 combinations"},
           Case{"  offload: [[query_proj]]\nplan: {offload: [key_proj]}\n",
                "give search.offload or plan.offload, not both"},

       }) {
    const Result r = Run({"plan", Tiny(c.extra)});
    EXPECT_EQ(r.exit_code, 2) << r;
    EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.extra << r;
    EXPECT_EQ(r.out, "") << r;
  }
  // GPU presets have no host link to offload over.
  const Result gpu = Run(
      {"plan", Tiny("  offload: [[], [query_proj]]\n"), "--set", "hardware={preset: h100-dgx}"});
  EXPECT_EQ(gpu.exit_code, 2) << gpu;
  EXPECT_NE(gpu.err.find("set hardware.device.host_bandwidth (key search.offload)"),
            std::string::npos)
      << gpu;
  const Result limit = Run({"plan", Tiny(), "--set", "search.memory_limit=1.5"});
  EXPECT_EQ(limit.exit_code, 2) << limit;
  EXPECT_NE(limit.err.find("memory_limit is a fraction of HBM in (0, 1]"), std::string::npos)
      << limit;
  const std::string bad_axis = WriteInput(
      "axis.yaml",
      "hardware: {preset: tpu-v5e, shape: [4, 2]}\n"
      "model: {kind: transformer, layers: 4, d_model: 64, d_ff: 128, heads: 8, vocab: 128}\n"
      "train: {global_batch: 16, seq_len: 16}\n"
      "search: {axes: [data, model]}\n");
  const Result r = Run({"plan", bad_axis});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("axis.yaml:4:"), std::string::npos) << r;
  EXPECT_NE(r.err.find("'model' has no default role"), std::string::npos) << r;
  // shardsim run refuses a search file's search: section.
  const Result run = Run({"run", Tiny()});
  EXPECT_EQ(run.exit_code, 2) << run;
  EXPECT_NE(run.err.find("search: is read by shardsim plan"), std::string::npos) << run;
}

}  // namespace
}  // namespace shardsim::cli_test
