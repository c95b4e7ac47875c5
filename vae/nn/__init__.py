"""Shared building blocks. Every architecture builds from these, so a change to how a norm or an
attention block runs (exact tiling, fused QKV, fp16 guards) is made once."""
