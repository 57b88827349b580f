"""Cast kernels, registered in the dispatch registry when this package is first imported.

``compiled`` registers the numba kernels (compiled lazily on first call); ``fallback`` then
registers an explicit numpy/ml_dtypes implementation for every remaining pair that promotion
can ask for, marked ``impl="fallback"`` in the registry.
"""

from . import compiled, fallback  # noqa: F401  (order matters: compiled kernels take their pairs first)
