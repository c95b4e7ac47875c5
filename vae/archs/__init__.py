"""One module per VAE family; each exports ``SPEC`` (an ``ArchSpec``)."""
