"""Models: the GGUF files a study measures - synthesized with the originals' shapes, downloaded
or linked - checked before use, their byte layout, and node-local copies."""
