"""std::mt19937_64 in Python (the C++ GRPO example draws its prompts with it; the Python training side must draw
the same ones): the 64-bit Mersenne Twister with the C++ standard's parameters and seeding."""
_MASK = (1 << 64) - 1
_N, _M = 312, 156
_UPPER, _LOWER = _MASK & ~((1 << 31) - 1), (1 << 31) - 1
_A = 0xB5026F5AA96619E9


class Mt19937_64:
    def __init__(self, seed=5489):
        self.mt = [seed & _MASK]
        for i in range(1, _N):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & _MASK)
        self.index = _N

    def _twist(self):
        mt = self.mt
        for i in range(_N):
            x = (mt[i] & _UPPER) | (mt[(i + 1) % _N] & _LOWER)
            mt[i] = mt[(i + _M) % _N] ^ (x >> 1) ^ (_A if x & 1 else 0)
        self.index = 0

    def __call__(self):
        if self.index >= _N:
            self._twist()
        x = self.mt[self.index]
        self.index += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        x ^= x >> 43
        return x & _MASK
