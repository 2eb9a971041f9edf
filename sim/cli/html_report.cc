#include "sim/cli/html_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "planner/models/link_use.h"
#include "sim/time.h"
#include "sim/units.h"

namespace shardsim {
namespace {

// Text safe inside HTML.
std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

std::string Pct(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100 * v);
  return buf;
}

// The page around `body`.
std::string Page(const std::string& title, const std::string& body) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
         Escape(title) +
         "</title>\n<style>\n"
         "body{font-family:sans-serif;margin:2em;color:#222}\n"
         "table{border-collapse:collapse;margin:1em 0}\n"
         "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px}\n"
         "th{background:#f0f0f0}\n"
         "svg{display:block;margin:1em 0}\n"
         "svg text{font-size:11px;font-family:sans-serif}\n"
         ".summary{font-family:monospace;white-space:pre-wrap;font-size:12px}\n"
         "</style>\n</head>\n<body>\n<h1>" +
         Escape(title) + "</h1>\n" + body + "</body>\n</html>\n";
}

// The parts of a step's busiest device, in drawing order, with their colours.
struct Segment {
  const char* name;
  const char* colour;
};
constexpr Segment kSegments[] = {{"compute", "#4e79a7"},
                                 {"recompute", "#a0cbe8"},
                                 {"exposed comm", "#e15759"},
                                 {"bubble", "#f28e2b"},
                                 {"waiting", "#bab0ac"}};

// The values of kSegments for one step: compute without its recompute, recompute, exposed
// communication, bubble, the rest of the step.
std::vector<double> SegmentValues(const planner::TrainStepReport& r) {
  const double step = r.step_time.seconds();
  const double compute = r.compute.seconds() - r.recompute.seconds();
  const double rest =
      std::max(0.0, step - r.compute.seconds() - r.exposed_comm.seconds() - r.bubble.seconds());
  return {std::max(0.0, compute), r.recompute.seconds(), r.exposed_comm.seconds(),
          r.bubble.seconds(), rest};
}

std::string Legend(int x, int y) {
  std::string s;
  for (const Segment& seg : kSegments) {
    s += "<rect class=\"legend\" x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) +
         "\" width=\"10\" height=\"10\" fill=\"" + seg.colour + "\"/><text x=\"" +
         std::to_string(x + 14) + "\" y=\"" + std::to_string(y + 9) + "\">" + seg.name + "</text>";
    x += 110;
  }
  return s;
}

// A horizontal stacked bar per step: its step time split into kSegments.
std::string StepBars(const std::vector<ReportedStep>& steps) {
  double longest = 0;
  for (const ReportedStep& s : steps) longest = std::max(longest, s.report.step_time.seconds());
  const int label_w = 60, width = 640, row = 22;
  const int height = 30 + row * static_cast<int>(steps.size()) + 30;
  std::string svg = "<svg id=\"step-bars\" width=\"" + std::to_string(label_w + width + 120) +
                    "\" height=\"" + std::to_string(height) + "\">";
  svg += Legend(label_w, 5);
  for (size_t i = 0; i < steps.size(); ++i) {
    const int y = 25 + row * static_cast<int>(i);
    svg +=
        "<text x=\"0\" y=\"" + std::to_string(y + 14) + "\">" + Escape(steps[i].label) + "</text>";
    double x = label_w;
    const std::vector<double> values = SegmentValues(steps[i].report);
    for (size_t k = 0; k < values.size(); ++k) {
      const double w = longest > 0 ? width * values[k] / longest : 0;
      if (w <= 0) continue;
      svg += "<rect class=\"step-part\" x=\"" + Num(x) + "\" y=\"" + std::to_string(y) +
             "\" width=\"" + Num(w) + "\" height=\"16\" fill=\"" + kSegments[k].colour +
             "\"><title>" + Escape(steps[i].label) + " " + kSegments[k].name + ": " +
             FormatTime(Time::Picoseconds(static_cast<int64_t>(values[k] * 1e12))) +
             "</title></rect>";
      x += w;
    }
    svg += "<text x=\"" + Num(x + 4) + "\" y=\"" + std::to_string(y + 13) + "\">" +
           FormatTime(steps[i].report.step_time) + "</text>";
  }
  return svg + "</svg>\n";
}

