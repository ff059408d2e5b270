#pragma once
// The training progress display: on a terminal, one line rewritten in place with '\r'
// (step/total, loss, tokens/s, ETA); otherwise plain lines every `total / 10` steps.
#include <chrono>
#include <cstdint>
#include <string>

namespace kiln::tool {

class Progress {
 public:
  // `tty`: whether stdout is a terminal (see stdout_is_tty()); `start_step`: the steps done
  // before this process began (a resumed run), left out of the rate and the ETA.
  Progress(int64_t total_steps, int64_t tokens_per_step, bool tty, int64_t start_step = 0);
  // Reports that step `step` (1-based) finished with training loss `loss`.
  void update(int64_t step, double loss);
  // Prints a whole line (an eval result), clearing the in-place line first.
  void print_line(const std::string& line);
  // Ends the in-place line.
  void finish();
  double elapsed_s() const;
  double tokens_per_s() const;

 private:
  std::string status(int64_t step, double loss) const;

  int64_t total_, tokens_per_step_, start_step_, step_, every_;
  bool tty_, dirty_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

bool stdout_is_tty();

}  // namespace kiln::tool
