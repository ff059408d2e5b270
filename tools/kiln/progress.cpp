#include "tools/kiln/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace kiln::tool {

namespace {
std::string format_duration(double s) {
  auto t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? fmt::format("{}h{:02d}m", t / 3600, t / 60 % 60)
                   : fmt::format("{}m{:02d}s", t / 60, t % 60);
}
}  // namespace

bool stdout_is_tty() { return isatty(fileno(stdout)) == 1; }

Progress::Progress(int64_t total_steps, int64_t tokens_per_step, bool tty, int64_t start_step)
    : total_(total_steps),
      tokens_per_step_(tokens_per_step),
      start_step_(start_step),
      step_(start_step),
      every_(std::max<int64_t>(1, total_steps / 10)),
      tty_(tty),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

double Progress::tokens_per_s() const {
  double s = elapsed_s();
  return s > 0 ? static_cast<double>((step_ - start_step_) * tokens_per_step_) / s : 0.0;
}

std::string Progress::status(int64_t step, double loss) const {
  double s = elapsed_s();
  const int64_t done = step - start_step_;
  double eta = done > 0 ? s / static_cast<double>(done) * static_cast<double>(total_ - step) : 0;
  int width = static_cast<int>(fmt::formatted_size("{}", total_));
  return fmt::format("step {:>{}}/{}  loss {:.4f}  {:.0f} tok/s  ETA {}", step, width, total_, loss,
                     tokens_per_s(), format_duration(eta));
}

void Progress::update(int64_t step, double loss) {
  step_ = step;
  if (tty_) {
    // Redrawing costs a write per step; a few times a second is enough for the eye.
    auto now = std::chrono::steady_clock::now();
    if (step != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    fmt::print("\r\033[K{}", status(step, loss));
    dirty_ = true;
  } else if (step % every_ == 0 || step == total_) {
    fmt::print("{}\n", status(step, loss));
  }
  std::fflush(stdout);
}

void Progress::print_line(const std::string& line) {
  if (dirty_) fmt::print("\r\033[K");
  dirty_ = false;
  fmt::print("{}\n", line);
  std::fflush(stdout);
}

void Progress::finish() {
  if (dirty_) fmt::print("\n");
  dirty_ = false;
  std::fflush(stdout);
}

}  // namespace kiln::tool
