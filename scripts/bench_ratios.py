"""Print the performance ratios of a pytest-benchmark JSON file (see benchmarks/test_casts.py).

    python scripts/bench_ratios.py bench.json

For each (pair, size): ours_out / copy (both into preallocated memory) and ours / peer (both
allocating their result), from medians measured in the same run.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> int:
    with open(path) as fh:
        data = json.load(fh)
    copy: dict[int, float] = {}
    rows: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    small = None
    for b in data["benchmarks"]:
        info = b["extra_info"]
        if info["kind"] == "copy":
            copy[info["n"]] = info["gbs"]
        elif info["kind"] == "small":
            small = b["stats"]["median"] * 1e6
        else:
            rows[(info["pair"], info["n"])][info["kind"]] = info["gbs"]
    print(f"{'pair':<26}{'n':>10}{'ours':>8}{'out=':>8}{'copy':>8}{'peer':>8}{'out=/copy':>11}{'ours/peer':>11}")
    for (pair, n), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if pair.startswith("mx "):
            continue
        c = copy.get(n, float("nan"))
        print(f"{pair:<26}{n:>10}{r.get('ours', 0):>8.1f}{r.get('ours_out', 0):>8.1f}{c:>8.1f}"
              f"{r.get('peer', 0):>8.2f}{r.get('ours_out', 0) / c:>10.2f}x"
              f"{r.get('ours', 0) / r.get('peer', float('nan')):>10.1f}x")
    mx = {key: r for key, r in rows.items() if key[0].startswith("mx ")}
    if mx:
        print(f"\n{'MX format':<26}{'n':>10}{'quant':>8}{'dequant':>9}{'fake':>8}{'peer':>8}"
              f"{'q/copy':>8}{'dq/copy':>9}{'fq/copy':>9}{'q/peer':>9}")
        for (pair, n), r in sorted(mx.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            c = copy.get(n, float("nan"))
            q, dq, fq, p = (r.get(k, float("nan")) for k in ("ours_quantize", "ours_dequantize",
                                                              "ours_fake_quantize", "peer"))
            print(f"{pair[3:]:<26}{n:>10}{q:>8.1f}{dq:>9.1f}{fq:>8.1f}{p:>8.2f}{q / c:>7.2f}x{dq / c:>8.2f}x"
                  f"{fq / c:>8.2f}x{q / p:>8.1f}x")
    if small is not None:
        print(f"16-element cast, whole call: {small:.1f} us median")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python scripts/bench_ratios.py BENCH.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
