"""The package's tools: throughput measurement (:mod:`.bench`), its charts (:mod:`.plots`) and
the ahead-of-time compile of kernels, for a host's cache and for the wheel's compiled tier
(:mod:`.warmup`). Nothing is imported here; each is imported from its own module."""