// One bar of a memory chart: its label, the bytes of each part, the peak and the HBM.
struct MemoryRow {
  std::string label;
  std::vector<double> values;  // Bytes, in the chart's part order.
  Bytes peak, capacity;
  bool fits = true;
};

// A stacked bar per row, its parts in `parts` order with the HBM capacity marked; the legend
// entries sit `legend[k]` pixels apart.
std::string MemoryChart(const std::vector<Segment>& parts, const std::vector<int>& legend,
                        const std::vector<MemoryRow>& rows) {
  double most = 0;
  for (const MemoryRow& r : rows) {
    most = std::max(
        {most, static_cast<double>(r.peak.count()), static_cast<double>(r.capacity.count())});
  }
  const int label_w = 60, width = 640, row = 22;
  const int height = 30 + row * static_cast<int>(rows.size()) + 10;
  std::string svg = "<svg id=\"memory-bars\" width=\"" + std::to_string(label_w + width + 160) +
                    "\" height=\"" + std::to_string(height) + "\">";
  int lx = label_w;
  for (size_t k = 0; k < parts.size(); ++k) {
    svg += "<rect x=\"" + std::to_string(lx) + "\" y=\"5\" width=\"10\" height=\"10\" fill=\"" +
           parts[k].colour + "\"/><text x=\"" + std::to_string(lx + 14) + "\" y=\"14\">" +
           parts[k].name + "</text>";
    lx += legend[k];
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const MemoryRow& m = rows[i];
    const int y = 25 + row * static_cast<int>(i);
    svg += "<text x=\"0\" y=\"" + std::to_string(y + 14) + "\">" + Escape(m.label) + "</text>";
    double x = label_w;
    for (size_t k = 0; k < parts.size(); ++k) {
      const double w = most > 0 ? width * m.values[k] / most : 0;
      if (w <= 0) continue;
      svg += "<rect class=\"memory-part\" x=\"" + Num(x) + "\" y=\"" + std::to_string(y) +
             "\" width=\"" + Num(w) + "\" height=\"16\" fill=\"" + parts[k].colour + "\"><title>" +
             parts[k].name + ": " + FormatBytes(Bytes(static_cast<int64_t>(m.values[k]))) +
             "</title></rect>";
      x += w;
    }
    const double cap =
        most > 0 ? label_w + width * static_cast<double>(m.capacity.count()) / most : label_w;
    svg += "<line class=\"capacity\" x1=\"" + Num(cap) + "\" x2=\"" + Num(cap) + "\" y1=\"" +
           std::to_string(y - 2) + "\" y2=\"" + std::to_string(y + 18) +
           "\" stroke=\"#000\" stroke-width=\"2\"/>";
    svg += "<text x=\"" + Num(std::max(x, cap) + 6) + "\" y=\"" + std::to_string(y + 13) + "\">" +
           FormatBytes(m.peak) + " of " + FormatBytes(m.capacity) +
           (m.fits ? "" : " (does not fit)") + "</text>";
  }
  return svg + "</svg>\n";
}

// A bar per step: parameters, gradients, optimizer state and activations stacked, with the
// HBM capacity marked.
std::string MemoryBars(const std::vector<ReportedStep>& steps) {
  std::vector<MemoryRow> rows;
  for (const ReportedStep& s : steps) {
    const planner::StepMemory& m = s.report.memory;
    rows.push_back(
        {s.label,
         {static_cast<double>(m.params.count()), static_cast<double>(m.grads.count()),
          static_cast<double>(m.optimizer.count()), static_cast<double>(m.activations.count())},
         m.peak,
         m.capacity,
         m.fits});
  }
  return MemoryChart({{"params", "#59a14f"},
                      {"grads", "#8cd17d"},
                      {"optimizer", "#b6992d"},
                      {"activations and temporaries", "#f1ce63"}},
                     {90, 90, 90, 200}, rows);
}

