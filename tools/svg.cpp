// tools/svg.cpp — the SVG writer and the schedule drawings of `burstlab schedule --svg` (svg.hpp).
#include "svg.hpp"

#include <algorithm>
#include <cstdio>

#include "burstlab/error.hpp"
#include "table.hpp"  // format

namespace burstlab::tools {

std::string xml_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default: o += c;
    }
  }
  return o;
}

namespace {

std::string num(double v) { return format("%.1f", v); }

std::string attrs(const std::vector<std::pair<std::string, std::string>>& data) {
  std::string o;
  for (const auto& [k, v] : data) o += " data-" + k + "=\"" + xml_escape(v) + "\"";
  return o;
}

// Near white (0) to light blue (1): the shade of a cell by its share of the panel's largest pair
// count (light enough for the dark text and the red send marks on it).
std::string shade(double f) {
  f = std::clamp(f, 0.0, 1.0);
  const int r = static_cast<int>(247 - f * (247 - 140)), g = static_cast<int>(251 - f * (251 - 190)),
            b = static_cast<int>(255 - f * (255 - 230));
  return format("#%02x%02x%02x", r, g, b);
}

constexpr double kLeft = 70, kTop = 34, kCellW = 190, kLine = 13, kPad = 6, kHead = 36;
constexpr const char* kIdle = "#e4e4e4";
constexpr const char* kSend = "#b2182b";
// Wide enough for the title (monospace, 13 px: about 8 px a character) and at least 420.
double min_width(const std::string& title) { return std::max(420.0, 16 + 8.0 * title.size()); }

}  // namespace

Svg::Svg(double width, double height, const std::string& title) : width_(width), height_(height), title_(title) {}

void Svg::open_group(const std::string& cls, const std::vector<std::pair<std::string, std::string>>& data) {
  body_ << "<g class=\"" << xml_escape(cls) << "\"" << attrs(data) << ">\n";
  ++depth_;
}

void Svg::close_group() {
  if (depth_ == 0) fail("svg: close_group without an open group");
  body_ << "</g>\n";
  --depth_;
}

void Svg::rect(double x, double y, double w, double h, const std::string& fill, const std::string& cls,
               const std::vector<std::pair<std::string, std::string>>& data) {
  body_ << "<rect" << (cls.empty() ? "" : " class=\"" + xml_escape(cls) + "\"") << attrs(data) << " x=\"" << num(x)
        << "\" y=\"" << num(y) << "\" width=\"" << num(w) << "\" height=\"" << num(h) << "\" fill=\""
        << xml_escape(fill) << "\" stroke=\"#888\" stroke-width=\"0.6\"/>\n";
}

void Svg::text(double x, double y, const std::string& s, double size, const std::string& anchor,
               const std::string& fill, bool bold) {
  body_ << "<text x=\"" << num(x) << "\" y=\"" << num(y) << "\" font-size=\"" << num(size) << "\" text-anchor=\""
        << anchor << "\" fill=\"" << xml_escape(fill) << "\"" << (bold ? " font-weight=\"bold\"" : "") << ">"
        << xml_escape(s) << "</text>\n";
}

std::string Svg::str() const {
  if (depth_ != 0) fail("svg: ", depth_, " group(s) left open");
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(width_) << "\" height=\"" << num(height_)
    << "\" viewBox=\"0 0 " << num(width_) << " " << num(height_) << "\" font-family=\"monospace\">\n"
    << "<title>" << xml_escape(title_) << "</title>\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << num(width_) << "\" height=\"" << num(height_) << "\" fill=\"white\"/>\n"
    << body_.str() << "</svg>\n";
  return o.str();
}

