"""Compiled kernels: casts and MX block formats.

``codec`` holds the generic encoder and decoder (numba); ``compiled`` lists one registry entry per
(source, target) pair of the format table (the registry loads them on its first use), each
compiled lazily on its first call; ``mx_kernels`` computes the MX formats.
"""
