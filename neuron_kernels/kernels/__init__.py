"""Cast kernels, registered in the dispatch registry when this package is first imported.

``codec`` holds the generic encoder and decoder (numba); ``compiled`` registers one entry per
(source, target) pair of the format table, compiled lazily on its first call.
"""

from . import compiled  # noqa: F401  (registers every pair)
