"""moe-offload-bench measurement harness."""
