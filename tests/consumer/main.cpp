// Uses the installed headers and library the way the README shows; exits non-zero on a wrong
// result so the test fails.
#include <cmath>
#include <cstdio>
#include <ditops/ditops.hpp>
#include <vector>

int main() {
  std::vector<float> x(2 * 8, 2.f), weight(8, 0.5f), out(x.size());
  ditops::rms_norm(ditops::view(x.data(), {2, 8}), ditops::view(weight.data(), {8}), 0.f,
                   ditops::view(out.data(), {2, 8}));
  // rms of a constant row is the constant: out = 2 / 2 * 0.5.
  for (float v : out) {
    if (std::fabs(v - 0.5f) > 1e-6f) return std::printf("rms_norm gave %g\n", v), 1;
  }
  std::vector<float> q(1 * 2 * 1 * 4, 1.f), cos(2 * 4, 0.f), sin(2 * 4, 1.f);
  ditops::rotary_position_embedding(
      ditops::view(q.data(), {1, 2, 1, 4}), ditops::view(cos.data(), {2, 4}),
      ditops::view(sin.data(), {2, 4}), ditops::view(q.data(), {1, 2, 1, 4}));
  // cos 0, sin 1: out = rot(x) = [-x2, -x3, x0, x1] = [-1, -1, 1, 1].
  if (q[0] != -1.f || q[2] != 1.f) return std::printf("rope gave %g %g\n", q[0], q[2]), 1;
  std::printf("consumer ok: isa %s, %d threads\n", ditops::cpu_info().isa.c_str(),
              ditops::num_threads());
  return 0;
}
