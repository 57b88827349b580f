"""Compiled kernels: casts and block formats.

:mod:`.codec` holds the generic encoder and decoder; :mod:`.sources` the source loaders;
:mod:`.casts` the cast loops; :mod:`.compiled` lists one registry entry per (source, target) pair
of the format table (the registry loads them on its first use), each compiled lazily on its first
call; :mod:`.blocks` computes the block formats (MX, NVFP4).
"""
