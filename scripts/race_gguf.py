"""The GGUF race (docs/performance.md, "The GGUF race"): one run, one machine, a GGUF file of a 7B
Llama's shapes quantised one way after another, each with its wall time and peak memory.

    python scripts/race_gguf.py WORKDIR [--layers 3] [--llama-quantize PATH] [--repeat 3]

1. Makes (once; kept in WORKDIR) a BF16 GGUF file of ``--layers`` layers of hidden 4096 /
   intermediate 11008, vocabulary 32000 (about 1.7 GB for 3 layers), random weights of standard
   deviation 0.02, written by gguf-py in pieces.
2. Times ``cat`` of the file into another (the ceiling), ``neuron-kernels quantize`` to NVFP4 and
   MXFP4 (also with ``--no-stats``), and, with ``--llama-quantize`` (llama.cpp's own tool, built
   from its source), ``llama-quantize`` to NVFP4 (where the tool offers it) and MXFP4_MOE with 2
   threads, ``--pure`` with the output layer kept in BF16 (the tensors the package quantises). Each runs
   ``--repeat`` times, alternating with ``cat``; the table gives the medians and the ratio to
   ``cat``.

Nothing here is a test; ``tests/test_race.py`` runs it on a tiny file to keep it working.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from race import race_arguments, timed  # the checkpoint race's options and timer (scripts/race.py)


def make_llama_gguf(path: Path, layers: int, hidden: int, intermediate: int, vocab: int) -> None:
    """A BF16 Llama GGUF file of random weights, each tensor generated as it is written."""
    import gguf

    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (vocab, hidden)}
    for i in range(layers):
        b = f"blk.{i}."
        shapes |= {b + "attn_norm.weight": (hidden,), b + "ffn_norm.weight": (hidden,)}
        shapes |= {b + f"attn_{n}.weight": (hidden, hidden) for n in ("q", "k", "v", "output")}
        shapes |= {b + "ffn_gate.weight": (intermediate, hidden), b + "ffn_up.weight": (intermediate, hidden)}
        shapes[b + "ffn_down.weight"] = (hidden, intermediate)
    shapes |= {"output_norm.weight": (hidden,), "output.weight": (vocab, hidden)}
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("context_length", 4096), ("embedding_length", hidden), ("block_count", layers),
                       ("feed_forward_length", intermediate), ("head_count", hidden // 128),
                       ("head_count_kv", hidden // 128)):  # fmt: skip
        getattr(w, f"add_{key}")(value)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(32)  # MOSTLY_BF16: norms in F32, as llama.cpp's converter writes them
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([1] * vocab)
    for name, shape in shapes.items():
        kind = gguf.GGMLQuantizationType.F32 if len(shape) == 1 else gguf.GGMLQuantizationType.BF16
        nbytes = int(np.prod(shape)) * (4 if len(shape) == 1 else 2)
        w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for shape in shapes.values():
        if len(shape) == 1:
            w.write_tensor_data(np.ones(shape, np.float32))
            continue
        x = (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).astype(ml_dtypes.bfloat16)
        w.write_tensor_data(x.view(np.uint16))
    w.close()


def main(argv: list[str] | None = None) -> int:
    ap = race_arguments(__doc__)
    ap.add_argument("--llama-quantize", help="llama.cpp's llama-quantize binary")
    args = ap.parse_args(argv)
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"llama-{args.layers}x{args.hidden}-bf16.gguf"
    if not src.exists():
        make_llama_gguf(src, args.layers, args.hidden, args.intermediate, args.vocab)
    nk = [sys.executable, "-m", "neuron_kernels", "quantize", str(src)]
    jobs = {"cat": ["sh", "-c", f'cat "{src}" > "{work / "cat.out"}"']}
    for fmt in ("nvfp4", "mxfp4_e2m1"):
        out = str(work / f"out-{fmt}.gguf")
        jobs[f"neuron-kernels {fmt}"] = [*nk, out, "--format", fmt, "--quiet", "--force"]
        jobs[f"neuron-kernels {fmt} --no-stats"] = [*jobs[f"neuron-kernels {fmt}"], "--no-stats"]
    if args.llama_quantize:
        # The same tensors as the package: every one llama-quantize may quantise (--pure: no Q8_0 for
        # the non-expert tensors of MXFP4_MOE) but the output layer, kept in BF16.
        offered = subprocess.run([args.llama_quantize, "--help"], capture_output=True, text=True)
        for kind in ("NVFP4", "MXFP4_MOE"):
            if f" {kind} " not in offered.stdout + offered.stderr:
                print(f"{args.llama_quantize} does not offer {kind}", file=sys.stderr)
                continue
            out = str(work / f"lq-{kind}.gguf")
            jobs[f"llama-quantize {kind}"] = [args.llama_quantize, "--pure", "--output-tensor-type", "bf16", str(src),
                                              out, kind, "2"]  # fmt: skip
    timed(jobs["cat"])  # the page cache warm
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in jobs}
    for _ in range(args.repeat):
        for name, command in jobs.items():
            if name == "cat":
                continue
            runs[name].append(timed(command))
            runs["cat"].append(timed(jobs["cat"]))  # alternate every conversion with cat
    cat_s = statistics.median(t for t, _ in runs["cat"])
    print(f"{'input':<24} {'conversion':<36} {'seconds':>8} {'x cat':>7} {'peak MB':>8}")
    label = f"{src.name} ({src.stat().st_size / 1e9:.2f} GB)"
    for name, results in runs.items():
        seconds = statistics.median(t for t, _ in results)
        peak = max(m for _, m in results) / 1024
        print(f"{label:<24} {name:<36} {seconds:8.2f} {seconds / cat_s:7.1f} {peak:8.0f}")
    (work / "cat.out").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