namespace {

// Sends of one (rank, step), grouped as the text trace groups them: before / after the compute,
// the double ring's prefetched inter-node hop and the previous step's partial sums.
// "-> 1 K,V 512 B".
std::vector<std::string> send_marks(const dist::RankStep& st, const std::vector<dist::Item>& items,
                                    dist::ElemBytes eb) {
  std::vector<std::string> out;
  for (int pass : {3, 0, 2, 1}) {
    std::string names;
    int64_t bytes = 0;
    int peer = -1;
    for (const dist::Message& m : st.sends) {
      if (dist::message_pass(m, items[m.item]) != pass) continue;
      names += (names.empty() ? "" : ",") + m.tensor;
      bytes += m.elems * eb.of(items[m.item]);
      peer = m.peer;
    }
    if (!names.empty())
      out.push_back(std::string(pass == 1 ? "then " : pass == 2 ? "inter " : pass == 3 ? "sum " : "") + "-> " +
                    std::to_string(peer) + " " +
                    names + " " + std::to_string(bytes) + " B");
  }
  return out;
}

// The visible pairs a rank computes at one step.
int64_t pairs_of(const dist::RankStep& st) {
  int64_t n = 0;
  for (const dist::BlockTask& b : st.blocks) n += b.visible;
  return n;
}

}  // namespace

std::string schedule_svg(const std::string& title, const std::vector<RingPanel>& panels, const dist::Partition& qp,
                         const dist::Partition& kp, dist::ElemBytes eb) {
  if (panels.empty()) fail("svg: no schedule to draw");
  // Rows are as tall as the busiest cell: one line per block, one per send mark.
  std::vector<double> row_h;
  double width = 0, height = kTop;
  for (const RingPanel& pn : panels) {
    const dist::Schedule& s = *pn.schedule;
    const auto& items = dist::travelling_items(s.algo, s.phase);
    size_t lines = 1;
    for (int r = 0; r < s.G; ++r)
      for (const dist::RankStep& st : s.steps[r]) lines = std::max(lines, st.blocks.size() + send_marks(st, items, eb).size());
    row_h.push_back(lines * kLine + 2 * kPad);
    width = std::max(width, kLeft + kCellW * static_cast<double>(s.steps.empty() ? 0 : s.steps[0].size()) + 20);
    height += kHead + row_h.back() * s.G + 14;
  }
  Svg svg(std::max(width, min_width(title)), height, title);
  svg.text(8, 18, title, 13, "start", "#111", true);
  double y = kTop;
  for (size_t k = 0; k < panels.size(); ++k) {
    const dist::Schedule& s = *panels[k].schedule;
    const auto& items = dist::travelling_items(s.algo, s.phase);
    const int T = s.steps.empty() ? 0 : static_cast<int>(s.steps[0].size());
    int64_t most = 1;
    for (int r = 0; r < s.G; ++r)
      for (const dist::RankStep& st : s.steps[r]) most = std::max(most, pairs_of(st));
    svg.open_group("phase", {{"phase", dist::to_string(s.phase)}, {"algo", panels[k].label},
                             {"ranks", std::to_string(s.G)}, {"steps", std::to_string(T)}});
    std::string moving;
    for (const dist::Item& it : items) moving += (moving.empty() ? "" : ",") + std::string(it.name);
    svg.text(8, y + 14, panels[k].label + ": travelling " + moving + "; cell = blocks Q x K (visible pairs), then what is sent",
             11, "start", "#111", true);
    for (int t = 0; t < T; ++t) svg.text(kLeft + kCellW * (t + 0.5), y + 30, "step " + std::to_string(t), 11, "middle");
    const double y0 = y + kHead, h = row_h[k];
    for (int r = 0; r < s.G; ++r) {
      svg.open_group("rank", {{"rank", std::to_string(r)}});
      svg.text(8, y0 + h * r + h / 2 + 4, "rank " + std::to_string(r), 11);
      for (int t = 0; t < T; ++t) {
        const dist::RankStep& st = s.steps[r][t];
        const int64_t n = pairs_of(st);
        const double x = kLeft + kCellW * t, yc = y0 + h * r;
        svg.rect(x, yc, kCellW, h, st.blocks.empty() ? kIdle : shade(static_cast<double>(n) / most), "cell",
                 {{"rank", std::to_string(r)}, {"step", std::to_string(t)}, {"pairs", std::to_string(n)},
                  {"blocks", std::to_string(st.blocks.size())}});
        double ty = yc + kPad + 10;
        if (st.blocks.empty()) {
          svg.text(x + 5, ty, st.skipped.empty() ? "idle" : "idle (" + std::to_string(st.skipped.size()) + " masked)",
                   10, "start", "#666");
          ty += kLine;
        }
        for (const dist::BlockTask& b : st.blocks) {
          svg.text(x + 5, ty,
                   "Q" + dist::chunk_name(qp.chunks[b.q_chunk]) + "xK" + dist::chunk_name(kp.chunks[b.k_chunk]) + " (" +
                       std::to_string(b.visible) + ")",
                   10);
          ty += kLine;
        }
        for (const std::string& m : send_marks(st, items, eb)) {
          svg.text(x + 5, ty, m, 10, "start", kSend);
          ty += kLine;
        }
      }
      svg.close_group();
    }
    svg.close_group();
    y = y0 + h * s.G + 14;
  }
  return svg.str();
}

