// tools/svg.hpp — a small self-contained SVG writer (no dependency) and the drawings of
// `burstlab schedule --svg FILE`: a distributed schedule as a grid, one row per rank, one column
// per step (spec §7.2, §7.12); each cell lists the blocks the rank computes at that step, shaded
// by visible pairs (idle cells grey), and marks what it sends (-> peer, tensors, bytes).
// The SVG is plain XML: every phase is a <g class="phase" data-phase=... data-ranks=G
// data-steps=T>, every rank a <g class="rank" data-rank=r> holding one <rect class="cell"
// data-rank=r data-step=t data-pairs=...> per step (tests/tools/check_svg.py parses it).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "distflash.hpp"
#include "partition.hpp"
#include "schedule.hpp"

namespace burstlab::tools {

// Text with &, <, >, ", ' escaped for XML content and attribute values.
std::string xml_escape(const std::string& s);

class Svg {
 public:
  Svg(double width, double height, const std::string& title);
  void open_group(const std::string& cls, const std::vector<std::pair<std::string, std::string>>& data = {});
  void close_group();
  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& cls = "",
            const std::vector<std::pair<std::string, std::string>>& data = {});
  // anchor: "start" | "middle" | "end"
  void text(double x, double y, const std::string& s, double size = 11, const std::string& anchor = "start",
            const std::string& fill = "#222", bool bold = false);
  std::string str() const;  // the document; throws Error if groups are left open

 private:
  std::ostringstream body_;
  double width_, height_;
  std::string title_;
  int depth_ = 0;
};

// One panel per schedule (e.g. forward then backward of one algorithm), stacked vertically.
// eb: element widths for the byte marks. title: the first line of the drawing.
struct RingPanel {
  const dist::Schedule* schedule;
  std::string label;  // "burst backward"
};
std::string schedule_svg(const std::string& title, const std::vector<RingPanel>& panels, const dist::Partition& qp,
                         const dist::Partition& kp, dist::ElemBytes eb);

// DistFlashAttn (spec §7.12): owner / helper / idle per (rank, step); pairs[a][b] = visible
// pairs of rank a's queries x rank b's keys.
std::string distflash_svg(const std::string& title, const dist::FlashSchedule& fs,
                          const std::vector<std::vector<int64_t>>& pairs);

}  // namespace burstlab::tools
