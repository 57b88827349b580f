"""Compiled kernels: casts and block formats.

:mod:`.codec` holds the generic encoder and decoder; :mod:`.loaders` the source loaders;
:mod:`.cast_loops` the cast loops; :mod:`.compiled` lists one registry entry per (source, target) pair
of the format table (the registry loads them on its first use), each compiled lazily on its first
call; :mod:`.block_kernels` computes the block formats (MX, NVFP4).
"""