// Step time against peak memory for every evaluated plan: filled when it fits, hollow when
// not; the capacity as a vertical line.
std::string Scatter(const planner::SearchResult& result, const std::string& what = "step time") {
  const int w = 640, h = 360, left = 70, bottom = 40;
  double max_t = 0, min_t = 0, max_m = 0, cap = 0;
  for (const planner::PlanResult& r : result.results) {
    if (!r.outcome.refused.empty()) continue;
    max_t = std::max(max_t, r.outcome.step_time.seconds());
    min_t =
        min_t == 0 ? r.outcome.step_time.seconds() : std::min(min_t, r.outcome.step_time.seconds());
    max_m = std::max(max_m, static_cast<double>(r.outcome.peak.count()));
    cap = static_cast<double>(r.outcome.capacity.count());
  }
  max_m = std::max(max_m, cap) * 1.05;
  // The time axis spans the plans' times (with a margin), not from zero: they differ by
  // percents.
  const double span = std::max(max_t - min_t, 0.01 * max_t);
  min_t = std::max(0.0, min_t - 0.05 * span);
  max_t += 0.05 * span;
  std::string svg = "<svg id=\"scatter\" width=\"" + std::to_string(w + left + 20) +
                    "\" height=\"" + std::to_string(h + bottom + 10) + "\">";
  svg += "<line x1=\"" + std::to_string(left) + "\" y1=\"" + std::to_string(h) + "\" x2=\"" +
         std::to_string(left + w) + "\" y2=\"" + std::to_string(h) + "\" stroke=\"#000\"/>";
  svg += "<line x1=\"" + std::to_string(left) + "\" y1=\"0\" x2=\"" + std::to_string(left) +
         "\" y2=\"" + std::to_string(h) + "\" stroke=\"#000\"/>";
  svg += "<text x=\"" + std::to_string(left + w / 2 - 60) + "\" y=\"" + std::to_string(h + 30) +
         "\">peak memory per device (max " + FormatBytes(Bytes(static_cast<int64_t>(max_m))) +
         ")</text>";
  svg += "<text x=\"0\" y=\"12\">" + what + "</text><text x=\"0\" y=\"26\">(max " +
         FormatTime(Time::Picoseconds(static_cast<int64_t>(max_t * 1e12))) +
         ")</text><text x=\"0\" y=\"" + std::to_string(h) + "\">" +
         FormatTime(Time::Picoseconds(static_cast<int64_t>(min_t * 1e12))) + "</text>";
  if (max_m > 0 && max_t > 0) {
    const double cx = left + w * cap / max_m;
    svg += "<line class=\"capacity\" x1=\"" + Num(cx) + "\" y1=\"0\" x2=\"" + Num(cx) + "\" y2=\"" +
           std::to_string(h) + "\" stroke=\"#999\" stroke-dasharray=\"4 3\"/><text x=\"" +
           Num(cx + 4) + "\" y=\"12\">HBM</text>";
    for (const planner::PlanResult& r : result.results) {
      if (!r.outcome.refused.empty()) continue;
      const double x = left + w * static_cast<double>(r.outcome.peak.count()) / max_m;
      const double y = h - h * (r.outcome.step_time.seconds() - min_t) / (max_t - min_t);
      svg += "<circle class=\"" + std::string(r.outcome.fits ? "fits" : "over") + "\" cx=\"" +
             Num(x) + "\" cy=\"" + Num(y) + "\" r=\"4\" " +
             (r.outcome.fits ? "fill=\"#4e79a7\"" : "fill=\"none\" stroke=\"#e15759\"") +
             "><title>" + Escape(r.key) + ": " + FormatTime(r.outcome.step_time) + ", " +
             FormatBytes(r.outcome.peak) + "</title></circle>";
    }
  }
  return svg + "</svg>\n";
}

