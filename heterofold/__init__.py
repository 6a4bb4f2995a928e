"""HeteroFold: the method. Token and layer alignment, RoPE handling, KV maps, adapters, evaluation.

Pure torch and tokenizers; knows nothing of HTTP, Redis or SQL.
"""
