"""The conversion race (docs/performance.md, "The conversion race"): one run, one machine, the
conversions of one checkpoint one after the other, each with its wall time and peak memory.

    python scripts/race.py WORKDIR [--layers 3] [--peer-python PATH] [--formats nvfp4,mxfp4_e2m1,...] [--no-stats]

1. Makes (once; kept in WORKDIR) a checkpoint of a 7B Llama's shapes in bfloat16 (``--layers``
   layers of hidden 4096 / intermediate 11008, vocabulary 32000: about 1.7 GB for 3 layers), and
   the same in fine-grained FP8 (128 x 128 blocks, by the package itself).
2. Times ``cat`` of each input's shards into a file (reading the input and writing as much: the
   ceiling), then ``neuron-kernels quantize`` to each format (with ``--no-stats``, also without
   the summary's error statistics), and, with ``--peer-python`` (a
   Python with llm-compressor installed, which pins its own torch and transformers, so it lives
   in an environment of its own), llm-compressor's ``model_free_ptq`` on the CPU with 2 workers
   for the same schemes (NVFP4A16, MXFP4A16, MXFP8A16, FP8_BLOCK, FP8_DYNAMIC). Each conversion
   runs ``--repeat`` times, alternating with ``cat``; the table gives the medians.
3. Prints one row per conversion: seconds, the ratio to ``cat`` of the same input, and the peak
   resident memory of the process (the largest ``ru_maxrss`` of its children).

The page cache is warm for every run after the first (the input is read once before timing).
Nothing here is a test; ``tests/test_race.py`` runs it on a tiny checkpoint to keep it working.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

#: The package's format -> llm-compressor's scheme of the same weights (no activation quantisation).
PEER_SCHEMES = {
    "nvfp4": "NVFP4A16",
    "mxfp4_e2m1": "MXFP4A16",
    "mxfp8_e4m3": "MXFP8A16",
    "fp8_block": "FP8_BLOCK",
    "fp8_channel": "FP8_DYNAMIC",
}
#: A process that runs one command and prints its wall time and its children's peak memory (KiB).
_TIMER = (
    "import resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
    "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)\n"
)
_PEER = (
    "import sys\n"
    "from llmcompressor import model_free_ptq\n"
    "model_free_ptq(model_stub=sys.argv[1], save_directory=sys.argv[2], scheme=sys.argv[3],\n"
    "               ignore=['lm_head', 'model.embed_tokens'], max_workers=2, device='cpu')\n"
)


def make_llama(folder: Path, layers: int, hidden: int, intermediate: int, vocab: int) -> None:
    """A bfloat16 Llama checkpoint of random weights (standard deviation 0.02), written tensor by
    tensor (bounded memory)."""
    from neuron_kernels.io.safetensors import SafetensorsWriter, TensorSpec

    folder.mkdir(parents=True)
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes |= {f"{p}.input_layernorm.weight": (hidden,), f"{p}.post_attention_layernorm.weight": (hidden,)}
        shapes |= {f"{p}.self_attn.{n}_proj.weight": (hidden, hidden) for n in "qkvo"}
        shapes |= {f"{p}.mlp.{n}_proj.weight": (intermediate, hidden) for n in ("gate", "up")}
        shapes[f"{p}.mlp.down_proj.weight"] = (hidden, intermediate)
    shapes |= {"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)}
    bf16 = np.dtype(ml_dtypes.bfloat16)
    specs = [TensorSpec(n, bf16, s) for n, s in shapes.items()]
    rng = np.random.default_rng(0)
    with SafetensorsWriter(str(folder / "model.safetensors"), specs, {"format": "pt"}) as writer:
        for name, shape in shapes.items():
            with writer.tensor(name) as sink:
                if len(shape) == 1:  # a norm's weight
                    sink.write(np.ones(shape, bf16))
                    continue
                step = max(1, (16 << 20) // (4 * shape[1]))  # rows of 16 MiB of float32
                for r0 in range(0, shape[0], step):
                    part = rng.standard_normal((min(step, shape[0] - r0), shape[1]), dtype=np.float32)
                    sink.write((part * np.float32(0.02)).astype(bf16))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": max(1, hidden // 128),
        "num_key_value_heads": max(1, hidden // 128), "vocab_size": vocab, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def timed(command: list[str]) -> tuple[float, int]:
    """(wall seconds, peak resident KiB) of ``command`` in a process of its own; raises if it fails."""
    out = subprocess.run([sys.executable, "-c", _TIMER, *command], capture_output=True, text=True, check=True)
    seconds, peak, status = out.stdout.split()
    if int(status):
        raise RuntimeError(f"{' '.join(command)} exited with {status}")
    return float(seconds), int(peak)


def cat_command(folder: Path, into: Path) -> list[str]:
    shards = sorted(str(p) for p in folder.glob("*.safetensors"))
    return ["sh", "-c", 'cat "$@" > ' + str(into), "cat", *shards]


def race_arguments(doc: str) -> argparse.ArgumentParser:
    """The options of a race: its working folder, the model's shapes (a 7B Llama's by default) and
    the number of timed runs."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=11008)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--repeat", type=int, default=3)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = race_arguments(__doc__)
    ap.add_argument("--formats", default=",".join(PEER_SCHEMES), help="comma-separated formats of the package")
    ap.add_argument("--peer-python", help="a Python with llm-compressor installed (its own environment)")
    ap.add_argument("--no-fp8-input", action="store_true", help="race the bfloat16 input only")
    ap.add_argument("--no-stats", action="store_true", help="also each conversion with --no-stats")
    args = ap.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    unknown = [f for f in formats if f not in PEER_SCHEMES]
    if unknown:
        ap.error(f"unknown formats {unknown}; choose among {', '.join(PEER_SCHEMES)}")
    work = args.workdir
    bf16 = work / f"llama-{args.layers}x{args.hidden}-bf16"
    if not bf16.exists():
        make_llama(bf16, args.layers, args.hidden, args.intermediate, args.vocab)
    inputs = {"bf16": bf16}
    nk = [sys.executable, "-m", "neuron_kernels"]
    if not args.no_fp8_input:
        fp8 = work / f"llama-{args.layers}x{args.hidden}-fp8"
        if not fp8.exists():
            make = [*nk, "quantize", str(bf16), str(fp8), "--format", "fp8_block", "--layout", "fp8", "--quiet"]
            subprocess.run(make, check=True, stdout=subprocess.DEVNULL)
        inputs["fp8"] = fp8
    rows = []
    for kind, src in inputs.items():
        size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
        timed(cat_command(src, work / "cat.out"))  # the page cache warm
        runs: dict[str, list[tuple[float, int]]] = {"cat": []}
        jobs = {"cat": cat_command(src, work / "cat.out")}
        for fmt in formats:
            if kind == "fp8" and fmt.startswith("fp8"):
                continue  # FP8 into FP8: bytes copied, not a race
            out = work / f"out-{kind}-{fmt}"
            jobs[f"neuron-kernels {fmt}"] = [*nk, "quantize", str(src), str(out), "--format", fmt, "--quiet", "--force"]
            if args.no_stats:
                jobs[f"neuron-kernels {fmt} --no-stats"] = [*jobs[f"neuron-kernels {fmt}"], "--no-stats"]
            if args.peer_python and kind == "bf16":
                peer = work / f"peer-{kind}-{fmt}"
                jobs[f"llm-compressor {PEER_SCHEMES[fmt]}"] = [args.peer_python, "-c", _PEER, str(src), str(peer),
                                                               PEER_SCHEMES[fmt]]  # fmt: skip
        for _ in range(args.repeat):
            for name, command in jobs.items():
                for stale in (work / "cat.out", *(Path(c) for c in command if "/peer-" in c)):
                    if stale.is_dir():
                        shutil.rmtree(stale)
                runs.setdefault(name, []).append(timed(command))
                if name != "cat":  # alternate every conversion with cat
                    runs["cat"].append(timed(jobs["cat"]))
        cat_s = statistics.median(t for t, _ in runs["cat"])
        for name, results in runs.items():
            seconds = statistics.median(t for t, _ in results)
            peak = max(m for _, m in results) / 1024
            rows.append((f"{kind} ({size / 1e9:.2f} GB)", name, seconds, seconds / cat_s, peak))
        (work / "cat.out").unlink(missing_ok=True)
    print(f"{'input':<16} {'conversion':<40} {'seconds':>8} {'x cat':>7} {'peak MB':>8}")
    for kind, name, seconds, ratio, peak in rows:
        print(f"{kind:<16} {name:<40} {seconds:8.2f} {ratio:7.1f} {peak:8.0f}")
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    status = main()
    print(f"race done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    sys.exit(status)