// Per-link utilisation of one step: every link that carried bytes, busiest first, as a bar
// each (collective bytes / bandwidth over the step time), and a table of the links grouped by
// kind and torus dimension.
std::string LinkChart(const std::string& id, const planner::TrainStepReport& r,
                      const Topology& topology) {
  if (r.link_busy.empty() || r.step_time <= Time()) {
    return "<p>No per-link figures for this step.</p>\n";
  }
  const std::vector<std::pair<double, LinkId>> use = planner::LinkUtilisation(r);
  const int w = 640, h = 160, left = 40;
  std::string svg = "<svg id=\"" + id + "\" width=\"" + std::to_string(w + left + 20) +
                    "\" height=\"" + std::to_string(h + 30) + "\">";
  // One bar per link, or per run of links (busiest first) when there are more links than
  // pixels: the run's busiest, so the page stays small on a pod.
  const size_t per_bar = (use.size() + static_cast<size_t>(w) - 1) / static_cast<size_t>(w);
  const size_t bars = (use.size() + per_bar - 1) / per_bar;
  const double bar = static_cast<double>(w) / static_cast<double>(bars);
  const double top = std::max(1.0, use.front().first);
  for (size_t i = 0; i < bars; ++i) {
    const size_t first = i * per_bar;
    const size_t last = std::min(use.size(), first + per_bar) - 1;
    const double bh = h * use[first].first / top;
    std::string title;
    if (first == last) {
      const Link& l = topology.link(use[first].second);
      title = topology.node(l.src).name + " to " + topology.node(l.dst).name + " (" +
              LinkKindName(l.kind) + "): " + Pct(use[first].first);
    } else {
      title = "links " + std::to_string(first + 1) + "-" + std::to_string(last + 1) +
              " by use: " + Pct(use[last].first) + " to " + Pct(use[first].first);
    }
    svg += "<rect class=\"link\" x=\"" + Num(left + bar * static_cast<double>(i)) + "\" y=\"" +
           Num(h - bh) + "\" width=\"" + Num(std::max(bar, 0.5)) + "\" height=\"" + Num(bh) +
           "\" fill=\"#76b7b2\"><title>" + Escape(title) + "</title></rect>";
  }
  svg += "<line x1=\"" + std::to_string(left) + "\" y1=\"" + std::to_string(h) + "\" x2=\"" +
         std::to_string(left + w) + "\" y2=\"" + std::to_string(h) + "\" stroke=\"#000\"/>";
  svg += "<text x=\"0\" y=\"12\">" + Pct(top) + "</text><text x=\"" + std::to_string(left) +
         "\" y=\"" + std::to_string(h + 20) + "\">" + std::to_string(use.size()) +
         " directed links that carried collective bytes, busiest first (of " +
         std::to_string(topology.links().size()) + ")</text>";
  svg += "</svg>\n";
  if (r.pipeline_stages > 1) {
    // A pipelined step is composed from one stage's runs on its own devices.
    svg +=
        "<p>A pipeline: the busiest stage's use of its devices' links (every stage's devices "
        "link alike), with its sends between stages and its gradient all-reduce.</p>\n";
  }
  std::string table =
      "<table class=\"links\"><tr><th>links</th><th>used</th><th>mean "
      "utilisation</th><th>busiest</th></tr>";
  for (const planner::LinkGroupUse& g : planner::LinkGroups(r, topology)) {
    table += "<tr><td>" + Escape(g.name) + "</td><td>" + std::to_string(g.links) + "</td><td>" +
             Pct(g.mean) + "</td><td>" + Pct(g.busiest) + "</td></tr>";
  }
  return svg + table + "</table>\n";
}

