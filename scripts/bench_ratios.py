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
    fresh: dict[int, float] = {}
    for b in data["benchmarks"]:
        info = b["extra_info"]
        if info["kind"] == "copy":
            copy[info["n"]] = info["gbs"]
        elif info["kind"] == "copy_fresh":
            fresh[info["n"]] = info["gbs"]
        elif info["kind"] == "small":
            small = b["stats"]["median"] * 1e6
        else:
            rows[(info["pair"], info["n"])][info["kind"]] = info["gbs"]
    print(f"{'pair':<40}{'n':>10}{'ours':>8}{'out=':>8}{'copy':>8}{'peer':>8}{'out=/copy':>11}{'ours/peer':>11}")
    for (pair, n), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if pair.startswith("mx "):
            continue
        c = copy.get(n, float("nan"))
        print(
            f"{pair:<40}{n:>10}{r.get('ours', 0):>8.1f}{r.get('ours_out', 0):>8.1f}{c:>8.1f}"
            f"{r.get('peer', 0):>8.2f}{r.get('ours_out', 0) / c:>10.2f}x"
            f"{r.get('ours', 0) / r.get('peer', float('nan')):>10.1f}x"
        )
    mx = {key: r for key, r in rows.items() if key[0].startswith("mx ")}
    if mx:
        print(
            f"\nBlock formats: GB/s, and ratios to the copy baseline (out = into a reused array)\n"
            f"{'case':<18}{'n':>10}{'quant':>7}{'dequant':>8}{'fake':>7}{'peer':>7}"
            f"{'q/copy':>8}{'dq/copy':>8}{'dq out':>8}{'fq/copy':>8}{'fq out':>8}{'q/peer':>8}{'q/torchao':>10}"
        )
        for (pair, n), r in sorted(mx.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            c = copy.get(n, float("nan"))
            q, dq, dqo, fq, fqo, p, ta = (
                r.get(k, float("nan"))
                for k in (
                    "ours_quantize",
                    "ours_dequantize",
                    "ours_dequantize_out",
                    "ours_fake_quantize",
                    "ours_fake_quantize_out",
                    "peer",
                    "torchao",
                )
            )
            print(
                f"{pair[3:]:<18}{n:>10}{q:>7.1f}{dq:>8.1f}{fq:>7.1f}{p:>7.2f}{q / c:>7.2f}x{dq / c:>7.2f}x"
                f"{dqo / c:>7.2f}x{fq / c:>7.2f}x{fqo / c:>7.2f}x{q / p:>7.1f}x{q / ta:>9.1f}x"
            )
    for n, gbs in sorted(fresh.items()):
        print(f"copy into a fresh array (x.copy()), n={n}: {gbs:.1f} GB/s, {gbs / copy[n]:.2f}x the copy baseline")
    if small is not None:
        print(f"16-element cast, whole call: {small:.1f} us median")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python scripts/bench_ratios.py BENCH.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
