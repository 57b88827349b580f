"""Speed of the lazy paths, measured (not asserted): prints one line per figure.

    python scripts/bench_dask.py [--gib 1] [--workers 2] [--chunk-mib 64]

1. float32 -> MXFP8 (``quantize_mx``) of a ``--gib`` array: in this process (a NumPy array, every
   thread) against a LocalCluster of ``--workers`` processes of one thread each, the input already
   in the workers' memory (generated there, persisted) and the codes and scales kept there
   (persisted): the time of the quantisation alone, on each side.
2. Peak memory of each worker while it quantises the same array streamed from a generator into a
   Zarr store (nothing persisted): the rise of its peak resident size over its size before, in
   chunks of the input.
3. A cast ufunc (float32 -> bfloat16) on a contiguous array against the array kernel, on one
   thread (the ufunc is one loop; ``cast`` splits large arrays across threads) and on every thread.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import ml_dtypes
import numpy as np

import neuron_kernels as nk


def _fill(block: np.ndarray, block_info=None) -> np.ndarray:
    """Deterministic float32 data of a chunk (cheap: a sine of the index, scaled per row)."""
    loc = block_info[None]["array-location"]
    shape = block_info[None]["chunk-shape"]
    i = np.arange(loc[0][0], loc[0][1], dtype=np.float32)[:, None]
    j = np.arange(loc[1][0], loc[1][1], dtype=np.float32)[None, :]
    out = np.empty(shape, np.float32)  # one chunk of memory, no temporaries
    np.add(i * np.float32(0.37), j * np.float32(0.011), out=out)
    np.sin(out, out=out)
    np.multiply(out, np.float32(1.0) + (i % 7), out=out)
    return out


def _best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _peak_rss() -> int:
    """The process's peak resident size (VmHWM: unlike ru_maxrss, not inherited across exec from
    the parent that spawned the worker)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    import dask
    import dask.array as da
    from distributed import Client, LocalCluster, wait

    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--chunk-mib", type=int, default=64)
    args = p.parse_args()

    cols = 4096
    rows = int(args.gib * (1 << 30) / 4 / cols)
    chunk_rows = max(1, (args.chunk_mib << 20) // (4 * cols))
    chunks = (chunk_rows, cols)
    lazy = da.zeros((rows, cols), np.float32, chunks=chunks).map_blocks(_fill, dtype=np.float32)
    print(f"array: {rows} x {cols} float32 ({rows * cols * 4 / 2**30:.2f} GiB), chunks {chunks}")

    # 1. in process
    x = np.empty((rows, cols), np.float32)
    dask.compute(lazy, scheduler="threads")  # warm the generator
    x[...] = lazy.compute(scheduler="threads")
    nk.quantize_mx(x[:64], "mxfp8_e4m3")  # compile (or load) the kernel
    in_process = _best(lambda: nk.quantize_mx(x, "mxfp8_e4m3"))
    print(f"in process quantize_mx: {in_process:.3f} s ({x.nbytes / in_process / 1e9:.2f} GB/s)")
    expected = nk.quantize_mx(x, "mxfp8_e4m3")
    x = np.empty(0, np.float32)  # free it

    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        xs = lazy.persist()
        wait(xs)
        client.run(lambda: __import__("neuron_kernels").quantize_mx(np.ones((8, 64), np.float32), "mxfp8_e4m3"))

        def on_cluster():
            q = nk.quantize_mx(xs, "mxfp8_e4m3")
            parts = dask.persist(q.codes, q.scales)
            wait(parts)
            return q, parts

        times = []
        for _ in range(5):
            t = time.perf_counter()
            q, parts = on_cluster()
            times.append(time.perf_counter() - t)
            if len(times) < 5:
                del q, parts  # release the results: the next run computes them again
                time.sleep(0.5)
        cluster_time = min(times)
        print(
            f"{args.workers}-process LocalCluster quantize_mx (input and output in the workers' memory): "
            f"{cluster_time:.3f} s; ratio to in process {cluster_time / in_process:.2f}"
        )
        got = q.compute()
        assert np.array_equal(got.codes, expected.codes) and np.array_equal(
            got.scales.view(np.uint8), expected.scales.view(np.uint8)
        ), "the cluster's codes differ from the in-process ones"
        del got, expected, q

    # 2. peak memory while streaming to Zarr
    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        client.run(lambda: __import__("neuron_kernels").quantize_mx(np.ones((8, 64), np.float32), "mxfp8_e4m3"))
        before = client.run(_rss)
        folder = tempfile.mkdtemp()
        try:
            import zarr

            lazy.sum().compute()  # generation alone: its peak is the baseline
            baseline = client.run(_peak_rss)
            q = nk.quantize_mx(lazy, "mxfp8_e4m3")
            out = zarr.open_group(os.path.join(folder, "q.zarr"), mode="w")
            zc = out.create_array("codes", shape=q.codes.shape, chunks=(chunk_rows, cols), dtype=np.uint8)
            zs = out.create_array("scales", shape=q.scales.shape, chunks=(chunk_rows, cols // 32), dtype=np.uint8)
            t = time.perf_counter()
            da.store([q.codes, q.scales], [zc, zs], lock=False)
            elapsed = time.perf_counter() - t
            peaks = client.run(_peak_rss)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        chunk_bytes = chunk_rows * cols * 4
        for worker, peak in sorted(peaks.items()):
            rise = peak - before[worker]
            print(
                f"worker {worker.rsplit(':', 1)[-1]}: peak RSS {peak / 2**20:.0f} MiB, "
                f"{rise / 2**20:.0f} MiB over its start = {rise / chunk_bytes:.1f} input chunks of "
                f"{chunk_bytes / 2**20:.0f} MiB (generating and summing alone: "
                f"{(baseline[worker] - before[worker]) / chunk_bytes:.1f} chunks)"
            )
        print(f"streamed to Zarr in {elapsed:.2f} s (generation and zstd compression included)")

    # 3. ufunc against the array kernel
    y = np.random.default_rng(0).standard_normal(64 << 20, dtype=np.float32)
    ufunc = nk.lookup_cast("float32", "bfloat16").ufunc()
    kernel = nk.lookup_cast("float32", "bfloat16")
    out16 = np.empty(y.shape, np.uint16)
    ufunc(y[:10], out=out16[:10])
    nk.cast(y[:10], "bfloat16")
    t_ufunc = _best(lambda: ufunc(y, out=out16), 5)
    bf16 = out16.view(ml_dtypes.bfloat16)
    t_kernel = _best(lambda: kernel.function(y, bf16, *_opts()), 5)
    for threads in (1, None):
        nk.set_num_threads(threads)
        t_cast = _best(lambda: nk.cast(y, "bfloat16", out=bf16), 5)
        label = "1 thread" if threads == 1 else f"{os.cpu_count()} threads"
        print(
            f"float32 -> bfloat16, 64 Mi elements: ufunc {t_ufunc * 1e3:.1f} ms, array kernel {t_kernel * 1e3:.1f} ms "
            f"(one call, one thread), cast() {t_cast * 1e3:.1f} ms ({label}); ufunc / kernel "
            f"{t_ufunc / t_kernel:.2f}, ufunc / cast {t_ufunc / t_cast:.2f}"
        )
    nk.set_num_threads(None)


def _opts():
    from neuron_kernels.registry import CastOptions

    return CastOptions("nearest_even", False), 0


if __name__ == "__main__":
    main()
