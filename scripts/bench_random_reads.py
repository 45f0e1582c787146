"""Random chunk reads for the benchmark: open, read, close of COUNT random chunk files among the
TOTAL files DIR/a/c/0 .. DIR/a/c/<TOTAL-1>, from THREADS threads (the same seeded sequence for
every file system; no directory listing, so only the reads are measured).

    python3 scripts/bench_random_reads.py DIR COUNT THREADS TOTAL
"""

import os
import random
import sys
from concurrent.futures import ThreadPoolExecutor


def main():
    root, count, threads, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    chunks = os.path.join(root, "a", "c")
    rng = random.Random(42)
    picks = [os.path.join(chunks, str(rng.randrange(total))) for _ in range(count)]

    def read(paths):
        total = 0
        for path in paths:
            with open(path, "rb") as f:
                total += len(f.read())
        return total

    share = [picks[i::threads] for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(read, share))
    if total == 0:
        sys.exit("read nothing")


if __name__ == "__main__":
    main()
