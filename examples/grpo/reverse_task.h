// The GRPO example's verifiable task: reverse a string of `digits` digits (grpo --digits, 2..8,
// default 3). A prompt is "314=" (bytes); the answer "413\n". The reward of a completion is
// dense: the fraction of the answer's digit positions it gets right (its first `digits` tokens
// against the reversed digits), so a policy that has learned the format but not the task scores
// about 0.1, and a solved task 1. The length travels with the prompt: answer() and reward() read
// it from the prompt.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace grpo {

constexpr int kMinDigits = 2, kMaxDigits = 8;
constexpr int64_t kEquals = '=', kNewline = '\n';

inline std::vector<int64_t> random_prompt(std::mt19937_64& rng, int digits) {
  std::vector<int64_t> p;
  for (int i = 0; i < digits; ++i) p.push_back('0' + int64_t(rng() % 10));
  p.push_back(kEquals);
  return p;
}

// The number of digits of a prompt ('=' last).
inline int prompt_digits(const std::vector<int64_t>& prompt) { return int(prompt.size()) - 1; }

inline std::vector<int64_t> answer(const std::vector<int64_t>& prompt) {
  std::vector<int64_t> a(prompt.rbegin() + 1, prompt.rend());  // the digits, reversed ('=' last in prompt)
  a.push_back(kNewline);
  return a;
}

inline double reward(const std::vector<int64_t>& prompt, const std::vector<int64_t>& completion) {
  const auto want = answer(prompt);
  const int digits = prompt_digits(prompt);
  int right = 0;
  for (int i = 0; i < digits; ++i) right += i < int(completion.size()) && completion[size_t(i)] == want[size_t(i)];
  return double(right) / digits;
}

}  // namespace grpo
