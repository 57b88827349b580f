"""The peak memory of a command run in a child process of its own, for the tests that bound it
(``test_cli_stream.py``, ``test_checkpoints_large.py``).

The peak is the child's own ``VmHWM`` (the high-water mark of its address space, read as it
exits). ``ru_maxrss`` from ``wait4`` would not do: a child started with vfork records the
parent's high-water mark at exec, and the parent here is a pytest process that may be large.
"""

#: The command, reporting its peak RSS on stderr as it exits.
REPORT_PEAK = """
import atexit, runpy, sys
def report():
    with open("/proc/self/status") as fh:
        sys.stderr.write("".join(line for line in fh if line.startswith("VmHWM")))
atexit.register(report)
sys.argv = ["neuron-kernels", *sys.argv[1:]]
runpy.run_module("neuron_kernels", run_name="__main__")
"""
