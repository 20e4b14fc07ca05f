"""Request targets drawn from a Zipf distribution, for the cache hit-ratio benchmark.

Usage: zipf_urls.py KEYS REQUESTS EXPONENT SEED BASE_URL > urls.txt
Prints REQUESTS lines BASE_URL/k/RANK?size=1k, RANK in 1..KEYS with P(RANK) ~ 1 / RANK**EXPONENT,
then on standard error the hit ratio an unbounded cache would reach (1 - distinct / requests).
"""
import bisect
import random
import sys


def main() -> None:
    keys, requests, exponent, seed, base = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        float(sys.argv[3]),
        int(sys.argv[4]),
        sys.argv[5].rstrip("/"),
    )
    cumulative = []
    total = 0.0
    for rank in range(1, keys + 1):
        total += rank ** -exponent
        cumulative.append(total)
    rng = random.Random(seed)
    seen = set()
    out = sys.stdout
    for _ in range(requests):
        rank = bisect.bisect_left(cumulative, rng.random() * total) + 1
        seen.add(rank)
        out.write(f"{base}/k/{rank}?size=1k\n")
    print(f"{1 - len(seen) / requests:.4f}", file=sys.stderr)


if __name__ == "__main__":
    main()