std::string distflash_svg(const std::string& title, const dist::FlashSchedule& fs,
                          const std::vector<std::vector<int64_t>>& pairs) {
  const int P = fs.P, T = fs.steps.empty() ? 0 : static_cast<int>(fs.steps[0].size());
  const double h = 3 * kLine + 2 * kPad;
  Svg svg(std::max(kLeft + kCellW * T + 20, min_width(title)), kTop + kHead + h * P + 30, title);
  svg.text(8, 18, title, 13, "start", "#111", true);
  int64_t most = 1;
  for (const auto& row : pairs)
    for (int64_t v : row) most = std::max(most, v);
  svg.open_group("phase", {{"phase", "forward"}, {"algo", "distflash"}, {"ranks", std::to_string(P)},
                           {"steps", std::to_string(T)}});
  svg.text(8, kTop + 14, "distflash: owner (blue) computes Q[a] x K[b]; helper (green) computes another rank's block", 11,
           "start", "#111", true);
  for (int t = 0; t < T; ++t) svg.text(kLeft + kCellW * (t + 0.5), kTop + 30, "step " + std::to_string(t), 11, "middle");
  const double y0 = kTop + kHead;
  int idle = 0;
  for (int r = 0; r < P; ++r) {
    svg.open_group("rank", {{"rank", std::to_string(r)}});
    svg.text(8, y0 + h * r + h / 2 + 4, "rank " + std::to_string(r), 11);
    for (int t = 0; t < T; ++t) {
      const dist::FlashStep& st = fs.steps[r][t];
      const double x = kLeft + kCellW * t, yc = y0 + h * r;
      const int64_t n = st.role == dist::FlashRole::Idle ? 0 : pairs.at(st.q).at(st.k);
      const char* role = st.role == dist::FlashRole::Idle ? "idle" : st.role == dist::FlashRole::Owner ? "owner" : "helper";
      std::string fill = kIdle;
      if (st.role == dist::FlashRole::Owner) fill = shade(static_cast<double>(n) / most);
      if (st.role == dist::FlashRole::Helper) fill = "#c7e9c0";
      idle += st.role == dist::FlashRole::Idle;
      svg.rect(x, yc, kCellW, h, fill, "cell",
               {{"rank", std::to_string(r)}, {"step", std::to_string(t)}, {"pairs", std::to_string(n)}, {"role", role}});
      double ty = yc + kPad + 10;
      if (st.role == dist::FlashRole::Idle) {
        svg.text(x + 5, ty, "idle", 10, "start", "#666");
      } else {
        svg.text(x + 5, ty, std::string(role) + " Q[" + std::to_string(st.q) + "] x K[" + std::to_string(st.k) + "] (" +
                                std::to_string(n) + ")", 10);
      }
      ty += kLine;
      if (st.kv_dst >= 0) {
        svg.text(x + 5, ty, "-> " + std::to_string(st.kv_dst) + " K,V", 10, "start", kSend);
        ty += kLine;
      }
      if (st.q_dst >= 0) svg.text(x + 5, ty, "-> " + std::to_string(st.q_dst) + " Q", 10, "start", kSend);
    }
    svg.close_group();
  }
  svg.close_group();
  svg.text(8, y0 + h * P + 18,
           format("idle slots %d of %d; idle fraction (eq. 7.24, over P^2) %.4f", idle, P * T,
                  dist::distflash_idle_fraction(fs)),
           11);
  return svg.str();
}

}  // namespace burstlab::tools