// A stacked bar per serving plan: its generation (TTFT + (decode_len - 1) TPOT) split into
// the prefill, then the decode steps' compute, exposed communication and the rest.
std::string ServeBars(const std::vector<ReportedServe>& plans) {
  const Segment parts[] = {{"prefill", "#59a14f"},
                           {"decode compute", "#4e79a7"},
                           {"decode exposed comm", "#e15759"},
                           {"decode waiting", "#bab0ac"}};
  double longest = 0;
  for (const ReportedServe& p : plans) longest = std::max(longest, p.report.total.seconds());
  const int label_w = 60, width = 640, row = 22;
  const int height = 30 + row * static_cast<int>(plans.size()) + 10;
  std::string svg = "<svg id=\"step-bars\" width=\"" + std::to_string(label_w + width + 120) +
                    "\" height=\"" + std::to_string(height) + "\">";
  int lx = label_w;
  for (const Segment& p : parts) {
    svg += "<rect class=\"legend\" x=\"" + std::to_string(lx) +
           "\" y=\"5\" width=\"10\" height=\"10\" fill=\"" + p.colour + "\"/><text x=\"" +
           std::to_string(lx + 14) + "\" y=\"14\">" + p.name + "</text>";
    lx += 150;
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    const planner::ServeReport& r = plans[i].report;
    const double steps = static_cast<double>(std::max<int64_t>(plans[i].decode_len - 1, 0));
    const double tpot = r.tpot.seconds();
    const double compute = std::min(r.decode_compute.seconds(), tpot);
    const double comm = std::min(r.decode_exposed_comm.seconds(), tpot - compute);
    const double values[] = {r.ttft.seconds(), steps * compute, steps * comm,
                             steps * std::max(0.0, tpot - compute - comm)};
    const int y = 25 + row * static_cast<int>(i);
    svg +=
        "<text x=\"0\" y=\"" + std::to_string(y + 14) + "\">" + Escape(plans[i].label) + "</text>";
    double x = label_w;
    for (size_t k = 0; k < 4; ++k) {
      const double w = longest > 0 ? width * values[k] / longest : 0;
      if (w <= 0) continue;
      svg += "<rect class=\"step-part\" x=\"" + Num(x) + "\" y=\"" + std::to_string(y) +
             "\" width=\"" + Num(w) + "\" height=\"16\" fill=\"" + parts[k].colour + "\"><title>" +
             Escape(plans[i].label) + " " + parts[k].name + ": " +
             FormatTime(Time::Picoseconds(static_cast<int64_t>(values[k] * 1e12))) +
             "</title></rect>";
      x += w;
    }
    svg += "<text x=\"" + Num(x + 4) + "\" y=\"" + std::to_string(y + 13) + "\">" +
           FormatTime(r.total) + "</text>";
  }
  return svg + "</svg>\n";
}

// A bar per serving plan: weights, KV cache and activations stacked, HBM marked.
std::string ServeMemoryBars(const std::vector<ReportedServe>& plans) {
  std::vector<MemoryRow> rows;
  for (const ReportedServe& p : plans) {
    const planner::ServeMemory& m = p.report.memory;
    rows.push_back({p.label,
                    {static_cast<double>(m.params.count()), static_cast<double>(m.kv_cache.count()),
                     static_cast<double>(m.activations.count())},
                    m.peak,
                    m.capacity,
                    m.fits});
  }
  return MemoryChart(
      {{"weights", "#59a14f"}, {"KV cache", "#b07aa1"}, {"activations and temporaries", "#f1ce63"}},
      {110, 110, 110}, rows);
}

std::string Table(const std::vector<std::vector<std::string>>& rows, const std::string& id) {
  std::string t = "<table id=\"" + id + "\">";
  for (size_t i = 0; i < rows.size(); ++i) {
    t += "<tr>";
    for (const std::string& cell : rows[i]) {
      t += (i == 0 ? "<th>" : "<td>") + Escape(cell) + (i == 0 ? "</th>" : "</td>");
    }
    t += "</tr>";
  }
  return t + "</table>\n";
}

}  // namespace

