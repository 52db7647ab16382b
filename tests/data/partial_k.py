#!/usr/bin/env python3
"""partial_k.py - writes partial_k.txt, the golden table of pRMSNorm's k that
tests/test_partial.c checks rmsnorm_partial_count against.

The definition (include/rmsnorm.h): k is the smallest integer in [1, d] whose
quotient k/d, rounded to the nearest double, is >= p. Computed here with
exact rationals (fractions.Fraction) and Python's correctly rounded
float(Fraction), independently of the library's fma-based computation. The
script also checks the promise the definition exists for: whenever the
shortest decimal that reads back as p (Python's repr) times d is an integer
K, k == K.

Each line: p as a C hex float, repr(p), d, k.
Run: python3 tests/data/partial_k.py > tests/data/partial_k.txt
"""
import math
import random
from fractions import Fraction


def k_of(p: float, d: int) -> int:
    """The smallest k in [1, d] with float(k/d) >= p, exactly."""
    c = math.ceil(Fraction(p) * d)  # ceil of the exact binary value times d
    while c > 1 and float(Fraction(c - 1, d)) >= p:
        c -= 1
    return max(1, min(d, c))


def check(p: float, d: int) -> int:
    k = k_of(p, d)
    exact = Fraction(repr(p)) * d
    if exact.denominator == 1 and 1 <= exact <= d:
        assert k == exact, (p, d, k, exact)
    return k


def main() -> None:
    rng = random.Random(20240610)
    cases = []
    # the grid (two-digit decimals, d 10..4096): the pairs where a
    # ceiling of the double product is off, plus a sample of the rest
    for nn in range(1, 100):
        p = float(f"0.{nn:02d}")
        for d in range(10, 4097):
            naive = math.ceil(p * d)
            if naive != math.ceil(Fraction(nn, 100) * d) or rng.random() < 0.002:
                cases.append((p, d))
    # decimals of 1..17 significant digits, d up to 2^40
    for _ in range(1500):
        digits = rng.randint(1, 17)
        scale = rng.randint(digits, digits + 4)
        p = float(Fraction(rng.randint(1, 10**digits - 1), 10**scale))
        if not 0 < p <= 1:
            continue
        d = rng.choice([rng.randint(1, 100), rng.randint(1, 10**6), rng.randint(1, 2**40)])
        cases.append((p, d))
    # quotients K/d computed in double, and their neighbours
    for _ in range(700):
        d = rng.choice([rng.randint(1, 64), rng.randint(1, 10**5), rng.randint(1, 2**36)])
        K = rng.randint(1, d)
        q = K / d
        cases.append((q, d))
        if q < 1:
            cases.append((math.nextafter(q, 2.0), d))
        cases.append((math.nextafter(q, 0.0), d))
    # fractions whose shortest decimal lies above K/d (5/6 = 0.8333333333333334)
    for den in range(2, 30):
        for num in range(1, den):
            p = num / den
            for m in (1, 7):
                cases.append((p, den * m))
    # the extremes
    cases += [(1.0, 1), (1.0, 4096), (5e-324, 1), (5e-324, 10**6), (1e-300, 2**40),
              (math.nextafter(1.0, 0.0), 2**40), (0.5, 1), (0.5, 3)]
    for p, d in cases:
        print(f"{p.hex()} {p!r} {d} {check(p, d)}")


if __name__ == "__main__":
    main()
