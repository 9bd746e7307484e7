// The GRPO example's verifiable task: reverse a string of digits. A prompt is "3141=" (bytes); the
// answer "1413\n". The reward of a completion is dense: the fraction of the answer's digit
// positions it gets right (its first kDigits tokens against the reversed digits), so a policy
// that has learned the format but not the task scores about 0.1, and a solved task 1.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace grpo {

constexpr int kDigits = 4;
constexpr int64_t kEquals = '=', kNewline = '\n';

inline std::vector<int64_t> random_prompt(std::mt19937_64& rng) {
  std::vector<int64_t> p;
  for (int i = 0; i < kDigits; ++i) p.push_back('0' + int64_t(rng() % 10));
  p.push_back(kEquals);
  return p;
}

inline std::vector<int64_t> answer(const std::vector<int64_t>& prompt) {
  std::vector<int64_t> a(prompt.rbegin() + 1, prompt.rend());  // the digits, reversed ('=' last in prompt)
  a.push_back(kNewline);
  return a;
}

inline double reward(const std::vector<int64_t>& prompt, const std::vector<int64_t>& completion) {
  const auto want = answer(prompt);
  int right = 0;
  for (int i = 0; i < kDigits; ++i) right += i < int(completion.size()) && completion[size_t(i)] == want[size_t(i)];
  return double(right) / kDigits;
}

}  // namespace grpo