std::string PlanReportHtml(const std::string& title, const std::vector<std::string>& summary,
                           const planner::SearchResult& result,
                           const std::vector<ReportedStep>& top, const Topology& topology) {
  std::string body = "<div class=\"summary\">";
  for (const std::string& line : summary) body += Escape(line) + "\n";
  body += "</div>\n<h2>Ranked plans</h2>\n";
  std::vector<std::vector<std::string>> rows = {
      {"rank", "plan", "step time", "MFU", "tokens/s/device", "peak / HBM"}};
  for (const ReportedStep& s : top) {
    char tok[32];
    std::snprintf(tok, sizeof(tok), "%.0f", s.report.tokens_per_s_per_device);
    rows.push_back(
        {s.label, s.plan, FormatTime(s.report.step_time), Pct(s.report.mfu), tok,
         FormatBytes(s.report.memory.peak) + " / " + FormatBytes(s.report.memory.capacity)});
  }
  body += Table(rows, "ranked");
  body += "<h2>Step time against peak memory, every evaluated plan</h2>\n" + Scatter(result);
  body += "<h2>Where each step goes (the busiest device)</h2>\n" + StepBars(top);
  body += "<h2>Memory per device</h2>\n" + MemoryBars(top);
  if (!top.empty()) {
    body += "<h2>Link utilisation of the best plan</h2>\n" +
            LinkChart("links-1", top.front().report, topology);
  }
  return Page(title, body);
}

std::string ServePlanReportHtml(const std::string& title, const std::vector<std::string>& summary,
                                const planner::SearchResult& result,
                                const std::vector<ReportedServe>& top) {
  std::string body = "<div class=\"summary\">";
  for (const std::string& line : summary) body += Escape(line) + "\n";
  body += "</div>\n<h2>Ranked plans</h2>\n";
  std::vector<std::vector<std::string>> rows = {
      {"rank", "plan", "TTFT", "TPOT", "generation", "tokens/s/device", "peak / HBM"}};
  for (const ReportedServe& s : top) {
    char tok[32];
    std::snprintf(tok, sizeof(tok), "%.0f", s.report.tokens_per_s_per_device);
    rows.push_back(
        {s.label, s.plan, FormatTime(s.report.ttft), FormatTime(s.report.tpot),
         FormatTime(s.report.total), tok,
         FormatBytes(s.report.memory.peak) + " / " + FormatBytes(s.report.memory.capacity)});
  }
  body += Table(rows, "ranked");
  body += "<h2>Generation time against peak memory, every evaluated plan</h2>\n" +
          Scatter(result, "generation");
  body += "<h2>Where each generation goes (the busiest device)</h2>\n" + ServeBars(top);
  body += "<h2>Memory per device</h2>\n" + ServeMemoryBars(top);
  body += "<p>Per-link utilisation is drawn for training steps only.</p>\n";
  return Page(title, body);
}

std::string CompareReportHtml(const std::string& title,
                              const std::vector<std::vector<std::string>>& table,
                              const std::vector<ReportedStep>& runs,
                              const std::vector<const Topology*>& topologies,
                              const std::vector<std::string>& reasons) {
  std::string body = Table(table, "side-by-side");
  body += "<h2>Why</h2>\n<ul id=\"reasons\">";
  for (const std::string& r : reasons) {
    // "why A is faster than B ..." heads the sentences that follow it.
    body += r.starts_with("why ") ? "</ul><p><b>" + Escape(r) + "</b></p><ul>"
                                  : "<li>" + Escape(r) + "</li>";
  }
  body += "</ul>\n<h2>Where each step goes (the busiest device)</h2>\n" + StepBars(runs);
  body += "<h2>Memory per device</h2>\n" + MemoryBars(runs);
  for (size_t i = 0; i < runs.size(); ++i) {
    body += "<h2>Link utilisation of " + Escape(runs[i].label) + "</h2>\n" +
            LinkChart("links-" + runs[i].label, runs[i].report, *topologies[i]);
  }
  return Page(title, body);
}

}  // namespace shardsim
