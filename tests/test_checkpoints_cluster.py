"""A checkpoint conversion on a Dask cluster (docs/checkpoints.md "On a cluster"): the per-tensor
scales' reads, then one task per output shard, each written by a worker under a temporary name.

What is checked: every file byte for byte equal to the one-process conversion's (shards small
enough that the shards of one fused layer lie in different files, so their shared scale comes from
the first pass), the reports' statistics equal; an exact re-layout (MXFP4 into NVFP4) and its
fallback; the command's ``--scheduler`` and ``--workers``; a worker process killed with its shard
half-written (the task runs again elsewhere, no partial file is left); an error in a task leaves no
output.
"""

import os

import pytest

from neuron_kernels.checkpoints import quantize_checkpoint
from neuron_kernels.io.arrays import FileFormatError

from .checkpoint_helpers import write_safetensors
from .cli_runner import run
from .command_checks import fails
from .modelopt_rules import BF16, make_llama

distributed = pytest.importorskip("distributed")

SHARD = 60_000  # bytes: about one weight a shard


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A 256 x 384 Llama of two layers in bfloat16 (``llama``) and in MXFP4 (``mx``), one of whose
    weights has block scales too far apart for NVFP4 (so it is quantised anew, not re-laid)."""
    d = tmp_path_factory.mktemp("cluster")
    dense = make_llama(d / "llama")
    wide = dense["model.layers.1.mlp.down_proj.weight"].astype("float32")
    wide[7] *= 2.0**-24
    dense["model.layers.1.mlp.down_proj.weight"] = wide.astype(BF16)
    write_safetensors(d / "llama" / "model.safetensors", dense)
    run("quantize", "llama", "mx", "--format", "mxfp4_e2m1", cwd=d)
    return d


def files(folder):
    return {e.name: (folder / e.name).read_bytes() for e in os.scandir(folder)}


def convert(src, dst, fmt, **kw):
    dst.mkdir()
    return quantize_checkpoint(str(src), str(dst), "compressed-tensors", fmt, max_shard_bytes=SHARD, **kw)


@pytest.mark.parametrize(
    "source, fmt",
    [("llama", "nvfp4"), ("llama", "mxfp8_e4m3"), ("llama", "fp8_block"), ("mx", "nvfp4")],
)
def test_the_same_bytes_as_one_process(models, tmp_path, dask_client, source, fmt):
    one = convert(models / source, tmp_path / "one", fmt)
    many = convert(models / source, tmp_path / "many", fmt, client=dask_client)
    expected, got = files(tmp_path / "one"), files(tmp_path / "many")
    assert sorted(got) == sorted(expected) and len([n for n in got if n.endswith(".safetensors")]) > 10
    for name in expected:
        assert got[name] == expected[name], name
    assert [(r.name, r.action, r.reason, r.outputs, r.fused_with) for r in many] == [
        (r.name, r.action, r.reason, r.outputs, r.fused_with) for r in one
    ]
    assert [r.stats for r in many] == [r.stats for r in one]
    if source == "mx":  # re-laid, and the weight whose scales do not fit quantised anew
        assert {r.action for r in many if r.stats is None and r.action != "kept"} == {"converted"}
        assert [r.name for r in many if r.action == "quantised"] == ["model.layers.1.mlp.down_proj.weight"]
    else:
        assert sum(r.stats is not None for r in many) == 14


def test_command_on_a_scheduler(models, tmp_path, dask_client):
    address = dask_client.scheduler.address
    r = run("quantize", models / "llama", "out", "--format", "nvfp4", "--max-shard-size", SHARD,
            "--scheduler", address, cwd=tmp_path)  # fmt: skip
    assert f"nvfp4 (on {address}): 14 tensor(s) quantised" in r.stdout, r.stdout
    run("quantize", models / "llama", "one", "--format", "nvfp4", "--max-shard-size", SHARD, cwd=tmp_path)
    assert files(tmp_path / "out") == files(tmp_path / "one")


def test_an_error_in_a_task_leaves_no_output(models, tmp_path, dask_client):
    """A task's error (a bfloat16 weight into NVFP4 changes its values, which --require-exact
    refuses) reaches the caller once the other tasks have stopped (no file is being written any
    more, no partial file is left); the command then leaves no output."""
    with pytest.raises(FileFormatError, match="--require-exact refuses"):
        convert(models / "llama", tmp_path / "api", "nvfp4", require_exact=True, client=dask_client)
    left = sorted(os.listdir(tmp_path / "api"))  # the other tasks have stopped: nothing changes any more
    assert not [n for n in left if n.endswith(".partial")] and sorted(os.listdir(tmp_path / "api")) == left
    fails("quantize", models / "llama", "out", "--format", "nvfp4", "--require-exact", "--scheduler",
          dask_client.scheduler.address, cwd=tmp_path, message="--require-exact refuses")  # fmt: skip


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--layout", "npz", "--workers", "2"], "the npz layout is one file"),
        (["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], "not both"),
    ],
)
def test_cluster_usage_errors(models, tmp_path, extra, message):
    out = "out.npz" if "npz" in extra else "out"
    fails("quantize", models / "llama", out, "--format", "nvfp4", *extra, cwd=tmp_path, message=message)


class DieMidShard(distributed.WorkerPlugin):
    """In the first worker to write a shard: the process exits after the shard's first item is
    written (its file half-written under its temporary name). ``marker`` says it happened (a
    restarted worker stays alive)."""

    def __init__(self, marker):
        self.marker = marker

    def setup(self, worker):
        from neuron_kernels.checkpoints import cluster

        real, marker = cluster.write_shard, self.marker

        def dying(path, shard, *rest):
            first = shard.items[0].fill

            def fill(sinks):
                first(sinks)
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    return
                os._exit(1)

            shard.items[0].fill = fill
            real(path, shard, *rest)

        cluster.write_shard = dying


def test_worker_killed_mid_shard(models, tmp_path, process_cluster):
    """A worker process dies with its shard half-written: the scheduler runs the task on another
    worker (the nanny restarts the dead one); the output is complete, the same bytes as in one
    process, with no partial file."""
    client = process_cluster
    marker = tmp_path / "died"
    before = set(client.scheduler_info()["workers"])
    client.register_plugin(DieMidShard(str(marker)))
    many = convert(models / "llama", tmp_path / "many", "nvfp4", client=client)
    assert marker.exists()  # a worker did die mid-shard
    one = convert(models / "llama", tmp_path / "one", "nvfp4")
    assert files(tmp_path / "many") == files(tmp_path / "one")
    assert [r.stats for r in many] == [r.stats for r in one]
    client.wait_for_workers(2, timeout=60)
    assert set(client.scheduler_info()["workers"]) != before  # the dead one's successor has another address
